#include "cuda/noop_nodes.h"

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda/driver.h"

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

// Bytes that no-op memsets set, of both kinds a memset's destination may be (the driver may
// refuse a destination of another kind than the node's): from cudaMalloc, and mapped through the
// virtual memory calls, as grape's arena is. Per device, made at first use, kept for the process.
enum class ScratchKind { kAllocated, kMapped };

cudaError_t make_mapped(int device, void** bytes) {
  const DriverApi& d = driver();
  if (d.cuMemCreate == nullptr || d.cuMemMap == nullptr || d.cuMemSetAccess == nullptr ||
      d.cuMemAddressReserve == nullptr || d.cuMemGetAllocationGranularity == nullptr) {
    return cudaErrorNotSupported;
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t size = 0;
  if (d.cuMemGetAllocationGranularity(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
      CUDA_SUCCESS) {
    return cudaErrorUnknown;
  }
  CUdeviceptr at = 0;
  CUmemGenericAllocationHandle handle = 0;
  if (d.cuMemAddressReserve(&at, size, size, 0, 0) != CUDA_SUCCESS) return cudaErrorUnknown;
  if (d.cuMemCreate(&handle, size, &prop, 0) != CUDA_SUCCESS) return cudaErrorMemoryAllocation;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (d.cuMemMap(at, size, 0, handle, 0) != CUDA_SUCCESS ||
      d.cuMemSetAccess(at, size, &access, 1) != CUDA_SUCCESS) {
    return cudaErrorUnknown;  // the process keeps what it reserved: a granule at most
  }
  *bytes = reinterpret_cast<void*>(at);
  return cudaSuccess;
}

cudaError_t scratch(ScratchKind kind, void** bytes) {
  static std::mutex mutex;
  static std::vector<void*> made[2];
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  std::vector<void*>& per_device = made[static_cast<int>(kind)];
  const auto index = static_cast<size_t>(device);
  std::lock_guard<std::mutex> lock(mutex);
  if (per_device.size() <= index) per_device.resize(index + 1, nullptr);
  if (per_device[index] == nullptr) {
    // Allocating is no stream operation: allow it while this thread captures (as PyTorch's
    // caching allocator does), so that a capture in progress is not invalidated.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    status = kind == ScratchKind::kAllocated ? cudaMalloc(&per_device[index], sizeof(uint32_t))
                                             : make_mapped(device, &per_device[index]);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (status != cudaSuccess) {
      per_device[index] = nullptr;
      return status;
    }
  }
  *bytes = per_device[index];
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

cudaError_t set_noop_memset(cudaGraphExec_t exec, cudaGraphNode_t node, unsigned element_size) {
  cudaError_t status = cudaErrorInvalidValue;
  for (ScratchKind kind : {ScratchKind::kAllocated, ScratchKind::kMapped}) {
    cudaMemsetParams params{};
    status = scratch(kind, &params.dst);
    if (status != cudaSuccess) continue;
    params.elementSize = element_size;
    params.width = 1;
    params.height = 1;
    status = cudaGraphExecMemsetNodeSetParams(exec, node, &params);
    if (status == cudaSuccess) return status;
    (void)cudaGetLastError();
  }
  return status;
}

}  // namespace grape::cuda
