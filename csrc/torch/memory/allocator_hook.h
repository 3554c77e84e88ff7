#pragma once
// Note [Allocator hook]
// ~~~~~~~~~~~~~~~~~~~~~
// grape sends the allocations a capture makes to the function's GraphArena instead of a private
// pool of PyTorch's caching allocator, so it decides where they land (around live outputs, in
// lanes that grow in place). Stock PyTorch has no per-pool allocation callback, so grape installs
// a CUDAAllocator that delegates every call to the allocator that was current before it, and
// intercepts one case only: `allocate()` on the thread and stream of an active AllocationRoute.
// Everything else (tensors made outside captures, raw_alloc, other streams, statistics, pools,
// IPC, snapshots) is PyTorch's, unchanged. Off a route the cost is one thread-local read, plus one
// atomic read once some function predicts where its inputs are allocated (Note [Allocation-site
// prediction]): then allocations of the size classes those sites serve, made by a thread that
// calls compiled functions, are looked up by their Python code position.
//
// The hook is installed by the first capture and can be removed at run time when no route is
// active; blocks already handed out keep their own deleters either way.

#include <cuda_runtime_api.h>

#include "torch/memory/graph_arena.h"

namespace grape {

void install_allocator_hook();
// Puts the previous allocator back; refuses (returns false) while a route is active.
bool uninstall_allocator_hook();
bool allocator_hook_installed();

// While alive, allocations this thread makes on `stream` come from `arena`: placeholders from its
// placeholder lane, anything else from the lane its size selects. A route `for_all_threads` also
// takes other threads' allocations on `stream`: a capture's backward pass runs on the autograd
// engine's device thread, on the stream of the forward it differentiates (one such route at a
// time: a capture's).
class AllocationRoute {
 public:
  AllocationRoute(GraphArena& arena, cudaStream_t stream, bool placeholders,
                  bool for_all_threads = false);
  ~AllocationRoute();
  AllocationRoute(const AllocationRoute&) = delete;
  AllocationRoute& operator=(const AllocationRoute&) = delete;

  GraphArena& arena() const { return arena_; }
  cudaStream_t stream() const { return stream_; }
  bool placeholders() const { return placeholders_; }

 private:
  GraphArena& arena_;
  cudaStream_t stream_;
  bool placeholders_;
  bool for_all_threads_;
  AllocationRoute* previous_;
};

// The innermost route of this thread, or null. Whether any thread has one: capture_state.h.
AllocationRoute* current_allocation_route();

}  // namespace grape
