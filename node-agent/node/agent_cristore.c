/* agent_cristore: two CRI calls over gRPC core (the device plugin's library), each a unary call
 * on a channel of its own, waited for on a completion queue of its own: the sweep runs every
 * few seconds, so nothing is kept open between calls. */
#include "agent_cristore.h"

#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cri.pb-c.h"

void agent_cristore_init(void)
{
	grpc_init();
}

void agent_cristore_shutdown(void)
{
	grpc_shutdown();
}

/* One unary call: method, the packed request; *resp the answer's bytes (malloc'd). */
static int call(const char *endpoint, const char *method, const uint8_t *req, size_t rlen, uint8_t **resp,
		size_t *len, struct gcr_err *err)
{
	char target[4200];
	*resp = NULL;
	*len = 0;
	if ((size_t)snprintf(target, sizeof(target), "unix:%s", endpoint) >= sizeof(target))
		return gcr_err_set(err, -ENAMETOOLONG, "CRI endpoint too long");
	grpc_channel_credentials *creds = grpc_insecure_credentials_create();
	grpc_channel *ch = grpc_channel_create(target, creds, NULL);
	grpc_channel_credentials_release(creds);
	grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
	gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
				       gpr_time_from_millis(AGENT_CRISTORE_TIMEOUT_MS, GPR_TIMESPAN));
	grpc_call *c = ch && cq ? grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
							   grpc_slice_from_static_string(method), NULL, dl, NULL)
				: NULL;
	grpc_slice s = grpc_slice_from_copied_buffer((const char *)req, rlen);
	grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1), *recv = NULL;
	grpc_slice_unref(s);
	grpc_metadata_array mi, mt;
	grpc_metadata_array_init(&mi);
	grpc_metadata_array_init(&mt);
	grpc_status_code status = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice();
	int rc = 0;
	if (c == NULL || send == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "CRI %s: no call", method);
	} else {
		grpc_op ops[6];
		memset(ops, 0, sizeof(ops));
		ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
		ops[1].op = GRPC_OP_SEND_MESSAGE;
		ops[1].data.send_message.send_message = send;
		ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
		ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
		ops[3].data.recv_initial_metadata.recv_initial_metadata = &mi;
		ops[4].op = GRPC_OP_RECV_MESSAGE;
		ops[4].data.recv_message.recv_message = &recv;
		ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
		ops[5].data.recv_status_on_client.trailing_metadata = &mt;
		ops[5].data.recv_status_on_client.status = &status;
		ops[5].data.recv_status_on_client.status_details = &details;
		static int tag;
		if (grpc_call_start_batch(c, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
			rc = gcr_err_set(err, -EIO, "CRI %s: the call did not start", method);
		} else {
			grpc_event ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
			if (ev.type != GRPC_OP_COMPLETE || !ev.success || status != GRPC_STATUS_OK) {
				char *d = grpc_slice_to_c_string(details);
				rc = gcr_err_set(err, status == GRPC_STATUS_NOT_FOUND ? -ENOENT : -EIO,
						 "CRI %s on %s: status %d %s", method, endpoint, (int)status, d ? d : "");
				gpr_free(d);
			}
		}
	}
	if (rc == 0 && recv != NULL) {
		grpc_byte_buffer_reader rd;
		if (!grpc_byte_buffer_reader_init(&rd, recv)) {
			rc = gcr_err_set(err, -EIO, "CRI %s: unreadable answer", method);
		} else {
			grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
			*len = GRPC_SLICE_LENGTH(all);
			*resp = malloc(*len ? *len : 1);
			if (*resp == NULL)
				rc = gcr_err_set(err, -ENOMEM, "out of memory");
			else
				memcpy(*resp, GRPC_SLICE_START_PTR(all), *len);
			grpc_slice_unref(all);
			grpc_byte_buffer_reader_destroy(&rd);
		}
	}
	if (recv != NULL)
		grpc_byte_buffer_destroy(recv);
	if (send != NULL)
		grpc_byte_buffer_destroy(send);
	grpc_slice_unref(details);
	grpc_metadata_array_destroy(&mi);
	grpc_metadata_array_destroy(&mt);
	if (c != NULL)
		grpc_call_unref(c);
	if (cq != NULL) {
		grpc_completion_queue_shutdown(cq);
		while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
		       GRPC_QUEUE_SHUTDOWN)
			;
		grpc_completion_queue_destroy(cq);
	}
	if (ch != NULL)
		grpc_channel_destroy(ch);
	if (rc < 0) {
		free(*resp);
		*resp = NULL;
	}
	return rc;
}

