#pragma once
// A kernel node that does nothing, an anchor of a union of near topologies (Note [Near
// topologies]): the start waits for work queued before a launch and every member's first nodes
// wait for it; the end waits for every member's last nodes and work queued after a launch waits
// for it. Empty nodes did not do (H100, CUDA 13) where the union disables a member's neighbour:
// work queued after a member's launch did not wait for the member's last kernel when a disabled
// node followed it, and the member's first kernel did not wait for work queued before the launch
// when a disabled node preceded it.

#include <cuda_runtime_api.h>

namespace grape::cuda {

// Adds the node to `graph`, without dependencies.
cudaError_t add_noop_kernel_node(cudaGraphNode_t* node, cudaGraph_t graph);

}  // namespace grape::cuda
