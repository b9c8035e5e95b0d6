/* drvpar: does the driver's checkpoint API serialise across processes, and is the serialisation
 * in the caller (one libcuda in one process) or in the driver? Issue 31's group suspend calls
 * cuCheckpointProcessLock+Checkpoint for every member at once from one thread per member of one
 * caller; run 57 measured the second member's driver step at twice the first's.
 *   drvpar MODE OP PID...   MODE: seq | threads | fork;  OP: out (lock + checkpoint) | in
 *   (restore + unlock). The processes' large buffers should already be out (gcrctl suspend
 *   --no-driver), so what is timed is the driver's own part, as in a group suspend.
 * Build: gcc -O2 -pthread -I<cuda include> -Iinclude -Ilib bench/drvpar.c lib/gcr_driver.c lib/gcr_uuid.c
 *   lib/gcr_error.c lib/gcr_time.c -ldl
 * Output: one JSON line: the mode, the op, each pid's start and end (ms from the common start)
 * and the wall time. Not part of the product. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gcr_driver.h"
#include "gcr_error.h"
#include "gcr_time.h"

#define MAXP 16

struct one {
	pid_t pid;
	int out;
	double t0, start, end; /* ms */
	int rc;
	char msg[256];
};

static void run_one(struct one *o)
{
	struct gcr_err err = { 0 };
	o->start = gcr_time_mono_ms() - o->t0;
	int rc = o->out ? gcr_driver_lock(o->pid, 10000, &err) : gcr_driver_restore(o->pid, NULL, 0, &err);
	if (rc == 0)
		rc = o->out ? gcr_driver_checkpoint(o->pid, &err) : gcr_driver_unlock(o->pid, &err);
	o->end = gcr_time_mono_ms() - o->t0;
	o->rc = rc;
	if (rc < 0)
		snprintf(o->msg, sizeof(o->msg), "%s", err.msg);
}

static void *thr(void *p)
{
	run_one(p);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc - 3 > MAXP) {
		fprintf(stderr, "usage: drvpar seq|threads|fork out|in PID...\n");
		return 2;
	}
	const char *mode = argv[1];
	int out = strcmp(argv[2], "out") == 0, n = argc - 3;
	/* Shared with fork's children, which write their own slot. */
	struct one *o = mmap(NULL, sizeof(*o) * MAXP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (o == MAP_FAILED)
		return 1;
	struct gcr_err err = { 0 };
	if (strcmp(mode, "fork") != 0 && gcr_driver_open(&err) < 0) { /* fork: each child opens its own */
		fprintf(stderr, "drvpar: %s\n", err.msg);
		return 1;
	}
	double t0 = gcr_time_mono_ms();
	for (int i = 0; i < n; i++)
		o[i] = (struct one){ .pid = (pid_t)atoi(argv[3 + i]), .out = out, .t0 = t0 };
	if (strcmp(mode, "seq") == 0) {
		for (int i = 0; i < n; i++)
			run_one(&o[i]);
	} else if (strcmp(mode, "threads") == 0) {
		pthread_t th[MAXP];
		for (int i = 0; i < n; i++)
			pthread_create(&th[i], NULL, thr, &o[i]);
		for (int i = 0; i < n; i++)
			pthread_join(th[i], NULL);
	} else {
		/* Each child opens libcuda itself (its cuInit is part of its time, as it would be). */
		pid_t kids[MAXP];
		for (int i = 0; i < n; i++) {
			kids[i] = fork();
			if (kids[i] == 0) {
				run_one(&o[i]);
				_exit(0);
			}
		}
		for (int i = 0; i < n; i++)
			waitpid(kids[i], NULL, 0);
	}
	double wall = gcr_time_mono_ms() - t0;
	printf("{\"kind\": \"drvpar\", \"mode\": \"%s\", \"op\": \"%s\", \"wall_ms\": %.1f, \"procs\": [", mode, argv[2],
	       wall);
	for (int i = 0; i < n; i++)
		printf("%s{\"pid\": %d, \"rc\": %d, \"start_ms\": %.1f, \"end_ms\": %.1f, \"ms\": %.1f, \"error\": \"%s\"}",
		       i ? ", " : "", (int)o[i].pid, o[i].rc, o[i].start, o[i].end, o[i].end - o[i].start, o[i].msg);
	printf("]}\n");
	return 0;
}
