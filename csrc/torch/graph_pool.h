#pragma once
// Note [Graph pool]
// ~~~~~~~~~~~~~~~~~
// One per compiled function. It owns
//   - a private pool of PyTorch's caching allocator that every capture of the function allocates
//     its temporaries and outputs from, so graphs of all shapes share memory and the pool stays
//     near the largest capture's working set instead of growing with the number of shapes;
//   - a second private pool for the graphs' input placeholders, shared by all shapes too. Keeping
//     placeholders apart from outputs means an output fed back as the next call's input never
//     overlaps that call's placeholder, so it can be moved in with one copy;
//   - the stream captures run on: one stream for all captures, because the allocator reuses a
//     pool's free blocks only on the stream that freed them;
//   - the registry of storages handed to callers that point into the pool
//     (see Note [Liveness of graph outputs] in core/replay_plan.h).
// Every handed-out storage holds a reference to its GraphPool, so pool memory stays reserved while
// any caller's tensor still points into it, even after the compiled function is gone.

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Storage.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <vector>

#include "core/address_ranges.h"

namespace grape {

class GraphPool : public std::enable_shared_from_this<GraphPool> {
 public:
  static std::shared_ptr<GraphPool> create(c10::DeviceIndex device);
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;

  c10::MempoolId_t id() const { return id_; }
  c10::MempoolId_t inputs_id() const { return inputs_id_; }
  // Routes allocations made on the capture stream to the placeholder pool until the returned
  // guard ends (outside of a stream capture).
  class PlaceholderAllocation {
   public:
    explicit PlaceholderAllocation(GraphPool& pool);
    ~PlaceholderAllocation();
    PlaceholderAllocation(const PlaceholderAllocation&) = delete;
    PlaceholderAllocation& operator=(const PlaceholderAllocation&) = delete;

   private:
    GraphPool& pool_;
    int use_count_before_;
  };
  c10::DeviceIndex device() const { return device_; }
  at::cuda::CUDAStream capture_stream() const { return capture_stream_; }
  // Makes the capture stream wait for the work queued so far on `stream`.
  void wait_for(const at::cuda::CUDAStream& stream);
  // Reference count the caching allocator keeps for a pool (ours plus one per live graph).
  int allocator_use_count() const;
  int allocator_use_count(c10::MempoolId_t id) const;
  // Drops allocator references to pool `id` beyond `count` (begin/endAllocateToPool leave one).
  void release_to(c10::MempoolId_t id, int count);
  // Torch versions differ in whether a captured CUDAGraph keeps a reference to its pool until it
  // is destroyed. These two make sure it does, so destroying a graph never takes ours:
  // after a successful capture (`before`: the count before capture_begin)...
  void hold_for_graph(int before);
  // ...and to destroy a captured graph.
  void destroy_graph(std::unique_ptr<at::cuda::CUDAGraph>& graph);

  // Re-reads the address ranges of the pool's segments (after a capture grew them).
  void refresh_segments();
  const core::AddressRangeSet& segments() const { return segments_; }

  struct LiveStorage {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    core::AddressRange range;
  };

  // A new storage over pool memory for a caller; registered live.
  c10::Storage hand_out(void* ptr, size_t bytes);
  // Points a live or new storage at pool memory `ptr` (its size unchanged) and registers it there.
  void move_into(c10::StorageImpl* storage, void* ptr);
  // Points a storage at `data` outside the pool and forgets it.
  void move_out(c10::StorageImpl* storage, c10::DataPtr&& data);

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
  c10::MempoolId_t inputs_id_;
  cudaStream_t raw_stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;
  at::cuda::CUDAStream capture_stream_;
  core::AddressRangeSet segments_;
  std::vector<LiveStorage> live_;
};

}  // namespace grape
