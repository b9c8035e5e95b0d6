/* agent_regtls: the registry's TLS identity. Why TLS with a client certificate: containerd
 * falls back to plain HTTP for a loopback registry it has no host configuration for, so any
 * process that takes 127.0.0.1:<port> first (a hostNetwork pod while the agent restarts)
 * would receive every pull, its token, and could serve its own image. With hosts.toml naming
 * "https://" and a CA of its own, containerd talks TLS only and trusts only a server holding
 * this authority's key, which exists only in this process (a new one at every start); with the
 * client certificate, the registry in turn talks only to whoever can read containerd's host
 * directory (root on the node), so an unauthenticated connection is never more than a
 * handshake the server may drop (agent_ocisrv). */
#include "agent_regtls.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct agent_regtls {
	gnutls_x509_privkey_t ca_key, srv_key, cli_key;
	gnutls_x509_crt_t ca, srv, cli;
	gnutls_certificate_credentials_t cred;
	char *ca_pem, *cli_pem, *cli_key_pem;
};

static int tls_fail(struct gcr_err *err, int rc, const char *what)
{
	return gcr_err_set(err, rc == GNUTLS_E_MEMORY_ERROR ? -ENOMEM : -EIO, "TLS %s: %s", what, gnutls_strerror(rc));
}

static char *pem_dup(gnutls_datum_t *d)
{
	char *s = malloc(d->size + 1);
	if (s != NULL) {
		memcpy(s, d->data, d->size);
		s[d->size] = '\0';
	}
	gnutls_free(d->data);
	d->data = NULL;
	return s;
}

/* One certificate: subject CN cn, key key, signed by (issuer, ikey), or self-signed when issuer
 * is NULL (the authority). kp: the extended key purpose OID (NULL for the authority). */
static int make_cert(gnutls_x509_crt_t *out, gnutls_x509_privkey_t key, const char *cn, gnutls_x509_crt_t issuer,
		     gnutls_x509_privkey_t ikey, const char *kp, int ip_san, struct gcr_err *err)
{
	gnutls_x509_crt_t c;
	unsigned char serial[16], kid[64];
	size_t kidlen = sizeof(kid);
	int rc = gnutls_x509_crt_init(&c);
	if (rc < 0)
		return tls_fail(err, rc, "certificate");
	if (getrandom(serial, sizeof(serial), 0) != (ssize_t)sizeof(serial)) {
		gnutls_x509_crt_deinit(c);
		return gcr_err_set(err, -EAGAIN, "getrandom: %s", strerror(errno));
	}
	serial[0] &= 0x7f; /* a positive serial */
	time_t now = time(NULL);
	const char *step = "version";
	rc = gnutls_x509_crt_set_version(c, 3);
	if (rc >= 0 && (step = "serial"))
		rc = gnutls_x509_crt_set_serial(c, serial, sizeof(serial));
	if (rc >= 0 && (step = "validity"))
		rc = gnutls_x509_crt_set_activation_time(c, now - 3600);
	if (rc >= 0)
		rc = gnutls_x509_crt_set_expiration_time(c, (time_t)(now + AGENT_REGTLS_VALID_S));
	if (rc >= 0 && (step = "subject"))
		rc = gnutls_x509_crt_set_dn_by_oid(c, GNUTLS_OID_X520_COMMON_NAME, 0, cn, (unsigned int)strlen(cn));
	if (rc >= 0 && (step = "key"))
		rc = gnutls_x509_crt_set_key(c, key);
	if (rc >= 0 && (step = "key id") && (rc = gnutls_x509_privkey_get_key_id(key, 0, kid, &kidlen)) >= 0)
		rc = gnutls_x509_crt_set_subject_key_id(c, kid, kidlen);
	if (rc >= 0 && (step = "constraints"))
		rc = gnutls_x509_crt_set_basic_constraints(c, issuer == NULL, issuer == NULL ? 0 : -1);
	if (rc >= 0 && (step = "key usage"))
		rc = gnutls_x509_crt_set_key_usage(c, issuer == NULL ? GNUTLS_KEY_KEY_CERT_SIGN | GNUTLS_KEY_CRL_SIGN
								      : GNUTLS_KEY_DIGITAL_SIGNATURE);
	if (rc >= 0 && kp != NULL && (step = "key purpose"))
		rc = gnutls_x509_crt_set_key_purpose_oid(c, kp, 1);
	if (rc >= 0 && ip_san && (step = "subject alt name")) {
		static const unsigned char lo[4] = { 127, 0, 0, 1 };
		rc = gnutls_x509_crt_set_subject_alt_name(c, GNUTLS_SAN_IPADDRESS, lo, sizeof(lo), GNUTLS_FSAN_SET);
	}
	if (rc >= 0 && issuer != NULL && (step = "authority key id")) {
		kidlen = sizeof(kid);
		if ((rc = gnutls_x509_privkey_get_key_id(ikey, 0, kid, &kidlen)) >= 0)
			rc = gnutls_x509_crt_set_authority_key_id(c, kid, kidlen);
	}
	if (rc >= 0 && (step = "signature"))
		rc = gnutls_x509_crt_sign2(c, issuer != NULL ? issuer : c, issuer != NULL ? ikey : key, GNUTLS_DIG_SHA256,
					   0);
	if (rc < 0) {
		gnutls_x509_crt_deinit(c);
		return tls_fail(err, rc, step);
	}
	*out = c;
	return 0;
}

