#include "torch/call_lock.h"

#include <pybind11/pybind11.h>

#include <mutex>

#include "core/forked.h"

namespace grape {

namespace {

// Never destroyed: a thread may still hold it while the interpreter exits.
std::recursive_mutex& call_mutex() {
  static auto* mutex = new std::recursive_mutex();
  return *mutex;
}

thread_local int depth = 0;  // how many CallLocks this thread holds

}  // namespace

CallLock::CallLock(bool unless_busy) {
  // In a forked child the parent's threads that held it are gone, and nothing runs on graphs.
  if (core::forked_child()) {
    held_ = true;
    return;
  }
  if (!call_mutex().try_lock()) {
    if (unless_busy) return;
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release without_gil;
      call_mutex().lock();
    } else {
      call_mutex().lock();
    }
  }
  held_ = true;
  ++depth;
}

CallLock::~CallLock() {
  if (!held_ || core::forked_child()) return;
  --depth;
  call_mutex().unlock();
}

bool CallLock::held_by_this_thread() { return depth > 0; }

}  // namespace grape
