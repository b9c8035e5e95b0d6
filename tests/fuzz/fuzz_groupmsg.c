/* fuzz_groupmsg: arbitrary bytes as a group operation's message (a member's reply, or the
 * coordinator's arguments) through every gcr_groupmsg decoder, and through the shim reply reader
 * of "comms"; aborts when a decoder accepts what its contract forbids or what it accepts does not
 * encode and decode to itself. */
#include "gcr_groupmsg.h"
#include "gcr_shimreply.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct gcr_group_comms comms, comms2;
static struct gcr_group_targets targets, targets2;
static struct gcr_group_ids ids, ids2;
static struct gcr_group_keys keys, keys2;

static void check_rc(int rc, size_t n, const struct gcr_err *err)
{
	if (rc != 0 && rc != -EBADMSG)
		abort();
	if (rc != 0 && (n != 0 || err->code != rc || err->msg[0] == '\0'))
		abort();
	if (n > GCR_GROUP_MAX_COMMS)
		abort();
}

static void check_comms(const struct gcr_group_comms *c)
{
	for (size_t i = 0; i < c->n; i++) {
		const struct gcr_group_comm *m = &c->c[i];
		if (m->key == 0 || m->nranks < 1 || m->nranks > GCR_GROUP_MAX_RANKS || m->rank < 0 || m->rank >= m->nranks ||
		    m->count < 0 || m->count >= GCR_GROUP_COUNT_MAX || m->device < -1 || m->device > GCR_GROUP_MAX_DEVICE ||
		    (unsigned)m->state >= GCR_GROUP_COMM_NSTATES || (unsigned)m->how >= GCR_GROUP_HOW_N ||
		    (m->how == GCR_GROUP_HOW_SPLIT) != (m->parent != 0))
			abort();
		for (size_t q = 0; q < i; q++)
			if (c->c[q].key == m->key && (c->c[q].rank == m->rank || c->c[q].nranks != m->nranks))
				abort();
	}
}

static void check_all(json_t *j)
{
	struct gcr_err err = { 0, "" };
	int rc = gcr_groupmsg_comms(j, &comms, &err);
	check_rc(rc, comms.n, &err);
	if (rc == 0) {
		check_comms(&comms);
		json_t *e = gcr_groupmsg_comms_json(&comms);
		if (e == NULL || gcr_groupmsg_comms(e, &comms2, &err) != 0 || comms2.n != comms.n ||
		    memcmp(comms.c, comms2.c, comms.n * sizeof(comms.c[0])) != 0)
			abort();
		json_decref(e);
	}
	rc = gcr_groupmsg_targets(j, &targets, &err);
	check_rc(rc, targets.n, &err);
	if (rc == 0) {
		json_t *e = gcr_groupmsg_targets_json(&targets);
		if (e == NULL || gcr_groupmsg_targets(e, &targets2, &err) != 0 || targets2.n != targets.n ||
		    memcmp(targets.t, targets2.t, targets.n * sizeof(targets.t[0])) != 0)
			abort();
		json_decref(e);
	}
	rc = gcr_groupmsg_ids(j, &ids, &err);
	check_rc(rc, ids.n, &err);
	if (rc == 0) {
		json_t *e = gcr_groupmsg_ids_json(&ids);
		if (e == NULL || gcr_groupmsg_ids(e, &ids2, &err) != 0 || ids2.n != ids.n ||
		    memcmp(ids.v, ids2.v, ids.n * sizeof(ids.v[0])) != 0)
			abort();
		json_decref(e);
	}
	rc = gcr_groupmsg_keys(j, &keys, &err);
	check_rc(rc, keys.n, &err);
	for (size_t i = 0; rc == 0 && i < keys.n; i++)
		if (keys.key[i] == 0)
			abort();
	long long v = -1;
	rc = gcr_groupmsg_int(j, "timeout_ms", 1, GCR_GROUP_MAX_MS, 5, &v, &err);
	if ((rc != 0 && rc != -EBADMSG) || (rc == 0 && (v < 1 || v > GCR_GROUP_MAX_MS)))
		abort();
	/* A status or reply object carrying "comms". */
	rc = gcr_shimreply_comms(j, &comms, &err);
	if (rc != 0 && rc != -ENOENT && rc != -EPROTO)
		abort();
	if (rc == 0)
		check_comms(&comms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t e;
	json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &e);
	if (j == NULL)
		return 0;
	check_all(j);
	json_decref(j);
	return 0;
}
