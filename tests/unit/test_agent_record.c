/* test_agent_record: the node agent's record store (what recovery, Restores and deletions
 * trust instead of status): round trip, persistence across a reopen, atomic replace, a
 * damaged or misnamed file set aside, a leftover temporary file dropped, a directory others
 * may write refused; and agent_crobj's decoding of a Checkpoint whose status was forged. */
#include "agent_crobj.h"
#include "agent_record.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define UID "0b6c5a1e-4d2f-4c1e-9a7b-1f2e3d4c5b6a"

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (f != NULL) {
		fputs(text, f);
		fclose(f);
	}
}

static int exists(const char *dir, const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

static void test_store(void)
{
	char base[] = "/tmp/gcr-record-XXXXXX";
	CHECK(mkdtemp(base) != NULL);
	char dir[300];
	snprintf(dir, sizeof(dir), "%s/a/records", base); /* parents made too */
	struct agent_record_store *s = NULL;
	struct gcr_err err;
	CHECK(agent_record_store_new(dir, &s, &err) == 0);
	struct stat sb;
	CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700);

	struct agent_record r = { .state = AGENT_REC_SUSPENDING, .n = 2, .keep_context = 1 };
	snprintf(r.uid, sizeof(r.uid), UID);
	snprintf(r.ns, sizeof(r.ns), "team-a");
	snprintf(r.name, sizeof(r.name), "ck-1");
	snprintf(r.pod, sizeof(r.pod), "llm-0");
	snprintf(r.pod_uid, sizeof(r.pod_uid), "5e8d2c4a-1b3f-4a6e-9c7d-0f2e4a6c8b1d");
	r.p[0] = (struct agent_record_proc){ .pid = 4242, .start = 123456789ULL, .container = "main" };
	r.p[1] = (struct agent_record_proc){ .pid = 7, .start = 1, .container = "" };
	CHECK(agent_record_put(s, &r, &err) == 0);
	r.state = AGENT_REC_SUSPENDED;
	json_t *st = json_pack("{s:s, s:s}", "phase", "Succeeded", "message", "2 process(es) suspended");
	agent_record_set_status(&r.ck_status, st);
	CHECK(agent_record_put(s, &r, &err) == 0); /* replaced whole */
	agent_record_store_free(s);

	/* Damage of every kind next to it; a write cut short left a temporary file. */
	write_file(dir, "garbage.json", "{\"version\":1,");
	write_file(dir, "11111111-2222.json", "{\"version\":1,\"uid\":\"" UID "\"}");
	write_file(dir, ".99999999-tmp.tmp", "{");
	char misnamed[2048];
	snprintf(misnamed, sizeof(misnamed),
		 "{\"version\":1,\"uid\":\"aaaa-bbbb\",\"namespace\":\"x\",\"name\":\"y\",\"pod\":\"p\",\"podUID\":\"u\","
		 "\"keepContext\":false,\"state\":\"suspended\",\"processes\":[],\"restoreUID\":\"\",\"restoreName\":\"\"}");
	write_file(dir, "cccc-dddd.json", misnamed); /* a record under another uid's name */
	write_file(dir, "eeee-ffff.json",
		   "{\"version\":1,\"uid\":\"eeee-ffff\",\"namespace\":\"x\",\"name\":\"y\",\"pod\":\"p\",\"podUID\":\"u\","
		   "\"keepContext\":false,\"state\":\"suspended\",\"processes\":[{\"pid\":-5,\"start\":0,\"container\":\"\"}],"
		   "\"restoreUID\":\"\",\"restoreName\":\"\"}");

	CHECK(agent_record_store_new(dir, &s, &err) == 0);
	struct agent_record g;
	CHECK(agent_record_get(s, UID, &g) == 0);
	CHECK(g.state == AGENT_REC_SUSPENDED && g.n == 2 && g.keep_context == 1);
	CHECK(g.p[0].pid == 4242 && g.p[0].start == 123456789ULL && strcmp(g.p[0].container, "main") == 0);
	CHECK_STR(g.pod_uid, "5e8d2c4a-1b3f-4a6e-9c7d-0f2e4a6c8b1d");
	CHECK(g.ck_status != NULL && json_equal(g.ck_status, st));
	CHECK(g.rs_status == NULL);
	agent_record_clear(&g);
	CHECK(agent_record_get(s, "cccc-dddd", &g) == -ENOENT);
	CHECK(agent_record_get(s, "eeee-ffff", &g) == -ENOENT);
	CHECK(exists(dir, "garbage.json.bad") && !exists(dir, "garbage.json"));
	CHECK(exists(dir, "cccc-dddd.json.bad") && exists(dir, "eeee-ffff.json.bad"));
	CHECK(exists(dir, "11111111-2222.json.bad"));
	CHECK(!exists(dir, ".99999999-tmp.tmp"));
	json_t *list = agent_record_list(s);
	CHECK(json_array_size(list) == 1);
	json_decref(list);

	/* A uid that is not a token is never a file name. */
	struct agent_record bad = r;
	bad.ck_status = NULL;
	snprintf(bad.uid, sizeof(bad.uid), "../x");
	CHECK(agent_record_put(s, &bad, &err) == -EINVAL);
	CHECK(agent_record_del(s, UID, &err) == 0 && !exists(dir, UID ".json"));
	CHECK(agent_record_get(s, UID, &g) == -ENOENT);
	agent_record_store_free(s);

	/* Records decide which processes are resumed: a directory others can write is refused. */
	CHECK(chmod(dir, 0777) == 0);
	CHECK(agent_record_store_new(dir, &s, &err) == -EPERM && strstr(err.msg, "writable") != NULL);
	agent_record_clear(&r);
	json_decref(st);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	CHECK(system(cmd) == 0);
}

