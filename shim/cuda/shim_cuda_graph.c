/* shim_cuda_graph: graph memory on the shim's arena. Explicit memory nodes become empty nodes
 * with the same dependencies over graph-owned blocks (shim_pool_graph_*), and the calls that
 * make or end a graph's holders (clone, child graph, instantiate, update, destroy) keep the
 * blocks' holder sets, so a block lives exactly as long as a graph or executable can use it. */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "shim_config.h"
#include "shim_cuda_pool.h"
#include "shim_gate.h"
#include "shim_gpu.h"
#include "shim_hook.h"
#include "shim_pool.h"
#include "shim_real.h"

/* cuGraphAddEmptyNode is not interposed: found once. */
static __typeof__(&cuGraphAddEmptyNode) real_empty;
static pthread_once_t empty_once = PTHREAD_ONCE_INIT;

static void empty_load(void)
{
	void *h = shim_real_handle(SHIM_CUDA);
	if (h != NULL)
		real_empty = (__typeof__(real_empty))shim_real_dlsym(h, "cuGraphAddEmptyNode");
}

/* Allocations the arena can serve: pinned device memory nobody imports (the driver's own
 * check for graph allocations, less what it rejects anyway). */
static int servable(const CUmemPoolProps *pp, size_t bytes)
{
	return shim_cfg.vmm && bytes > 0 && pp->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
	       pp->location.type == CU_MEM_LOCATION_TYPE_DEVICE && pp->handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
	       pp->location.id >= 0 && pp->location.id < SHIM_MAX_DEVICES;
}

/* The block of an allocation node, or -ENOENT: the driver's node. */
static int node_alloc(CUgraph g, const CUmemPoolProps *pp, size_t bytes, uint64_t *va)
{
	if (!servable(pp, bytes))
		return -ENOENT;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuGraphAddMemAllocNode), 0);
	int rc = shim_cuda_pool_graph_alloc(0, pp->location.id, bytes, SHIM_CUDA_HOLD_GRAPH(g), va);
	shim_gate_exit(t);
	return rc;
}

static CUresult code_of(int rc)
{
	return rc == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
}

/* An allocation node's block is the graph's; the node itself is an empty one, so the driver
 * allocates nothing. The driver's node type and cuGraphMemAllocNodeGetParams see EMPTY. */
SHIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
					    size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
	__typeof__(&cuGraphAddMemAllocNode) real = SHIM_REAL(cuGraphAddMemAllocNode, 0);
	pthread_once(&empty_once, empty_load);
	__typeof__(&cuGraphAddEmptyNode) empty = real_empty;
	if (real == NULL || empty == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t va = 0;
	int rc = nodeParams != NULL && phGraphNode != NULL
			 ? node_alloc(hGraph, &nodeParams->poolProps, nodeParams->bytesize, &va)
			 : -ENOENT;
	if (rc == -ENOENT)
		return real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
	if (rc < 0)
		return code_of(rc);
	CUresult r = empty(phGraphNode, hGraph, dependencies, numDependencies);
	if (r == CUDA_SUCCESS)
		nodeParams->dptr = va;
	else
		(void)shim_pool_graph_undo(va, SHIM_CUDA_HOLD_GRAPH(hGraph));
	return r;
}

/* A free node of an arena block: an empty node; the block is the graph's from here on (one
 * allocated outside the graph too: it cannot be reused while the graph may free it). */
