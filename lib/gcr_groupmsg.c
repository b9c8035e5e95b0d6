/* gcr_groupmsg: encoding and strict decoding of the group operations' lists. A decoder refuses
 * the whole message at the first bad field, so a half-read list never reaches a drain target or
 * an ncclCommInitRank. */
#include "gcr_groupmsg.h"

#include <errno.h>
#include <string.h>

static const char *const state_names[GCR_GROUP_COMM_NSTATES] = { "live", "down", "failed" };
static const char *const how_names[GCR_GROUP_HOW_N] = { "init", "split", "local" };

const char *gcr_groupmsg_state_name(enum gcr_group_comm_state s)
{
	return (unsigned)s < GCR_GROUP_COMM_NSTATES ? state_names[s] : "unknown";
}

const char *gcr_groupmsg_how_name(enum gcr_group_how h)
{
	return (unsigned)h < GCR_GROUP_HOW_N ? how_names[h] : "unknown";
}

static const char hexdig[] = "0123456789abcdef";

void gcr_groupmsg_key_fmt(uint64_t key, char *out)
{
	for (int i = 0; i < 16; i++)
		out[i] = hexdig[(key >> (60 - 4 * i)) & 0xf];
	out[16] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int gcr_groupmsg_key_parse(const char *s, size_t len, uint64_t *key)
{
	uint64_t k = 0;
	*key = 0;
	if (s == NULL || len != 16)
		return -EINVAL;
	for (size_t i = 0; i < 16; i++) {
		int v = hexval(s[i]);
		if (v < 0)
			return -EINVAL;
		k = k << 4 | (uint64_t)v;
	}
	if (k == 0)
		return -EINVAL;
	*key = k;
	return 0;
}

static json_t *key_json(uint64_t key)
{
	char buf[GCR_GROUP_KEY_LEN];
	gcr_groupmsg_key_fmt(key, buf);
	return json_string(buf);
}

/* ---- encoders ---- */

json_t *gcr_groupmsg_comms_json(const struct gcr_group_comms *c)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr != NULL && i < c->n; i++) {
		const struct gcr_group_comm *m = &c->c[i];
		json_t *o = json_pack("{s:o, s:i, s:i, s:I, s:i, s:s, s:s}", "key", key_json(m->key), "rank", m->rank,
				      "nranks", m->nranks, "count", (json_int_t)m->count, "device", m->device, "state",
				      gcr_groupmsg_state_name(m->state), "how", gcr_groupmsg_how_name(m->how));
		if (o != NULL && m->how == GCR_GROUP_HOW_SPLIT)
			json_object_set_new(o, "parent", key_json(m->parent));
		if (o == NULL || json_array_append_new(arr, o) < 0) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

json_t *gcr_groupmsg_targets_json(const struct gcr_group_targets *t)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr != NULL && i < t->n; i++)
		if (json_array_append_new(arr, json_pack("{s:o, s:I}", "key", key_json(t->t[i].key), "count",
							 (json_int_t)t->t[i].count)) < 0) {
			json_decref(arr);
			return NULL;
		}
	return arr;
}

json_t *gcr_groupmsg_ids_json(const struct gcr_group_ids *ids)
{
	json_t *arr = json_array();
	char hex[2 * GCR_GROUP_ID_BYTES + 1];
	for (size_t i = 0; arr != NULL && i < ids->n; i++) {
		for (size_t b = 0; b < GCR_GROUP_ID_BYTES; b++) {
			hex[2 * b] = hexdig[ids->v[i].id[b] >> 4];
			hex[2 * b + 1] = hexdig[ids->v[i].id[b] & 0xf];
		}
		hex[2 * GCR_GROUP_ID_BYTES] = '\0';
		if (json_array_append_new(arr, json_pack("{s:o, s:s}", "key", key_json(ids->v[i].key), "id", hex)) < 0) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

json_t *gcr_groupmsg_keys_json(const struct gcr_group_keys *k)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr != NULL && i < k->n; i++)
		if (json_array_append_new(arr, key_json(k->key[i])) < 0) {
			json_decref(arr);
			return NULL;
		}
	return arr;
}

/* ---- decoders ---- */

