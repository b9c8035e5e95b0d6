/* fuzz_manifest: arbitrary bytes as an image's manifest.json through gcr_image_manifest_parse,
 * and as a process's gpu/allocs.json through gcr_image_table_parse (with jansson's allocations
 * under gcr_jsonbudget, as in the agent); aborts when an accepted manifest or table breaks what
 * verify, the agent's copy and image-read rely on. */
#include "gcr_image.h"
#include "gcr_jsonbudget.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	gcr_jsonbudget_install();
	return 0;
}

/* A path verify joins to the image directory: relative, no "." or ".." part, bounded. */
static void check_rel(const char *s)
{
	size_t n = strnlen(s, GCR_IMAGE_NAME_MAX);
	if (n == 0 || n >= GCR_IMAGE_NAME_MAX || s[0] == '/' || strstr(s, "//") != NULL)
		abort();
	for (const char *p = s; *p;) {
		size_t k = strcspn(p, "/");
		if ((k == 1 && p[0] == '.') || (k == 2 && p[0] == '.' && p[1] == '.'))
			abort();
		p += k + (p[k] == '/');
	}
}

static void check_manifest(const struct gcr_image_manifest *m)
{
	if (m->format != GCR_IMAGE_FORMAT || m->pid <= 0 || m->nfiles > GCR_IMAGE_MAX_FILES ||
	    (m->nfiles > 0 && m->files == NULL) || m->table.n > GCR_IMAGE_MAX_FILES)
		abort();
	for (size_t i = 0; i < m->nfiles; i++) {
		check_rel(m->files[i].path);
		/* Only an allocation's data file may lack a whole-file checksum. */
		int data = 0;
		for (size_t k = 0; k < m->table.n; k++)
			data |= strcmp(m->table.a[k].file, m->files[i].path) == 0;
		if (!m->files[i].has_crc && !data)
			abort();
	}
	for (size_t i = 0; i < m->table.n; i++) {
		const struct gcr_image_alloc *a = &m->table.a[i];
		check_rel(a->file);
		if (strncmp(a->file, "gpu/", 4) != 0 || a->size == 0 ||
		    a->nchunks != (a->size + GCR_IMAGE_CHUNK - 1) / GCR_IMAGE_CHUNK)
			abort();
		/* Chunks cover the allocation; written ones lie back to back in the file, so
		 * image-read never reads outside it or past a chunk's length. */
		uint64_t covered = 0, off = 0;
		for (size_t c = 0; c < a->nchunks; c++) {
			const struct gcr_image_chunk *k = &a->chunks[c];
			if (k->len == 0 || k->len > GCR_IMAGE_CHUNK)
				abort();
			covered += k->len;
			if (!k->zero) {
				if (k->off != off)
					abort();
				off += k->len;
			}
		}
		if (covered != a->size)
			abort();
		for (size_t j = 0; j < i; j++)
			if (strcmp(m->table.a[j].file, a->file) == 0)
				abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_image_manifest m;
	struct gcr_err err = { 0, "" };
	memset(&m, 0xa5, sizeof(m));
	int rc = gcr_image_manifest_parse((const char *)data, size, &m, &err);
	if (rc != 0 && rc != -EBADMSG && rc != -ENOTSUP && rc != -ENOMEM && rc != -EFBIG)
		abort();
	/* The same bytes as a table file: accepted only whole, each allocation's need inside it. */
	struct gcr_image_table t;
	struct gcr_err terr = { 0, "" };
	memset(&t, 0xa5, sizeof(t));
	int trc = gcr_image_table_parse((const char *)data, size, &t, &terr);
	if (trc < 0 && (t.a != NULL || t.n != 0 || terr.msg[0] == '\0'))
		abort();
	for (size_t i = 0; trc == 0 && i < t.n; i++)
		if (gcr_image_alloc_need(&t.a[i]) > t.a[i].size)
			abort();
	if (trc == 0)
		gcr_image_table_clear(&t);
	if (rc < 0) {
		/* Nothing kept on failure, and a message says why. */
		if (m.files != NULL || m.table.a != NULL || m.nfiles != 0 || err.code != rc || err.msg[0] == '\0')
			abort();
		return 0;
	}
	check_manifest(&m);
	/* The table written back parses to the same table (the shim's table and the manifest's
	 * "allocs" are one format). */
	json_t *allocs = gcr_image_table_to_json(&m.table);
	struct gcr_image_table t2;
	if (allocs != NULL) {
		if (gcr_image_table_from_json(allocs, &t2, &err) < 0 || t2.n != m.table.n)
			abort();
		for (size_t i = 0; i < t2.n; i++)
			if (t2.a[i].address != m.table.a[i].address || t2.a[i].size != m.table.a[i].size ||
			    t2.a[i].nchunks != m.table.a[i].nchunks ||
			    memcmp(t2.a[i].chunks, m.table.a[i].chunks, t2.a[i].nchunks * sizeof(*t2.a[i].chunks)) != 0)
				abort();
		gcr_image_table_clear(&t2);
		json_decref(allocs);
	}
	gcr_image_manifest_clear(&m);
	if (m.files != NULL || m.table.a != NULL)
		abort();
	return 0;
}
