/* agent_dpmsg: decoding and validation of the kubelet's device plugin requests, and
 * encoding of the plugin's answers. Pure functions over protobuf-c; fuzzed by fuzz_dpmsg. */
#include "agent_dpmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOT_PREFIX "gcr-slot-"

int agent_dpmsg_slot_index(const char *id, unsigned slots)
{
	size_t plen = sizeof(SLOT_PREFIX) - 1;
	unsigned long v = 0;
	const char *p;

	if (id == NULL || strncmp(id, SLOT_PREFIX, plen) != 0)
		return -EINVAL;
	p = id + plen;
	if (*p == '\0' || (p[0] == '0' && p[1] != '\0') || strlen(p) > 4)
		return -EINVAL;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (unsigned long)(*p - '0');
	}
	return v < slots ? (int)v : -EINVAL;
}

/* Every id valid, none repeated, at most slots of them. */
static int check_ids(char **ids, size_t n, unsigned slots, const char *what, struct gcr_err *err)
{
	unsigned char seen[AGENT_DPMSG_MAX_SLOTS / 8] = { 0 };

	if (n > slots)
		return gcr_err_set(err, -EINVAL, "%s: %zu device ids, at most %u", what, n, slots);
	for (size_t i = 0; i < n; i++) {
		int k = agent_dpmsg_slot_index(ids[i], slots);
		if (k < 0)
			return gcr_err_set(err, -EINVAL, "%s: device id %zu is not one of ours", what,
					   i);
		if (seen[k / 8] & (1u << (k % 8)))
			return gcr_err_set(err, -EINVAL, "%s: device id %s repeated", what, ids[i]);
		seen[k / 8] |= (unsigned char)(1u << (k % 8));
	}
	return 0;
}

static int check_len(size_t len, unsigned slots, struct gcr_err *err)
{
	if (len > AGENT_DPMSG_MAX_BYTES)
		return gcr_err_set(err, -EMSGSIZE, "request of %zu bytes, at most %u", len,
				   AGENT_DPMSG_MAX_BYTES);
	if (slots == 0 || slots > AGENT_DPMSG_MAX_SLOTS)
		return gcr_err_set(err, -EINVAL, "slots %u not in 1..%u", slots,
				   AGENT_DPMSG_MAX_SLOTS);
	return 0;
}

V1beta1__Empty *agent_dpmsg_empty_decode(const uint8_t *buf, size_t len, struct gcr_err *err)
{
	V1beta1__Empty *m;

	if (check_len(len, 1, err) < 0)
		return NULL;
	m = v1beta1__empty__unpack(NULL, len, buf);
	if (m == NULL)
		gcr_err_set(err, -EINVAL, "Empty: does not unpack");
	return m;
}

V1beta1__AllocateRequest *agent_dpmsg_allocate_decode(const uint8_t *buf, size_t len,
						      unsigned slots, struct gcr_err *err)
{
	V1beta1__AllocateRequest *m;

	if (check_len(len, slots, err) < 0)
		return NULL;
	m = v1beta1__allocate_request__unpack(NULL, len, buf);
	if (m == NULL) {
		gcr_err_set(err, -EINVAL, "AllocateRequest: does not unpack");
		return NULL;
	}
	if (m->n_container_requests == 0 || m->n_container_requests > AGENT_DPMSG_MAX_CONTAINERS) {
		gcr_err_set(err, -EINVAL, "AllocateRequest: %zu containers, want 1..%u",
			    m->n_container_requests, AGENT_DPMSG_MAX_CONTAINERS);
		goto fail;
	}
	for (size_t i = 0; i < m->n_container_requests; i++) {
		const V1beta1__ContainerAllocateRequest *c = m->container_requests[i];
		if (c->n_devices_ids == 0) {
			gcr_err_set(err, -EINVAL, "AllocateRequest: container %zu asks for no device",
				    i);
			goto fail;
		}
		if (check_ids(c->devices_ids, c->n_devices_ids, slots, "AllocateRequest", err) < 0)
			goto fail;
	}
	return m;
fail:
	v1beta1__allocate_request__free_unpacked(m, NULL);
	return NULL;
}

