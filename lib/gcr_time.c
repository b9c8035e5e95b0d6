/* gcr_time: time arithmetic shared by the agent's threads (gcr_time.h). */
#include "gcr_time.h"

void gcr_time_deadline(struct timespec *dl, long ms)
{
	clock_gettime(CLOCK_REALTIME, dl);
	dl->tv_sec += ms / 1000;
	dl->tv_nsec += (ms % 1000) * 1000000L;
	if (dl->tv_nsec >= 1000000000L) {
		dl->tv_sec++;
		dl->tv_nsec -= 1000000000L;
	}
}
