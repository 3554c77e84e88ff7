#pragma once
// Nodes that do nothing, for unions of near topologies (Note [Near topologies]): a union's
// anchors, and what runs in place of the nodes a member lacks. Neither is an empty or a disabled
// node, which did not keep a launch's order on an H100 (CUDA 13) where a member's neighbour was
// disabled: work queued after a member's launch did not wait for the member's last kernel when a
// disabled node followed it, and the member's first kernel did not wait for work queued before
// the launch when a disabled node preceded it, empty nodes around the members notwithstanding.

#include <cuda_runtime_api.h>

namespace grape::cuda {

// Adds a kernel node that does nothing to `graph`, without dependencies.
cudaError_t add_noop_kernel_node(cudaGraphNode_t* node, cudaGraph_t graph);

// Makes kernel node `node` of `exec` launch a kernel that does nothing, `grid` blocks of one
// thread (a multiple of the node's cluster dimensions, where it has them).
cudaError_t set_noop_kernel(cudaGraphExec_t exec, cudaGraphNode_t node, dim3 grid);

// Makes memset node `node` of `exec` (one-dimensional, of `element_size` bytes per element: 1, 2
// or 4) set one element that nothing reads, on the current device.
cudaError_t set_noop_memset(cudaGraphExec_t exec, cudaGraphNode_t node, unsigned element_size);

}  // namespace grape::cuda
