#include "test_kernels.h"

namespace grape::test_kernels {

namespace {

constexpr unsigned kThreads = 256;

unsigned blocks(size_t bytes) { return static_cast<unsigned>((bytes + kThreads - 1) / kThreads); }

__global__ void add_one(uint8_t* out, int value, size_t bytes) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < bytes) out[i] = static_cast<uint8_t>(value + 1);
}

__global__ void times_two(uint8_t* out, int value, size_t bytes) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < bytes) out[i] = static_cast<uint8_t>(value * 2);
}

__global__ void fill_slowly(uint8_t* out, int value, size_t bytes, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < bytes) out[i] = static_cast<uint8_t>(value);
}

__global__ void copy(uint8_t* out, const uint8_t* in, size_t bytes) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < bytes) out[i] = in[i];
}

}  // namespace

cudaError_t launch_add_one(uint8_t* out, int value, size_t bytes, cudaStream_t stream) {
  add_one<<<blocks(bytes), kThreads, 0, stream>>>(out, value, bytes);
  return cudaGetLastError();
}

cudaError_t launch_times_two(uint8_t* out, int value, size_t bytes, cudaStream_t stream) {
  times_two<<<blocks(bytes), kThreads, 0, stream>>>(out, value, bytes);
  return cudaGetLastError();
}

cudaError_t launch_fill_slowly(uint8_t* out, int value, size_t bytes, long long cycles,
                               cudaStream_t stream) {
  fill_slowly<<<blocks(bytes), kThreads, 0, stream>>>(out, value, bytes, cycles);
  return cudaGetLastError();
}

cudaError_t launch_copy(uint8_t* out, const uint8_t* in, size_t bytes, cudaStream_t stream) {
  copy<<<blocks(bytes), kThreads, 0, stream>>>(out, in, bytes);
  return cudaGetLastError();
}

}  // namespace grape::test_kernels
