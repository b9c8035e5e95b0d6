/* test_agent_kubeconfig: kubeconfig variants (contexts, data vs file, aliases,
 * refused settings, bad input), in-cluster settings and token rotation. */
#include "agent_kubeconfig.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CA_PEM                                                                \
	"-----BEGIN CERTIFICATE-----\n"                                       \
	"MIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAjMSEwHwYDVQQDDBhrM3Mtc2Vy\n" \
	"-----END CERTIFICATE-----\n"
#define CA_B64                                                                                  \
	"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkekNDQVIyZ0F3SUJBZ0lCQURBS0JnZ3Foa2pPUFFRREFq" \
	"QWpNU0V3SHdZRFZRUUREQmhyTTNNdGMyVnkKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="
#define KEY_PEM                                              \
	"-----BEGIN EC PRIVATE KEY-----\n"                   \
	"MHcCAQEEIHNvbWUta2V5LWJ5dGVzLWZvci10ZXN0cw==\n" \
	"-----END EC PRIVATE KEY-----\n"
#define KEY_B64                                                                                 \
	"LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUhOdmJXVXRhMlY1TFdKNWRHVnpMV1p2Y2kx" \
	"MFpYTjBjdz09Ci0tLS0tRU5EIEVDIFBSSVZBVEUgS0VZLS0tLS0K"

static struct gcr_err err;

static int parse(const char *text, const char *base, const char *ctx, struct agent_kubeconfig **kc)
{
	gcr_err_clear(&err);
	int rc = agent_kubeconfig_parse(text, strlen(text), base, ctx, kc, &err);
	/* Every failure leaves a one-line message and no result. */
	if (rc < 0)
		CHECK(err.code == rc && err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL && *kc == NULL);
	return rc;
}

/* Builds "kubeconfig with one context" from the cluster and user bodies. */
static char *one(const char *cluster, const char *user)
{
	static char buf[8192];
	snprintf(buf, sizeof(buf),
		 "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
		 "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
		 "clusters:\n- name: k\n  cluster:\n%s"
		 "users:\n- name: u\n  user:\n%s",
		 cluster, user);
	return buf;
}

#define SRV "    server: https://10.0.0.1:6443\n"
#define TOK "    token: abc.def\n"

static void test_multi_context(void)
{
	const char *t = "apiVersion: v1\n"
			"kind: Config\n"
			"current-context: staging\n"
			"clusters:\n"
			"- name: prod\n"
			"  cluster:\n"
			"    server: https://prod.example.com\n"
			"    certificate-authority-data: " CA_B64 "\n"
			"- name: staging\n"
			"  cluster:\n"
			"    server: \"https://[fd00::1]:6443\"\n"
			"    certificate-authority: /etc/staging/ca.pem\n"
			"    insecure-skip-tls-verify: false\n"
			"contexts:\n"
			"- name: prod\n"
			"  context:\n"
			"    cluster: prod\n"
			"    user: admin\n"
			"    namespace: default\n"
			"- name: staging\n"
			"  context: {cluster: staging, user: ci, namespace: ci-ns}\n"
			"users:\n"
			"- name: admin\n"
			"  user:\n"
			"    client-certificate-data: " CA_B64 "\n"
			"    client-key-data: " KEY_B64 "\n"
			"- name: ci\n"
			"  user:\n"
			"    token: \"  eyJhbGciOi.payload.sig\\n\"\n";
	struct agent_kubeconfig *kc = NULL;

	CHECK(parse(t, "/home/u/.kube", NULL, &kc) == 0);
	if (kc) {
		CHECK_STR(kc->server, "https://[fd00::1]:6443");
		CHECK_STR(kc->ca_file, "/etc/staging/ca.pem");
		CHECK(kc->ca_pem == NULL);
		CHECK_STR(kc->token, "eyJhbGciOi.payload.sig");
		CHECK_STR(kc->namespace, "ci-ns");
		CHECK(kc->client_cert_pem == NULL && kc->client_key_file == NULL && kc->token_file == NULL);
		CHECK(kc->tls_server_name == NULL);
	}
	agent_kubeconfig_free(kc);

	/* An explicit context overrides current-context. */
	CHECK(parse(t, NULL, "prod", &kc) == 0);
	if (kc) {
		CHECK_STR(kc->server, "https://prod.example.com");
		CHECK(kc->ca_pem_len == strlen(CA_PEM) && memcmp(kc->ca_pem, CA_PEM, kc->ca_pem_len) == 0);
		CHECK(kc->ca_pem[kc->ca_pem_len] == '\0');
		CHECK_STR(kc->client_cert_pem, CA_PEM);
		CHECK_STR(kc->client_key_pem, KEY_PEM);
		CHECK(kc->client_key_pem_len == strlen(KEY_PEM));
		CHECK(kc->token == NULL);
		CHECK_STR(kc->namespace, "default");
	}
	agent_kubeconfig_free(kc);

	CHECK(parse(t, NULL, "nope", &kc) == -ENOENT);
	CHECK(strstr(err.msg, "context 'nope' not found") != NULL);
}

