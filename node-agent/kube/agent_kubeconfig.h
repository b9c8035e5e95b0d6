/* agent_kubeconfig: where the Kubernetes API is and how to authenticate to it,
 * from a kubeconfig file or from the in-cluster service account; token rotation. */
#ifndef AGENT_KUBECONFIG_H
#define AGENT_KUBECONFIG_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#include "gcr_error.h"

/* A kubeconfig is a few KiB; 4 MiB leaves room for many clusters and long
 * certificate chains while keeping a hostile file from eating memory. */
#define AGENT_KUBECONFIG_MAX_FILE (4u * 1024 * 1024)
/* Any single value (base64 certificate data included), in bytes. */
#define AGENT_KUBECONFIG_MAX_VALUE (1024u * 1024)
/* Bearer tokens (service account JWTs are ~1 KiB) and token files. */
#define AGENT_KUBECONFIG_MAX_TOKEN (64u * 1024)
/* Default re-read period for the token file even when it looks unchanged,
 * in seconds: kubelet rotates projected tokens well before they expire. */
#define AGENT_KUBECONFIG_TOKEN_REREAD_S 60
/* Service account mount of every pod. */
#define AGENT_KUBECONFIG_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

struct agent_kubeconfig {
	char *server;          /* "https://host[:port][/path]", no trailing '/' */
	char *tls_server_name; /* SNI / verification name, NULL for the URL's host */
	/* Exactly one of ca_pem / ca_file is set, or neither (system CAs). PEM
	 * buffers are NUL-terminated; the length excludes the NUL. */
	char *ca_pem;
	size_t ca_pem_len;
	char *ca_file;
	char *client_cert_pem; /* client certificate: PEM or path, or neither */
	size_t client_cert_pem_len;
	char *client_cert_file;
	char *client_key_pem; /* client key: set exactly when the certificate is */
	size_t client_key_pem_len;
	char *client_key_file;
	char *token;      /* bearer token (without "Bearer "), NULL if none */
	char *token_file; /* re-read by agent_kubeconfig_refresh_token */
	char *namespace;  /* context's namespace, or the pod's; NULL if unset */

	/* Seconds after which refresh re-reads token_file even when it looks
	 * unchanged (AGENT_KUBECONFIG_TOKEN_REREAD_S; 0: on every call). */
	int token_reread_s;
	/* Token file state for refresh; callers leave these alone. */
	struct timespec token_mtime;
	off_t token_size;
	dev_t token_dev;
	ino_t token_ino;
	struct timespec token_read_at; /* CLOCK_MONOTONIC */
};

/* Parses kubeconfig text (len bytes). No file I/O: relative paths are joined
 * to base_dir (the kubeconfig's directory; NULL leaves them relative) and
 * token_file is not read (see agent_kubeconfig_refresh_token). context names
 * the context to use, NULL for current-context. Refuses what we cannot honour:
 * insecure-skip-tls-verify, non-https servers, exec and auth-provider plugins. */
int agent_kubeconfig_parse(const char *text, size_t len, const char *base_dir, const char *context,
			   struct agent_kubeconfig **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Reads and parses the kubeconfig at path, then reads its token file if any. */
int agent_kubeconfig_load_file(const char *path, const char *context, struct agent_kubeconfig **out,
			       struct gcr_err *err) __attribute__((warn_unused_result));

/* In-cluster configuration: server from KUBERNETES_SERVICE_HOST/PORT, and
 * token, ca.crt and namespace from sa_dir (NULL: AGENT_KUBECONFIG_SA_DIR).
 * The token is kept as token_file so that rotation is picked up. */
int agent_kubeconfig_in_cluster(const char *sa_dir, struct agent_kubeconfig **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Re-reads token_file when its mtime, size or inode changed (kubelet swaps a
 * symlink), or token_reread_s seconds passed since the last read. Returns 1
 * when the token changed, 0 when not (or no token file), negative errno on
 * error; on error the previous token is kept. */
int agent_kubeconfig_refresh_token(struct agent_kubeconfig *kc, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* NULL-safe; wipes secrets before freeing them. */
void agent_kubeconfig_free(struct agent_kubeconfig *kc);

#endif
