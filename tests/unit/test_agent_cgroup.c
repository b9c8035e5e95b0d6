/* test_agent_cgroup: /proc/<pid>/cgroup samples from real kubelet, containerd,
 * CRI-O, docker, kind and k3s nodes (IDs replaced), plus malformed input. */
#include "agent_cgroup.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define U "1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8f"
#define U_ "1f0c5b0e_9d7a_4c2b_8e6f_3a4b5c6d7e8f"
#define U2 "5e8d2c4a-1b3f-4a6e-9c7d-0f2e4a6c8b1d"
#define C "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
#define C2 "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
#define H32 "4a8a08f09d37b73795649038408b5f33"

enum { G = AGENT_CGROUP_QOS_GUARANTEED, B = AGENT_CGROUP_QOS_BURSTABLE,
       BE = AGENT_CGROUP_QOS_BESTEFFORT, Q0 = AGENT_CGROUP_QOS_UNKNOWN };

struct sample {
	const char *name;
	const char *text;
	int rc;
	const char *uid, *cid, *runtime;
	int qos;
};

/* A cgroup v1 (or hybrid) file: every controller shows the same path. */
#define V1(path)                                                                   \
	"12:hugetlb:" path "\n11:pids:" path "\n10:devices:" path "\n9:memory:" path \
	"\n8:cpu,cpuacct:" path "\n7:blkio:" path "\n6:net_cls,net_prio:" path       \
	"\n5:freezer:" path "\n4:perf_event:" path "\n3:cpuset:" path              \
	"\n2:rdma:/\n1:name=systemd:" path "\n"

