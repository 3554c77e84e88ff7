#include "core/arena_layout.h"

#include <algorithm>
#include <iterator>

namespace grape::core {

namespace {
size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

// First fit's step over busy intervals taken in address order: true where `size` bytes fit in the
// gap from `cursor` (aligned) to `begin`; else `cursor` moves past the interval's aligned end.
bool fits_before(size_t begin, size_t end, size_t size, size_t alignment, size_t& cursor) {
  if (begin >= cursor && begin - cursor >= size) return true;
  cursor = std::max(cursor, align_up(end, alignment));
  return false;
}
}  // namespace

ArenaLayout::ArenaLayout(size_t capacity, size_t alignment)
    : capacity_(capacity), alignment_(alignment) {}

std::optional<size_t> ArenaLayout::allocate(size_t bytes) {
  if (bytes == 0) return std::nullopt;
  const size_t size = align_up(bytes, alignment_);
  std::optional<size_t> offset;
  if (following_) {
    const size_t index = trace_.allocations.size();
    following_ = index < plan_.placements.size() && plan_.placements[index].first == size &&
                 plan_.placements[index].second <= capacity_ - size &&
                 is_free(plan_.placements[index].second, size);
    if (following_) {
      offset = plan_.placements[index].second;
      ++placed_by_plan_;
    }
  }
  if (!offset) offset = first_fit(size);
  if (!offset) return std::nullopt;
  blocks_.emplace(*offset, size);
  allocated_bytes_ += size;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  extent_ = std::max(extent_, *offset + size);
  if (tracing_) {
    traced_[*offset] = trace_.allocations.size();
    trace_.allocations.push_back({size, *offset, clock_++, LayoutTrace::kLive});
    trace_.extent = std::max(trace_.extent, *offset + size);
  }
  return offset;
}

std::optional<size_t> ArenaLayout::first_fit(size_t size) const {
  // Busy intervals in address order: the blocks (a map, in order) and the pins (kept sorted),
  // merged as they are walked. Every allocation of a capture comes here, with its function's
  // other blocks and pins busy: gathering and sorting them each time cost a large model's capture
  // a sizeable share of its function's time.
  size_t cursor = 0;  // start of the current gap (aligned)
  auto block = blocks_.begin();
  auto pin = pinned_.begin();
  while (block != blocks_.end() || pin != pinned_.end()) {
    size_t begin = 0, end = 0;
    if (pin == pinned_.end() || (block != blocks_.end() && block->first <= pin->first)) {
      begin = block->first;
      end = block->first + block->second;
      ++block;
    } else {
      begin = pin->first;
      end = pin->second;
      ++pin;
    }
    if (fits_before(begin, end, size, alignment_, cursor)) break;
  }
  if (cursor > capacity_ || capacity_ - cursor < size) return std::nullopt;
  return cursor;
}

bool ArenaLayout::is_free(size_t offset, size_t size) const {
  const size_t end = offset + size;
  auto it = blocks_.lower_bound(end);  // the first block at or past the end
  if (it != blocks_.begin() && std::prev(it)->first + std::prev(it)->second > offset) return false;
  for (const auto& [begin, stop] : pinned_) {
    if (begin < end && offset < stop) return false;
  }
  return true;
}

bool ArenaLayout::free(size_t offset) {
  auto it = blocks_.find(offset);
  if (it == blocks_.end()) return false;
  allocated_bytes_ -= it->second;
  blocks_.erase(it);
  if (tracing_) {
    auto traced = traced_.find(offset);
    if (traced != traced_.end()) {
      trace_.allocations[traced->second].freed = clock_++;
      traced_.erase(traced);
    }
  }
  return true;
}

void ArenaLayout::begin_trace(LayoutPlan plan) {
  tracing_ = true;
  clock_ = 0;
  trace_ = {};
  traced_.clear();
  for (const auto& [offset, length] : blocks_) trace_.fixed.emplace_back(offset, offset + length);
  trace_.fixed.insert(trace_.fixed.end(), pinned_.begin(), pinned_.end());
  std::sort(trace_.fixed.begin(), trace_.fixed.end());
  plan_ = std::move(plan);
  following_ = !plan_.empty();
  placed_by_plan_ = 0;
}

LayoutTrace ArenaLayout::end_trace() {
  tracing_ = false;
  following_ = false;
  plan_ = {};
  traced_.clear();
  return std::move(trace_);
}

void ArenaLayout::retract_extent(size_t floor) {
  extent_ = floor;
  if (!blocks_.empty()) {
    const auto& last = *blocks_.rbegin();
    extent_ = std::max(extent_, last.first + last.second);
  }
}

LayoutPlan plan_layout(const LayoutTrace& trace, size_t alignment) {
  const auto& allocations = trace.allocations;
  LayoutPlan plan;
  if (allocations.empty() || allocations.size() > kMaxPlannedAllocations) return plan;
  std::vector<size_t> order(allocations.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return allocations[a].bytes > allocations[b].bytes;
  });
  plan.placements.resize(allocations.size());
  std::vector<size_t> placed;  // indices, in placement order
  placed.reserve(allocations.size());
  std::vector<std::pair<size_t, size_t>> busy;
  for (size_t i : order) {
    const auto& a = allocations[i];
    busy.assign(trace.fixed.begin(), trace.fixed.end());
    for (size_t j : placed) {
      const auto& b = allocations[j];
      if (b.allocated < a.freed && a.allocated < b.freed) {
        busy.emplace_back(plan.placements[j].second, plan.placements[j].second + b.bytes);
      }
    }
    std::sort(busy.begin(), busy.end());
    size_t cursor = 0;
    for (const auto& [begin, end] : busy) {
      if (fits_before(begin, end, a.bytes, alignment, cursor)) break;
    }
    plan.placements[i] = {a.bytes, cursor};
    plan.extent = std::max(plan.extent, cursor + a.bytes);
    placed.push_back(i);
  }
  return plan;
}

void ArenaLayout::pin(size_t offset, size_t bytes) {
  if (bytes == 0) return;
  const std::pair<size_t, size_t> range{offset, offset + bytes};
  pinned_.insert(std::upper_bound(pinned_.begin(), pinned_.end(), range), range);
}

std::optional<std::pair<size_t, size_t>> ArenaLayout::block_containing(size_t offset) const {
  auto it = blocks_.upper_bound(offset);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (offset >= it->first + it->second) return std::nullopt;
  return std::make_pair(it->first, it->second);
}

}  // namespace grape::core
