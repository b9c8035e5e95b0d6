/* agent_scalemsg: the scaler's parsers and encoders of outside input: a LabelSelector
 * to its string and query forms, and the activity note node agents put on their Lease. */
#include "agent_scalemsg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Version of the activity note's layout. */
#define ACTIVITY_V 1

/* A label key: optional DNS-subdomain prefix and '/', then a name of at most 63
 * characters, alphanumeric at both ends, '-', '_', '.' inside. */
static int key_ok(const char *k)
{
	if (k == NULL || k[0] == '\0' || strlen(k) > 317)
		return 0;
	const char *name = strrchr(k, '/');
	if (name != NULL) {
		if (name == k || name - k > 253)
			return 0;
		for (const char *p = k; p < name; p++)
			if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
				return 0;
		name++;
	} else {
		name = k;
	}
	size_t n = strlen(name);
	if (n == 0 || n > 63)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = name[i];
		int alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
		if (!alnum && ((i == 0 || i == n - 1) || (ch != '-' && ch != '_' && ch != '.')))
			return 0;
	}
	return 1;
}

/* A label value: empty, or at most 63 characters as a key's name part. */
static int value_ok(const char *v)
{
	if (v == NULL)
		return 0;
	if (v[0] == '\0')
		return 1;
	return strchr(v, '/') == NULL && key_ok(v);
}

/* Appends fmt's output to out at *pos; -ENAMETOOLONG when it does not fit. */
static int put(char *out, size_t len, size_t *pos, const char *a, const char *b, const char *c)
{
	int n = snprintf(out + *pos, len - *pos, "%s%s%s", a, b ? b : "", c ? c : "");
	if (n < 0 || (size_t)n >= len - *pos)
		return -ENAMETOOLONG;
	*pos += (size_t)n;
	return 0;
}

int agent_scalemsg_selector(json_t *sel, char *out, size_t len, struct gcr_err *err)
{
	size_t pos = 0;
	int terms = 0;
	if (len == 0)
		return gcr_err_set(err, -EINVAL, "no room for the selector");
	out[0] = '\0';
	if (!json_is_object(sel))
		return gcr_err_set(err, -EINVAL, "selector is not an object");
	json_t *ml = json_object_get(sel, "matchLabels"), *me = json_object_get(sel, "matchExpressions");
	if ((ml != NULL && !json_is_object(ml) && !json_is_null(ml)) ||
	    (me != NULL && !json_is_array(me) && !json_is_null(me)))
		return gcr_err_set(err, -EINVAL, "matchLabels must be an object and matchExpressions an array");
	const char *k;
	json_t *v;
	json_object_foreach(ml, k, v)
	{
		const char *s = json_string_value(v);
		if (!key_ok(k) || !value_ok(s))
			return gcr_err_set(err, -EINVAL, "matchLabels: '%.64s' is not a label key and value", k);
		if (put(out, len, &pos, terms ? "," : "", k, "=") < 0 || put(out, len, &pos, s, NULL, NULL) < 0)
			return gcr_err_set(err, -ENAMETOOLONG, "selector longer than %zu bytes", len - 1);
		terms++;
	}
	size_t i;
	json_t *e;
	json_array_foreach(me, i, e)
	{
		const char *key = json_string_value(json_object_get(e, "key"));
		const char *op = json_string_value(json_object_get(e, "operator"));
		json_t *vals = json_object_get(e, "values");
		size_t nv = json_is_array(vals) ? json_array_size(vals) : 0;
		if (!key_ok(key) || op == NULL)
			return gcr_err_set(err, -EINVAL, "matchExpressions[%zu]: bad key or no operator", i);
		int set = strcmp(op, "In") == 0 || strcmp(op, "NotIn") == 0;
		if (!set && strcmp(op, "Exists") != 0 && strcmp(op, "DoesNotExist") != 0)
			return gcr_err_set(err, -EINVAL, "matchExpressions[%zu]: unknown operator '%.32s'", i, op);
		if (set != (nv > 0) || (vals != NULL && !json_is_array(vals) && !json_is_null(vals)))
			return gcr_err_set(err, -EINVAL, "matchExpressions[%zu]: In and NotIn need values, "
					   "Exists and DoesNotExist take none", i);
		int rc = put(out, len, &pos, terms ? "," : "", strcmp(op, "DoesNotExist") == 0 ? "!" : "", key);
		if (rc == 0 && set)
			rc = put(out, len, &pos, strcmp(op, "In") == 0 ? " in (" : " notin (", NULL, NULL);
		for (size_t j = 0; rc == 0 && j < nv; j++) {
			const char *s = json_string_value(json_array_get(vals, j));
			if (!value_ok(s))
				return gcr_err_set(err, -EINVAL, "matchExpressions[%zu]: value %zu is not a label value", i, j);
			rc = put(out, len, &pos, j ? "," : "", s, NULL);
		}
		if (rc == 0 && set)
			rc = put(out, len, &pos, ")", NULL, NULL);
		if (rc < 0)
			return gcr_err_set(err, -ENAMETOOLONG, "selector longer than %zu bytes", len - 1);
		terms++;
	}
	if (terms == 0)
		return gcr_err_set(err, -EINVAL, "the selector is empty: it would pick every pod of the namespace");
	return 0;
}