static const struct sample samples[] = {
	/* cgroup v2, systemd driver: the layout of current distributions. */
	{ "v2 systemd containerd burstable",
	  "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_
	  ".slice/cri-containerd-" C ".scope\n",
	  0, U, C, "containerd", B },
	{ "v2 systemd containerd guaranteed",
	  "0::/kubepods.slice/kubepods-pod" U_ ".slice/cri-containerd-" C ".scope\n", 0, U, C,
	  "containerd", G },
	{ "v2 systemd containerd besteffort",
	  "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" U_
	  ".slice/cri-containerd-" C ".scope\n",
	  0, U, C, "containerd", BE },
	{ "v2 systemd cri-o",
	  "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_ ".slice/crio-" C
	  ".scope\n",
	  0, U, C, "cri-o", B },
	{ "v2 systemd cri-o with crun's container sub-cgroup",
	  "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_ ".slice/crio-" C
	  ".scope/container\n",
	  0, U, C, "cri-o", B },
	{ "v2 systemd cri-o conmon",
	  "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_
	  ".slice/crio-conmon-" C ".scope\n",
	  -ENOENT, NULL, NULL, NULL, 0 },
	{ "v2 systemd docker (cri-dockerd)",
	  "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" U_
	  ".slice/docker-" C ".scope\n",
	  0, U, C, "docker", BE },
	{ "v2 pod-level process", "0::/kubepods.slice/kubepods-pod" U_ ".slice\n", 0, U, "", "", G },
	{ "v2 nested cgroups inside the container",
	  "0::/kubepods.slice/kubepods-pod" U_ ".slice/cri-containerd-" C
	  ".scope/system.slice/sshd.service\n",
	  0, U, C, "containerd", G },
	{ "uppercase hex is lowercased",
	  "0::/kubepods.slice/kubepods-pod1F0C5B0E_9D7A_4C2B_8E6F_3A4B5C6D7E8F.slice/cri-containerd-"
	  "CA978112CA1BBDCAFAC231B39A23DC4DA786EFF8147C4E72B9807785AFEE48BB.scope",
	  0, U, C, "containerd", G },

	/* cgroup v1 and hybrid hierarchies. */
	{ "v1 systemd containerd", V1("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_
				      ".slice/cri-containerd-" C ".scope"),
	  0, U, C, "containerd", B },
	{ "hybrid: v1 lines plus 0::/ on the unified hierarchy",
	  V1("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" U_ ".slice/docker-" C
	     ".scope") "0::/\n",
	  0, U, C, "docker", BE },
	{ "v1 cgroupfs docker burstable", V1("/kubepods/burstable/pod" U "/" C), 0, U, C, "", B },
	{ "v1 cgroupfs guaranteed", V1("/kubepods/pod" U "/" C), 0, U, C, "", G },
	{ "v1 cgroupfs cri-o", V1("/kubepods/besteffort/pod" U "/crio-" C), 0, U, C, "cri-o", BE },
	{ "v1 cgroupfs cri-o conmon", V1("/kubepods/besteffort/pod" U "/crio-conmon-" C), -ENOENT, NULL,
	  NULL, NULL, 0 },
	{ "v1 one hierarchy shows only the pod",
	  "4:memory:/kubepods/burstable/pod" U "\n3:cpu:/kubepods/burstable/pod" U "/" C "\n", 0, U, C,
	  "", B },
	{ "v2 cgroupfs besteffort containerd", "0::/kubepods/besteffort/pod" U "/" C "\n", 0, U, C, "",
	  BE },
	{ "static pod: 32-hex config hash", "0::/kubepods/burstable/pod" H32 "/" C "\n", 0, H32, C, "",
	  B },

	/* kind and k3s. */
	{ "kind, systemd driver, cgroup root /kubelet",
	  "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
	  "kubelet-kubepods-besteffort-pod" U_ ".slice/cri-containerd-" C ".scope\n",
	  0, U, C, "containerd", BE },
	{ "kind node seen from the host (cgroupfs inside docker)",
	  V1("/docker/" C2 "/kubelet/kubepods/burstable/pod" U "/" C), 0, U, C, "", B },
	{ "k3s: literal systemd name under containerd.service",
	  V1("/system.slice/containerd.service/kubepods-burstable-pod" U_ ".slice:cri-containerd:" C),
	  0, U, C, "containerd", B },
	{ "literal systemd name, cri-o",
	  "0::/system.slice/crio.service/kubepods-pod" U_ ".slice:crio:" C "\n", 0, U, C, "cri-o", G },
	{ "literal systemd name, conmon",
	  "0::/system.slice/crio.service/kubepods-pod" U_ ".slice:crio-conmon:" C "\n", -ENOENT, NULL,
	  NULL, NULL, 0 },
	{ "literal systemd name, unknown prefix",
	  "0::/system.slice/x.service/kubepods-pod" U_ ".slice:runx:" C "\n", -EINVAL, NULL, NULL, NULL,
	  0 },
	{ "literal systemd name, no ID", "0::/system.slice/x.service/kubepods-pod" U_ ".slice:crio\n",
	  -EINVAL, NULL, NULL, NULL, 0 },
	{ "k3s cgroupfs", "0::/kubepods/besteffort/pod" U "/" C "\n", 0, U, C, "", BE },
	/* Two kubelets on one machine (the test bed's gcr-node-2): cgroupRoot keeps them apart. */
	{ "cgroupfs under a kubelet cgroupRoot", V1("/gcr-node-2/kubepods/besteffort/pod" U "/" C), 0, U, C, "", BE },
	{ "cgroupfs under a kubelet cgroupRoot, guaranteed", V1("/gcr-node-2/kubepods/pod" U "/" C), 0, U, C, "", G },

	/* Cgroup namespaces: the agent's own view may be relative. */
	{ "inside a cgroup namespace: root", "0::/\n", -ENOENT, NULL, NULL, NULL, 0 },
	{ "inside a container: its own sub-cgroup", "0::/init.scope\n", -ENOENT, NULL, NULL, NULL, 0 },
	{ "relative path to a host service", "0::/../../../system.slice/containerd.service\n", -ENOENT,
	  NULL, NULL, NULL, 0 },
	{ "relative path to another pod (systemd)",
	  "0::/../../kubepods-besteffort-pod" U_ ".slice/cri-containerd-" C ".scope\n", 0, U, C,
	  "containerd", BE },
	{ "relative path to another pod (cgroupfs)", "0::/../../pod" U "/" C "\n", 0, U, C, "", Q0 },
	{ "relative path keeps the QoS directory", "0::/../../burstable/pod" U "/" C "\n", 0, U, C, "",
	  B },

	/* Host processes. */
	{ "host service", "0::/system.slice/containerd.service\n", -ENOENT, NULL, NULL, NULL, 0 },
	{ "user session", "0::/user.slice/user-1000.slice/session-3.scope\n", -ENOENT, NULL, NULL, NULL,
	  0 },
	{ "kubepods slices without a pod", "0::/kubepods.slice/kubepods-burstable.slice\n", -ENOENT, NULL,
	  NULL, NULL, 0 },
	{ "v1 host process", V1("/system.slice/kubelet.service"), -ENOENT, NULL, NULL, NULL, 0 },
	{ "pod directory not under kubepods", "0::/mypods/pod" U "/" C "\n", -ENOENT, NULL, NULL, NULL,
	  0 },
	{ "systemd kubepods prefix glued to a word",
	  "0::/xkubepods-pod" U_ ".slice/cri-containerd-" C ".scope\n", -ENOENT, NULL, NULL, NULL, 0 },

	/* Malformed. */
	{ "empty text", "", -EINVAL, NULL, NULL, NULL, 0 },
	{ "only newlines", "\n\n\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "garbage", "hello world\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "one colon", "0:/kubepods/pod" U "/" C "\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "non-numeric hierarchy", "x::/kubepods/pod" U "/" C "\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "hierarchy id too long", "12345678901::/\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "relative without slash", "0::kubepods/pod" U "/" C "\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "empty path", "0::\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "short container ID (systemd)",
	  "0::/kubepods.slice/kubepods-pod" U_ ".slice/cri-containerd-abc123.scope\n", -EINVAL, NULL,
	  NULL, NULL, 0 },
	{ "short container ID (cgroupfs)", "0::/kubepods/pod" U "/abc123\n", -EINVAL, NULL, NULL, NULL, 0 },
	{ "container ID with a non-hex digit",
	  "0::/kubepods/pod" U "/ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bg\n",
	  -EINVAL, NULL, NULL, NULL, 0 },
	{ "unknown scope", "0::/kubepods.slice/kubepods-pod" U_ ".slice/libpod-" C ".scope\n", -EINVAL,
	  NULL, NULL, NULL, 0 },
	{ "pod slice with junk after .slice", "0::/kubepods.slice/kubepods-pod" U_ ".slicex/x\n", -EINVAL,
	  NULL, NULL, NULL, 0 },
	{ "UID with mixed separators",
	  "0::/kubepods/pod1f0c5b0e-9d7a_4c2b-8e6f-3a4b5c6d7e8f/" C "\n", -ENOENT, NULL, NULL, NULL, 0 },
	{ "UID one char short", "0::/kubepods/pod1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8/" C "\n", -ENOENT,
	  NULL, NULL, NULL, 0 },
	{ "UID with a non-hex digit", "0::/kubepods/pod1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8z/" C "\n",
	  -ENOENT, NULL, NULL, NULL, 0 },
	{ "lines name different pods",
	  "2:memory:/kubepods/pod" U "/" C "\n1:cpu:/kubepods/pod" U2 "/" C "\n", -EINVAL, NULL, NULL,
	  NULL, 0 },
	{ "lines name different containers",
	  "2:memory:/kubepods/pod" U "/" C "\n1:cpu:/kubepods/pod" U "/" C2 "\n", -EINVAL, NULL, NULL,
	  NULL, 0 },
	{ "good line then a malformed one", "0::/kubepods/pod" U "/" C "\nbogus\n", -EINVAL, NULL, NULL,
	  NULL, 0 },
	{ "no trailing newline", "0::/kubepods/pod" U "/" C, 0, U, C, "", G },
	{ "path contains a colon", "0::/a:b/kubepods/pod" U "/" C "\n", 0, U, C, "", G },
};

