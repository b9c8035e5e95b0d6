/* fuzz_dpmsg: the device plugin's request decoding (protobuf-c unpack plus agent_dpmsg's
 * validation) on arbitrary bytes; accepted requests must satisfy the checks and re-encode. */
#include "agent_dpmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void ids_ok(char **ids, size_t n, unsigned slots)
{
	if (n > slots)
		abort();
	for (size_t i = 0; i < n; i++)
		if (agent_dpmsg_slot_index(ids[i], slots) < 0)
			abort();
}

static void err_ok(const struct gcr_err *err)
{
	if (err->code >= 0 || err->msg[0] == '\0' || strchr(err->msg, '\n') != NULL)
		abort();
}

/* The first byte picks the request type, the second the slot count; the rest is the message. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_err err = { 0, "" };
	unsigned slots;
	size_t len = 0;
	uint8_t *out = NULL;

	if (size < 2)
		return 0;
	slots = 1 + data[1] % 64;
	switch (data[0] % 4) {
	case 0: {
		V1beta1__Empty *m = agent_dpmsg_empty_decode(data + 2, size - 2, &err);
		if (m == NULL)
			err_ok(&err);
		agent_dpmsg_empty_free(m);
		break;
	}
	case 1: {
		V1beta1__AllocateRequest *m = agent_dpmsg_allocate_decode(data + 2, size - 2, slots, &err);
		struct agent_dpmsg_alloc a[AGENT_DPMSG_MAX_CONTAINERS];
		if (m == NULL) {
			err_ok(&err);
			break;
		}
		if (m->n_container_requests == 0 || m->n_container_requests > AGENT_DPMSG_MAX_CONTAINERS)
			abort();
		for (size_t i = 0; i < m->n_container_requests; i++) {
			if (m->container_requests[i]->n_devices_ids == 0)
				abort();
			ids_ok(m->container_requests[i]->devices_ids,
			       m->container_requests[i]->n_devices_ids, slots);
			a[i] = (struct agent_dpmsg_alloc){ "/h/shim", "/c/shim", "/h/sock", "/c/sock",
							   "/h/agent", "/c/agent", "/c/agent/a.sock",
							   i % 2 ? "gpucr.dev/shim=all" : NULL, NULL, 0 };
		}
		out = agent_dpmsg_allocate_encode(a, m->n_container_requests, &len);
		if (out == NULL)
			abort();
		agent_dpmsg_allocate_free(m);
		break;
	}
	case 2: {
		V1beta1__PreferredAllocationRequest *m =
			agent_dpmsg_preferred_decode(data + 2, size - 2, slots, &err);
		V1beta1__PreferredAllocationResponse *r;
		if (m == NULL) {
			err_ok(&err);
			break;
		}
		for (size_t i = 0; i < m->n_container_requests; i++) {
			const V1beta1__ContainerPreferredAllocationRequest *c = m->container_requests[i];
			ids_ok(c->available_deviceids, c->n_available_deviceids, slots);
			ids_ok(c->must_include_deviceids, c->n_must_include_deviceids, slots);
		}
		out = agent_dpmsg_preferred_encode(m, &len);
		if (out == NULL)
			abort();
		/* The answer holds allocation_size available ids per container. */
		r = v1beta1__preferred_allocation_response__unpack(NULL, len, out);
		if (r == NULL || r->n_container_responses != m->n_container_requests)
			abort();
		for (size_t i = 0; i < r->n_container_responses; i++)
			if (r->container_responses[i]->n_deviceids !=
			    (size_t)m->container_requests[i]->allocation_size)
				abort();
		v1beta1__preferred_allocation_response__free_unpacked(r, NULL);
		agent_dpmsg_preferred_free(m);
		break;
	}
	default: {
		V1beta1__PreStartContainerRequest *m =
			agent_dpmsg_prestart_decode(data + 2, size - 2, slots, &err);
		if (m == NULL)
			err_ok(&err);
		else
			ids_ok(m->devices_ids, m->n_devices_ids, slots);
		agent_dpmsg_prestart_free(m);
		break;
	}
	}
	free(out);
	return 0;
}