static int list_of(json_t *arr, const char *what, struct gcr_err *err)
{
	if (!json_is_array(arr))
		return gcr_err_set(err, -EBADMSG, "\"%s\" must be an array", what);
	if (json_array_size(arr) > GCR_GROUP_MAX_COMMS)
		return gcr_err_set(err, -EBADMSG, "\"%s\" has %zu entries, at most %d", what, json_array_size(arr),
				   GCR_GROUP_MAX_COMMS);
	return 0;
}

static int key_of(json_t *v, const char *what, size_t i, uint64_t *key, struct gcr_err *err)
{
	if (!json_is_string(v) || gcr_groupmsg_key_parse(json_string_value(v), json_string_length(v), key) < 0)
		return gcr_err_set(err, -EBADMSG, "%s %zu: a key must be 16 lowercase hex digits, not 0", what, i);
	return 0;
}

static int int_of(json_t *o, const char *key, long long lo, long long hi, const char *what, size_t i,
		  long long *out, struct gcr_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return gcr_err_set(err, -EBADMSG, "%s %zu: \"%s\" must be an integer in %lld .. %lld", what, i, key, lo,
				   hi);
	*out = json_integer_value(v);
	return 0;
}

static int name_of(json_t *o, const char *key, const char *const *names, int n, const char *what, size_t i,
		   int *out, struct gcr_err *err)
{
	json_t *v = json_object_get(o, key);
	const char *s = json_string_value(v);
	for (int k = 0; s != NULL && k < n; k++)
		if (strlen(names[k]) == json_string_length(v) && strcmp(s, names[k]) == 0) {
			*out = k;
			return 0;
		}
	return gcr_err_set(err, -EBADMSG, "%s %zu: \"%s\" is not one of the names it may have", what, i, key);
}

/* Whether key is among the first n of keys (a key twice is refused). */
static int seen(const uint64_t *keys, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		if (keys[i] == key)
			return 1;
	return 0;
}

int gcr_groupmsg_comms(json_t *arr, struct gcr_group_comms *out, struct gcr_err *err)
{
	out->n = 0;
	int rc = list_of(arr, "comms", err);
	size_t i;
	json_t *o;
	if (rc < 0)
		return rc;
	json_array_foreach(arr, i, o) {
		struct gcr_group_comm *m = &out->c[i];
		long long v;
		int e;
		memset(m, 0, sizeof(*m));
		if (!json_is_object(o))
			rc = gcr_err_set(err, -EBADMSG, "communicator %zu is not an object", i);
		if (rc == 0)
			rc = key_of(json_object_get(o, "key"), "communicator", i, &m->key, err);
		if (rc == 0 && (rc = int_of(o, "nranks", 1, GCR_GROUP_MAX_RANKS, "communicator", i, &v, err)) == 0)
			m->nranks = (int)v;
		if (rc == 0 && (rc = int_of(o, "rank", 0, m->nranks - 1, "communicator", i, &v, err)) == 0)
			m->rank = (int)v;
		/* One process may hold several ranks of a communicator (ncclCommInitAll), each once. */
		for (size_t q = 0; rc == 0 && q < i; q++)
			if (out->c[q].key == m->key && (out->c[q].rank == m->rank || out->c[q].nranks != m->nranks))
				rc = gcr_err_set(err, -EBADMSG, "communicator %zu: the same key and rank given twice, or "
						 "two sizes", i);
		if (rc == 0 && (rc = int_of(o, "count", 0, GCR_GROUP_COUNT_MAX - 1, "communicator", i, &v, err)) == 0)
			m->count = v;
		if (rc == 0 && (rc = int_of(o, "device", -1, GCR_GROUP_MAX_DEVICE, "communicator", i, &v, err)) == 0)
			m->device = (int)v;
		if (rc == 0 && (rc = name_of(o, "state", state_names, GCR_GROUP_COMM_NSTATES, "communicator", i, &e,
					     err)) == 0)
			m->state = (enum gcr_group_comm_state)e;
		if (rc == 0 && (rc = name_of(o, "how", how_names, GCR_GROUP_HOW_N, "communicator", i, &e, err)) == 0)
			m->how = (enum gcr_group_how)e;
		json_t *parent = json_object_get(o, "parent");
		if (rc == 0 && m->how == GCR_GROUP_HOW_SPLIT)
			rc = key_of(parent, "communicator", i, &m->parent, err);
		else if (rc == 0 && parent != NULL)
			rc = gcr_err_set(err, -EBADMSG, "communicator %zu: \"parent\" on a communicator not split", i);
		if (rc < 0)
			break;
	}
	out->n = rc == 0 ? json_array_size(arr) : 0;
	return rc;
}

