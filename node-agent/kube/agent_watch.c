/* agent_watch: splits a watch stream into lines, decodes each with jansson and
 * hands object events to the caller; tracks resourceVersion, spots 410 Gone. */
#include "agent_watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* First allocation for a partial line; grows by doubling up to max_line. */
#define BUF_MIN 4096
/* A buffer grown past this by one big event is dropped afterwards, so one
 * large object does not pin megabytes for the life of the watch. */
#define BUF_KEEP (256 * 1024)
/* Longest piece of a server message quoted in an error, in bytes. */
#define QUOTE_MAX 160

struct agent_watch {
	agent_watch_cb cb;
	void *data;
	size_t max_line;
	char *buf; /* the partial line carried between feeds */
	size_t len, cap;
	int failed;            /* sticky result once the stream is over */
	struct gcr_err status; /* its message, repeated on later calls */
	unsigned long lines;
	char rv[AGENT_WATCH_RV_MAX + 1];
};

static const struct {
	const char *name;
	int type; /* 0 for ERROR */
} event_types[] = {
	{ "ADDED", AGENT_WATCH_ADDED },
	{ "MODIFIED", AGENT_WATCH_MODIFIED },
	{ "DELETED", AGENT_WATCH_DELETED },
	{ "BOOKMARK", AGENT_WATCH_BOOKMARK },
	{ "ERROR", 0 },
};

struct agent_watch *agent_watch_new(size_t max_line, agent_watch_cb cb, void *data)
{
	struct agent_watch *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return NULL;
	w->cb = cb;
	w->data = data;
	w->max_line = max_line ? max_line : AGENT_WATCH_MAX_LINE_DEFAULT;
	return w;
}

void agent_watch_free(struct agent_watch *w)
{
	if (w == NULL)
		return;
	free(w->buf);
	free(w);
}

void agent_watch_reset(struct agent_watch *w)
{
	if (w == NULL)
		return;
	w->len = 0;
	w->failed = 0;
	gcr_err_clear(&w->status);
	if (w->cap > BUF_KEEP) {
		free(w->buf);
		w->buf = NULL;
		w->cap = 0;
	}
}

const char *agent_watch_resource_version(const struct agent_watch *w)
{
	return w ? w->rv : "";
}

int agent_watch_set_resource_version(struct agent_watch *w, const char *rv)
{
	if (rv == NULL)
		rv = "";
	if (w == NULL || strlen(rv) > AGENT_WATCH_RV_MAX)
		return -EINVAL;
	strcpy(w->rv, rv);
	return 0;
}

unsigned long agent_watch_lines(const struct agent_watch *w)
{
	return w ? w->lines : 0;
}