SHIM_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
					   size_t numDependencies, CUdeviceptr dptr)
{
	__typeof__(&cuGraphAddMemFreeNode) real = SHIM_REAL(cuGraphAddMemFreeNode, 0);
	pthread_once(&empty_once, empty_load);
	__typeof__(&cuGraphAddEmptyNode) empty = real_empty;
	if (real == NULL || empty == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t base = 0;
	if (!shim_pool_block(dptr, &base, NULL, NULL) || base != dptr)
		return real(phGraphNode, hGraph, dependencies, numDependencies, dptr);
	CUresult r = empty(phGraphNode, hGraph, dependencies, numDependencies);
	if (r == CUDA_SUCCESS && shim_pool_graph_adopt(dptr, SHIM_CUDA_HOLD_GRAPH(hGraph)) < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	return r;
}

/* The generic form: memory nodes as above (an empty node through the same call, so the edge
 * data stays), a child graph's memory held by the parent too. */
SHIM_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
				       const CUgraphEdgeData *dependencyData, size_t numDependencies,
				       CUgraphNodeParams *nodeParams)
{
	__typeof__(&cuGraphAddNode_v2) real = SHIM_REAL(cuGraphAddNode_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUgraphNodeParams none = { .type = CU_GRAPH_NODE_TYPE_EMPTY };
	uint64_t va = 0, base = 0;
	int rc = -ENOENT;
	if (nodeParams != NULL && phGraphNode != NULL && nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		rc = node_alloc(hGraph, &nodeParams->alloc.poolProps, nodeParams->alloc.bytesize, &va);
	else if (nodeParams != NULL && nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_FREE &&
		 shim_pool_block(nodeParams->free.dptr, &base, NULL, NULL) && base == nodeParams->free.dptr)
		rc = 0;
	if (rc < 0 && rc != -ENOENT)
		return code_of(rc);
	CUresult r = real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, rc == 0 ? &none : nodeParams);
	if (rc == -ENOENT) {
		if (r == CUDA_SUCCESS && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH &&
		    shim_pool_graph_share(SHIM_CUDA_HOLD_GRAPH(hGraph), SHIM_CUDA_HOLD_GRAPH(nodeParams->graph.graph)) < 0)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
		if (r == CUDA_SUCCESS)
			nodeParams->alloc.dptr = va;
		else
			(void)shim_pool_graph_undo(va, SHIM_CUDA_HOLD_GRAPH(hGraph));
	} else if (r == CUDA_SUCCESS && shim_pool_graph_adopt(base, SHIM_CUDA_HOLD_GRAPH(hGraph)) < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	return r;
}

/* ---- holders: what may still run a graph's memory ---- */

static CUresult shared(CUresult r, uint64_t to, uint64_t from)
{
	if (r == CUDA_SUCCESS && shim_pool_graph_share(to, from) < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY; /* the new object exists; its memory is not known held */
	return r;
}

SHIM_EXPORT CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph)
{
	__typeof__(&cuGraphClone) real = SHIM_REAL(cuGraphClone, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(phGraphClone, originalGraph);
	return shared(r, SHIM_CUDA_HOLD_GRAPH(r == CUDA_SUCCESS ? *phGraphClone : NULL),
		      SHIM_CUDA_HOLD_GRAPH(originalGraph));
}

/* The driver embeds a clone of the child: the parent holds the child's memory. */
SHIM_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
					      size_t numDependencies, CUgraph childGraph)
{
	__typeof__(&cuGraphAddChildGraphNode) real = SHIM_REAL(cuGraphAddChildGraphNode, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(phGraphNode, hGraph, dependencies, numDependencies, childGraph);
	return shared(r, SHIM_CUDA_HOLD_GRAPH(hGraph), SHIM_CUDA_HOLD_GRAPH(childGraph));
}

SHIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	__typeof__(&cuGraphInstantiateWithFlags) real = SHIM_REAL(cuGraphInstantiateWithFlags, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(phGraphExec, hGraph, flags);
	return shared(r, SHIM_CUDA_HOLD_EXEC(r == CUDA_SUCCESS ? *phGraphExec : NULL), SHIM_CUDA_HOLD_GRAPH(hGraph));
}

static CUresult instantiate_params(int v, CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	__typeof__(&cuGraphInstantiateWithParams) real = SHIM_REAL(cuGraphInstantiateWithParams, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(phGraphExec, hGraph, p);
	return shared(r, SHIM_CUDA_HOLD_EXEC(r == CUDA_SUCCESS ? *phGraphExec : NULL), SHIM_CUDA_HOLD_GRAPH(hGraph));
}

SHIM_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
						  CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiate_params(0, phGraphExec, hGraph, instantiateParams);
}

SHIM_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
						       CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiate_params(1, phGraphExec, hGraph, instantiateParams);
}

/* The executable may now run the new graph's memory; it keeps holding the old (superset). */
SHIM_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
	__typeof__(&cuGraphExecUpdate_v2) real = SHIM_REAL(cuGraphExecUpdate_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hGraphExec, hGraph, resultInfo);
	return shared(r, SHIM_CUDA_HOLD_EXEC(hGraphExec), SHIM_CUDA_HOLD_GRAPH(hGraph));
}

SHIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	__typeof__(&cuGraphExecDestroy) real = SHIM_REAL(cuGraphExecDestroy, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hGraphExec);
	if (r == CUDA_SUCCESS)
		(void)shim_pool_graph_drop(SHIM_CUDA_HOLD_EXEC(hGraphExec));
	return r;
}

SHIM_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
	__typeof__(&cuGraphDestroy) real = SHIM_REAL(cuGraphDestroy, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hGraph);
	if (r == CUDA_SUCCESS)
		(void)shim_pool_graph_drop(SHIM_CUDA_HOLD_GRAPH(hGraph));
	return r;
}