static void test_forged_status(void)
{
	json_t *o = json_loads("{\"metadata\":{\"namespace\":\"tenant-a\",\"name\":\"steal\",\"uid\":\"u-1\","
			       "\"finalizers\":[\"x\",\"" AGENT_CROBJ_FINALIZER "\"]},"
			       "\"spec\":{\"podName\":\"victim\"},"
			       "\"status\":{\"phase\":\"Runnin\",\"nodeName\":\"../node\",\"processes\":[{\"pid\":1}]}}",
			       0, NULL);
	struct agent_crobj d;
	struct gcr_err err;
	CHECK(agent_crobj_decode(o, AGENT_CROBJ_CHECKPOINT, &d, &err) == 0);
	CHECK(d.phase == AGENT_PHASE_UNKNOWN && d.node[0] == '\0' && d.finalizer == 1 && !d.deleting);
	CHECK_STR(d.target, "victim");
	json_object_set_new(json_object_get(o, "spec"), "podName", json_string("Bad_Name"));
	CHECK(agent_crobj_decode(o, AGENT_CROBJ_CHECKPOINT, &d, &err) == -EINVAL && strcmp(d.uid, "u-1") == 0);
	json_object_del(json_object_get(o, "metadata"), "uid");
	CHECK(agent_crobj_decode(o, AGENT_CROBJ_CHECKPOINT, &d, &err) == -EINVAL && d.uid[0] == '\0');
	json_decref(o);
}

/* An Image's record: every field round trips, the marker of when the store began to record
 * every Checkpoint stays, and a damaged image part sets the record aside. */
