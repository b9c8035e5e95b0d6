/* test_agent_ocisrv: the registry's transport and TLS identity, with a GnuTLS client playing
 * containerd: hosts.toml and its files; a pull over TLS with the client certificate (the server's
 * certificate checked for 127.0.0.1 against the CA), keep-alive, HEAD, 405; refused without
 * the client certificate, in plain HTTP; a port taken at start (retried, reported with who
 * holds it, then served); idle connections of root and of another user that never keep an
 * honest client out; an idle authenticated connection making way; a handshake's deadline. */
#include "agent_ocisrv.h"
#include "agent_regtls.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gcr_time.h"

static struct agent_regtls *tls;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int st_listening = -1, st_changes;
static char st_why[300];
static int handled;

static void handler(void *data, struct agent_ocisrv_conn *c, const struct agent_ocisrv_req *req)
{
	(void)data;
	pthread_mutex_lock(&mu);
	handled++;
	pthread_mutex_unlock(&mu);
	char body[AGENT_OCIDIST_HEAD_MAX + 32];
	int n = snprintf(body, sizeof(body), "target %s\n", req->target);
	agent_ocisrv_reply(c, 200, "text/plain", "sha256:test", body, (size_t)n);
}

static void on_state(void *data, int listening, const char *why)
{
	(void)data;
	pthread_mutex_lock(&mu);
	st_listening = listening;
	st_changes++;
	snprintf(st_why, sizeof(st_why), "%s", why ? why : "");
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Waits (bounded) until the server reports listening == want. */
static int wait_state(int want, int ms)
{
	struct timespec dl;
	gcr_time_deadline(&dl, ms);
	pthread_mutex_lock(&mu);
	while (st_listening != want && pthread_cond_timedwait(&cv, &mu, &dl) == 0)
		;
	int ok = st_listening == want;
	pthread_mutex_unlock(&mu);
	return ok;
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(sa);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || getsockname(fd, (struct sockaddr *)&sa, &l) < 0)
		return -1;
	close(fd);
	return ntohs(sa.sin_port);
}