static void test_samples(void)
{
	for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++) {
		const struct sample *s = &samples[i];
		struct agent_cgroup_pod pod;
		struct gcr_err err = { 0, "" };
		int rc = agent_cgroup_parse(s->text, strlen(s->text), &pod, &err);
		if (rc != s->rc)
			fprintf(stderr, "sample '%s': rc %d (%s), want %d\n", s->name, rc, err.msg, s->rc);
		CHECK(rc == s->rc);
		if (rc != 0) {
			/* Errors carry a message and leave nothing behind. */
			CHECK(err.code == rc && err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL);
			CHECK(pod.pod_uid[0] == '\0' && pod.container_id[0] == '\0');
			continue;
		}
		if (s->rc != 0)
			continue;
		CHECK_STR(pod.pod_uid, s->uid);
		CHECK_STR(pod.container_id, s->cid);
		CHECK_STR(pod.runtime, s->runtime);
		CHECK((int)pod.qos == s->qos);
		if (strcmp(pod.pod_uid, s->uid) != 0 || strcmp(pod.container_id, s->cid) != 0)
			fprintf(stderr, "sample '%s': got %s/%s\n", s->name, pod.pod_uid, pod.container_id);
	}
}

static void test_messages(void)
{
	struct agent_cgroup_pod pod;
	struct gcr_err err = { 0, "" };
	const char *t = "0::/kubepods.slice/kubepods-pod" U_ ".slice/crio-conmon-" C ".scope\n";
	CHECK(agent_cgroup_parse(t, strlen(t), &pod, &err) == -ENOENT);
	CHECK(strstr(err.msg, "conmon") != NULL);
	t = "0::/\n";
	CHECK(agent_cgroup_parse(t, strlen(t), &pod, &err) == -ENOENT);
	CHECK(strstr(err.msg, "not in a Kubernetes pod") != NULL);
	t = "0::/ok\n1:cpu:/kubepods/pod" U "/libpod-x\n";
	CHECK(agent_cgroup_parse(t, strlen(t), &pod, &err) == -EINVAL);
	CHECK(strstr(err.msg, "line 2") != NULL && strstr(err.msg, "libpod-x") != NULL);
	/* A NULL error record is allowed. */
	CHECK(agent_cgroup_parse(t, strlen(t), &pod, NULL) == -EINVAL);
}

