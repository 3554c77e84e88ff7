#pragma once
// A set of device address ranges [begin, end), kept sorted and merged. Used for the memory a
// graph pool owns (to tell pool outputs from static tensors) and for overlap tests between live
// tensors and a graph's placeholders.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace grape::core {

struct AddressRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;  // one past the last byte
  size_t bytes() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool overlaps(const AddressRange& o) const { return begin < o.end && o.begin < end; }
  bool contains(const AddressRange& o) const { return begin <= o.begin && o.end <= end; }
  friend bool operator==(const AddressRange& a, const AddressRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

inline AddressRange make_range(const void* ptr, size_t bytes) {
  auto b = reinterpret_cast<uintptr_t>(ptr);
  return {b, b + bytes};
}

class AddressRangeSet {
 public:
  // Adds a range, merging it with the ranges it touches. Empty ranges are ignored.
  void add(AddressRange r);
  void clear() { ranges_.clear(); }

  bool overlaps(AddressRange r) const;
  // True if r lies entirely inside one range of the set.
  bool contains(AddressRange r) const;
  size_t total_bytes() const;
  const std::vector<AddressRange>& ranges() const { return ranges_; }

 private:
  // First range whose end is after `addr`.
  std::vector<AddressRange>::const_iterator first_ending_after(uintptr_t addr) const;
  std::vector<AddressRange> ranges_;
};

}  // namespace grape::core
