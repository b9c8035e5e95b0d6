/* agent_quantity: a Kubernetes resource quantity ("512Mi", "2G", "1.5Gi", "129e6", "100m") as a
 * whole number of units, rounded up: what the agent reads of a pod's limits (its
 * ephemeral-storage, which the agent's copy of the pod's files is counted against). */
#ifndef AGENT_QUANTITY_H
#define AGENT_QUANTITY_H

#include <stddef.h>

/* Parses s (len bytes, outside input: a pod's spec as the API server returns it) into *out.
 * 0, or -EINVAL (not a quantity) / -ERANGE (negative or past 2^63). */
int agent_quantity_parse(const char *s, size_t len, unsigned long long *out);

#endif
