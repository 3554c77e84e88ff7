#pragma once
// Note [Conditional capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A data-dependent branch cannot be captured as host control flow: reading the condition is a
// host sync, and a graph replays whatever the capture recorded. CUDA conditional nodes (CUDA 12.4:
// IF and WHILE; 12.8: IF with an ELSE body) decide on the GPU whether a body graph runs. To put one
// into a graph being captured from a stream:
//   1. read the capture's graph and its current dependencies (cudaStreamGetCaptureInfo);
//   2. create a conditional handle in that graph;
//   3. launch, on the capturing stream, a 1-thread kernel that sets the handle from the condition
//      tensor: it becomes a node of the graph, so the condition is read at replay, where it lies;
//   4. add the conditional node after that kernel and make it the capture's only dependency
//      (cudaStreamUpdateCaptureDependencies), so later work runs after the branch;
//   5. capture each body from a side stream into the node's body graph
//      (cudaStreamBeginCaptureToGraph ... cudaStreamEndCapture).
// A WHILE body ends with the same 1-thread kernel, reading the condition recomputed by the body.
// Bodies may hold kernels, memcpys, memsets and nested conditionals, not event waits across
// streams. This file is torch-free; csrc/torch/graphs/conditional.cpp routes allocations and
// streams.

#include <cuda_runtime_api.h>

namespace grape::cuda {

enum class ConditionalKind { kIf, kIfElse, kWhile };

// Whether the runtime and driver support conditional nodes (IF, WHILE), and IF with an ELSE body.
bool conditional_nodes_supported();
bool if_else_supported();

struct ConditionalNode {
  cudaGraphConditionalHandle handle = 0;
  cudaGraphNode_t node = nullptr;
  cudaGraph_t bodies[2] = {nullptr, nullptr};  // owned by the node
  int body_count = 0;
};

// Adds a conditional node at the current position of the capture on `stream`, deciding on
// `*condition` (a device bool) at replay. Errors are returned, not thrown.
cudaError_t add_conditional_node(cudaStream_t stream, const bool* condition, ConditionalKind kind,
                                 ConditionalNode* out);

// Launches the 1-thread kernel that sets `handle` from `*condition` (the end of a WHILE body).
cudaError_t launch_set_condition(cudaGraphConditionalHandle handle, const bool* condition,
                                 cudaStream_t stream);

// The graph that `stream` is capturing into and the number of nodes its next operation will
// depend on; a way to check that nothing was captured between two points.
cudaError_t capture_position(cudaStream_t stream, cudaGraph_t* graph, const cudaGraphNode_t** deps,
                             size_t* count);

}  // namespace grape::cuda
