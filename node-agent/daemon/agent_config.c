/* agent_config: the agent's YAML file through libyaml's document API: the whole document
 * is composed first, then walked; only its shape is checked here, values by the agent. */
#include "agent_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

struct walk {
	yaml_document_t *d;
	const char *path;
	const struct agent_config_sink *sink;
	unsigned char *seen; /* per node: visited already (a second visit is an alias) */
	size_t nnodes;
};

static yaml_node_t *node_at(struct walk *w, int id)
{
	return yaml_document_get_node(w->d, id);
}

/* The node id, marked visited; NULL for a node visited before (an alias of it), with
 * *alias set. */
static yaml_node_t *visit(struct walk *w, int id, int *alias)
{
	yaml_node_t *n = node_at(w, id);
	size_t i = (size_t)(id - 1);
	*alias = 0;
	if (n == NULL || i >= w->nnodes)
		return NULL;
	if (w->seen[i]) {
		*alias = 1;
		return NULL;
	}
	w->seen[i] = 1;
	return n;
}

static const char *scalar(yaml_node_t *n)
{
	return n != NULL && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int wrap(struct walk *w, int rc, struct gcr_err *err)
{
	if (rc < 0)
		gcr_err_wrap(err, "%s", w->path);
	return rc;
}

static int no_alias(struct walk *w, struct gcr_err *err)
{
	return gcr_err_set(err, -EINVAL, "%s: no aliases", w->path);
}

static int shim_env(struct walk *w, yaml_node_t *map, struct gcr_err *err)
{
	if (map->type != YAML_MAPPING_NODE)
		return gcr_err_set(err, -EINVAL, "%s: %s.%s must be a mapping", w->path, AGENT_CONFIG_SECTION,
				   AGENT_CONFIG_SHIM_ENV);
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
		int ak, av;
		yaml_node_t *k = visit(w, p->key, &ak), *v = visit(w, p->value, &av);
		if (ak || av)
			return gcr_err_set(err, -EINVAL, "%s: %s.%s: no aliases", w->path, AGENT_CONFIG_SECTION,
					   AGENT_CONFIG_SHIM_ENV);
		if (scalar(k) == NULL || scalar(v) == NULL)
			return gcr_err_set(err, -EINVAL, "%s: %s.%s: names and values must be scalars", w->path,
					   AGENT_CONFIG_SECTION, AGENT_CONFIG_SHIM_ENV);
		int rc = wrap(w, w->sink->dp_env(w->sink->data, scalar(k), scalar(v), err), err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int section(struct walk *w, yaml_node_t *map, struct gcr_err *err)
{
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
		int ak, av, rc;
		yaml_node_t *k = visit(w, p->key, &ak), *v = visit(w, p->value, &av);
		const char *key = scalar(k);
		if (ak || av)
			return key != NULL && strcmp(key, AGENT_CONFIG_SHIM_ENV) == 0
				       ? gcr_err_set(err, -EINVAL, "%s: %s.%s: no aliases", w->path, AGENT_CONFIG_SECTION,
						     AGENT_CONFIG_SHIM_ENV)
				       : no_alias(w, err);
		if (k == NULL || v == NULL)
			return gcr_err_set(err, -EINVAL, "%s: %s: malformed document", w->path, AGENT_CONFIG_SECTION);
		if (key == NULL)
			return gcr_err_set(err, -EINVAL, "%s: %s: keys must be scalars", w->path, AGENT_CONFIG_SECTION);
		if (scalar(v) != NULL)
			rc = wrap(w, w->sink->dp_opt(w->sink->data, key, scalar(v), err), err);
		else if (strcmp(key, AGENT_CONFIG_SHIM_ENV) == 0)
			rc = shim_env(w, v, err);
		else
			rc = wrap(w, w->sink->dp_nested(w->sink->data, key, err), err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int top(struct walk *w, yaml_node_t *root, struct gcr_err *err)
{
	if (root->type != YAML_MAPPING_NODE)
		return gcr_err_set(err, -EINVAL, "%s: expected a mapping of options", w->path);
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
		int ak, av, rc;
		yaml_node_t *k = visit(w, p->key, &ak), *v = visit(w, p->value, &av);
		if (ak || av)
			return no_alias(w, err);
		if (k == NULL || v == NULL)
			return gcr_err_set(err, -EINVAL, "%s: malformed document", w->path);
		const char *key = scalar(k);
		if (scalar(v) != NULL && key != NULL)
			rc = wrap(w, w->sink->opt(w->sink->data, key, scalar(v), err), err);
		else if (key != NULL && strcmp(key, AGENT_CONFIG_SECTION) == 0 && v->type == YAML_MAPPING_NODE)
			rc = section(w, v, err);
		else
			rc = gcr_err_set(err, -EINVAL, "%s: option '%s' must be a scalar", w->path, key ? key : "?");
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int run(yaml_parser_t *p, const char *path, const struct agent_config_sink *sink, struct gcr_err *err)
{
	int rc = 0;
	while (rc == 0) {
		yaml_document_t d;
		if (!yaml_parser_load(p, &d))
			return gcr_err_set(err, -EINVAL, "%s:%zu: %s", path, p->problem_mark.line + 1,
					   p->problem ? p->problem : "YAML error");
		yaml_node_t *root = yaml_document_get_root_node(&d);
		if (root == NULL) { /* the end of the stream */
			yaml_document_delete(&d);
			break;
		}
		struct walk w = { .d = &d, .path = path, .sink = sink };
		w.nnodes = (size_t)(d.nodes.top - d.nodes.start);
		w.seen = calloc(w.nnodes ? w.nnodes : 1, 1);
		int alias;
		if (w.seen == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of memory");
		else
			rc = top(&w, visit(&w, 1, &alias), err);
		free(w.seen);
		yaml_document_delete(&d);
	}
	return rc;
}

int agent_config_parse(const char *text, size_t len, const char *path, const struct agent_config_sink *sink,
		       struct gcr_err *err)
{
	yaml_parser_t p;
	if (!yaml_parser_initialize(&p))
		return gcr_err_set(err, -ENOMEM, "out of memory");
	yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
	int rc = run(&p, path, sink, err);
	yaml_parser_delete(&p);
	return rc;
}

int agent_config_load(const char *path, const struct agent_config_sink *sink, struct gcr_err *err)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return gcr_err_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
	yaml_parser_t p;
	int rc;
	if (!yaml_parser_initialize(&p)) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
	} else {
		yaml_parser_set_input_file(&p, f);
		rc = run(&p, path, sink, err);
		yaml_parser_delete(&p);
	}
	fclose(f);
	return rc;
}
