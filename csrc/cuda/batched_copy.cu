#include "cuda/batched_copy.h"

#include <algorithm>
#include <cstdint>

namespace grape::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSegmentsPerLaunch = 96;  // 96 * 24 bytes of kernel parameters
constexpr int kMaxBlocksPerSegment = 1024;

struct Batch {
  CopySegment segments[kMaxSegmentsPerLaunch];
};

// blockIdx.y selects the segment; the blocks along x stride over its bytes, 16 bytes per thread
// when both pointers and the size allow it.
__global__ void batched_copy_kernel(const __grid_constant__ Batch batch) {
  const CopySegment seg = batch.segments[blockIdx.y];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto src_addr = reinterpret_cast<uintptr_t>(seg.src);
  const auto dst_addr = reinterpret_cast<uintptr_t>(seg.dst);
  if (((src_addr | dst_addr) & 15u) == 0) {
    const size_t vectors = seg.bytes / 16;
    const auto* src = static_cast<const uint4*>(seg.src);
    auto* dst = static_cast<uint4*>(seg.dst);
    for (size_t i = tid; i < vectors; i += stride) dst[i] = src[i];
    // The tail past the last whole vector.
    const auto* src_b = static_cast<const unsigned char*>(seg.src);
    auto* dst_b = static_cast<unsigned char*>(seg.dst);
    for (size_t i = vectors * 16 + tid; i < seg.bytes; i += stride) dst_b[i] = src_b[i];
  } else {
    const auto* src = static_cast<const unsigned char*>(seg.src);
    auto* dst = static_cast<unsigned char*>(seg.dst);
    for (size_t i = tid; i < seg.bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t launch_batched_copy(const CopySegment* segments, size_t count, cudaStream_t stream) {
  for (size_t first = 0; first < count; first += kMaxSegmentsPerLaunch) {
    const size_t n = std::min<size_t>(kMaxSegmentsPerLaunch, count - first);
    Batch batch;
    size_t largest = 0;
    for (size_t i = 0; i < n; ++i) {
      batch.segments[i] = segments[first + i];
      largest = std::max(largest, segments[first + i].bytes);
    }
    if (largest == 0) continue;
    // Enough blocks that the largest segment gets ~4 vectors per thread.
    const size_t per_block = static_cast<size_t>(kThreads) * 16 * 4;
    const auto blocks = static_cast<unsigned>(
        std::min<size_t>(kMaxBlocksPerSegment, (largest + per_block - 1) / per_block));
    batched_copy_kernel<<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, stream>>>(batch);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace grape::cuda
