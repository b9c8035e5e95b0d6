/* fuzz_kubeconfig: agent_kubeconfig_parse on arbitrary YAML (no file I/O:
 * parse never reads the files a kubeconfig names). */
#include "agent_kubeconfig.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_kubeconfig *kc = NULL;
	struct gcr_err err = { 0, "" };
	int rc = agent_kubeconfig_parse((const char *)data, size, "/base", NULL, &kc, &err);
	if (rc == 0) {
		/* A success always has an https server and some credential. */
		if (kc == NULL || kc->server == NULL || strncmp(kc->server, "https://", 8) != 0 ||
		    (kc->token == NULL && kc->token_file == NULL && kc->client_cert_pem == NULL &&
		     kc->client_cert_file == NULL))
			abort();
		if (kc->ca_pem != NULL && strlen(kc->ca_pem) > kc->ca_pem_len)
			abort();
	} else if (kc != NULL || err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL) {
		abort();
	}
	agent_kubeconfig_free(kc);
	return 0;
}
