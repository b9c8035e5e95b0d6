/* agent_share: per-owner counts of each shared table, refusals past an owner's share, and the
 * thread that tells them as Events (agent_share.h: the rule). One lock for every table: a take
 * or a give is a short scan of the table's owners, so the registry's, the holds' and the
 * controller's threads never wait on one another for long. */
#include "agent_share.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcr_log.h"
#include "gcr_time.h"

/* Owners remembered beyond those holding entries: the recently told, so that their next
 * refusal within AGENT_SHARE_TELL_MS is not told again. */
#define OWNER_SLACK 64
#define MAX_TABLES 16

struct owner {
	char key[AGENT_SHARE_OWNER_MAX + 1];
	int used;
	unsigned long long since_told; /* refusals not told yet */
	double told;                   /* monotonic ms of the last tell; 0: never */
};

struct agent_share {
	struct agent_shares *ss;
	char name[32], what[64], kind[16];
	int capacity, per_owner, tell;
	int in_use;
	unsigned long long refused;
	int nowners;
	struct owner *owners; /* capacity + OWNER_SLACK */
};

struct notice {
	char owner[AGENT_SHARE_OWNER_MAX + 1], table[32], note[400];
};

struct agent_shares {
	pthread_mutex_t lock; /* guards everything */
	pthread_cond_t cv;
	struct agent_share *t[MAX_TABLES];
	int nt;
	agent_share_tell_fn tell;
	void *tell_data;
	struct notice q[AGENT_SHARE_NOTICES];
	int nq, stop, started;
	unsigned long long dropped;
	pthread_t th;
};

int agent_share_fair(int capacity, int owners)
{
	if (owners <= 0)
		owners = AGENT_SHARE_OWNERS_DEFAULT;
	return capacity / owners > 1 ? capacity / owners : 1;
}

struct agent_shares *agent_shares_new(void)
{
	struct agent_shares *ss = calloc(1, sizeof(*ss));
	if (ss == NULL)
		return NULL;
	pthread_mutex_init(&ss->lock, NULL);
	pthread_cond_init(&ss->cv, NULL);
	return ss;
}

struct agent_share *agent_shares_add(struct agent_shares *ss, const struct agent_share_cfg *cfg,
				     struct gcr_err *err)
{
	if (cfg->name == NULL || cfg->what == NULL || cfg->capacity <= 0 || cfg->per_owner < 0 ||
	    strlen(cfg->name) >= sizeof(((struct agent_share *)0)->name)) {
		gcr_err_set(err, -EINVAL, "share %s: a name, what it counts and a capacity > 0 are needed",
			    cfg->name ? cfg->name : "?");
		return NULL;
	}
	struct agent_share *s = calloc(1, sizeof(*s));
	struct owner *o = calloc((size_t)cfg->capacity + OWNER_SLACK, sizeof(*o));
	pthread_mutex_lock(&ss->lock);
	if (s == NULL || o == NULL || ss->nt == MAX_TABLES) {
		pthread_mutex_unlock(&ss->lock);
		free(s);
		free(o);
		gcr_err_set(err, -ENOMEM, "share %s: out of memory (or more than %d tables)", cfg->name, MAX_TABLES);
		return NULL;
	}
	s->ss = ss;
	s->owners = o;
	snprintf(s->name, sizeof(s->name), "%s", cfg->name);
	snprintf(s->what, sizeof(s->what), "%s", cfg->what);
	snprintf(s->kind, sizeof(s->kind), "%s", cfg->owner ? cfg->owner : "pod");
	s->capacity = cfg->capacity;
	s->per_owner = cfg->per_owner > 0 ? cfg->per_owner : agent_share_fair(cfg->capacity, cfg->owners);
	if (s->per_owner > s->capacity)
		s->per_owner = s->capacity;
	s->tell = cfg->tell;
	ss->t[ss->nt++] = s;
	pthread_mutex_unlock(&ss->lock);
	return s;
}