/* Whether v is one of the strings of the array vals. */
static int in_values(json_t *vals, const char *v)
{
	size_t i;
	json_t *x;
	json_array_foreach(vals, i, x)
	{
		if (json_is_string(x) && strcmp(json_string_value(x), v) == 0)
			return 1;
	}
	return 0;
}

int agent_scalemsg_selector_match(json_t *sel, json_t *labels, struct gcr_err *err)
{
	/* The same checks as the string form, so both readings agree on what is a selector. */
	char buf[AGENT_SCALEMSG_SELECTOR_MAX];
	int rc = agent_scalemsg_selector(sel, buf, sizeof(buf), err);
	if (rc < 0)
		return rc;
	const char *k;
	json_t *v;
	json_object_foreach(json_object_get(sel, "matchLabels"), k, v)
	{
		const char *have = json_string_value(json_object_get(labels, k));
		if (have == NULL || strcmp(have, json_string_value(v)) != 0)
			return 0;
	}
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(sel, "matchExpressions"), i, e)
	{
		const char *op = json_string_value(json_object_get(e, "operator"));
		const char *have = json_string_value(json_object_get(labels, json_string_value(json_object_get(e, "key"))));
		json_t *vals = json_object_get(e, "values");
		int ok;
		if (strcmp(op, "In") == 0)
			ok = have != NULL && in_values(vals, have);
		else if (strcmp(op, "NotIn") == 0)
			ok = have == NULL || !in_values(vals, have);
		else if (strcmp(op, "Exists") == 0)
			ok = have != NULL;
		else
			ok = have == NULL;
		if (!ok)
			return 0;
	}
	return 1;
}

int agent_scalemsg_query_escape(const char *s, char *out, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			    ch == '-' || ch == '_' || ch == '.' || ch == '~';
		if (o + (plain ? 1 : 3) >= len)
			return -ENAMETOOLONG;
		if (plain) {
			out[o++] = (char)ch;
		} else {
			out[o++] = '%';
			out[o++] = hex[ch >> 4];
			out[o++] = hex[ch & 15];
		}
	}
	if (o >= len)
		return -ENAMETOOLONG;
	out[o] = '\0';
	return 0;
}

/* The entry e's "s" (state name -> process count) and the note's "at" into out. Optional
 * (older agents send neither), but strict when there: only known names, counts in
 * 1 .. AGENT_SCALEMSG_PROCS_MAX, "at" a time. */
