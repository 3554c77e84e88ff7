#pragma once
// Note [Graph pool]
// ~~~~~~~~~~~~~~~~~
// One per compiled function. It owns
//   - the GraphArena that every capture of the function allocates from (through the allocator
//     hook, Note [Allocator hook]): placeholders, temporaries and outputs of all shapes share its
//     lanes, so memory stays near the largest capture's working set instead of growing with the
//     number of shapes. Placeholders have a lane of their own, so an output fed back as the next
//     call's input never overlaps that call's copied-in placeholder and can be moved in with one
//     copy;
//   - a private pool of PyTorch's caching allocator, which CUDAGraph needs for what the hook does
//     not route (raw allocations, side streams of the capture);
//   - the stream captures run on: one stream for all captures, so capture allocations are ordered
//     by that stream;
//   - the registry of storages handed to callers that point into the pool
//     (see Note [Liveness of graph outputs] in core/replay_plan.h).
// Every handed-out storage holds a reference to its GraphPool, so pool memory stays reserved while
// any caller's tensor still points into it, even after the compiled function is gone.

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Storage.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/address_ranges.h"
#include "torch/memory/graph_arena.h"

namespace grape {

// A captured CUDAGraph whose executable lives in a SharedExecutables (Note [Shared executables]).
// It keeps what a replay needs from PyTorch, the RNG states registered during its capture and the
// reference to the pool, and hands its cudaGraph_t over. Captured with keep_graph, so capture_end
// does not instantiate. A failed capture leaves PyTorch's generators as they were, and the
// destructor never throws (Note [Generators of a failed capture]).
class ReplayGraph : public at::cuda::CUDAGraph {
 public:
  ReplayGraph() : at::cuda::CUDAGraph(/*keep_graph=*/true) {}
  // The executable is not ours: CUDAGraph's destructor must not destroy it.
  ~ReplayGraph();
  ReplayGraph(const ReplayGraph&) = delete;
  ReplayGraph& operator=(const ReplayGraph&) = delete;

  // Before capture_begin, with `device`'s capture stream current and no allocation route active:
  // registers the device's default generator with this graph, as capture_begin would.
  void register_generators(c10::DeviceIndex device);
  // After a capture that did not reach its end: takes the generators out of capture mode.
  void abandon_capture();
  // Whether the captured graph draws random numbers (a generator's offset advances with each
  // replay, which PyTorch's replay does and a graph restored in another process could not).
  bool draws_random_numbers() const;
  // The captured graph's node count (after capture_end).
  size_t node_count() const;
  // The captured graph; the caller owns it from here on.
  cudaGraph_t release_graph();
  // PyTorch's replay (RNG offsets advanced for the registered generators), launching `exec`.
  void launch(cudaGraphExec_t exec);
  // Launches the captured graph once, from an executable of its own, destroyed once it has run
  // (the work a capture recorded before f raised, Note [Exceptions under capture]).
  void launch_once();

 private:
  void detach() {
    graph_exec_ = nullptr;
    has_graph_exec_ = false;
  }
};

class GraphPool : public std::enable_shared_from_this<GraphPool> {
 public:
  static std::shared_ptr<GraphPool> create(c10::DeviceIndex device);
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;

  c10::MempoolId_t id() const { return id_; }
  GraphArena& arena() const { return *arena_; }
  c10::DeviceIndex device() const { return device_; }
  at::cuda::CUDAStream capture_stream() const { return capture_stream_; }
  // Makes the capture stream wait for the work queued so far on `stream`.
  void wait_for(const at::cuda::CUDAStream& stream);
  // Reference count the caching allocator keeps for the private pool (ours plus one per live
  // graph).
  int allocator_use_count() const;
  // Drops allocator references to the private pool beyond `count` (begin/endAllocateToPool leave
  // one).
  void release_to(int count);
  // Torch versions differ in whether a captured CUDAGraph keeps a reference to its pool until it
  // is destroyed. These two make sure it does, so destroying a graph never takes ours:
  // after a successful capture (`before`: the count before capture_begin)...
  void hold_for_graph(int before);
  // ...and to destroy a captured graph.
  void destroy_graph(std::unique_ptr<ReplayGraph>& graph);
  // After a capture that failed before its end: the pinned-host allocator stops sending this
  // pool's captures their allocations, as capture_end would have it (a second capture of the pool
  // is refused while it does).
  void end_host_recording();

  // Re-reads the address ranges of the pool's memory: the arena's lanes and the private pool's
  // segments (after a capture grew them).
  void refresh_segments();
  const core::AddressRangeSet& segments() const { return segments_; }
  // Device memory the pool holds: the arena's mapped lanes and the private pool's segments, as of
  // the last refresh_segments().
  size_t device_bytes() const { return arena_->mapped_bytes() + private_pool_bytes_; }

  // A number of the calling thread that no other thread of the process gets, even after this one
  // has ended (std::thread::id, a pthread_t, goes to the next thread at once).
  static uint64_t calling_thread();

  struct LiveStorage {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    core::AddressRange range;
    std::shared_ptr<bool> read_in_place;  // of the graph whose replay made it, if any
    // The thread whose call handed it out (Note [Outputs of several threads]).
    uint64_t taker = calling_thread();
    bool taken_by_this_thread() const { return taker == calling_thread(); }
  };

  // A new storage over pool memory for a caller; registered live. `read_in_place`: the flag of the
  // graph that made it (CapturedGraph::outputs_read_in_place).
  c10::Storage hand_out(void* ptr, size_t bytes, std::shared_ptr<bool> read_in_place);
  // Points a live or new storage at pool memory `ptr` (its size unchanged) and registers it there.
  void move_into(c10::StorageImpl* storage, void* ptr);
  // Points each storage at a copy of its bytes outside the pool (one batched copy on `stream`)
  // and forgets it: what a caller keeps must not be memory that replays may write. Returns the
  // bytes copied.
  size_t evacuate(const std::vector<c10::StorageImpl*>& storages, cudaStream_t stream);

  // Drops registry entries whose storage died.
  void prune_live();
  // The registry entry of a storage, or null if it is not a live handed-out storage.
  const LiveStorage* find_live(const c10::StorageImpl* storage) const;
  const std::vector<LiveStorage>& live() const { return live_; }

 private:
  explicit GraphPool(c10::DeviceIndex device);
  c10::DataPtr pool_data_ptr(void* ptr);

  c10::DeviceIndex device_;
  c10::MempoolId_t id_;
  std::shared_ptr<GraphArena> arena_;
  cudaStream_t raw_stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;
  at::cuda::CUDAStream capture_stream_;
  core::AddressRangeSet segments_;
  size_t private_pool_bytes_ = 0;
  std::vector<LiveStorage> live_;
};

}  // namespace grape
