/* fuzz_crobj: arbitrary bytes as a Checkpoint or Restore object (a tenant writes its status,
 * and with a forged one tried to steer the agent: issue 15), through agent_crobj_decode, and
 * as a record file through agent_record_decode and back; aborts when a decoded field breaks
 * its documented bounds or a record does not survive encode + decode unchanged. */
#include "agent_crobj.h"
#include "agent_record.h"
#include "gcr_uuid.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_str(const char *s, size_t cap, int empty_ok)
{
	size_t n = strnlen(s, cap);
	if (n >= cap || (n == 0 && !empty_ok))
		abort();
	for (size_t i = 0; i < n; i++)
		if (s[i] <= ' ' || s[i] > '~' || s[i] == '/')
			abort();
}

static void check_obj(json_t *j, enum agent_crobj_kind kind)
{
	struct agent_crobj o;
	struct gcr_err err = { 0, "" };
	int rc = agent_crobj_decode(j, kind, &o, &err);
	if (rc != 0 && (rc != -EINVAL || err.code != rc || err.msg[0] == '\0'))
		abort();
	if (rc != 0)
		return;
	check_str(o.ns, sizeof(o.ns), 0);
	check_str(o.name, sizeof(o.name), 0);
	check_str(o.uid, sizeof(o.uid), 0);
	check_str(o.target, sizeof(o.target), 0);
	check_str(o.container, sizeof(o.container), 1);
	check_str(o.node, sizeof(o.node), 1);
	check_str(o.pod, sizeof(o.pod), 1);
	if (!agent_crobj_is_label(o.ns) || !agent_crobj_is_subdomain(o.target) || (unsigned)o.phase > AGENT_PHASE_UNKNOWN ||
	    o.timeout_s < 0 || o.timeout_s > 3600 || (kind == AGENT_CROBJ_RESTORE && o.keep_context))
		abort();
	/* The kubelet's CPU side only for an Image; a new pod only named by a Restore, and validly. */
	if ((o.cpu_kubelet && (kind != AGENT_CROBJ_CHECKPOINT || o.action != AGENT_ACTION_IMAGE)) ||
	    (o.pod[0] != '\0' && (kind != AGENT_CROBJ_RESTORE || !agent_crobj_is_subdomain(o.pod))))
		abort();
	/* Other GPUs: only a Restore names them, one way or the other, each a UUID. */
	if ((o.target_gpu[0] != '\0' || o.npairs > 0) && (kind != AGENT_CROBJ_RESTORE ||
							 (o.target_gpu[0] != '\0' && o.npairs > 0)))
		abort();
	if (o.npairs > AGENT_CROBJ_MAX_PAIRS || (o.target_gpu[0] != '\0' && !gcr_uuid_valid(o.target_gpu)))
		abort();
	for (size_t i = 0; i < o.npairs; i++)
		if (!gcr_uuid_valid(o.pairs[i].from) || !gcr_uuid_valid(o.pairs[i].to))
			abort();
}

static void check_record(json_t *j)
{
	struct agent_record r, r2;
	struct gcr_err err = { 0, "" };
	if (agent_record_decode(j, &r, &err) != 0) {
		agent_record_clear(&r);
		return;
	}
	if (r.n < 0 || r.n > AGENT_RECORD_MAX_PROCS || (unsigned)r.state >= AGENT_REC_NSTATES)
		abort();
	check_str(r.uid, sizeof(r.uid), 0);
	check_str(r.pod_uid, sizeof(r.pod_uid), 0);
	check_str(r.rs_uid, sizeof(r.rs_uid), 1);
	for (int i = 0; i < r.n; i++)
		if (r.p[i].pid < 1)
			abort();
	json_t *again = agent_record_encode(&r);
	if (again == NULL || agent_record_decode(again, &r2, &err) != 0 || memcmp(r.p, r2.p, sizeof(r.p)) != 0 ||
	    r.n != r2.n || r.state != r2.state || strcmp(r.uid, r2.uid) != 0 || strcmp(r.pod_uid, r2.pod_uid) != 0)
		abort();
	if ((r.ck_status || r2.ck_status) && !json_equal(r.ck_status, r2.ck_status))
		abort();
	agent_record_clear(&r2);
	json_decref(again);
	agent_record_clear(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
	if (j == NULL)
		return 0;
	check_obj(j, AGENT_CROBJ_CHECKPOINT);
	check_obj(j, AGENT_CROBJ_RESTORE);
	check_record(j);
	json_decref(j);
	return 0;
}
