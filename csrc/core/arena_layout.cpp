#include "core/arena_layout.h"

#include <algorithm>

namespace grape::core {

namespace {
size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }
}  // namespace

ArenaLayout::ArenaLayout(size_t capacity, size_t alignment)
    : capacity_(capacity), alignment_(alignment) {}

std::optional<size_t> ArenaLayout::allocate(size_t bytes) {
  if (bytes == 0) return std::nullopt;
  const size_t size = align_up(bytes, alignment_);
  // Busy intervals in address order: blocks and pins.
  std::vector<std::pair<size_t, size_t>> busy;
  busy.reserve(blocks_.size() + pinned_.size());
  for (const auto& [offset, length] : blocks_) busy.emplace_back(offset, offset + length);
  busy.insert(busy.end(), pinned_.begin(), pinned_.end());
  std::sort(busy.begin(), busy.end());

  size_t cursor = 0;  // start of the current gap (aligned)
  for (const auto& [begin, end] : busy) {
    if (begin >= cursor && begin - cursor >= size) break;
    cursor = std::max(cursor, align_up(end, alignment_));
  }
  if (cursor > capacity_ || capacity_ - cursor < size) return std::nullopt;
  blocks_.emplace(cursor, size);
  allocated_bytes_ += size;
  extent_ = std::max(extent_, cursor + size);
  return cursor;
}

bool ArenaLayout::free(size_t offset) {
  auto it = blocks_.find(offset);
  if (it == blocks_.end()) return false;
  allocated_bytes_ -= it->second;
  blocks_.erase(it);
  return true;
}

void ArenaLayout::pin(size_t offset, size_t bytes) {
  if (bytes > 0) pinned_.emplace_back(offset, offset + bytes);
}

std::optional<std::pair<size_t, size_t>> ArenaLayout::block_containing(size_t offset) const {
  auto it = blocks_.upper_bound(offset);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (offset >= it->first + it->second) return std::nullopt;
  return std::make_pair(it->first, it->second);
}

}  // namespace grape::core
