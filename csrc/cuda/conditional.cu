#include "cuda/conditional.h"

namespace grape::cuda {

namespace {

__global__ void set_condition(cudaGraphConditionalHandle handle, const bool* condition) {
  cudaGraphSetConditional(handle, *condition ? 1U : 0U);
}

int driver_version() {
  static const int version = [] {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return v;
  }();
  return version;
}

}  // namespace

bool conditional_nodes_supported() { return CUDART_VERSION >= 12040 && driver_version() >= 12040; }

bool if_else_supported() { return CUDART_VERSION >= 12080 && driver_version() >= 12080; }

cudaError_t capture_position(cudaStream_t stream, cudaGraph_t* graph, const cudaGraphNode_t** deps,
                             size_t* count) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &status, nullptr, graph, deps, nullptr, count);
  if (err != cudaSuccess) return err;
  return status == cudaStreamCaptureStatusActive ? cudaSuccess : cudaErrorStreamCaptureInvalidated;
}

cudaError_t launch_set_condition(cudaGraphConditionalHandle handle, const bool* condition,
                                 cudaStream_t stream) {
  set_condition<<<1, 1, 0, stream>>>(handle, condition);
  return cudaGetLastError();
}

cudaError_t add_conditional_node(cudaStream_t stream, const bool* condition, ConditionalKind kind,
                                 ConditionalNode* out) {
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t count = 0;
  cudaError_t err = capture_position(stream, &graph, &deps, &count);
  if (err != cudaSuccess) return err;
  err = cudaGraphConditionalHandleCreate(&out->handle, graph, 0, cudaGraphCondAssignDefault);
  if (err != cudaSuccess) return err;
  // The condition is read at replay, by a node that the conditional node depends on.
  err = launch_set_condition(out->handle, condition, stream);
  if (err != cudaSuccess) return err;
  err = capture_position(stream, &graph, &deps, &count);
  if (err != cudaSuccess) return err;

  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = out->handle;
  params.conditional.type = kind == ConditionalKind::kWhile ? cudaGraphCondTypeWhile : cudaGraphCondTypeIf;
  params.conditional.size = kind == ConditionalKind::kIfElse ? 2 : 1;
  err = cudaGraphAddNode(&out->node, graph, deps, nullptr, count, &params);
  if (err != cudaSuccess) return err;
  out->body_count = static_cast<int>(params.conditional.size);
  for (int i = 0; i < out->body_count; ++i) out->bodies[i] = params.conditional.phGraph_out[i];
  // Everything captured from here on runs after the branch.
  return cudaStreamUpdateCaptureDependencies(stream, &out->node, nullptr, 1,
                                             cudaStreamSetCaptureDependencies);
}

}  // namespace grape::cuda
