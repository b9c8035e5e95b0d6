/* pause: the test bed's sandbox ("pause") container process. It holds the pod's namespaces open,
 * reaps the zombies PID 1 inherits, and exits 0 on SIGTERM or SIGINT. Built static by build.sh. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A handler, not SIG_DFL: the kernel drops default-action signals sent to a namespace's PID 1. The
 * signals stay blocked and are taken with sigwaitinfo, so the handler never runs. */
static void pause_noop(int sig)
{
	(void)sig;
}

int main(int argc, char **argv)
{
	static const int sigs[] = {SIGTERM, SIGINT, SIGCHLD};
	struct sigaction sa;
	sigset_t set;
	size_t i;

	if (argc > 1) {
		if (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0) {
			puts("gcr-test pause 1");
			return 0;
		}
		fprintf(stderr, "usage: pause [-v]\n");
		return 2;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not PID 1, reaping only my own children\n");

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = pause_noop;
	sigemptyset(&set);
	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		sigaddset(&set, sigs[i]);
		if (sigaction(sigs[i], &sa, NULL) != 0) {
			perror("pause: sigaction");
			return 1;
		}
	}
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) {
		perror("pause: sigprocmask");
		return 1;
	}

	for (;;) {
		int sig = sigwaitinfo(&set, NULL);

		if (sig < 0) {
			if (errno == EINTR)
				continue;
			perror("pause: sigwaitinfo");
			return 1;
		}
		if (sig == SIGCHLD) {
			/* One SIGCHLD may stand for several exits: reap until none is left. */
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
			continue;
		}
		fprintf(stderr, "pause: %s, exiting\n", strsignal(sig));
		return 0;
	}
}