static void test_image_record(void)
{
	char base[] = "/tmp/gcr-record-img-XXXXXX";
	CHECK(mkdtemp(base) != NULL);
	char dir[300];
	snprintf(dir, sizeof(dir), "%s/records", base);
	struct agent_record_store *s = NULL;
	struct gcr_err err;
	CHECK(agent_record_store_new(dir, &s, &err) == 0);
	long long since = agent_record_store_since(s);
	CHECK(since > 0 && exists(dir, ".since"));
	struct agent_record r = { .state = AGENT_REC_IMAGING, .action = AGENT_REC_ACT_IMAGE, .n = 1 };
	snprintf(r.uid, sizeof(r.uid), UID);
	snprintf(r.ns, sizeof(r.ns), "team-a");
	snprintf(r.name, sizeof(r.name), "img-1");
	snprintf(r.pod, sizeof(r.pod), "llm-0");
	snprintf(r.pod_uid, sizeof(r.pod_uid), "5e8d2c4a-1b3f-4a6e-9c7d-0f2e4a6c8b1d");
	r.p[0] = (struct agent_record_proc){ .pid = 77, .start = 42, .container = "model" };
	r.img = (struct agent_record_image){ .kubelet = 1, .from_suspended = 1, .converted = 1,
					     .step = AGENT_REC_STEP_DUMP, .attempt = 2, .dump_at = 1800000000,
					     .kept = 1 };
	snprintf(r.img.path, sizeof(r.img.path), "/var/lib/gcr/images/team-a/llm-0/img-1");
	snprintf(r.img.work, sizeof(r.img.work), "/run/gcr/image-" UID);
	snprintf(r.img.partial, sizeof(r.img.partial), "/var/lib/gcr/images/team-a/llm-0/img-1.partial.9");
	snprintf(r.img.archive, sizeof(r.img.archive), "/var/lib/kubelet/checkpoints/checkpoint-llm-0_team-a-model-x.tar");
	snprintf(r.img.container, sizeof(r.img.container), "model");
	CHECK(agent_record_put(s, &r, &err) == 0);
	agent_record_store_free(s);

	CHECK(agent_record_store_new(dir, &s, &err) == 0);
	CHECK(agent_record_store_since(s) == since); /* kept, not renewed */
	struct agent_record g;
	CHECK(agent_record_get(s, UID, &g) == 0);
	CHECK(g.action == AGENT_REC_ACT_IMAGE && g.state == AGENT_REC_IMAGING);
	CHECK(g.img.kubelet == 1 && g.img.from_suspended == 1 && g.img.converted == 1 && g.img.kept == 1);
	CHECK(g.img.step == AGENT_REC_STEP_DUMP && g.img.attempt == 2 && g.img.dump_at == 1800000000);
	CHECK_STR(g.img.path, r.img.path);
	CHECK_STR(g.img.work, r.img.work);
	CHECK_STR(g.img.partial, r.img.partial);
	CHECK_STR(g.img.archive, r.img.archive);
	CHECK_STR(g.img.container, "model");
	CHECK_STR(agent_record_step_name(g.img.step), "dump");
	agent_record_clear(&g);
	agent_record_store_free(s);

	/* A record names paths the agent removes: one that climbs out, or a state of an Image on a
	 * Suspend's record, is set aside. */
	json_t *j = agent_record_encode(&r);
	json_object_set_new(json_object_get(j, "image"), "partial", json_string("/var/lib/gcr/../../etc"));
	CHECK(agent_record_decode(j, &g, &err) == -EINVAL);
	json_object_set_new(json_object_get(j, "image"), "partial", json_string("relative/path"));
	CHECK(agent_record_decode(j, &g, &err) == -EINVAL);
	json_object_set_new(json_object_get(j, "image"), "partial", json_string(""));
	json_object_set_new(json_object_get(j, "image"), "step", json_string("teleport"));
	CHECK(agent_record_decode(j, &g, &err) == -EINVAL);
	json_object_set_new(json_object_get(j, "image"), "step", json_string("seal"));
	CHECK(agent_record_decode(j, &g, &err) == 0 && g.img.step == AGENT_REC_STEP_SEAL);
	agent_record_clear(&g);
	json_object_del(j, "action");
	json_object_del(j, "image");
	CHECK(agent_record_decode(j, &g, &err) == -EINVAL && strstr(err.msg, "imaging") != NULL);
	json_decref(j);
	/* An older agent's Suspend record (no "action") is a Suspend. */
	r.action = AGENT_REC_ACT_SUSPEND;
	r.state = AGENT_REC_SUSPENDED;
	j = agent_record_encode(&r);
	CHECK(json_object_get(j, "action") == NULL && json_object_get(j, "image") == NULL);
	CHECK(agent_record_decode(j, &g, &err) == 0 && g.action == AGENT_REC_ACT_SUSPEND);
	agent_record_clear(&g);
	json_decref(j);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	CHECK(system(cmd) == 0);
}

int main(void)
{
	test_store();
	test_forged_status();
	test_image_record();
	return test_summary("test_agent_record");
}
