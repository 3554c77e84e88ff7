// GPU tests of the batched copy kernel; they skip on machines without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "cuda/batched_copy.h"

namespace {

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

}  // namespace

TEST(BatchedCopy, CopiesManySegmentsOfOddSizesAndAlignments) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  // Sizes and offsets exercise the vector path, the byte path and the tails; 130 segments
  // take two launches.
  const size_t count = 130;
  std::vector<size_t> sizes(count), src_off(count), dst_off(count);
  size_t total_src = 0, total_dst = 0;
  for (size_t i = 0; i < count; ++i) {
    sizes[i] = (i % 7 == 0) ? (1u << 20) + i : 1 + i * 37;
    src_off[i] = total_src + (i % 3);  // misaligned for some
    dst_off[i] = total_dst + ((i % 5 == 0) ? 0 : 16);
    total_src = src_off[i] + sizes[i] + 64;
    total_dst = dst_off[i] + sizes[i] + 64;
  }
  std::vector<uint8_t> host_src(total_src);
  for (size_t i = 0; i < total_src; ++i) host_src[i] = static_cast<uint8_t>(i * 131 + 7);
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&src), total_src));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dst), total_dst));
  CUDA_OK(cudaMemcpy(src, host_src.data(), total_src, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dst, 0xAB, total_dst));

  std::vector<grape::cuda::CopySegment> segments;
  for (size_t i = 0; i < count; ++i) segments.push_back({src + src_off[i], dst + dst_off[i], sizes[i]});
  CUDA_OK(grape::cuda::launch_batched_copy(segments, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint8_t> host_dst(total_dst);
  CUDA_OK(cudaMemcpy(host_dst.data(), dst, total_dst, cudaMemcpyDeviceToHost));
  size_t next = 0;
  for (size_t i = 0; i < count; ++i) {
    for (size_t b = next; b < dst_off[i]; ++b) ASSERT_EQ(host_dst[b], 0xAB) << "gap before " << i;
    for (size_t b = 0; b < sizes[i]; ++b) {
      ASSERT_EQ(host_dst[dst_off[i] + b], host_src[src_off[i] + b]) << "segment " << i << " byte " << b;
    }
    next = dst_off[i] + sizes[i];
  }
  cudaFree(src);
  cudaFree(dst);
}

TEST(BatchedCopy, EmptyBatchAndZeroSizedSegmentsAreNoOps) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(grape::cuda::launch_batched_copy(nullptr, 0, nullptr), cudaSuccess);
  grape::cuda::CopySegment empty{nullptr, nullptr, 0};
  EXPECT_EQ(grape::cuda::launch_batched_copy(&empty, 1, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
