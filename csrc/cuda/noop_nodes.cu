#include "cuda/noop_nodes.h"

#include <mutex>
#include <vector>

namespace grape::cuda {

namespace {

__global__ void noop() {}

cudaKernelNodeParams noop_params(dim3 grid) {
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(&noop);
  params.gridDim = grid;
  params.blockDim = dim3(1);
  return params;
}

// Per device, a byte that no-op memsets set: allocated at first use, kept for the process.
cudaError_t scratch_byte(void** byte) {
  static std::mutex mutex;
  static std::vector<void*> bytes;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const auto index = static_cast<size_t>(device);
  std::lock_guard<std::mutex> lock(mutex);
  if (bytes.size() <= index) bytes.resize(index + 1, nullptr);
  if (bytes[index] == nullptr) {
    status = cudaMalloc(&bytes[index], 1);
    if (status != cudaSuccess) return status;
  }
  *byte = bytes[index];
  return cudaSuccess;
}

}  // namespace

cudaError_t add_noop_kernel_node(cudaGraphNode_t* node, cudaGraph_t graph) {
  const cudaKernelNodeParams params = noop_params(dim3(1));
  return cudaGraphAddKernelNode(node, graph, nullptr, 0, &params);
}

cudaError_t set_noop_kernel(cudaGraphExec_t exec, cudaGraphNode_t node, dim3 grid) {
  const cudaKernelNodeParams params = noop_params(grid);
  return cudaGraphExecKernelNodeSetParams(exec, node, &params);
}

cudaError_t set_noop_memset(cudaGraphExec_t exec, cudaGraphNode_t node) {
  cudaMemsetParams params{};
  cudaError_t status = scratch_byte(&params.dst);
  if (status != cudaSuccess) return status;
  params.elementSize = 1;
  params.width = 1;
  params.height = 1;
  return cudaGraphExecMemsetNodeSetParams(exec, node, &params);
}

}  // namespace grape::cuda
