#include "torch/call_lock.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/graph_task.h>

#include <pthread.h>

#include <mutex>

namespace grape {

namespace {

std::recursive_mutex* call_mutex_ = nullptr;
thread_local int depth = 0;  // how many CallLocks this thread holds

// In a forked child the threads that held the lock in the parent are gone: the child takes a new
// lock, held as often as the thread that forked held the old one (a call that forks keeps its
// lock). The old one is left as it is.
void renew_in_child() {
  auto* fresh = new std::recursive_mutex();
  for (int i = 0; i < depth; ++i) fresh->lock();
  call_mutex_ = fresh;
}

// Never destroyed: a thread may still hold it while the interpreter exits.
std::recursive_mutex& call_mutex() {
  static std::once_flag made;
  std::call_once(made, [] {
    call_mutex_ = new std::recursive_mutex();
    pthread_atfork(nullptr, nullptr, &renew_in_child);
  });
  return *call_mutex_;
}

}  // namespace

CallLock::CallLock(bool (*unless_busy)()) {
  if (!call_mutex().try_lock()) {
    if (unless_busy != nullptr && unless_busy()) return;
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
  if (!held_) return;
  --depth;
  call_mutex().unlock();
}

bool CallLock::held_by_this_thread() { return depth > 0; }

bool in_backward_pass() { return torch::autograd::get_current_graph_task_id() != -1; }

}  // namespace grape