int gcr_groupmsg_targets(json_t *arr, struct gcr_group_targets *out, struct gcr_err *err)
{
	uint64_t keys[GCR_GROUP_MAX_COMMS];
	out->n = 0;
	int rc = list_of(arr, "targets", err);
	size_t i;
	json_t *o;
	if (rc < 0)
		return rc;
	json_array_foreach(arr, i, o) {
		long long v = 0;
		if (!json_is_object(o))
			rc = gcr_err_set(err, -EBADMSG, "target %zu is not an object", i);
		if (rc == 0)
			rc = key_of(json_object_get(o, "key"), "target", i, &out->t[i].key, err);
		if (rc == 0 && seen(keys, i, out->t[i].key))
			rc = gcr_err_set(err, -EBADMSG, "target %zu: key given twice", i);
		keys[i] = out->t[i].key;
		if (rc == 0)
			rc = int_of(o, "count", 0, GCR_GROUP_COUNT_MAX - 1, "target", i, &v, err);
		out->t[i].count = v;
		if (rc < 0)
			break;
	}
	out->n = rc == 0 ? json_array_size(arr) : 0;
	return rc;
}

int gcr_groupmsg_ids(json_t *arr, struct gcr_group_ids *out, struct gcr_err *err)
{
	uint64_t keys[GCR_GROUP_MAX_COMMS];
	out->n = 0;
	int rc = list_of(arr, "ids", err);
	size_t i;
	json_t *o;
	if (rc < 0)
		return rc;
	json_array_foreach(arr, i, o) {
		struct gcr_group_id *m = &out->v[i];
		if (!json_is_object(o))
			rc = gcr_err_set(err, -EBADMSG, "id %zu is not an object", i);
		if (rc == 0)
			rc = key_of(json_object_get(o, "key"), "id", i, &m->key, err);
		if (rc == 0 && seen(keys, i, m->key))
			rc = gcr_err_set(err, -EBADMSG, "id %zu: key given twice", i);
		keys[i] = m->key;
		json_t *v = json_object_get(o, "id");
		const char *s = json_string_value(v);
		if (rc == 0 && (s == NULL || json_string_length(v) != 2 * GCR_GROUP_ID_BYTES))
			rc = gcr_err_set(err, -EBADMSG, "id %zu: \"id\" must be %d hex digits", i, 2 * GCR_GROUP_ID_BYTES);
		for (size_t b = 0; rc == 0 && b < GCR_GROUP_ID_BYTES; b++) {
			int hi = hexval(s[2 * b]), lo = hexval(s[2 * b + 1]);
			if (hi < 0 || lo < 0)
				rc = gcr_err_set(err, -EBADMSG, "id %zu: \"id\" must be lowercase hex digits", i);
			else
				m->id[b] = (unsigned char)(hi << 4 | lo);
		}
		if (rc < 0)
			break;
	}
	out->n = rc == 0 ? json_array_size(arr) : 0;
	return rc;
}

int gcr_groupmsg_keys(json_t *arr, struct gcr_group_keys *out, struct gcr_err *err)
{
	out->n = 0;
	int rc = list_of(arr, "keys", err);
	size_t i;
	json_t *v;
	if (rc < 0)
		return rc;
	json_array_foreach(arr, i, v) {
		rc = key_of(v, "key", i, &out->key[i], err);
		if (rc == 0 && seen(out->key, i, out->key[i]))
			rc = gcr_err_set(err, -EBADMSG, "key %zu given twice", i);
		if (rc < 0)
			break;
	}
	out->n = rc == 0 ? json_array_size(arr) : 0;
	return rc;
}

int gcr_groupmsg_int(json_t *args, const char *key, long long lo, long long hi, long long def, long long *out,
		     struct gcr_err *err)
{
	json_t *v = json_object_get(args, key);
	*out = def;
	if (v == NULL)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return gcr_err_set(err, -EBADMSG, "\"%s\" must be an integer in %lld .. %lld", key, lo, hi);
	*out = json_integer_value(v);
	return 0;
}
