/* agent_regtls: the TLS identity of the node's checkpoint-image registry (agent_ocireg), so that
 * containerd pulls only from this agent: a certificate authority made at every agent start
 * (its key never leaves the agent's memory), the registry's server certificate for 127.0.0.1,
 * and the one client certificate the registry accepts, handed to containerd with the CA in its
 * registry host directory (hosts.toml: docs/install.md, "The image registry"). */
#ifndef AGENT_REGTLS_H
#define AGENT_REGTLS_H

#include <gnutls/gnutls.h>

#include "gcr_error.h"

/* containerd's name for a registry's host directory: "<config_path>/<host>_<port>_", the
 * first of the names it tries (core/remotes/docker/config, hostPaths). */
#define AGENT_REGTLS_HOSTS_TOML "hosts.toml"
/* Certificates are valid this long (seconds): the authority is new at every start anyway. */
#define AGENT_REGTLS_VALID_S (10LL * 365 * 24 * 3600)

struct agent_regtls;

/* A new authority, server certificate (IP SAN 127.0.0.1) and client certificate, ECDSA P-256.
 * what names the node in the subjects. 0 or -errno with a message. */
int agent_regtls_new(const char *what, struct agent_regtls **out, struct gcr_err *err)
	__attribute__((warn_unused_result));
void agent_regtls_free(struct agent_regtls *t);

/* Writes containerd's registry host configuration for https://127.0.0.1:port into dir (the
 * host directory, "<config_path>/127.0.0.1_<port>_", as this process sees it): the CA and the
 * client pair in a new "gen-<random>/" (files 0600), then hosts.toml naming them (relative
 * paths: containerd resolves them against dir) by an atomic rename, then removes older
 * gen-* directories. containerd reads the files at every pull. 0 or -errno. */
int agent_regtls_write_hosts(const struct agent_regtls *t, const char *dir, int port, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* hosts.toml's text for port with the generation directory gen (for tests and the docs). */
int agent_regtls_hosts_toml(int port, const char *gen, char *out, size_t len);

/* The server's credentials (owned by t): certificate and key, and the CA that client
 * certificates must chain to. */
gnutls_certificate_credentials_t agent_regtls_cred(const struct agent_regtls *t);

/* After a server handshake: 0 when the peer presented a certificate of this authority for
 * client authentication, else -EACCES with why. */
int agent_regtls_check_client(gnutls_session_t s, struct gcr_err *err) __attribute__((warn_unused_result));

/* PEM texts (owned by t): for tests, which act as containerd. */
const char *agent_regtls_ca_pem(const struct agent_regtls *t);
const char *agent_regtls_client_cert_pem(const struct agent_regtls *t);
const char *agent_regtls_client_key_pem(const struct agent_regtls *t);

#endif
