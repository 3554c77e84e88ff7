#include "torch/memory/capture_state.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <atomic>

namespace grape {

namespace {

std::atomic<int> active_routes{0};

}  // namespace

bool current_stream_is_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

bool allocation_routes_active() { return active_routes.load() > 0; }
void enter_allocation_route() { ++active_routes; }
void leave_allocation_route() { --active_routes; }

}  // namespace grape