void agent_shares_set_teller(struct agent_shares *ss, agent_share_tell_fn fn, void *data)
{
	pthread_mutex_lock(&ss->lock);
	ss->tell = fn;
	ss->tell_data = data;
	pthread_mutex_unlock(&ss->lock);
}

static void *teller(void *data)
{
	struct agent_shares *ss = data;
	pthread_mutex_lock(&ss->lock);
	while (!ss->stop) {
		if (ss->nq == 0) {
			pthread_cond_wait(&ss->cv, &ss->lock);
			continue;
		}
		struct notice n = ss->q[0];
		memmove(ss->q, ss->q + 1, (size_t)(--ss->nq) * sizeof(ss->q[0]));
		agent_share_tell_fn fn = ss->tell;
		void *d = ss->tell_data;
		pthread_mutex_unlock(&ss->lock);
		if (fn != NULL) /* an API call: never under the lock */
			fn(d, n.owner, n.table, n.note);
		pthread_mutex_lock(&ss->lock);
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

int agent_shares_start(struct agent_shares *ss, struct gcr_err *err)
{
	int rc = pthread_create(&ss->th, NULL, teller, ss);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the shares' thread: %s", strerror(rc));
	ss->started = 1;
	return 0;
}

void agent_shares_stop(struct agent_shares *ss)
{
	if (ss == NULL || !ss->started)
		return;
	pthread_mutex_lock(&ss->lock);
	ss->stop = 1;
	pthread_cond_signal(&ss->cv);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(ss->th, NULL);
	ss->started = 0;
}

void agent_shares_free(struct agent_shares *ss)
{
	if (ss == NULL)
		return;
	agent_shares_stop(ss);
	for (int i = 0; i < ss->nt; i++) {
		free(ss->t[i]->owners);
		free(ss->t[i]);
	}
	pthread_cond_destroy(&ss->cv);
	pthread_mutex_destroy(&ss->lock);
	free(ss);
}

/* The entry of key, or a new one (a free or the stalest idle one); NULL when every entry is
 * busy. Caller holds the lock. */
static struct owner *owner_of(struct agent_share *s, const char *key, int create, double now)
{
	struct owner *idle = NULL;
	for (int i = 0; i < s->nowners; i++) {
		struct owner *o = &s->owners[i];
		if (strcmp(o->key, key) == 0)
			return o;
		if (o->used == 0 && (idle == NULL || o->told < idle->told))
			idle = o;
	}
	if (!create)
		return NULL;
	if (s->nowners < s->capacity + OWNER_SLACK)
		idle = &s->owners[s->nowners++];
	else if (idle == NULL || (idle->told > 0 && now - idle->told < AGENT_SHARE_TELL_MS && idle->since_told > 0))
		return NULL; /* keep an untold count rather than forget it */
	*idle = (struct owner){ 0 };
	snprintf(idle->key, sizeof(idle->key), "%s", key);
	return idle;
}

/* A refusal of o (NULL: not remembered): counted; logged and queued as a notice when o was not
 * told within AGENT_SHARE_TELL_MS. Returns whether it is told now. Caller holds the lock. */
static int refuse(struct agent_share *s, struct owner *o, const char *key, const char *who, const char *why,
		  double now)
{
	s->refused++;
	if (o != NULL && o->told > 0 && now - o->told < AGENT_SHARE_TELL_MS) {
		o->since_told++;
		return 0;
	}
	unsigned long long more = o != NULL ? o->since_told : 0;
	if (o != NULL) {
		o->told = now;
		o->since_told = 0;
	}
	char note[400], more_s[80] = "";
	if (more > 0)
		snprintf(more_s, sizeof(more_s), " (%llu more refused since the last report)", more);
	snprintf(note, sizeof(note), "%s refused for %s: %s%s; the other %ss are not affected", s->what,
		 who && who[0] ? who : "a request", why, more_s, s->kind);
	GCR_LOG(GCR_LOG_WARN, "share", "%s %s: %s", s->kind, key, note);
	struct agent_shares *ss = s->ss;
	if (!s->tell || key[0] == '\0')
		return 1;
	if (ss->nq == AGENT_SHARE_NOTICES) {
		ss->dropped++;
		return 1;
	}
	struct notice *n = &ss->q[ss->nq++];
	snprintf(n->owner, sizeof(n->owner), "%s", key);
	snprintf(n->table, sizeof(n->table), "%s", s->name);
	snprintf(n->note, sizeof(n->note), "%s", note);
	pthread_cond_signal(&ss->cv);
	return 1;
}

int agent_share_take(struct agent_share *s, const char *owner, const char *who, int *tell, struct gcr_err *err)
{
	char why[200];
	int rc = 0, told = 0;
	double now = gcr_time_mono_ms();
	if (tell != NULL)
		*tell = 0;
	if (owner == NULL)
		owner = "";
	pthread_mutex_lock(&s->ss->lock);
	struct owner *o = owner[0] != '\0' ? owner_of(s, owner, 1, now) : NULL;
	if (owner[0] != '\0' && o != NULL && o->used >= s->per_owner) {
		snprintf(why, sizeof(why), "the %s holds its whole share of the node's %s table (%d of %d)", s->kind,
			 s->name, o->used, s->capacity);
		rc = gcr_err_set(err, -EDQUOT, "%s %s holds its share of %s (%d of the node's %d): refused", s->kind,
				 owner, s->what, o->used, s->capacity);
		told = refuse(s, o, owner, who, why, now);
	} else if (s->in_use >= s->capacity || (owner[0] != '\0' && o == NULL)) {
		snprintf(why, sizeof(why), "the node's %s table is full (%d of %d, more %ss than expected)", s->name,
			 s->in_use, s->capacity, s->kind);
		rc = gcr_err_set(err, -ENOSPC, "the node's %s table is full (%d): refused", s->name, s->capacity);
		told = refuse(s, o, owner, who, why, now);
	} else {
		s->in_use++;
		if (o != NULL)
			o->used++;
	}
	pthread_mutex_unlock(&s->ss->lock);
	if (tell != NULL)
		*tell = told;
	return rc;
}

void agent_share_give(struct agent_share *s, const char *owner)
{
	pthread_mutex_lock(&s->ss->lock);
	struct owner *o = owner != NULL && owner[0] != '\0' ? owner_of(s, owner, 0, 0) : NULL;
	if (o != NULL && o->used > 0)
		o->used--;
	if (s->in_use > 0)
		s->in_use--;
	pthread_mutex_unlock(&s->ss->lock);
}

int agent_share_used(struct agent_share *s, const char *owner)
{
	pthread_mutex_lock(&s->ss->lock);
	struct owner *o = owner != NULL && owner[0] != '\0' ? owner_of(s, owner, 0, 0) : NULL;
	int n = o != NULL ? o->used : 0;
	pthread_mutex_unlock(&s->ss->lock);
	return n;
}

int agent_share_limit(const struct agent_share *s)
{
	return s->per_owner;
}

int agent_share_capacity(const struct agent_share *s)
{
	return s->capacity;
}

void agent_shares_each(struct agent_shares *ss, void (*fn)(void *data, const struct agent_share_stat *st), void *data)
{
	pthread_mutex_lock(&ss->lock);
	for (int i = 0; i < ss->nt; i++) {
		const struct agent_share *s = ss->t[i];
		struct agent_share_stat st = { .name = s->name, .capacity = s->capacity, .per_owner = s->per_owner,
					       .in_use = s->in_use, .refused = s->refused };
		for (int k = 0; k < s->nowners; k++)
			st.owners += s->owners[k].used > 0;
		fn(data, &st);
	}
	pthread_mutex_unlock(&ss->lock);
}