/* Every must-include id is among the available ones. */
static int check_subset(const V1beta1__ContainerPreferredAllocationRequest *c, struct gcr_err *err)
{
	for (size_t i = 0; i < c->n_must_include_deviceids; i++) {
		size_t j = 0;
		while (j < c->n_available_deviceids &&
		       strcmp(c->must_include_deviceids[i], c->available_deviceids[j]) != 0)
			j++;
		if (j == c->n_available_deviceids)
			return gcr_err_set(err, -EINVAL,
					   "PreferredAllocationRequest: must-include id %zu not available",
					   i);
	}
	return 0;
}

V1beta1__PreferredAllocationRequest *agent_dpmsg_preferred_decode(const uint8_t *buf, size_t len,
								  unsigned slots,
								  struct gcr_err *err)
{
	V1beta1__PreferredAllocationRequest *m;
	const char *what = "PreferredAllocationRequest";

	if (check_len(len, slots, err) < 0)
		return NULL;
	m = v1beta1__preferred_allocation_request__unpack(NULL, len, buf);
	if (m == NULL) {
		gcr_err_set(err, -EINVAL, "%s: does not unpack", what);
		return NULL;
	}
	if (m->n_container_requests == 0 || m->n_container_requests > AGENT_DPMSG_MAX_CONTAINERS) {
		gcr_err_set(err, -EINVAL, "%s: %zu containers, want 1..%u", what,
			    m->n_container_requests, AGENT_DPMSG_MAX_CONTAINERS);
		goto fail;
	}
	for (size_t i = 0; i < m->n_container_requests; i++) {
		const V1beta1__ContainerPreferredAllocationRequest *c = m->container_requests[i];
		if (check_ids(c->available_deviceids, c->n_available_deviceids, slots, what, err) < 0 ||
		    check_ids(c->must_include_deviceids, c->n_must_include_deviceids, slots, what,
			      err) < 0 ||
		    check_subset(c, err) < 0)
			goto fail;
		if (c->allocation_size < 1 || (size_t)c->allocation_size > c->n_available_deviceids ||
		    (size_t)c->allocation_size < c->n_must_include_deviceids) {
			gcr_err_set(err, -EINVAL, "%s: allocation size %d with %zu available, %zu required",
				    what, (int)c->allocation_size, c->n_available_deviceids,
				    c->n_must_include_deviceids);
			goto fail;
		}
	}
	return m;
fail:
	v1beta1__preferred_allocation_request__free_unpacked(m, NULL);
	return NULL;
}

V1beta1__PreStartContainerRequest *agent_dpmsg_prestart_decode(const uint8_t *buf, size_t len,
							       unsigned slots, struct gcr_err *err)
{
	V1beta1__PreStartContainerRequest *m;

	if (check_len(len, slots, err) < 0)
		return NULL;
	m = v1beta1__pre_start_container_request__unpack(NULL, len, buf);
	if (m == NULL) {
		gcr_err_set(err, -EINVAL, "PreStartContainerRequest: does not unpack");
		return NULL;
	}
	if (check_ids(m->devices_ids, m->n_devices_ids, slots, "PreStartContainerRequest", err) < 0) {
		v1beta1__pre_start_container_request__free_unpacked(m, NULL);
		return NULL;
	}
	return m;
}

void agent_dpmsg_empty_free(V1beta1__Empty *m)
{
	if (m)
		v1beta1__empty__free_unpacked(m, NULL);
}

void agent_dpmsg_allocate_free(V1beta1__AllocateRequest *m)
{
	if (m)
		v1beta1__allocate_request__free_unpacked(m, NULL);
}

void agent_dpmsg_preferred_free(V1beta1__PreferredAllocationRequest *m)
{
	if (m)
		v1beta1__preferred_allocation_request__free_unpacked(m, NULL);
}

void agent_dpmsg_prestart_free(V1beta1__PreStartContainerRequest *m)
{
	if (m)
		v1beta1__pre_start_container_request__free_unpacked(m, NULL);
}

