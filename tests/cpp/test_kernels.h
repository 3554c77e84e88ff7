#pragma once
// Kernels for GPU tests of graphs (test_kernels.cu): two distinct kernels of one signature and
// one launch configuration, for graphs that differ only in which kernel runs at a node, a slow
// one, for work that is still running when the host goes on, and a copy, for a graph that reads.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace grape::test_kernels {

// Sets out[0, bytes) to value + 1 (truncated to a byte) on `stream`; bytes > 0. Returns the
// launch error, if any.
cudaError_t launch_add_one(uint8_t* out, int value, size_t bytes, cudaStream_t stream);
// The same, writing value * 2.
cudaError_t launch_times_two(uint8_t* out, int value, size_t bytes, cudaStream_t stream);
// Sets out[0, bytes) to `value` after each thread has spun for `cycles` clock cycles.
cudaError_t launch_fill_slowly(uint8_t* out, int value, size_t bytes, long long cycles,
                               cudaStream_t stream);

// Copies in[0, bytes) to out[0, bytes).
cudaError_t launch_copy(uint8_t* out, const uint8_t* in, size_t bytes, cudaStream_t stream);

}  // namespace grape::test_kernels