static void test_files_and_precedence(void)
{
	struct agent_kubeconfig *kc = NULL;
	const char *t = one(SRV "    certificate-authority: ca.crt\n"
			    "    tls-server-name: api.internal\n",
			    "    client-certificate: pki/client.crt\n"
			    "    client-key: /abs/client.key\n"
			    "    tokenFile: ../tok\n");
	CHECK(parse(t, "/etc/kube", NULL, &kc) == 0);
	if (kc) {
		CHECK_STR(kc->ca_file, "/etc/kube/ca.crt");
		CHECK_STR(kc->client_cert_file, "/etc/kube/pki/client.crt");
		CHECK_STR(kc->client_key_file, "/abs/client.key");
		CHECK_STR(kc->token_file, "/etc/kube/../tok");
		CHECK(kc->token == NULL); /* parse does no I/O */
		CHECK_STR(kc->tls_server_name, "api.internal");
		CHECK(kc->token_reread_s == AGENT_KUBECONFIG_TOKEN_REREAD_S);
	}
	agent_kubeconfig_free(kc);

	/* Without a base directory relative paths stay as written. */
	CHECK(parse(t, NULL, NULL, &kc) == 0);
	if (kc)
		CHECK_STR(kc->ca_file, "ca.crt");
	agent_kubeconfig_free(kc);

	/* -data wins over the path, as in client-go. */
	t = one(SRV "    certificate-authority: ca.crt\n"
		    "    certificate-authority-data: " CA_B64 "\n",
		TOK);
	CHECK(parse(t, "/x", NULL, &kc) == 0);
	if (kc) {
		CHECK(kc->ca_file == NULL);
		CHECK_STR(kc->ca_pem, CA_PEM);
	}
	agent_kubeconfig_free(kc);

	/* Base64 wrapped over lines in a block scalar. */
	t = one(SRV "    certificate-authority-data: |\n"
		    "      LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkekNDQVIyZ0F3SUJBZ0lCQURBS0Jn\n"
		    "      Z3Foa2pPUFFRREFqQWpNU0V3SHdZRFZRUUREQmhyTTNNdGMyVnkKLS0tLS1FTkQgQ0VSVElG\n"
		    "      SUNBVEUtLS0tLQo=\n",
		TOK);
	CHECK(parse(t, NULL, NULL, &kc) == 0);
	if (kc)
		CHECK_STR(kc->ca_pem, CA_PEM);
	agent_kubeconfig_free(kc);

	/* Trailing slashes go; the path stays; the scheme is lowercased. */
	t = one("    server: HTTPS://lb.example.com:443/k8s/clusters/c-m-abc//\n", TOK);
	CHECK(parse(t, NULL, NULL, &kc) == 0);
	if (kc)
		CHECK_STR(kc->server, "https://lb.example.com:443/k8s/clusters/c-m-abc");
	agent_kubeconfig_free(kc);
}