static void test_bounds(void)
{
	struct agent_cgroup_pod pod;
	struct gcr_err err = { 0, "" };

	/* Length is honoured: the text need not be NUL-terminated. */
	const char *t = "0::/kubepods/pod" U "/" C "XXXX";
	CHECK(agent_cgroup_parse(t, strlen(t) - 4, &pod, &err) == 0);
	CHECK_STR(pod.container_id, C);

	/* An embedded NUL is malformed, not a terminator. */
	char nul[] = "0::/kubepods/pod" U "/" C "\n";
	nul[5] = '\0';
	CHECK(agent_cgroup_parse(nul, sizeof(nul) - 1, &pod, &err) == -EINVAL);

	CHECK(agent_cgroup_parse(NULL, 0, &pod, &err) == -EINVAL);

	size_t big = AGENT_CGROUP_MAX_TEXT + 1;
	char *huge = malloc(big);
	memset(huge, '/', big);
	memcpy(huge, "0::", 3);
	CHECK(agent_cgroup_parse(huge, big, &pod, &err) == -EINVAL);
	/* A path over the kernel's limit. */
	CHECK(agent_cgroup_parse(huge, 5000, &pod, &err) == -EINVAL);
	CHECK(strstr(err.msg, "longer") != NULL);
	/* Only separators: no component at all. */
	CHECK(agent_cgroup_parse(huge, 4000, &pod, &err) == -ENOENT);
	free(huge);
}

