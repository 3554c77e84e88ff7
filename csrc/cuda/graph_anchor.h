#pragma once
// A kernel node that does nothing, ending a union of near topologies (Note [Near topologies]):
// work queued after a launch waits for it, and it waits for every member's last nodes. An empty
// node did not do (H100, CUDA 13): work queued after a member's launch did not wait for the
// member's last kernel when a node the member disables followed that kernel, with an empty end
// node after both.

#include <cuda_runtime_api.h>

namespace grape::cuda {

// Adds the node to `graph`, without dependencies.
cudaError_t add_noop_kernel_node(cudaGraphNode_t* node, cudaGraph_t graph);

}  // namespace grape::cuda
