#pragma once
// Note [Capture arena layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where a capture's allocations go inside one lane of a compiled function's arena (see Note
// [Graph pool] in csrc/torch/memory/graph_pool.h). A lane is a reserved range of virtual addresses
// whose physical memory is mapped from offset 0 up to the highest byte ever handed out (the
// extent), so the lane's device memory is its extent, rounded up to the mapping granularity.
//
// Placement is first fit in address order over the gaps between allocated blocks and pinned
// ranges; freed blocks coalesce with their neighbours by construction (only allocated blocks are
// stored). First fit keeps the extent near the working set even as shapes grow: a step that reads
// a live buffer of size s and writes one of size s' > s lays out as a ping-pong whose extent stays
// under about three times the largest buffer, with no rounding of request sizes (a caching
// allocator with fixed segments instead leaves a dead segment behind at every size it outgrows).
//
// Pins hold memory that callers still reference (graph outputs handed out) out of a capture's
// reach without owning it: the capture lays out around them, so its graph reads a live input in
// place and never writes over another live output.
//
// This file is torch-free and unit-tested; csrc/torch/memory/graph_arena.cpp maps the memory.
//
// Note [Planned capture layouts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// First fit places each allocation as it comes, not knowing when it will be freed. A training step
// defeats it: the forward pass saves activations that the backward frees in reverse order among
// gradients of other sizes, and the extent ends far above the most bytes ever live at once
// (docs/results.md, "Figures behind design rules", gives wav2vec2's). Once a capture has run,
// though, its whole sequence is known: every allocation's size and when it was freed (a trace).
// Placed offline, largest first, each at the lowest offset free throughout its lifetime (greedy by
// size, as TensorFlow Lite's arena planner does), the same sequence needs about its live peak. A
// graph cannot be moved once captured (its kernels hold its addresses), so grape's runtime captures
// again, along the plan, a graph whose first-fit layout grew the arena well beyond what its plan
// needs. Following a plan, an allocation takes its planned offset if it comes as traced (the same
// aligned size, in order) and the range is free; from the first one that does not, placement is
// first fit again, so a plan can cost memory but never correctness.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace grape::core {

// A capture's allocations in one lane, in the order they came (Note [Planned capture layouts]).
struct LayoutTrace {
  static constexpr uint64_t kLive = UINT64_MAX;  // not freed before the trace ended
  struct Allocation {
    size_t bytes = 0;     // aligned
    size_t offset = 0;    // where it was placed
    uint64_t allocated = 0;  // event times: allocations and frees numbered in order
    uint64_t freed = kLive;
  };
  std::vector<std::pair<size_t, size_t>> fixed;  // [begin, end) busy when the trace began
  std::vector<Allocation> allocations;
  size_t extent = 0;  // the highest end of a traced allocation
};

// Offsets for a trace's allocations, in their order, and the extent they reach.
struct LayoutPlan {
  std::vector<std::pair<size_t, size_t>> placements;  // (aligned bytes, offset)
  size_t extent = 0;
  bool empty() const { return placements.empty(); }
};

// Greedy by size: allocations largest first (earlier first among equals), each at the lowest
// aligned offset that no fixed range and no placed allocation whose lifetime overlaps its own
// occupies. An empty plan for traces above kMaxPlannedAllocations (the search is quadratic).
constexpr size_t kMaxPlannedAllocations = 8192;
LayoutPlan plan_layout(const LayoutTrace& trace, size_t alignment = 512);

class ArenaLayout {
 public:
  // `capacity`: bytes of address space in the lane. `alignment`: of every block (a power of two).
  explicit ArenaLayout(size_t capacity, size_t alignment = 512);

  // Offset of a new block of `bytes` (> 0), or nullopt when the lane's address space is full.
  std::optional<size_t> allocate(size_t bytes);
  // Frees the block that starts at `offset`; returns false if no block starts there.
  bool free(size_t offset);
  // Keeps [offset, offset + bytes) out of allocate() until unpin_all().
  void pin(size_t offset, size_t bytes);
  void unpin_all() { pinned_.clear(); }

  // Records the allocations and frees from here on, and places allocations along `plan` while
  // they come as it expects (Note [Planned capture layouts]).
  void begin_trace(LayoutPlan plan = {});
  // Stops recording and following; returns what was recorded.
  LayoutTrace end_trace();
  bool tracing() const { return tracing_; }
  // Allocations recorded so far by the current trace: the next one's index in it.
  size_t traced_allocations() const { return trace_.allocations.size(); }
  // Allocations of the current or last trace that took their planned offset.
  size_t placed_by_plan() const { return placed_by_plan_; }
  // Lowers the extent to `floor`, or to the end of the highest block if that is higher: after the
  // blocks of a dropped capture were freed, so the memory above need not stay mapped.
  void retract_extent(size_t floor);

  // The allocated block containing `offset`: (start, bytes).
  std::optional<std::pair<size_t, size_t>> block_containing(size_t offset) const;
  size_t extent() const { return extent_; }
  size_t capacity() const { return capacity_; }
  size_t allocated_bytes() const { return allocated_bytes_; }
  // The most bytes ever allocated at once: what no placement can go below.
  size_t peak_allocated_bytes() const { return peak_allocated_bytes_; }
  size_t blocks() const { return blocks_.size(); }

 private:
  size_t capacity_;
  size_t alignment_;
  std::map<size_t, size_t> blocks_;  // offset -> bytes (aligned)
  std::vector<std::pair<size_t, size_t>> pinned_;  // (begin, end), sorted
  size_t extent_ = 0;
  size_t allocated_bytes_ = 0;
  size_t peak_allocated_bytes_ = 0;

  // Whether [offset, offset + size) overlaps no block and no pin.
  bool is_free(size_t offset, size_t size) const;
  std::optional<size_t> first_fit(size_t size) const;

  bool tracing_ = false;
  uint64_t clock_ = 0;
  LayoutTrace trace_;
  std::map<size_t, size_t> traced_;  // offset of a live traced block -> its allocation's index
  LayoutPlan plan_;
  bool following_ = false;
  size_t placed_by_plan_ = 0;
};

}  // namespace grape::core