/* Packs any message into a fresh buffer. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);

	if (buf == NULL)
		return NULL;
	*len = protobuf_c_message_pack(m, buf);
	return buf;
}

uint8_t *agent_dpmsg_options_encode(size_t *len)
{
	V1beta1__DevicePluginOptions o = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;

	o.pre_start_required = 0;
	o.get_preferred_allocation_available = 1;
	return pack(&o.base, len);
}

uint8_t *agent_dpmsg_empty_encode(size_t *len)
{
	V1beta1__Empty e = V1BETA1__EMPTY__INIT;

	return pack(&e.base, len);
}

uint8_t *agent_dpmsg_devices_encode(unsigned slots, bool healthy, size_t *len)
{
	V1beta1__ListAndWatchResponse r = V1BETA1__LIST_AND_WATCH_RESPONSE__INIT;
	V1beta1__Device *devs = calloc(slots, sizeof(*devs));
	V1beta1__Device **ptrs = calloc(slots, sizeof(*ptrs));
	char (*ids)[AGENT_DPMSG_MAX_ID + 1] = calloc(slots, sizeof(*ids));
	uint8_t *buf = NULL;

	if (slots > AGENT_DPMSG_MAX_SLOTS || devs == NULL || ptrs == NULL || ids == NULL)
		goto out;
	for (unsigned i = 0; i < slots; i++) {
		v1beta1__device__init(&devs[i]);
		snprintf(ids[i], sizeof(ids[i]), SLOT_PREFIX "%u", i);
		devs[i].id = ids[i];
		devs[i].health = (char *)(healthy ? "Healthy" : "Unhealthy");
		ptrs[i] = &devs[i];
	}
	r.n_devices = slots;
	r.devices = ptrs;
	buf = pack(&r.base, len);
out:
	free(ids);
	free(ptrs);
	free(devs);
	return buf;
}

uint8_t *agent_dpmsg_preferred_encode(const V1beta1__PreferredAllocationRequest *req, size_t *len)
{
	V1beta1__PreferredAllocationResponse r = V1BETA1__PREFERRED_ALLOCATION_RESPONSE__INIT;
	size_t n = req->n_container_requests;
	V1beta1__ContainerPreferredAllocationResponse *cs = calloc(n, sizeof(*cs));
	V1beta1__ContainerPreferredAllocationResponse **ptrs = calloc(n, sizeof(*ptrs));
	uint8_t *buf = NULL;
	size_t i;

	if (n == 0 || cs == NULL || ptrs == NULL)
		goto out;
	for (i = 0; i < n; i++) {
		const V1beta1__ContainerPreferredAllocationRequest *c = req->container_requests[i];
		size_t want = (size_t)c->allocation_size, k = 0;

		v1beta1__container_preferred_allocation_response__init(&cs[i]);
		ptrs[i] = &cs[i];
		cs[i].deviceids = calloc(want ? want : 1, sizeof(char *));
		if (cs[i].deviceids == NULL)
			goto out;
		for (size_t j = 0; j < c->n_must_include_deviceids && k < want; j++)
			cs[i].deviceids[k++] = c->must_include_deviceids[j];
		for (size_t j = 0; j < c->n_available_deviceids && k < want; j++) {
			size_t m = 0;
			while (m < c->n_must_include_deviceids &&
			       strcmp(c->must_include_deviceids[m], c->available_deviceids[j]) != 0)
				m++;
			if (m == c->n_must_include_deviceids)
				cs[i].deviceids[k++] = c->available_deviceids[j];
		}
		cs[i].n_deviceids = k;
	}
	r.n_container_responses = n;
	r.container_responses = ptrs;
	buf = pack(&r.base, len);
out:
	for (i = 0; cs && i < n; i++)
		free(cs[i].deviceids);
	free(ptrs);
	free(cs);
	return buf;
}

/* The storage of one container response; fixed counts, so no allocation per field. */
struct alloc_resp {
	V1beta1__ContainerAllocateResponse r;
	V1beta1__ContainerAllocateResponse__EnvsEntry env[4 + AGENT_DPMSG_MAX_EXTRA_ENV];
	V1beta1__ContainerAllocateResponse__EnvsEntry *envp[4 + AGENT_DPMSG_MAX_EXTRA_ENV];
	V1beta1__Mount mnt[4];
	V1beta1__Mount *mntp[4];
	V1beta1__CDIDevice cdi;
	V1beta1__CDIDevice *cdip[1];
	char preload[512]; /* <shim container dir>/libgcr.so; the agent checks dirs < 100 bytes */
};