static int states_of(json_t *note, json_t *e, const char *pod_uid, struct agent_scalemsg_activity *out,
		     struct gcr_err *err)
{
	json_t *s = json_object_get(e, "s"), *at = json_object_get(note, "at");
	if (s == NULL)
		return 0;
	double t = json_number_value(at);
	if (!json_is_object(s) || !json_is_number(at) || !isfinite(t) || t <= 0)
		return gcr_err_set(err, -EINVAL, "activity note: states of %.64s without a sample time", pod_uid);
	const char *k;
	json_t *v;
	json_object_foreach(s, k, v)
	{
		enum gcr_shimreply_st st = gcr_shimreply_st_of(k);
		json_int_t n = json_integer_value(v);
		if ((st == GCR_SHIMREPLY_ST_UNKNOWN && strcmp(k, gcr_shimreply_st_name(st)) != 0) ||
		    !json_is_integer(v) || n < 1 || n > AGENT_SCALEMSG_PROCS_MAX) {
			memset(out->procs, 0, sizeof(out->procs));
			return gcr_err_set(err, -EINVAL, "activity note: bad state count for %.64s", pod_uid);
		}
		out->procs[st] = (int)n;
	}
	out->have_states = 1;
	out->sampled = t;
	return 0;
}

int agent_scalemsg_activity_find(const char *text, size_t len, const char *pod_uid,
				 struct agent_scalemsg_activity *out, struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	if (len > AGENT_SCALEMSG_ACTIVITY_MAX)
		return gcr_err_set(err, -EINVAL, "activity note of %zu bytes is too long", len);
	json_error_t je;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	int rc = 0;
	json_t *pods = json_object_get(j, "pods");
	if (!json_is_object(j) || json_integer_value(json_object_get(j, "v")) != ACTIVITY_V || !json_is_object(pods)) {
		rc = gcr_err_set(err, -EINVAL, "activity note: not a version %d note", ACTIVITY_V);
		goto out;
	}
	json_t *e = pod_uid ? json_object_get(pods, pod_uid) : NULL;
	if (e == NULL) {
		rc = -ENOENT;
		goto out;
	}
	json_t *t = json_object_get(e, "t"), *c = json_object_get(e, "c");
	double tv = json_number_value(t);
	if (!json_is_object(e) || !json_is_number(t) || !json_is_integer(c) || !isfinite(tv) || tv < 0 ||
	    json_integer_value(c) < 0) {
		rc = gcr_err_set(err, -EINVAL, "activity note: bad entry for %.64s", pod_uid);
		goto out;
	}
	out->last_active = tv;
	out->calls = (long long)json_integer_value(c);
	rc = states_of(j, e, pod_uid, out, err);
out:
	json_decref(j);
	return rc;
}

int agent_scalemsg_activity_add(json_t *note, const char *pod_uid, const struct agent_scalemsg_activity *a)
{
	json_t *pods = json_object_get(note, "pods");
	if (pods == NULL) {
		json_object_set_new(note, "v", json_integer(ACTIVITY_V));
		pods = json_object();
		if (json_object_set_new(note, "pods", pods) < 0)
			return -ENOMEM;
	}
	json_t *e = json_pack("{s:f, s:I}", "t", a->last_active, "c", (json_int_t)a->calls);
	if (e != NULL && a->have_states) {
		json_t *s = json_object();
		for (int i = 0; s != NULL && i < GCR_SHIMREPLY_ST_N; i++)
			if (a->procs[i] > 0)
				json_object_set_new(s, gcr_shimreply_st_name((enum gcr_shimreply_st)i),
						    json_integer(a->procs[i]));
		if (s == NULL || json_object_set_new(e, "s", s) < 0 ||
		    json_object_set_new(note, "at", json_real(a->sampled)) < 0) {
			json_decref(e);
			return -ENOMEM;
		}
	}
	return e != NULL && json_object_set_new(pods, pod_uid, e) == 0 ? 0 : -ENOMEM;
}

char *agent_scalemsg_activity_text(json_t *note)
{
	if (json_object_get(note, "pods") == NULL) {
		json_object_set_new(note, "v", json_integer(ACTIVITY_V));
		json_object_set_new(note, "pods", json_object());
	}
	return json_dumps(note, JSON_COMPACT | JSON_SORT_KEYS);
}