static int make_key(gnutls_x509_privkey_t *k, struct gcr_err *err)
{
	int rc = gnutls_x509_privkey_init(k);
	if (rc >= 0)
		rc = gnutls_x509_privkey_generate(*k, GNUTLS_PK_ECDSA, GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0);
	return rc < 0 ? tls_fail(err, rc, "key generation") : 0;
}

int agent_regtls_new(const char *what, struct agent_regtls **out, struct gcr_err *err)
{
	*out = NULL;
	struct agent_regtls *t = calloc(1, sizeof(*t));
	if (t == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	char cn[200];
	snprintf(cn, sizeof(cn), "gcr-agent image registry CA (%.120s)", what);
	gnutls_datum_t d = { 0 };
	int rc = make_key(&t->ca_key, err);
	if (rc == 0)
		rc = make_key(&t->srv_key, err);
	if (rc == 0)
		rc = make_key(&t->cli_key, err);
	if (rc == 0)
		rc = make_cert(&t->ca, t->ca_key, cn, NULL, NULL, NULL, 0, err);
	if (rc == 0)
		rc = make_cert(&t->srv, t->srv_key, "127.0.0.1", t->ca, t->ca_key, GNUTLS_KP_TLS_WWW_SERVER, 1, err);
	if (rc == 0)
		rc = make_cert(&t->cli, t->cli_key, "containerd (gcr-agent image registry client)", t->ca, t->ca_key,
			       GNUTLS_KP_TLS_WWW_CLIENT, 0, err);
	int g = 0;
	if (rc == 0 && (g = gnutls_certificate_allocate_credentials(&t->cred)) >= 0 &&
	    (g = gnutls_certificate_set_x509_key(t->cred, &t->srv, 1, t->srv_key)) >= 0)
		g = gnutls_certificate_set_x509_trust(t->cred, &t->ca, 1);
	if (rc == 0 && g < 0)
		rc = tls_fail(err, g, "credentials");
	if (rc == 0 && (g = gnutls_x509_crt_export2(t->ca, GNUTLS_X509_FMT_PEM, &d)) >= 0)
		t->ca_pem = pem_dup(&d);
	if (rc == 0 && g >= 0 && (g = gnutls_x509_crt_export2(t->cli, GNUTLS_X509_FMT_PEM, &d)) >= 0)
		t->cli_pem = pem_dup(&d);
	if (rc == 0 && g >= 0 &&
	    (g = gnutls_x509_privkey_export2_pkcs8(t->cli_key, GNUTLS_X509_FMT_PEM, NULL, GNUTLS_PKCS_PLAIN, &d)) >= 0)
		t->cli_key_pem = pem_dup(&d);
	if (rc == 0 && (g < 0 || t->ca_pem == NULL || t->cli_pem == NULL || t->cli_key_pem == NULL))
		rc = g < 0 ? tls_fail(err, g, "export") : gcr_err_set(err, -ENOMEM, "out of memory");
	if (rc < 0) {
		agent_regtls_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void agent_regtls_free(struct agent_regtls *t)
{
	if (t == NULL)
		return;
	if (t->cred != NULL)
		gnutls_certificate_free_credentials(t->cred);
	gnutls_x509_crt_t crts[] = { t->ca, t->srv, t->cli };
	gnutls_x509_privkey_t keys[] = { t->ca_key, t->srv_key, t->cli_key };
	for (size_t i = 0; i < 3; i++) {
		if (crts[i] != NULL)
			gnutls_x509_crt_deinit(crts[i]);
		if (keys[i] != NULL)
			gnutls_x509_privkey_deinit(keys[i]);
	}
	if (t->cli_key_pem != NULL) /* containerd's copy is on disk; this one goes */
		explicit_bzero(t->cli_key_pem, strlen(t->cli_key_pem));
	free(t->ca_pem);
	free(t->cli_pem);
	free(t->cli_key_pem);
	free(t);
}

gnutls_certificate_credentials_t agent_regtls_cred(const struct agent_regtls *t)
{
	return t->cred;
}

const char *agent_regtls_ca_pem(const struct agent_regtls *t)
{
	return t->ca_pem;
}

const char *agent_regtls_client_cert_pem(const struct agent_regtls *t)
{
	return t->cli_pem;
}

const char *agent_regtls_client_key_pem(const struct agent_regtls *t)
{
	return t->cli_key_pem;
}

int agent_regtls_check_client(gnutls_session_t s, struct gcr_err *err)
{
	unsigned int status = 0, n = 0;
	if (gnutls_certificate_type_get(s) != GNUTLS_CRT_X509 || gnutls_certificate_get_peers(s, &n) == NULL || n == 0)
		return gcr_err_set(err, -EACCES, "no client certificate");
	/* The chain to this authority, and the purpose: the server's own certificate (same CA)
	 * is not a client's. */
	gnutls_typed_vdata_st purpose = { .type = GNUTLS_DT_KEY_PURPOSE_OID,
					   .data = (unsigned char *)GNUTLS_KP_TLS_WWW_CLIENT };
	int rc = gnutls_certificate_verify_peers(s, &purpose, 1, &status);
	if (rc < 0)
		return gcr_err_set(err, -EACCES, "client certificate not verified: %s", gnutls_strerror(rc));
	if (status != 0) {
		gnutls_datum_t why = { 0 };
		char msg[160] = "?";
		if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why, 0) >= 0) {
			snprintf(msg, sizeof(msg), "%.*s", (int)why.size, (const char *)why.data);
			gnutls_free(why.data);
		}
		return gcr_err_set(err, -EACCES, "client certificate refused: %s", msg);
	}
	return 0;
}

int agent_regtls_hosts_toml(int port, const char *gen, char *out, size_t len)
{
	int n = snprintf(out, len,
			 "# Written by gcr-agent at its start (docs/install.md, \"The image registry\"): containerd\n"
			 "# pulls checkpoint images from this node's agent over TLS only, trusting only the\n"
			 "# agent's own authority, and shows the client certificate only the agent accepts.\n"
			 "server = \"https://127.0.0.1:%d\"\n"
			 "capabilities = [\"pull\", \"resolve\"]\n"
			 "skip_verify = false\n"
			 "ca = \"%s/ca.pem\"\n"
			 "client = [[\"%s/client.pem\", \"%s/client-key.pem\"]]\n",
			 port, gen, gen, gen);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int write_at(int dfd, const char *name, const char *text, struct gcr_err *err)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot create %s: %s", name, strerror(errno));
	size_t n = strlen(text), off = 0;
	int rc = 0;
	while (rc == 0 && off < n) {
		ssize_t w = write(fd, text + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			rc = gcr_err_set(err, -errno, "writing %s: %s", name, strerror(errno));
		else
			off += (size_t)w;
	}
	if (rc == 0 && fsync(fd) < 0)
		rc = gcr_err_set(err, -errno, "fsync of %s: %s", name, strerror(errno));
	close(fd);
	return rc;
}

/* Removes dir/name/ (flat) unless it is keep. */
static void remove_gen(int dfd, const char *name)
{
	int g = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = g < 0 ? NULL : fdopendir(g);
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			(void)unlinkat(g, de->d_name, 0);
	if (d != NULL)
		closedir(d);
	else if (g >= 0)
		close(g);
	(void)unlinkat(dfd, name, AT_REMOVEDIR);
}

int agent_regtls_write_hosts(const struct agent_regtls *t, const char *dir, int port, struct gcr_err *err)
{
	unsigned char r[8];
	char gen[32], text[1024], name[64];
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return gcr_err_set(err, -EAGAIN, "getrandom: %s", strerror(errno));
	snprintf(gen, sizeof(gen), "gen-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
	if (agent_regtls_hosts_toml(port, gen, text, sizeof(text)) < 0)
		return gcr_err_set(err, -ENAMETOOLONG, "hosts.toml too long");
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return gcr_err_set(err, -errno, "containerd's registry host directory %s: %s", dir, strerror(errno));
	int rc = 0;
	if (mkdirat(dfd, gen, 0700) < 0)
		rc = gcr_err_set(err, -errno, "cannot create %s/%s: %s", dir, gen, strerror(errno));
	int gfd = rc == 0 ? openat(dfd, gen, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
	if (rc == 0 && gfd < 0)
		rc = gcr_err_set(err, -errno, "cannot open %s/%s: %s", dir, gen, strerror(errno));
	if (rc == 0)
		rc = write_at(gfd, "ca.pem", t->ca_pem, err);
	if (rc == 0)
		rc = write_at(gfd, "client.pem", t->cli_pem, err);
	if (rc == 0)
		rc = write_at(gfd, "client-key.pem", t->cli_key_pem, err);
	if (rc == 0 && fsync(gfd) < 0)
		rc = gcr_err_set(err, -errno, "fsync of %s/%s: %s", dir, gen, strerror(errno));
	if (gfd >= 0)
		close(gfd);
	/* The switch: one rename, so a pull reads the old set or the new one, never a mix. */
	snprintf(name, sizeof(name), ".%s.tmp", AGENT_REGTLS_HOSTS_TOML);
	(void)unlinkat(dfd, name, 0);
	if (rc == 0)
		rc = write_at(dfd, name, text, err);
	if (rc == 0 && renameat(dfd, name, dfd, AGENT_REGTLS_HOSTS_TOML) < 0)
		rc = gcr_err_set(err, -errno, "cannot rename %s/%s: %s", dir, name, strerror(errno));
	if (rc == 0 && fsync(dfd) < 0)
		rc = gcr_err_set(err, -errno, "fsync of %s: %s", dir, strerror(errno));
	/* Older generations (their authority died with the agent that made it), or this one
	 * when it was not switched to. */
	DIR *d = fdopendir(dup(dfd));
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL)
		if (strncmp(de->d_name, "gen-", 4) == 0 && (rc < 0 || strcmp(de->d_name, gen) != 0))
			remove_gen(dfd, de->d_name);
	if (d != NULL)
		closedir(d);
	close(dfd);
	return rc;
}
