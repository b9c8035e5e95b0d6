/* test_agent_dpmsg: the device plugin's message checks: slot ids, request validation
 * (counts, ids, repeats, sizes) and what the answers carry. */
#include "agent_dpmsg.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>

/* Packs an AllocateRequest with one container per ids[i] (a NULL-terminated list each). */
static uint8_t *pack_allocate(char **ids[], size_t n, size_t *len)
{
	V1beta1__AllocateRequest r = V1BETA1__ALLOCATE_REQUEST__INIT;
	V1beta1__ContainerAllocateRequest c[AGENT_DPMSG_MAX_CONTAINERS + 1];
	V1beta1__ContainerAllocateRequest *cp[AGENT_DPMSG_MAX_CONTAINERS + 1];
	uint8_t *buf;

	for (size_t i = 0; i < n; i++) {
		v1beta1__container_allocate_request__init(&c[i]);
		c[i].devices_ids = ids[i];
		while (ids[i][c[i].n_devices_ids])
			c[i].n_devices_ids++;
		cp[i] = &c[i];
	}
	r.n_container_requests = n;
	r.container_requests = cp;
	*len = v1beta1__allocate_request__get_packed_size(&r);
	buf = malloc(*len + 1);
	v1beta1__allocate_request__pack(&r, buf);
	return buf;
}

static int allocate_rc(char **ids[], size_t n, unsigned slots)
{
	struct gcr_err err = { 0 };
	size_t len;
	uint8_t *buf = pack_allocate(ids, n, &len);
	V1beta1__AllocateRequest *m = agent_dpmsg_allocate_decode(buf, len, slots, &err);

	free(buf);
	agent_dpmsg_allocate_free(m);
	return m ? 0 : err.code;
}

