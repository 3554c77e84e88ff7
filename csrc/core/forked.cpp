#include "core/forked.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace grape::core {

namespace {

// Set in every child forked after grape made CUDA state here (and in their children): a flag
// rather than a comparison of process ids, since every compiled call asks.
std::atomic<bool> in_forked_child{false};

void mark_child() { in_forked_child.store(true, std::memory_order_relaxed); }

}  // namespace

bool forked_child() { return in_forked_child.load(std::memory_order_relaxed); }

void making_cuda_state() {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, &mark_child); });
}

}  // namespace grape::core
