/* gcr_time: time arithmetic shared by the agent's threads, so no module carries its own
 * copy of the nanosecond carry. */
#ifndef GCR_TIME_H
#define GCR_TIME_H

#include <time.h>

/* The absolute CLOCK_REALTIME time ms milliseconds (>= 0) from now, as
 * pthread_cond_timedwait takes it (condition variables default to CLOCK_REALTIME). */
void gcr_time_deadline(struct timespec *dl, long ms);

#endif
