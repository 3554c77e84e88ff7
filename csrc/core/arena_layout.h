#pragma once
// Note [Capture arena layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where a capture's allocations go inside one lane of a compiled function's arena (see Note
// [Graph pool] in csrc/torch/graph_pool.h). A lane is a reserved range of virtual addresses whose
// physical memory is mapped from offset 0 up to the highest byte ever handed out (the extent),
// so the lane's device memory is its extent, rounded up to the mapping granularity.
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
// This file is torch-free and unit-tested; csrc/torch/graph_pool.cpp maps the memory.

#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace grape::core {

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

  // The allocated block containing `offset`: (start, bytes).
  std::optional<std::pair<size_t, size_t>> block_containing(size_t offset) const;
  size_t extent() const { return extent_; }
  size_t capacity() const { return capacity_; }
  size_t allocated_bytes() const { return allocated_bytes_; }
  size_t blocks() const { return blocks_.size(); }

 private:
  size_t capacity_;
  size_t alignment_;
  std::map<size_t, size_t> blocks_;  // offset -> bytes (aligned)
  std::vector<std::pair<size_t, size_t>> pinned_;  // (begin, end), unsorted
  size_t extent_ = 0;
  size_t allocated_bytes_ = 0;
};

}  // namespace grape::core
