#pragma once
// Note [One compiled call at a time]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Threads call compiled functions at once (a server's request threads), while other threads run
// eager CUDA work. Every compiled call holds one process-wide lock, the call lock, for its whole
// length, whether it warms up, captures, replays or runs eagerly:
//   - A capture must meet no other grape work. On torch versions whose CUDA generator keeps one
//     process-wide capture flag (2.11), a random op of a replay or of an eager run raises while any
//     graph of the device captures; and a capture's failure must not end another's.
//   - A compiled function's state (its signatures, its pool's registry of live outputs, its
//     executables) is read and changed by every call, and f releases the GIL while its kernels
//     launch, so the GIL does not keep two calls apart.
//   - One lock, re-entrant, cannot deadlock with itself: a call that calls compiled functions (a
//     compiled model inside a compiled step) takes it again.
// A replay holds the GIL from start to end, so the lock takes no parallelism from replays that
// they had; what it costs is that other threads' calls wait while one thread captures or runs a
// compiled function eagerly. The lock is waited for with the GIL released, so the holder, which
// needs the GIL to go on, is never kept from finishing.
// Captures use CUDA's thread-local capture mode: other threads' eager work (allocations that map
// new memory among it) neither fails nor ends a capture. What torch itself refuses stays refused:
// on torch 2.11 a random op in another thread, outside grape, raises while a graph captures.
// Two calls take no lock: a call inside a capture, which runs eagerly into that capture and
// touches no state of its function; and a call from a backward pass (the autograd engine's
// thread) while another thread holds the lock, which runs eagerly, since that thread may be
// waiting for this backward pass (a checkpointed block recomputed inside a compiled step's
// warm-up). grape.stats reads without the lock (what it reads changes only while the GIL is
// held), and reset() from a backward pass while another thread holds the lock raises. A
// compiled function must not wait, while it runs eagerly, for another thread's compiled call:
// that call waits for the lock it holds.

namespace grape {

class CallLock {
 public:
  // Takes the lock, waiting as long as it takes with the GIL released. `unless_busy`, asked only
  // where another thread holds the lock: if it says so, held() is false at once instead. A forked
  // child has a lock of its own, held only where the thread that forked held it.
  explicit CallLock(bool (*unless_busy)() = nullptr);
  ~CallLock();
  CallLock(const CallLock&) = delete;
  CallLock& operator=(const CallLock&) = delete;

  bool held() const { return held_; }
  // Whether the calling thread holds the lock (tests).
  static bool held_by_this_thread();

 private:
  bool held_ = false;
};

// Whether the calling thread runs a backward pass (the autograd engine's thread, or a backward
// called from this one): the `unless_busy` of calls that must not wait for the lock's holder.
bool in_backward_pass();

}  // namespace grape