static void test_parse_path(void)
{
	struct agent_cgroup_pod pod;
	struct gcr_err err = { 0, "" };
	const char *p = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" U_
			".slice/cri-containerd-" C ".scope";
	CHECK(agent_cgroup_parse_path(p, strlen(p), &pod, &err) == 0);
	CHECK_STR(pod.pod_uid, U);
	CHECK_STR(pod.runtime, "containerd");
	CHECK(agent_cgroup_parse_path(NULL, 0, &pod, &err) == -EINVAL);
	CHECK(agent_cgroup_parse_path("/", 1, &pod, &err) == -ENOENT);
	/* The first pod wins when kubelets nest. */
	p = "/kubepods/burstable/pod" U "/" C "/kubelet/kubepods/pod" U2 "/" C2;
	CHECK(agent_cgroup_parse_path(p, strlen(p), &pod, &err) == 0);
	CHECK_STR(pod.pod_uid, U);
	CHECK_STR(pod.container_id, C);
}

static void test_files(void)
{
	struct agent_cgroup_pod pod;
	struct gcr_err err = { 0, "" };
	char dir[] = "/tmp/test_agent_cgroup.XXXXXX";
	char path[256], fifo[256];
	CHECK(mkdtemp(dir) != NULL);

	snprintf(path, sizeof(path), "%s/cgroup", dir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(V1("/kubepods/burstable/pod" U "/" C), f);
		fclose(f);
	}
	CHECK(agent_cgroup_read_file(path, &pod, &err) == 0);
	CHECK_STR(pod.pod_uid, U);
	CHECK(pod.qos == AGENT_CGROUP_QOS_BURSTABLE);

	/* Too large for a cgroup file. */
	f = fopen(path, "w");
	if (f) {
		for (int i = 0; i < 2000; i++)
			fputs("0::/system.slice/some-very-long-service-name.service\n", f);
		fclose(f);
	}
	CHECK(agent_cgroup_read_file(path, &pod, &err) == -EINVAL);
	CHECK(strstr(err.msg, "larger") != NULL);
	unlink(path);

	CHECK(agent_cgroup_read_file(path, &pod, &err) == -ESRCH);
	CHECK(agent_cgroup_read_file(dir, &pod, &err) == -EINVAL);
	/* A FIFO must be refused, not block the agent. */
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	CHECK(mkfifo(fifo, 0600) == 0);
	CHECK(agent_cgroup_read_file(fifo, &pod, &err) == -EINVAL);
	unlink(fifo);
	rmdir(dir);

	/* This process: a pod when the tests run in CI pods, else not. */
	int rc = agent_cgroup_read_pid(getpid(), &pod, &err);
	CHECK(rc == 0 || rc == -ENOENT);
	CHECK(agent_cgroup_read_pid(0, &pod, &err) == -EINVAL);
	CHECK(agent_cgroup_read_pid(-5, &pod, &err) == -EINVAL);
	/* pid_max is at most 2^22: this one cannot exist. */
	CHECK(agent_cgroup_read_pid(99999999, &pod, &err) == -ESRCH);
}

static void test_qos_names(void)
{
	CHECK_STR(agent_cgroup_qos_name(AGENT_CGROUP_QOS_GUARANTEED), "Guaranteed");
	CHECK_STR(agent_cgroup_qos_name(AGENT_CGROUP_QOS_BURSTABLE), "Burstable");
	CHECK_STR(agent_cgroup_qos_name(AGENT_CGROUP_QOS_BESTEFFORT), "BestEffort");
	CHECK_STR(agent_cgroup_qos_name(AGENT_CGROUP_QOS_UNKNOWN), "");
	CHECK_STR(agent_cgroup_qos_name((enum agent_cgroup_qos)42), "");
}

int main(void)
{
	test_samples();
	test_messages();
	test_bounds();
	test_parse_path();
	test_files();
	test_qos_names();
	return test_summary("test_agent_cgroup");
}