static void env_set(struct alloc_resp *a, size_t i, const char *key, const char *value)
{
	v1beta1__container_allocate_response__envs_entry__init(&a->env[i]);
	a->env[i].key = (char *)key;
	a->env[i].value = (char *)value;
	a->envp[i] = &a->env[i];
}

static void mount_set(struct alloc_resp *a, size_t i, const char *host, const char *cont, bool ro)
{
	v1beta1__mount__init(&a->mnt[i]);
	a->mnt[i].host_path = (char *)host;
	a->mnt[i].container_path = (char *)cont;
	a->mnt[i].read_only = ro;
	a->mntp[i] = &a->mnt[i];
}

uint8_t *agent_dpmsg_allocate_encode(const struct agent_dpmsg_alloc *allocs, size_t n,
				     size_t *len)
{
	V1beta1__AllocateResponse r = V1BETA1__ALLOCATE_RESPONSE__INIT;
	struct alloc_resp *as = calloc(n, sizeof(*as));
	V1beta1__ContainerAllocateResponse **ptrs = calloc(n, sizeof(*ptrs));
	uint8_t *buf = NULL;

	if (n == 0 || as == NULL || ptrs == NULL)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const struct agent_dpmsg_alloc *al = &allocs[i];
		struct alloc_resp *a = &as[i];

		if (al->n_extra_env > AGENT_DPMSG_MAX_EXTRA_ENV)
			goto out;

		v1beta1__container_allocate_response__init(&a->r);
		snprintf(a->preload, sizeof(a->preload), "%s/libgcr.so", al->shim_container_dir);
		env_set(a, 0, "LD_PRELOAD", a->preload);
		env_set(a, 1, "GCR_SOCKET_DIR", al->sock_container_dir);
		env_set(a, 2, "GCR_AGENT_SOCKET", al->agent_container_socket);
		for (size_t e = 0; e < al->n_extra_env; e++)
			env_set(a, 3 + e, al->extra_env[2 * e], al->extra_env[2 * e + 1]);
		a->r.n_envs = 3 + al->n_extra_env;
		if (al->image_dir != NULL)
			env_set(a, a->r.n_envs++, AGENT_DPMSG_IMAGE_DIR_ENV, al->image_dir);
		a->r.envs = a->envp;
		mount_set(a, 0, al->shim_host_dir, al->shim_container_dir, true);
		mount_set(a, 1, al->sock_host_dir, al->sock_container_dir, false);
		mount_set(a, 2, al->agent_host_dir, al->agent_container_dir, true);
		a->r.n_mounts = 3;
		if (al->image_dir != NULL)
			mount_set(a, a->r.n_mounts++, al->image_dir, al->image_dir, false);
		a->r.mounts = a->mntp;
		if (al->cdi_device != NULL && al->cdi_device[0] != '\0') {
			v1beta1__cdidevice__init(&a->cdi);
			a->cdi.name = (char *)al->cdi_device;
			a->cdip[0] = &a->cdi;
			a->r.n_cdi_devices = 1;
			a->r.cdi_devices = a->cdip;
		}
		ptrs[i] = &a->r;
	}
	r.n_container_responses = n;
	r.container_responses = ptrs;
	buf = pack(&r.base, len);
out:
	free(ptrs);
	free(as);
	return buf;
}

uint8_t *agent_dpmsg_register_encode(const char *endpoint, const char *resource_name,
				     size_t *len)
{
	V1beta1__RegisterRequest r = V1BETA1__REGISTER_REQUEST__INIT;
	V1beta1__DevicePluginOptions o = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;

	o.get_preferred_allocation_available = 1;
	r.version = (char *)"v1beta1";
	r.endpoint = (char *)endpoint;
	r.resource_name = (char *)resource_name;
	r.options = &o;
	return pack(&r.base, len);
}
