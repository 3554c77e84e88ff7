#pragma once
// The device memory that a compiled function's captures allocate from: five lanes of reserved
// virtual address space, each backed by physical memory mapped on demand from its start up to its
// extent (see Note [Capture arena layout] in core/arena_layout.h):
//   - kLarge:       capture allocations above kSmallLimit (caches, activations of big batches);
//   - kSmall:       capture allocations up to kSmallLimit, kept apart so that small outputs a
//                   caller holds do not split the large lane's free space;
//   - kPlaceholder: the graphs' input placeholders, allocated before each capture begins;
//   - kInput:       buffers handed to the caller's allocations at predicted sites (Note
//                   [Allocation-site prediction]); a graph writes one only as its own placeholder
//                   (a graph restored from the graph cache may before the buffer exists, never
//                   while a tensor holds one there);
//   - kOutput:      capture allocations up to kSmallLimit predicted to outlive the capture or to
//                   change size with the shape, kept apart from the small lane's temporaries
//                   (Note [Outputs apart from temporaries] in core/survivor_prediction.h).
// All lanes but kInput are shared by every graph of the function: any replay may write anywhere
// in them, and the runtime's liveness rules (Note [Liveness of graph outputs]) protect what
// callers hold.
//
// Blocks are handed out as DataPtrs whose context is the data pointer itself (like the caching
// allocator's), freed through a process-wide registry of arenas. An arena whose owner is gone stays
// alive, memory mapped, until its last block is freed: a library may keep a block allocated during
// a capture (a workspace) beyond the function's life.

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/address_ranges.h"
#include "core/arena_layout.h"
#include "core/memory_budget.h"
#include "core/survivor_prediction.h"

namespace grape {

enum class ArenaLane { kLarge = 0, kSmall = 1, kPlaceholder = 2, kInput = 3, kOutput = 4 };

class GraphArena : public std::enable_shared_from_this<GraphArena> {
 public:
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr int kLanes = 5;

  // Reserves the lanes' address space on `device` and registers the arena.
  static std::shared_ptr<GraphArena> create(c10::DeviceIndex device);
  ~GraphArena();
  GraphArena(const GraphArena&) = delete;
  GraphArena& operator=(const GraphArena&) = delete;

  // A block in `lane`, mapping memory as needed. Throws c10::OutOfMemoryError when the device has
  // no memory left for it.
  c10::DataPtr allocate(ArenaLane lane, size_t bytes);
  // A block for an allocation that a capture makes (not a placeholder), in the lane its size and
  // Note [Outputs apart from temporaries] choose.
  c10::DataPtr allocate_for_capture(size_t bytes);

  // Keeps memory out of reach of allocate() until unpin_all() (ranges outside the arena are
  // ignored).
  void pin(core::AddressRange range);
  void unpin_all();
  // A block must not be reused before the end of the current capture: it was used on another
  // stream, whose work the capture does not order against ours.
  void hold_until_unpin(const void* ptr);

  // Growth beyond `bytes` mapped in all lanes throws c10::OutOfMemoryError (a memory budget).
  void set_limit(size_t bytes);

  // Note [Planned capture layouts] (core/arena_layout.h). A plan per lane (empty: first fit).
  using CapturePlan = std::vector<core::LayoutPlan>;
  // Traces every lane's allocations from here on, placing them along `plan` where it has lanes.
  void begin_capture(const CapturePlan& plan);
  // Ends the trace (again: does nothing). For a capture that followed no plan: the plan of what it
  // allocated, where that would map less than the capture did by a granule at least, and by a
  // sixteenth of the arena or half of what the capture grew it by; empty otherwise. `survivors`,
  // where given, receives the blocks the capture allocated that are still allocated.
  // `completed`: false for a capture that failed part-way, whose allocations then predict nothing
  // (Note [Outputs apart from temporaries]): its retry allocates as it did.
  CapturePlan end_capture(std::vector<core::AddressRange>* survivors = nullptr,
                          bool completed = true);
  // After the capture that just ended was dropped and its blocks freed: unmaps what it mapped
  // beyond the arena's size before it, sparing the blocks still allocated.
  void forget_capture();
  // Whether some allocation of the last capture did not take its planned offset.
  bool plan_diverged() const;

  // Maps `lane` from its start up to `bytes` at least, allocating nothing: the memory a shape
  // restored from the graph cache reads and writes at its stored offsets. Throws
  // c10::OutOfMemoryError as allocate() does.
  void map_at_least(ArenaLane lane, size_t bytes);

  bool contains(const void* ptr) const;
  core::AddressRange lane_range(ArenaLane lane) const;
  // Device memory mapped by each lane, and in all.
  size_t mapped_bytes(ArenaLane lane) const;
  size_t mapped_bytes() const;
  size_t allocated_bytes() const;
  // The most bytes each lane ever held allocated at once (the floor of its mapped bytes).
  size_t peak_allocated_bytes(ArenaLane lane) const;
  c10::DeviceIndex device() const { return device_; }

  // Called by the owner when it no longer needs the arena: it goes away with its last block.
  // Not during a stream capture (its destructor synchronizes the device, which would invalidate
  // the capture): an arena whose last block is freed then (by Python's garbage collector, say)
  // waits for destroy_released(), which each capture calls once it has ended.
  void release_owner();
  static void destroy_released();
  // The deleter of every arena block; frees `ptr` in whichever arena holds it.
  static void free_block(void* ptr);
  // Frees `ptr` if an arena holds it; false (nothing done) otherwise.
  static bool free_if_owned(void* ptr);
  // The arena holding `ptr`, if any.
  static std::shared_ptr<GraphArena> find(const void* ptr);

 private:
  explicit GraphArena(c10::DeviceIndex device);
  // Frees `ptr` here; returns whether the arena is now empty and its owner gone.
  bool free_local(void* ptr);
  void map_up_to(int lane, size_t extent);  // requires mutex_
  c10::DataPtr allocate_locked(int lane, size_t bytes);  // requires mutex_

  struct Lane {
    uintptr_t base = 0;
    size_t reserved = 0;
    size_t mapped = 0;
    std::unique_ptr<core::ArenaLayout> layout;
    std::vector<unsigned long long> handles;  // CUmemGenericAllocationHandle of each mapping
    std::vector<size_t> handle_bytes;         // ... and its size, mapped in order from the base
    std::vector<size_t> held;                 // block offsets freed while held
    // At the start of the capture being traced: what was mapped, and the layout's extent.
    size_t mapped_before = 0;
    size_t extent_before = 0;
    size_t planned = 0;  // allocations in the plan the capture follows
  };
  c10::DeviceIndex device_;
  size_t granularity_ = 0;
  mutable std::mutex mutex_;
  std::array<Lane, kLanes> lanes_;
  std::vector<const void*> holds_;  // blocks held until unpin_all()
  // Note [Outputs apart from temporaries]: the prediction, and each small allocation of the
  // capture being traced: where it went (its lane and its index in that lane's trace), its size.
  core::SurvivorPrediction survivors_;
  struct SmallAllocation {
    int lane = 0;
    size_t index = 0;
    size_t bytes = 0;
  };
  std::vector<SmallAllocation> small_allocations_;
  bool owner_released_ = false;
  size_t limit_ = core::kNoLimit;
};

}  // namespace grape