/* Server text quoted in messages may hold newlines; messages stay one line. */
static void one_line(struct gcr_err *e)
{
	for (char *c = e->msg; *c != '\0'; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
}

static const char *str_or(json_t *j, const char *dflt)
{
	const char *s = json_string_value(j);
	return s ? s : dflt;
}

/* An ERROR event carries a metav1.Status; 410 means our resourceVersion was
 * compacted away and only a relist can recover. */
static int status_error(struct agent_watch *w, json_t *status)
{
	json_t *code = json_object_get(status, "code");
	const char *reason = str_or(json_object_get(status, "reason"), "");
	const char *message = str_or(json_object_get(status, "message"), "");
	long long c = json_is_integer(code) ? (long long)json_integer_value(code) : 0;

	if (c == 410 || strcmp(reason, "Expired") == 0 || strcmp(reason, "Gone") == 0)
		return gcr_err_set(&w->status, -ESTALE, "line %lu: watch expired (%lld %.32s), relist: %.*s",
				   w->lines, c, reason, QUOTE_MAX, message);
	return gcr_err_set(&w->status, -EIO, "line %lu: watch ERROR status %lld %.32s: %.*s", w->lines, c,
			   reason, QUOTE_MAX, message[0] ? message : "(no message)");
}

static int decode_line(struct agent_watch *w, const char *line, size_t n)
{
	json_error_t jerr;
	json_t *root = NULL;
	int rc = 0, type = -1;

	w->lines++;
	/* json.Encoder ends each event with '\n'; proxies may add '\r' or blank lines. */
	while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
		n--;
	size_t lead = 0;
	while (lead < n && (line[lead] == ' ' || line[lead] == '\t' || line[lead] == '\r'))
		lead++;
	if (lead == n)
		return 0;

	/* Duplicate keys would make "which type?" ambiguous; NULs in strings
	 * would cut the C strings we hand out. Both are refused by jansson. */
	root = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL) {
		rc = gcr_err_set(&w->status, -EPROTO, "line %lu: invalid JSON at column %d: %s", w->lines,
				 jerr.column, jerr.text);
		goto out;
	}
	const char *tname = json_string_value(json_object_get(root, "type"));
	json_t *object = json_object_get(root, "object");
	if (!json_is_object(root) || tname == NULL) {
		rc = gcr_err_set(&w->status, -EPROTO, "line %lu: not a watch event (no \"type\")", w->lines);
		goto out;
	}
	for (size_t i = 0; i < sizeof(event_types) / sizeof(event_types[0]); i++)
		if (strcmp(tname, event_types[i].name) == 0)
			type = event_types[i].type;
	if (type < 0) {
		rc = gcr_err_set(&w->status, -EPROTO, "line %lu: unknown watch event type '%.32s'", w->lines,
				 tname);
		goto out;
	}
	if (!json_is_object(object)) {
		rc = gcr_err_set(&w->status, -EPROTO, "line %lu: %s event without an \"object\"", w->lines, tname);
		goto out;
	}
	if (type == 0) {
		rc = status_error(w, object);
		goto out;
	}

	json_t *rvj = json_object_get(json_object_get(object, "metadata"), "resourceVersion");
	const char *rv = json_string_value(rvj);
	size_t rvlen = rv ? json_string_length(rvj) : 0;
	/* Without a version we could not resume after this event. */
	if (rv == NULL || rvlen == 0 || rvlen > AGENT_WATCH_RV_MAX) {
		rc = gcr_err_set(&w->status, -EPROTO, "line %lu: %s event without a valid metadata.resourceVersion",
				 w->lines, tname);
		goto out;
	}
	if (w->cb != NULL) {
		struct agent_watch_event ev = { (enum agent_watch_type)type, object, rv };
		gcr_err_clear(&w->status);
		rc = w->cb(&ev, w->data, &w->status);
		if (rc < 0) {
			if (w->status.code == 0)
				gcr_err_set(&w->status, rc, "watch callback stopped the stream (%d)", rc);
			w->status.code = rc;
			goto out;
		}
		rc = 0;
	}
	memcpy(w->rv, rv, rvlen + 1);
out:
	json_decref(root);
	return rc;
}

/* Ends the stream with rc; the message stays for later calls. */
static int fail(struct agent_watch *w, int rc, struct gcr_err *err)
{
	w->failed = rc;
	w->status.code = rc;
	one_line(&w->status);
	w->len = 0;
	if (err != NULL)
		*err = w->status;
	return rc;
}

static int append(struct agent_watch *w, const char *p, size_t n)
{
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : BUF_MIN;
		while (cap < w->len + n)
			cap *= 2;
		if (cap > w->max_line)
			cap = w->max_line;
		char *b = realloc(w->buf, cap);
		if (b == NULL)
			return gcr_err_set(&w->status, -ENOMEM, "out of memory for a %zu-byte watch line",
					   w->len + n);
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	return 0;
}

static int too_long(struct agent_watch *w)
{
	return gcr_err_set(&w->status, -EMSGSIZE, "line %lu: watch event longer than %zu bytes",
			   w->lines + 1, w->max_line);
}

int agent_watch_feed(struct agent_watch *w, const void *data, size_t len, struct gcr_err *err)
{
	const char *p = data;
	int rc;

	if (w == NULL)
		return gcr_err_set(err, -EINVAL, "no watch decoder");
	if (w->failed)
		return fail(w, w->failed, err);
	while (len > 0) {
		const char *nl = memchr(p, '\n', len);
		size_t seg = nl ? (size_t)(nl - p) : len;
		if (w->len + seg > w->max_line)
			return fail(w, too_long(w), err);
		if (nl == NULL) {
			rc = append(w, p, seg);
			if (rc < 0)
				return fail(w, rc, err);
			break;
		}
		if (w->len == 0) {
			/* The common case: a whole line inside this chunk, no copy. */
			rc = decode_line(w, p, seg);
		} else {
			rc = append(w, p, seg);
			if (rc == 0)
				rc = decode_line(w, w->buf, w->len);
			w->len = 0;
			if (w->cap > BUF_KEEP) {
				free(w->buf);
				w->buf = NULL;
				w->cap = 0;
			}
		}
		if (rc < 0)
			return fail(w, rc, err);
		p += seg + 1;
		len -= seg + 1;
	}
	return 0;
}

int agent_watch_finish(struct agent_watch *w, struct gcr_err *err)
{
	if (w == NULL)
		return gcr_err_set(err, -EINVAL, "no watch decoder");
	if (w->failed)
		return fail(w, w->failed, err);
	if (w->len == 0)
		return 0;
	int rc = decode_line(w, w->buf, w->len);
	w->len = 0;
	return rc < 0 ? fail(w, rc, err) : 0;
}