void agent_cristore_list_clear(struct agent_cristore_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		for (size_t k = 0; k < l->img[i].nnames; k++)
			free(l->img[i].names[k]);
	free(l->img);
	l->img = NULL;
	l->n = 0;
}

static int under(const char *name, const char *prefix)
{
	return name != NULL && strncmp(name, prefix, strlen(prefix)) == 0;
}

int agent_cristore_images(const char *endpoint, const char *prefix, struct agent_cristore_list *out,
			  struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	Runtime__V1__ListImagesRequest req = RUNTIME__V1__LIST_IMAGES_REQUEST__INIT;
	uint8_t rb[16], *resp = NULL;
	size_t rl = runtime__v1__list_images_request__pack(&req, rb), len = 0;
	int rc = call(endpoint, "/runtime.v1.ImageService/ListImages", rb, rl, &resp, &len, err);
	if (rc < 0)
		return rc;
	Runtime__V1__ListImagesResponse *r = runtime__v1__list_images_response__unpack(NULL, len, resp);
	free(resp);
	if (r == NULL)
		return gcr_err_set(err, -EBADMSG, "CRI ListImages: an answer that does not decode");
	for (size_t i = 0; rc == 0 && i < r->n_images; i++) {
		const Runtime__V1__Image *im = r->images[i];
		struct agent_cristore_image one = { 0 };
		if (im->id == NULL || strlen(im->id) >= sizeof(one.id))
			continue;
		snprintf(one.id, sizeof(one.id), "%s", im->id);
		for (size_t k = 0; k < im->n_repo_tags + im->n_repo_digests && one.nnames < AGENT_CRISTORE_MAX_NAMES; k++) {
			const char *nm = k < im->n_repo_tags ? im->repo_tags[k] : im->repo_digests[k - im->n_repo_tags];
			if (under(nm, prefix) && (one.names[one.nnames] = strdup(nm)) != NULL)
				one.nnames++;
		}
		if (one.nnames == 0)
			continue;
		struct agent_cristore_image *g = realloc(out->img, (out->n + 1) * sizeof(*g));
		if (g == NULL) {
			for (size_t k = 0; k < one.nnames; k++)
				free(one.names[k]);
			rc = gcr_err_set(err, -ENOMEM, "out of memory");
			break;
		}
		out->img = g;
		out->img[out->n++] = one;
	}
	runtime__v1__list_images_response__free_unpacked(r, NULL);
	if (rc < 0)
		agent_cristore_list_clear(out);
	return rc;
}

int agent_cristore_remove(const char *endpoint, const char *id, struct gcr_err *err)
{
	Runtime__V1__ImageSpec spec = RUNTIME__V1__IMAGE_SPEC__INIT;
	spec.image = (char *)id;
	Runtime__V1__RemoveImageRequest req = RUNTIME__V1__REMOVE_IMAGE_REQUEST__INIT;
	req.image = &spec;
	size_t rl = runtime__v1__remove_image_request__get_packed_size(&req), len = 0;
	uint8_t *rb = malloc(rl ? rl : 1), *resp = NULL;
	if (rb == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	runtime__v1__remove_image_request__pack(&req, rb);
	int rc = call(endpoint, "/runtime.v1.ImageService/RemoveImage", rb, rl, &resp, &len, err);
	free(rb);
	free(resp);
	return rc == -ENOENT ? 0 : rc;
}