static int tcp(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	struct timeval tv = { .tv_sec = 5 };
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

struct client {
	int fd;
	gnutls_session_t s;
	gnutls_certificate_credentials_t cred;
};

/* containerd's side: trusts the agent's CA only, checks the name 127.0.0.1, shows the client
 * certificate when with_cert. 0 once the handshake is done (TLS 1.3: before the server has
 * checked the client's certificate). */
static int client_open(int port, int with_cert, struct client *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = tcp(port);
	if (c->fd < 0)
		return -1;
	gnutls_datum_t ca = { (unsigned char *)agent_regtls_ca_pem(tls), (unsigned)strlen(agent_regtls_ca_pem(tls)) };
	gnutls_datum_t crt = { (unsigned char *)agent_regtls_client_cert_pem(tls),
			       (unsigned)strlen(agent_regtls_client_cert_pem(tls)) };
	gnutls_datum_t key = { (unsigned char *)agent_regtls_client_key_pem(tls),
			       (unsigned)strlen(agent_regtls_client_key_pem(tls)) };
	gnutls_certificate_allocate_credentials(&c->cred);
	gnutls_certificate_set_x509_trust_mem(c->cred, &ca, GNUTLS_X509_FMT_PEM);
	if (with_cert)
		gnutls_certificate_set_x509_key_mem(c->cred, &crt, &key, GNUTLS_X509_FMT_PEM);
	gnutls_init(&c->s, GNUTLS_CLIENT);
	gnutls_set_default_priority(c->s);
	gnutls_credentials_set(c->s, GNUTLS_CRD_CERTIFICATE, c->cred);
	gnutls_session_set_verify_cert(c->s, "127.0.0.1", 0);
	gnutls_transport_set_int(c->s, c->fd);
	int rc;
	do
		rc = gnutls_handshake(c->s);
	while (rc < 0 && !gnutls_error_is_fatal(rc));
	return rc < 0 ? -1 : 0;
}

static void client_close(struct client *c)
{
	if (c->s != NULL)
		gnutls_deinit(c->s);
	if (c->cred != NULL)
		gnutls_certificate_free_credentials(c->cred);
	if (c->fd >= 0)
		close(c->fd);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

/* Sends req, reads one answer (head + Content-Length bytes; none for HEAD) into out. Its
 * status code, or -1. */
static int client_ask(struct client *c, const char *req, int head_only, char *out, size_t len)
{
	out[0] = '\0'; /* a failed ask leaves an empty answer, never stale or unset bytes */
	if (gnutls_record_send(c->s, req, strlen(req)) != (ssize_t)strlen(req))
		return -1;
	size_t have = 0;
	char *end = NULL;
	while ((end = memmem(out, have, "\r\n\r\n", 4)) == NULL) {
		ssize_t n = gnutls_record_recv(c->s, out + have, len - 1 - have);
		if (n <= 0)
			return -1;
		have += (size_t)n;
	}
	out[have] = '\0';
	const char *cl = strcasestr(out, "Content-Length: ");
	size_t body = cl ? strtoul(cl + 16, NULL, 10) : 0, need = (size_t)(end + 4 - out) + (head_only ? 0 : body);
	while (have < need && have < len - 1) {
		ssize_t n = gnutls_record_recv(c->s, out + have, len - 1 - have);
		if (n <= 0)
			return -1;
		have += (size_t)n;
	}
	out[have] = '\0';
	return have == need ? atoi(out + 9) : -1;
}

static void test_hosts(void)
{
	char dir[] = "/tmp/gcr-regtls-XXXXXX", p[512], text[1024], want[1024];
	struct gcr_err err = { 0 };
	CHECK(mkdtemp(dir) != NULL);
	CHECK(agent_regtls_write_hosts(tls, dir, 5055, &err) == 0);
	snprintf(p, sizeof(p), "%s/hosts.toml", dir);
	int fd = open(p, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
	if (fd >= 0)
		close(fd);
	CHECK(n > 0);
	text[n > 0 ? n : 0] = '\0';
	/* The generation it names holds the CA and the client pair, root only. */
	const char *g = strstr(text, "ca = \"");
	char gen[64] = "";
	if (g != NULL)
		sscanf(g + 6, "%63[^/]", gen);
	CHECK(strncmp(gen, "gen-", 4) == 0);
	CHECK(agent_regtls_hosts_toml(5055, gen, want, sizeof(want)) == 0 && strcmp(text, want) == 0);
	CHECK(strstr(text, "server = \"https://127.0.0.1:5055\"") != NULL && strstr(text, "skip_verify = false") != NULL);
	const char *files[] = { "ca.pem", "client.pem", "client-key.pem" };
	for (int i = 0; i < 3; i++) {
		struct stat st;
		snprintf(p, sizeof(p), "%s/%s/%s", dir, gen, files[i]);
		CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size > 100);
	}
	/* Written again (a restart): one generation left, the new one. */
	struct agent_regtls *t2 = NULL;
	CHECK(agent_regtls_new("again", &t2, &err) == 0);
	CHECK(t2 != NULL && agent_regtls_write_hosts(t2, dir, 5055, &err) == 0);
	snprintf(p, sizeof(p), "%s/%s", dir, gen);
	struct stat st;
	CHECK(stat(p, &st) < 0 && errno == ENOENT);
	CHECK(strcmp(agent_regtls_ca_pem(t2), agent_regtls_ca_pem(tls)) != 0);
	agent_regtls_free(t2);
	CHECK(agent_regtls_write_hosts(tls, "/nonexistent/dir", 5055, &err) < 0 && err.msg[0] != '\0');
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
}

static struct agent_ocisrv *start(int port, unsigned pending_max, unsigned per_uid, unsigned root, unsigned serving,
				  int handshake_ms)
{
	struct agent_ocisrv_cfg cfg = { .port = port, .tls = tls, .fn = handler, .state = on_state,
					.pending_max = pending_max, .pending_per_uid = per_uid, .pending_root = root,
					.serving_max = serving, .handshake_ms = (int)test_ms(handshake_ms ? handshake_ms : AGENT_OCISRV_HANDSHAKE_MS),
					.idle_ms = (int)test_ms(3000),
					.backoff_min_ms = 20, .backoff_max_ms = 100 };
	struct agent_ocisrv *s = NULL;
	struct gcr_err err = { 0 };
	pthread_mutex_lock(&mu);
	st_listening = -1;
	pthread_mutex_unlock(&mu);
	CHECK(agent_ocisrv_start(&cfg, &s, &err) == 0 && s != NULL);
	return s;
}

static int pull_once(int port)
{
	struct client c;
	char buf[4096];
	int code = client_open(port, 1, &c) == 0
			   ? client_ask(&c, "GET /v2/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 0, buf, sizeof(buf))
			   : -1;
	client_close(&c);
	return code;
}

static void test_serve(void)
{
	int port = free_port();
	struct agent_ocisrv *s = start(port, 0, 0, 0, 0, 0);
	CHECK(wait_state(1, 30000));
	struct client c;
	char buf[4096];
	CHECK(client_open(port, 1, &c) == 0);
	CHECK(client_ask(&c, "GET /v2/one HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 0, buf, sizeof(buf)) == 200);
	CHECK(strstr(buf, "target /v2/one\n") != NULL && strstr(buf, "Docker-Content-Digest: sha256:test\r\n") != NULL);
	/* The same connection again (keep-alive), then HEAD: the length, no body. */
	CHECK(client_ask(&c, "GET /v2/two HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf)) == 200 &&
	      strstr(buf, "target /v2/two\n") != NULL);
	CHECK(client_ask(&c, "HEAD /v2/three HTTP/1.1\r\n\r\n", 1, buf, sizeof(buf)) == 200 &&
	      strstr(buf, "Content-Length: 17\r\n") != NULL && strstr(buf, "target") == NULL);
	CHECK(client_ask(&c, "DELETE /v2/x HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf)) == 405);
	CHECK(client_ask(&c, "GET /v2/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, buf, sizeof(buf)) == 400);
	client_close(&c);
	/* Without the client certificate: no answer, the handler never called. */
	pthread_mutex_lock(&mu);
	int before = handled;
	pthread_mutex_unlock(&mu);
	int code = client_open(port, 0, &c) == 0 ? client_ask(&c, "GET /v2/nocert HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf))
						 : -1;
	CHECK(code == -1);
	client_close(&c);
	pthread_mutex_lock(&mu);
	CHECK(handled == before);
	pthread_mutex_unlock(&mu);
	/* Plain HTTP: told so, in plain text. */
	int fd = tcp(port);
	const char *plain = "GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
	CHECK(fd >= 0 && write(fd, plain, strlen(plain)) == (ssize_t)strlen(plain));
	ssize_t n = fd >= 0 ? recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL) : -1;
	buf[n > 0 ? n : 0] = '\0';
	CHECK(strncmp(buf, "HTTP/1.1 400 ", 13) == 0 && strstr(buf, "TLS only") != NULL);
	if (fd >= 0)
		close(fd);
	struct agent_ocisrv_stats st;
	agent_ocisrv_stats(s, &st);
	CHECK(st.listening == 1 && st.authenticated >= 1 && st.handshake_failed >= 2 && st.requests >= 5);
	agent_ocisrv_free(s);
}

/* The port taken when the server starts: it runs on, says who holds it, and serves once free. */
static void test_squat(void)
{
	int port = free_port();
	int sq = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1;
	setsockopt(sq, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(bind(sq, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(sq, 8) == 0);
	struct agent_ocisrv *s = start(port, 0, 0, 0, 0, 0);
	CHECK(wait_state(0, 30000));
	char mine[64];
	snprintf(mine, sizeof(mine), "by pid %d ", (int)getpid());
	pthread_mutex_lock(&mu);
	CHECK(strstr(st_why, "is taken") != NULL && strstr(st_why, mine) != NULL);
	if (strstr(st_why, mine) == NULL)
		fprintf(stderr, "why: %s\n", st_why);
	pthread_mutex_unlock(&mu);
	/* Retried meanwhile (back-off 20..100 ms here): wait for a few tries, by the counter. */
	struct agent_ocisrv_stats st = { 0 };
	double t0 = gcr_time_mono_ms();
	while (st.bind_failures < 3 && gcr_time_mono_ms() - t0 < 30000) {
		struct timespec ts = { 0, 10 * 1000000L };
		nanosleep(&ts, NULL);
		agent_ocisrv_stats(s, &st);
	}
	CHECK(st.bind_failures >= 3 && st.listening == 0);
	close(sq);
	CHECK(wait_state(1, 30000));
	CHECK(pull_once(port) == 200);
	agent_ocisrv_free(s);
}

/* Idle connections of root and of another user never keep an honest client out. */
static void test_flood(void)
{
	int port = free_port();
	/* Small tables: 8 handshakes, 2 per user, 6 for root. */
	struct agent_ocisrv *s = start(port, 8, 2, 6, 4, 2000);
	CHECK(wait_state(1, 30000));
	int fds[40];
	for (int i = 0; i < 40; i++)
		fds[i] = tcp(port); /* root's, this process's: idle, never a byte */
	CHECK(pull_once(port) == 200);
	struct agent_ocisrv_stats st;
	agent_ocisrv_stats(s, &st);
	CHECK(st.evicted >= 30 && st.pending <= 8);
	/* Another user's: at most 2 of the table at once, however many. */
	int pipefd[2];
	CHECK(pipe(pipefd) == 0);
	pid_t child = geteuid() == 0 ? fork() : -1;
	if (child == 0) {
		close(pipefd[0]);
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(2);
		int kept[30];
		for (int i = 0; i < 30; i++)
			kept[i] = tcp(port);
		(void)write(pipefd[1], "x", 1);
		char b;
		(void)read(pipefd[1], &b, 1); /* until the parent closes its end... never: killed */
		pause();
		(void)kept;
		_exit(0);
	}
	if (child > 0) {
		close(pipefd[1]);
		char b;
		CHECK(read(pipefd[0], &b, 1) == 1);
		unsigned long long ev0 = st.evicted;
		CHECK(pull_once(port) == 200);
		agent_ocisrv_stats(s, &st);
		/* 30 connections of uid 65534 could hold 2 slots: 28 of theirs went, at least. */
		CHECK(st.evicted - ev0 >= 28);
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
		close(pipefd[0]);
	} else {
		printf("test_agent_ocisrv: not root: the other user's flood is not tried\n");
		close(pipefd[0]);
		close(pipefd[1]);
	}
	for (int i = 0; i < 40; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	agent_ocisrv_free(s);
}

/* Authenticated idle connections make way; a handshake has a deadline. */
static void test_idle(void)
{
	int port = free_port();
	/* 1.5 s for a handshake: a honest one takes milliseconds (under valgrind, tenths). */
	struct agent_ocisrv *s = start(port, 8, 2, 6, 2, 1500);
	CHECK(wait_state(1, 30000));
	struct client a, b;
	char buf[4096];
	CHECK(client_open(port, 1, &a) == 0 && client_ask(&a, "GET /a HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf)) == 200);
	CHECK(client_open(port, 1, &b) == 0 && client_ask(&b, "GET /b HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf)) == 200);
	/* Both serving slots are held by idle connections: a third client still gets its answer. */
	CHECK(pull_once(port) == 200);
	/* One of the two was closed for it: its next request finds the end. */
	int ca = client_ask(&a, "GET /a2 HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf));
	int cb = client_ask(&b, "GET /b2 HTTP/1.1\r\n\r\n", 0, buf, sizeof(buf));
	CHECK((ca == -1) != (cb == -1));
	client_close(&a);
	client_close(&b);
	/* A connection that never starts its handshake is closed after 1.5 s. */
	int fd = tcp(port);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	double t0 = gcr_time_mono_ms();
	CHECK(fd >= 0 && poll(&p, 1, (int)test_ms(5000)) == 1);
	char c;
	CHECK(recv(fd, &c, 1, 0) == 0);
	double took = gcr_time_mono_ms() - t0;
	CHECK(took >= test_ms(1400) && took < test_ms(6000));
	if (fd >= 0)
		close(fd);
	agent_ocisrv_free(s);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	struct gcr_err err = { 0 };
	CHECK(agent_regtls_new("test", &tls, &err) == 0 && tls != NULL);
	if (tls == NULL)
		return test_summary("test_agent_ocisrv");
	test_hosts();
	test_serve();
	test_squat();
	test_flood();
	test_idle();
	agent_regtls_free(tls);
	return test_summary("test_agent_ocisrv");
}
