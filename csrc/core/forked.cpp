#include "core/forked.h"

#include <unistd.h>

#include <atomic>

namespace grape::core {

namespace {
// The process in which grape made CUDA state; 0: none yet.
std::atomic<pid_t> cuda_state_process{0};
}  // namespace

bool forked_child() {
  const pid_t owner = cuda_state_process.load(std::memory_order_relaxed);
  return owner != 0 && owner != getpid();
}

void making_cuda_state() {
  pid_t none = 0;
  cuda_state_process.compare_exchange_strong(none, getpid());
}

}  // namespace grape::core
