#include "core/address_ranges.h"

#include <algorithm>

namespace grape::core {

std::vector<AddressRange>::const_iterator AddressRangeSet::first_ending_after(
    uintptr_t addr) const {
  return std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                          [](uintptr_t a, const AddressRange& r) { return a < r.end; });
}

void AddressRangeSet::add(AddressRange r) {
  if (r.empty()) return;
  // Ranges that touch or overlap r: end >= r.begin and begin <= r.end.
  auto lo = std::lower_bound(ranges_.begin(), ranges_.end(), r.begin,
                             [](const AddressRange& x, uintptr_t a) { return x.end < a; });
  auto hi = lo;
  while (hi != ranges_.end() && hi->begin <= r.end) {
    r.begin = std::min(r.begin, hi->begin);
    r.end = std::max(r.end, hi->end);
    ++hi;
  }
  lo = ranges_.erase(lo, hi);
  ranges_.insert(lo, r);
}

bool AddressRangeSet::overlaps(AddressRange r) const {
  if (r.empty()) return false;
  auto it = first_ending_after(r.begin);
  return it != ranges_.end() && it->begin < r.end;
}

bool AddressRangeSet::contains(AddressRange r) const {
  if (r.empty()) return false;
  auto it = first_ending_after(r.begin);
  return it != ranges_.end() && it->contains(r);
}

size_t AddressRangeSet::total_bytes() const {
  size_t total = 0;
  for (const auto& r : ranges_) total += r.bytes();
  return total;
}

}  // namespace grape::core
