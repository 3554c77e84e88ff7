#pragma once
// One kernel launch that performs many device-to-device copies. A replay typically copies a few
// inputs into placeholders and evacuates a few live outputs; issuing one cudaMemcpyAsync for each
// costs a few microseconds of CPU per copy, which is the whole budget of a replay.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace grape::cuda {

struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
};

// Copies every segment on `stream`. Segments must not overlap each other's destinations, and no
// destination may overlap a source. Launch errors are returned, not thrown (the caller checks).
cudaError_t launch_batched_copy(const CopySegment* segments, size_t count, cudaStream_t stream);

inline cudaError_t launch_batched_copy(const std::vector<CopySegment>& segments,
                                       cudaStream_t stream) {
  return launch_batched_copy(segments.data(), segments.size(), stream);
}

}  // namespace grape::cuda
