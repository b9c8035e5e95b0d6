/* gcr-dp-standalone: the device plugin alone, for tests: serves and registers until
 * SIGTERM/SIGINT; SIGUSR1 marks the slots unhealthy, SIGUSR2 healthy again. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_deviceplugin.h"
#include "gcr_log.h"

static volatile sig_atomic_t got_stop, got_health = -1;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		got_health = 0;
	else if (sig == SIGUSR2)
		got_health = 1;
	else
		got_stop = 1;
}

static void usage(FILE *f)
{
	fputs("usage: gcr-dp-standalone [--kubelet-dir D] [--endpoint NAME] [--resource NAME]\n"
	      "         [--slots N] [--shim-dir D] [--shim-container-dir D] [--socket-root D]\n"
	      "         [--socket-container-dir D] [--agent-socket PATH] [--agent-container-dir D]\n"
	      "         [--cdi-device NAME] [--poll-ms MS]\n",
	      f);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "kubelet-dir", required_argument, NULL, 'k' },
		{ "endpoint", required_argument, NULL, 'e' },
		{ "resource", required_argument, NULL, 'r' },
		{ "slots", required_argument, NULL, 'n' },
		{ "shim-dir", required_argument, NULL, 's' },
		{ "shim-container-dir", required_argument, NULL, 'S' },
		{ "socket-root", required_argument, NULL, 'o' },
		{ "socket-container-dir", required_argument, NULL, 'O' },
		{ "agent-socket", required_argument, NULL, 'a' },
		{ "agent-container-dir", required_argument, NULL, 'A' },
		{ "cdi-device", required_argument, NULL, 'c' },
		{ "poll-ms", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_dp_config cfg = { 0 };
	struct gcr_err err = { 0 };
	struct sigaction sa;
	struct agent_dp *dp;
	int c;

	gcr_log_init(GCR_LOG_INFO);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'k': cfg.kubelet_dir = optarg; break;
		case 'e': cfg.endpoint = optarg; break;
		case 'r': cfg.resource_name = optarg; break;
		case 'n': cfg.slots = (unsigned)strtoul(optarg, NULL, 10); break;
		case 's': cfg.shim_host_dir = optarg; break;
		case 'S': cfg.shim_container_dir = optarg; break;
		case 'o': cfg.socket_root = optarg; break;
		case 'O': cfg.socket_container_dir = optarg; break;
		case 'a': cfg.agent_socket = optarg; break;
		case 'A': cfg.agent_container_dir = optarg; break;
		case 'c': cfg.cdi_device = optarg; break;
		case 'p': cfg.poll_ms = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	dp = agent_dp_new(&cfg, &err);
	if (dp == NULL || agent_dp_start(dp, &err) < 0) {
		fprintf(stderr, "gcr-dp-standalone: %s\n", err.msg);
		agent_dp_free(dp);
		return 1;
	}
	fprintf(stderr, "gcr-dp-standalone: running\n");
	while (!got_stop) {
		usleep(20000); /* 20 ms: signals are applied here, off the handler */
		if (got_health >= 0) {
			agent_dp_set_healthy(dp, got_health == 1);
			fprintf(stderr, "gcr-dp-standalone: healthy=%d\n", (int)got_health);
			got_health = -1;
		}
	}
	fprintf(stderr, "gcr-dp-standalone: stopping after %u registration(s)\n",
		agent_dp_registrations(dp));
	agent_dp_free(dp);
	return 0;
}