static void test_refused(void)
{
	struct agent_kubeconfig *kc = NULL;

	CHECK(parse(one(SRV "    insecure-skip-tls-verify: true\n", TOK), NULL, NULL, &kc) == -EPERM);
	CHECK(strstr(err.msg, "insecure-skip-tls-verify") != NULL);
	CHECK(parse(one(SRV "    insecure-skip-tls-verify: yes\n", TOK), NULL, NULL, &kc) == -EPERM);
	CHECK(parse(one(SRV "    insecure-skip-tls-verify: \"maybe\"\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one(SRV "    insecure-skip-tls-verify: [true]\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one(SRV "    insecure-skip-tls-verify: null\n", TOK), NULL, NULL, &kc) == 0);
	agent_kubeconfig_free(kc);
	kc = NULL;

	CHECK(parse(one("    server: http://10.0.0.1:8080\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "https") != NULL);
	CHECK(parse(one("    server: https://\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one("    server: https:///path\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one("    server: \"https://a b\"\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one("    server: \"https://a\\r\\nX-Evil: 1\"\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one("    certificate-authority: /ca\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "no server") != NULL);
	CHECK(parse(one("    server: {a: b}\n", TOK), NULL, NULL, &kc) == -EINVAL);

	/* Credentials we cannot use. */
	CHECK(parse(one(SRV, "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
			     "      command: aws\n"),
		    NULL, NULL, &kc) == -ENOTSUP);
	CHECK(strstr(err.msg, "exec") != NULL);
	CHECK(parse(one(SRV, "    auth-provider: {name: gcp}\n"), NULL, NULL, &kc) == -ENOTSUP);
	CHECK(parse(one(SRV, "    username: admin\n    password: secret\n"), NULL, NULL, &kc) == -ENOTSUP);
	CHECK(parse(one(SRV, "    {}\n"), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "no credentials") != NULL);
	CHECK(parse(one(SRV, "    client-certificate: a.crt\n"), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "without a key") != NULL);
	CHECK(parse(one(SRV, "    client-key-data: " KEY_B64 "\n"), NULL, NULL, &kc) == -EINVAL);

	/* A token is a header value: no spaces, no control bytes. */
	CHECK(parse(one(SRV, "    token: \"abc def\"\n"), NULL, NULL, &kc) == -EINVAL);
	CHECK(parse(one(SRV, "    token: \"abc\\r\\nX-Evil: 1\"\n"), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "0x0d") != NULL);
	CHECK(parse(one(SRV, "    token: \"   \"\n"), NULL, NULL, &kc) == -EINVAL);
	/* "\0" in a double-quoted scalar would cut a C string short. */
	CHECK(parse(one(SRV, "    token: \"abc\\0def\"\n"), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "NUL") != NULL);
}

static void test_bad_base64(void)
{
	struct agent_kubeconfig *kc = NULL;
	static const char *const bad[] = {
		"    certificate-authority-data: LS0t*S1C\n",      /* bad character */
		"    certificate-authority-data: LS0tLS1\n",       /* length not a multiple of 4 */
		"    certificate-authority-data: YWI=YWI=\n",      /* data after padding */
		"    certificate-authority-data: Y===\n",          /* too much padding */
		"    certificate-authority-data: \"====\"\n",      /* only padding */
		"    certificate-authority-data: bm90IGEgcGVt\n", /* "not a pem" */
		"    certificate-authority-data: [a, b]\n",        /* not a string */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char cluster[256];
		snprintf(cluster, sizeof(cluster), SRV "%s", bad[i]);
		int rc = parse(one(cluster, TOK), NULL, NULL, &kc);
		CHECK(rc == -EINVAL);
		if (rc != -EINVAL)
			fprintf(stderr, "bad base64 %zu: rc %d\n", i, rc);
	}
	CHECK(parse(one(SRV "    certificate-authority-data: LS0t*S1C\n", TOK), NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "cluster 'k'") != NULL && strstr(err.msg, "base64") != NULL);
	CHECK(parse(one(SRV, "    client-key-data: bm90IGEgcGVt\n    client-certificate: x\n"), NULL, NULL,
		    &kc) == -EINVAL);
	CHECK(strstr(err.msg, "client-key-data does not decode to PEM") != NULL);
}

static void test_missing(void)
{
	struct agent_kubeconfig *kc = NULL;
	const char *base = "clusters:\n- name: k\n  cluster: {server: https://a}\n"
			   "users:\n- name: u\n  user: {token: t}\n";
	char buf[1024];

	snprintf(buf, sizeof(buf), "%scontexts:\n- name: c\n  context: {cluster: k, user: u}\n", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -ENOENT);
	CHECK(strstr(err.msg, "current-context") != NULL);
	CHECK(parse(buf, NULL, "c", &kc) == 0);
	agent_kubeconfig_free(kc);
	kc = NULL;

	snprintf(buf, sizeof(buf), "current-context: \"\"\n%s", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -ENOENT);

	snprintf(buf, sizeof(buf),
		 "current-context: c\n%scontexts:\n- name: c\n  context: {cluster: k, user: ghost}\n", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -ENOENT);
	CHECK(strstr(err.msg, "user 'ghost' not found") != NULL);

	snprintf(buf, sizeof(buf), "current-context: c\n%scontexts:\n- name: c\n  context: {cluster: k}\n", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "names no user") != NULL);

	snprintf(buf, sizeof(buf), "current-context: c\n%scontexts:\n- name: c\n  context: {user: u}\n", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -EINVAL);
	snprintf(buf, sizeof(buf),
		 "current-context: c\n%scontexts:\n- name: c\n  context: {cluster: nope, user: u}\n", base);
	CHECK(parse(buf, NULL, NULL, &kc) == -ENOENT);
	CHECK(strstr(err.msg, "cluster 'nope' not found") != NULL);
	CHECK(parse("current-context: c\ncontexts:\n- name: c\n", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("current-context: c\ncontexts: {c: 1}\n", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("current-context: c\ncontexts:\n", NULL, NULL, &kc) == -ENOENT);
	CHECK(parse("current-context: c\n", NULL, NULL, &kc) == -ENOENT);

	/* Not kubeconfigs at all. */
	CHECK(parse("", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("# only a comment\n", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("- a\n- b\n", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("just a string", NULL, NULL, &kc) == -EINVAL);
	CHECK(parse("a: [1, 2\nb: {", NULL, NULL, &kc) == -EINVAL);
	CHECK(strstr(err.msg, "YAML error at line") != NULL);
	CHECK(parse("a: *undefined\n", NULL, NULL, &kc) == -EINVAL);
	CHECK(agent_kubeconfig_parse(NULL, 0, NULL, NULL, &kc, NULL) == -EINVAL);
	/* Names with control characters still give one-line messages. */
	CHECK(parse("current-context: \"a\\nb\"\n", NULL, NULL, &kc) == -ENOENT);
}

static void test_aliases(void)
{
	struct agent_kubeconfig *kc = NULL;
	/* Shared settings through anchors, aliases and merge keys. */
	const char *t = "defaults:\n"
			"  cluster: &base\n"
			"    certificate-authority-data: " CA_B64 "\n"
			"    server: https://base.example.com\n"
			"  creds: &creds\n"
			"    token: shared-token\n"
			"current-context: &cur two\n"
			"clusters:\n"
			"- name: one\n"
			"  cluster: *base\n"
			"- name: two\n"
			"  cluster:\n"
			"    <<: *base\n"
			"    server: https://two.example.com\n"
			"contexts:\n"
			"- name: *cur\n"
			"  context: {cluster: two, user: u2}\n"
			"- name: one\n"
			"  context: {cluster: one, user: u1}\n"
			"users:\n"
			"- name: u1\n"
			"  user: *creds\n"
			"- name: u2\n"
			"  user:\n"
			"    <<: [*creds]\n";
	CHECK(parse(t, NULL, NULL, &kc) == 0);
	if (kc) {
		CHECK_STR(kc->server, "https://two.example.com");
		CHECK_STR(kc->ca_pem, CA_PEM);
		CHECK_STR(kc->token, "shared-token");
	}
	agent_kubeconfig_free(kc);
	CHECK(parse(t, NULL, "one", &kc) == 0);
	if (kc)
		CHECK_STR(kc->server, "https://base.example.com");
	agent_kubeconfig_free(kc);
	kc = NULL;

	/* A merge key that refers to its own mapping: bounded, no hang. */
	t = "current-context: c\ncontexts:\n- name: c\n  context: &loop\n    <<: *loop\n";
	int rc = parse(t, NULL, NULL, &kc);
	CHECK(rc < 0);
	agent_kubeconfig_free(kc);
	kc = NULL;

	/* "Billion laughs": aliases are shared nodes, never expanded. */
	char big[4096];
	int n = snprintf(big, sizeof(big), "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
	for (int i = 1; i < 30; i++)
		n += snprintf(big + n, sizeof(big) - (size_t)n,
			      "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i,
			      i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
	snprintf(big + n, sizeof(big) - (size_t)n, "clusters: *a29\ncurrent-context: c\n");
	CHECK(parse(big, NULL, NULL, &kc) == -ENOENT);

	/* Merge keys fanned out through aliases: 10^8 mappings if followed
	 * naively; the lookup budget makes this quick. */
	n = snprintf(big, sizeof(big), "m0: &m0 {x: 1}\n");
	for (int i = 1; i < 9; i++)
		n += snprintf(big + n, sizeof(big) - (size_t)n,
			      "m%d: &m%d {<<: [*m%d, *m%d, *m%d, *m%d, *m%d, *m%d, *m%d, *m%d, *m%d, *m%d]}\n", i, i,
			      i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
	snprintf(big + n, sizeof(big) - (size_t)n,
		 "current-context: c\ncontexts:\n- name: c\n  context: {<<: *m8, cluster: k, user: u}\n");
	CHECK(parse(big, NULL, NULL, &kc) == -ENOENT);
	CHECK(strstr(err.msg, "cluster 'k' not found") != NULL);
}

static void test_huge(void)
{
	struct agent_kubeconfig *kc = NULL;
	size_t n = AGENT_KUBECONFIG_MAX_VALUE + 100;
	char *t = malloc(n + 512);
	int k = snprintf(t, 512, "%s", one(SRV, "    token: "));
	memset(t + k, 'a', n);
	strcpy(t + k + n, "\n");
	CHECK(parse(t, NULL, NULL, &kc) == -EFBIG);
	CHECK(strstr(err.msg, "token is longer") != NULL);
	free(t);

	/* Over the file limit: refused before parsing. */
	n = AGENT_KUBECONFIG_MAX_FILE + 1;
	t = malloc(n + 1);
	memset(t, '#', n);
	t[n] = '\0';
	CHECK(parse(t, NULL, NULL, &kc) == -EFBIG);
	free(t);

	/* A token under the value limit but over the token limit. */
	n = AGENT_KUBECONFIG_MAX_TOKEN + 1;
	t = malloc(n + 512);
	k = snprintf(t, 512, "%s", one(SRV, "    token: "));
	memset(t + k, 'a', n);
	strcpy(t + k + n, "\n");
	CHECK(parse(t, NULL, NULL, &kc) == -EINVAL);
	free(t);
}

static const char *srcdir(void)
{
	const char *d = getenv("top_srcdir");
	return d ? d : ".";
}

static void test_load_file(void)
{
	struct agent_kubeconfig *kc = NULL;
	char path[1024], want[1024];

	snprintf(path, sizeof(path), "%s/tests/unit/data/kubeconfig/kind.yaml", srcdir());
	CHECK(agent_kubeconfig_load_file(path, NULL, &kc, &err) == 0);
	if (kc) {
		CHECK_STR(kc->server, "https://127.0.0.1:40561");
		CHECK_STR(kc->ca_pem, CA_PEM);
		CHECK_STR(kc->client_cert_pem, CA_PEM);
		CHECK_STR(kc->client_key_pem, KEY_PEM);
		CHECK(kc->token == NULL && kc->namespace == NULL);
	} else {
		fprintf(stderr, "%s\n", err.msg);
	}
	agent_kubeconfig_free(kc);

	snprintf(path, sizeof(path), "%s/tests/unit/data/kubeconfig/files.yaml", srcdir());
	CHECK(agent_kubeconfig_load_file(path, NULL, &kc, &err) == 0);
	if (kc) {
		snprintf(want, sizeof(want), "%s/tests/unit/data/kubeconfig/pki/ca.crt", srcdir());
		CHECK_STR(kc->ca_file, want);
		/* The token file's content overrides the inline token. */
		CHECK_STR(kc->token, "file-token-0123456789.abcdef");
		CHECK_STR(kc->namespace, "gcr-system");
		CHECK_STR(kc->tls_server_name, "kubernetes.default.svc");
		CHECK_STR(kc->server, "https://api.prod.example.com:6443");
	} else {
		fprintf(stderr, "%s\n", err.msg);
	}
	agent_kubeconfig_free(kc);

	CHECK(agent_kubeconfig_load_file("/nonexistent/kubeconfig", NULL, &kc, &err) == -ENOENT);
	CHECK(kc == NULL && strstr(err.msg, "/nonexistent/kubeconfig") != NULL);
	CHECK(agent_kubeconfig_load_file("/", NULL, &kc, &err) == -EINVAL);
	agent_kubeconfig_free(NULL);
}

static int write_file(const char *dir, const char *name, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return -1;
	fputs(text, f);
	return fclose(f);
}

static void test_in_cluster(void)
{
	struct agent_kubeconfig *kc = NULL;
	char sa[1024];

	snprintf(sa, sizeof(sa), "%s/tests/unit/data/serviceaccount", srcdir());
	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == 0);
	if (kc) {
		char want[1100];
		CHECK_STR(kc->server, "https://10.96.0.1:443");
		snprintf(want, sizeof(want), "%s/ca.crt", sa);
		CHECK_STR(kc->ca_file, want);
		snprintf(want, sizeof(want), "%s/token", sa);
		CHECK_STR(kc->token_file, want);
		CHECK(kc->token != NULL && strncmp(kc->token, "eyJhbGciOiJSUzI1NiIs", 20) == 0);
		CHECK_STR(kc->namespace, "gcr-system");
	} else {
		fprintf(stderr, "%s\n", err.msg);
	}
	agent_kubeconfig_free(kc);

	setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == 0);
	if (kc)
		CHECK_STR(kc->server, "https://[fd00:10:96::1]:443");
	agent_kubeconfig_free(kc);

	setenv("KUBERNETES_SERVICE_PORT", "0x1bb", 1);
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == -EINVAL);
	setenv("KUBERNETES_SERVICE_PORT", "70000", 1);
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == -EINVAL);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	setenv("KUBERNETES_SERVICE_HOST", "evil.com/path?", 1);
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == -EINVAL);
	unsetenv("KUBERNETES_SERVICE_HOST");
	CHECK(agent_kubeconfig_in_cluster(sa, &kc, &err) == -ENOENT);
	CHECK(strstr(err.msg, "KUBERNETES_SERVICE_HOST") != NULL);
	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);

	/* A missing CA or token is an error; a missing namespace is not. */
	char dir[] = "/tmp/test_agent_kubeconfig.XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == -ENOENT);
	CHECK(strstr(err.msg, "ca.crt") != NULL);
	CHECK(write_file(dir, "ca.crt", CA_PEM) == 0);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == -ENOENT);
	CHECK(strstr(err.msg, "token") != NULL);
	CHECK(write_file(dir, "token", "\n") == 0);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == -EINVAL);
	CHECK(write_file(dir, "token", "tok-1\n") == 0);
	CHECK(write_file(dir, "namespace", "Not A Namespace") == 0);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == -EINVAL);
	CHECK(write_file(dir, "namespace", "") == 0);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == -EINVAL);
	char p[1100];
	snprintf(p, sizeof(p), "%s/namespace", dir);
	unlink(p);
	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == 0);
	if (kc)
		CHECK(kc->namespace == NULL);
	agent_kubeconfig_free(kc);
	snprintf(p, sizeof(p), "%s/token", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/ca.crt", dir);
	unlink(p);
	rmdir(dir);
}

/* kubelet's projected volume: token -> ..data/token, ..data -> ..<timestamp>;
 * rotation writes a new timestamped directory and swaps ..data atomically. */
static void rotate(const char *dir, const char *gen, const char *token)
{
	char d[600], f[700], tmp[600];
	snprintf(d, sizeof(d), "%s/%s", dir, gen);
	CHECK(mkdir(d, 0700) == 0);
	snprintf(f, sizeof(f), "%s/token", d);
	FILE *fp = fopen(f, "w");
	if (fp) {
		fputs(token, fp);
		fclose(fp);
	}
	snprintf(tmp, sizeof(tmp), "%s/..data_tmp", dir);
	CHECK(symlink(gen, tmp) == 0);
	snprintf(d, sizeof(d), "%s/..data", dir);
	CHECK(rename(tmp, d) == 0);
}

static void test_rotation(void)
{
	struct agent_kubeconfig *kc = NULL;
	char dir[] = "/tmp/test_agent_kubeconfig.XXXXXX";
	char p[700], q[700];

	CHECK(mkdtemp(dir) != NULL);
	rotate(dir, "..2024_01_01_00_00_00.1", "token-one\n");
	snprintf(p, sizeof(p), "%s/token", dir);
	CHECK(symlink("..data/token", p) == 0);
	CHECK(write_file(dir, "ca.crt", CA_PEM) == 0);

	CHECK(agent_kubeconfig_in_cluster(dir, &kc, &err) == 0);
	if (kc == NULL) {
		fprintf(stderr, "%s\n", err.msg);
		return;
	}
	CHECK_STR(kc->token, "token-one");
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 0);

	/* Atomic swap: new inode, picked up at once. */
	rotate(dir, "..2024_01_01_01_00_00.2", "token-two\n");
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 1);
	CHECK_STR(kc->token, "token-two");
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 0);

	/* Rewritten in place with the same size and mtime: only the periodic
	 * re-read notices. */
	snprintf(q, sizeof(q), "%s/..2024_01_01_01_00_00.2/token", dir);
	struct stat st;
	CHECK(stat(q, &st) == 0);
	FILE *f = fopen(q, "r+");
	if (f) {
		fputs("token-six", f);
		fclose(f);
	}
	struct timespec times[2] = { st.st_atim, st.st_mtim };
	CHECK(utimensat(AT_FDCWD, q, times, 0) == 0);
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 0);
	CHECK_STR(kc->token, "token-two");
	kc->token_reread_s = 0;
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 1);
	CHECK_STR(kc->token, "token-six");
	/* Re-read with the same content: not a change. */
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == 0);

	/* A bad token file keeps the previous token. */
	rotate(dir, "..2024_01_01_02_00_00.3", "bad token\n");
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == -EINVAL);
	CHECK_STR(kc->token, "token-six");
	CHECK(strstr(err.msg, "bad token") == NULL); /* no secrets in messages */
	unlink(p);
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == -ENOENT);
	CHECK_STR(kc->token, "token-six");
	/* A FIFO in its place is refused without blocking. */
	CHECK(mkfifo(p, 0600) == 0);
	CHECK(agent_kubeconfig_refresh_token(kc, &err) == -EINVAL);
	CHECK_STR(kc->token, "token-six");
	agent_kubeconfig_free(kc);

	CHECK(agent_kubeconfig_refresh_token(NULL, &err) == 0);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK(system(cmd) == 0);
}

int main(void)
{
	test_multi_context();
	test_files_and_precedence();
	test_refused();
	test_bad_base64();
	test_missing();
	test_aliases();
	test_huge();
	test_load_file();
	test_in_cluster();
	test_rotation();
	return test_summary("test_agent_kubeconfig");
}