static void test_slot_index(void)
{
	CHECK(agent_dpmsg_slot_index("gcr-slot-0", 4) == 0);
	CHECK(agent_dpmsg_slot_index("gcr-slot-3", 4) == 3);
	CHECK(agent_dpmsg_slot_index("gcr-slot-4", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index("gcr-slot-1023", 1024) == 1023);
	CHECK(agent_dpmsg_slot_index("gcr-slot-01", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index("gcr-slot-", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index("gcr-slot-1x", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index("gcr-slot-99999999999999999999", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index("nvidia0", 4) == -EINVAL);
	CHECK(agent_dpmsg_slot_index(NULL, 4) == -EINVAL);
}

static void test_allocate_decode(void)
{
	char *one[] = { "gcr-slot-0", NULL }, *two[] = { "gcr-slot-1", "gcr-slot-2", NULL };
	char *rep[] = { "gcr-slot-1", "gcr-slot-1", NULL }, *bad[] = { "gcr-slot-9", NULL };
	char *none[] = { NULL };
	char **ok[] = { one, two }, **r1[] = { rep }, **b1[] = { bad }, **n1[] = { none };
	char **many[AGENT_DPMSG_MAX_CONTAINERS + 1];
	struct gcr_err err = { 0 };
	uint8_t junk[] = { 0x0a, 0xff, 0xff, 0xff };

	for (size_t i = 0; i <= AGENT_DPMSG_MAX_CONTAINERS; i++)
		many[i] = one;
	CHECK(allocate_rc(ok, 2, 4) == 0);
	CHECK(allocate_rc(ok, 0, 4) == -EINVAL);
	CHECK(allocate_rc(r1, 1, 4) == -EINVAL);
	CHECK(allocate_rc(b1, 1, 4) == -EINVAL);
	CHECK(allocate_rc(n1, 1, 4) == -EINVAL);
	CHECK(allocate_rc(many, AGENT_DPMSG_MAX_CONTAINERS, 4) == 0);
	CHECK(allocate_rc(many, AGENT_DPMSG_MAX_CONTAINERS + 1, 4) == -EINVAL);
	CHECK(agent_dpmsg_allocate_decode(junk, sizeof(junk), 4, &err) == NULL && err.code == -EINVAL);
	CHECK(agent_dpmsg_allocate_decode(junk, AGENT_DPMSG_MAX_BYTES + 1, 4, &err) == NULL &&
	      err.code == -EMSGSIZE);
	CHECK(agent_dpmsg_allocate_decode(junk, 0, 0, &err) == NULL && err.code == -EINVAL);
}

static V1beta1__PreferredAllocationRequest *preferred(char **avail, size_t na, char **must,
						      size_t nm, int size, struct gcr_err *err)
{
	V1beta1__PreferredAllocationRequest r = V1BETA1__PREFERRED_ALLOCATION_REQUEST__INIT;
	V1beta1__ContainerPreferredAllocationRequest c =
		V1BETA1__CONTAINER_PREFERRED_ALLOCATION_REQUEST__INIT, *cp = &c;
	uint8_t buf[4096];
	size_t len;

	c.available_deviceids = avail;
	c.n_available_deviceids = na;
	c.must_include_deviceids = must;
	c.n_must_include_deviceids = nm;
	c.allocation_size = size;
	r.n_container_requests = 1;
	r.container_requests = &cp;
	len = v1beta1__preferred_allocation_request__pack(&r, buf);
	return agent_dpmsg_preferred_decode(buf, len, 4, err);
}

static void test_preferred(void)
{
	char *avail[] = { "gcr-slot-0", "gcr-slot-1", "gcr-slot-2" }, *must[] = { "gcr-slot-2" };
	char *absent[] = { "gcr-slot-3" };
	struct gcr_err err = { 0 };
	V1beta1__PreferredAllocationRequest *m = preferred(avail, 3, must, 1, 2, &err);
	V1beta1__PreferredAllocationResponse *r = NULL;
	size_t len = 0;
	uint8_t *out;

	CHECK(m != NULL);
	if (m) {
		out = agent_dpmsg_preferred_encode(m, &len);
		r = out ? v1beta1__preferred_allocation_response__unpack(NULL, len, out) : NULL;
		CHECK(r != NULL && r->n_container_responses == 1 &&
		      r->container_responses[0]->n_deviceids == 2);
		if (r && r->container_responses[0]->n_deviceids == 2) {
			CHECK_STR(r->container_responses[0]->deviceids[0], "gcr-slot-2");
			CHECK_STR(r->container_responses[0]->deviceids[1], "gcr-slot-0");
		}
		if (r)
			v1beta1__preferred_allocation_response__free_unpacked(r, NULL);
		free(out);
	}
	agent_dpmsg_preferred_free(m);
	CHECK(preferred(avail, 3, absent, 1, 2, &err) == NULL && err.code == -EINVAL);
	CHECK(preferred(avail, 3, must, 1, 0, &err) == NULL);
	CHECK(preferred(avail, 3, must, 1, 4, &err) == NULL);
	CHECK(preferred(avail, 0, NULL, 0, 1, &err) == NULL);
}

static void test_answers(void)
{
	struct agent_dpmsg_alloc a = { "/opt/gcr/lib", "/gcr/lib", "/run/gcr/alloc/x", "/run/gcr/sock",
				       "/run/gcr/agent", "/run/gcr/agent", "/run/gcr/agent/agent.sock",
				       "gpucr.dev/shim=all", NULL, 0, NULL };
	V1beta1__ListAndWatchResponse *lw;
	V1beta1__AllocateResponse *ar;
	V1beta1__RegisterRequest *rr;
	size_t len = 0;
	uint8_t *out = agent_dpmsg_devices_encode(8, false, &len);

	lw = out ? v1beta1__list_and_watch_response__unpack(NULL, len, out) : NULL;
	CHECK(lw != NULL && lw->n_devices == 8);
	if (lw && lw->n_devices == 8) {
		CHECK_STR(lw->devices[7]->id, "gcr-slot-7");
		CHECK_STR(lw->devices[7]->health, "Unhealthy");
	}
	if (lw)
		v1beta1__list_and_watch_response__free_unpacked(lw, NULL);
	free(out);

	out = agent_dpmsg_allocate_encode(&a, 1, &len);
	ar = out ? v1beta1__allocate_response__unpack(NULL, len, out) : NULL;
	CHECK(ar != NULL && ar->n_container_responses == 1);
	if (ar && ar->n_container_responses == 1) {
		V1beta1__ContainerAllocateResponse *c = ar->container_responses[0];
		CHECK(c->n_envs == 3 && c->n_mounts == 3 && c->n_cdi_devices == 1);
		if (c->n_envs == 3 && c->n_mounts == 3 && c->n_cdi_devices == 1) {
			CHECK_STR(c->envs[0]->value, "/gcr/lib/libgcr.so");
			CHECK_STR(c->envs[1]->value, "/run/gcr/sock");
			CHECK_STR(c->envs[2]->value, "/run/gcr/agent/agent.sock");
			CHECK(c->mounts[0]->read_only && !c->mounts[1]->read_only && c->mounts[2]->read_only);
			CHECK_STR(c->mounts[1]->host_path, "/run/gcr/alloc/x");
			CHECK_STR(c->cdi_devices[0]->name, "gpucr.dev/shim=all");
		}
	}
	if (ar)
		v1beta1__allocate_response__free_unpacked(ar, NULL);
	free(out);

	/* images of pods: the allocation's image directory, at the same path, named last */
	a.image_dir = "/var/lib/gcr/images/.alloc/x";
	out = agent_dpmsg_allocate_encode(&a, 1, &len);
	ar = out ? v1beta1__allocate_response__unpack(NULL, len, out) : NULL;
	CHECK(ar != NULL && ar->n_container_responses == 1);
	if (ar && ar->n_container_responses == 1) {
		V1beta1__ContainerAllocateResponse *c = ar->container_responses[0];
		CHECK(c->n_envs == 4 && c->n_mounts == 4);
		if (c->n_envs == 4 && c->n_mounts == 4) {
			CHECK_STR(c->envs[3]->key, AGENT_DPMSG_IMAGE_DIR_ENV);
			CHECK_STR(c->envs[3]->value, "/var/lib/gcr/images/.alloc/x");
			CHECK_STR(c->mounts[3]->host_path, "/var/lib/gcr/images/.alloc/x");
			CHECK_STR(c->mounts[3]->container_path, "/var/lib/gcr/images/.alloc/x");
			CHECK(!c->mounts[3]->read_only);
		}
	}
	if (ar)
		v1beta1__allocate_response__free_unpacked(ar, NULL);
	free(out);
	a.image_dir = NULL;

	/* the chart's shimEnv, after the plugin's own three; over the bound: no answer */
	static const char *const extra[] = { "GCR_VMM_MIN_BYTES", "1048576", "X", "" };
	a.extra_env = extra;
	a.n_extra_env = 2;
	out = agent_dpmsg_allocate_encode(&a, 1, &len);
	ar = out ? v1beta1__allocate_response__unpack(NULL, len, out) : NULL;
	CHECK(ar != NULL && ar->n_container_responses == 1 && ar->container_responses[0]->n_envs == 5);
	if (ar && ar->n_container_responses == 1 && ar->container_responses[0]->n_envs == 5) {
		CHECK_STR(ar->container_responses[0]->envs[0]->key, "LD_PRELOAD");
		CHECK_STR(ar->container_responses[0]->envs[3]->key, "GCR_VMM_MIN_BYTES");
		CHECK_STR(ar->container_responses[0]->envs[3]->value, "1048576");
		CHECK_STR(ar->container_responses[0]->envs[4]->key, "X");
	}
	if (ar)
		v1beta1__allocate_response__free_unpacked(ar, NULL);
	free(out);
	a.n_extra_env = AGENT_DPMSG_MAX_EXTRA_ENV + 1;
	out = agent_dpmsg_allocate_encode(&a, 1, &len);
	CHECK(out == NULL);
	free(out);
	a.extra_env = NULL;
	a.n_extra_env = 0;

	out = agent_dpmsg_register_encode("gcr-shim.sock", "gpucr.dev/shim", &len);
	rr = out ? v1beta1__register_request__unpack(NULL, len, out) : NULL;
	CHECK(rr != NULL && rr->options != NULL && rr->options->get_preferred_allocation_available);
	if (rr) {
		CHECK_STR(rr->version, "v1beta1");
		CHECK_STR(rr->endpoint, "gcr-shim.sock");
		CHECK_STR(rr->resource_name, "gpucr.dev/shim");
		v1beta1__register_request__free_unpacked(rr, NULL);
	}
	free(out);
}

int main(void)
{
	test_slot_index();
	test_allocate_decode();
	test_preferred();
	test_answers();
	return test_summary("test_agent_dpmsg");
}
