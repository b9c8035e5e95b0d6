/* gcr_time: the one clock reader and time arithmetic shared by the shim, the agent and
 * gcrctl, so no module carries its own copy of clock_gettime or the nanosecond carry. */
#ifndef GCR_TIME_H
#define GCR_TIME_H

#include <time.h>

/* The absolute CLOCK_REALTIME time ms milliseconds (>= 0) from now, as
 * pthread_cond_timedwait takes it (condition variables default to CLOCK_REALTIME). */
void gcr_time_deadline(struct timespec *dl, long ms);

/* Milliseconds on CLOCK_MONOTONIC, with the fraction (timings report sub-millisecond steps;
 * a double holds whole milliseconds exactly for 285,000 years). Never goes back; its zero
 * is arbitrary, so only differences mean anything. */
double gcr_time_mono_ms(void);

/* Seconds since the epoch on CLOCK_REALTIME, with the fraction: for deadlines and times that
 * others set on the wall clock (a pod's deletionTimestamp, a Lease's renewTime). */
double gcr_time_wall_s(void);

#endif
