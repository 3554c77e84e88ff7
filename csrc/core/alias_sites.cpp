#include "core/alias_sites.h"

#include <functional>

namespace grape::core {

size_t CodePositionHash::operator()(const CodePosition& p) const {
  return std::hash<const void*>()(p.code) * 31 + static_cast<size_t>(p.offset);
}

size_t SiteHash::operator()(const Site& s) const {
  return CodePositionHash()(s.position) * 1000003 + static_cast<size_t>(s.occurrence);
}

int size_class(size_t bytes) {
  if (bytes <= (size_t{1} << kMinSizeClass)) return kMinSizeClass;
  // ceil(log2(bytes)); sizes beyond 2^63 do not exist on a device.
  return 64 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1));
}

size_t class_capacity(int size_class) { return size_t{1} << size_class; }

int OccurrenceCounter::next(const CodePosition& position, int size_class) {
  return counts_[position][size_class]++;
}

void AllocationLog::record(const void* ptr, size_t bytes, const Site& site) {
  if (entries_.size() < kCapacity) {
    entries_.push_back({ptr, bytes, site});
    return;
  }
  entries_[next_] = {ptr, bytes, site};
  next_ = (next_ + 1) % kCapacity;
}

std::optional<Site> AllocationLog::find(const void* ptr, size_t bytes) const {
  // Newest first: memory freed and reused keeps only its latest allocation's site.
  const size_t n = entries_.size();
  for (size_t k = 0; k < n; ++k) {
    const Entry& e = entries_[(next_ + n - 1 - k) % n];
    if (e.ptr == ptr) {
      if (e.bytes == bytes) return e.site;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

void AllocationLog::clear() {
  entries_.clear();
  next_ = 0;
}

bool SiteTable::assign(const Site& site, int64_t target) {
  auto [it, inserted] = sites_.emplace(site, target);
  if (inserted) return true;
  if (it->second == target) return false;
  it->second = target;
  return true;
}

std::optional<int64_t> SiteTable::target_of(const Site& site) const {
  auto it = sites_.find(site);
  if (it == sites_.end()) return std::nullopt;
  return it->second;
}

void SiteTable::forget(int64_t target) {
  for (auto it = sites_.begin(); it != sites_.end();) {
    it = it->second == target ? sites_.erase(it) : std::next(it);
  }
  if (sites_.empty()) class_mask_ = 0;
}

void SiteTable::note_class(int size_class) {
  for (int c = size_class - 1; c <= size_class + 1; ++c) {
    if (c >= 0 && c < kSizeClasses) class_mask_ |= uint64_t{1} << c;
  }
}

bool LearningBudget::after_call(int unexplained, int learned, bool warm_up) {
  if (!learning_) return false;
  if (warm_up && learned == 0) return true;
  if (learned > 0) {
    fruitless_ = 0;
    learning_ = unexplained > 0;  // satisfied once every input is explained
  } else if (unexplained > 0) {
    learning_ = ++fruitless_ < kFruitlessWindows;
  } else {
    learning_ = ++quiet_ < kQuietCalls;
  }
  return learning_;
}

bool LearningBudget::resume() {
  if (!exhausted()) {
    learning_ = true;
    quiet_ = 0;
  }
  return learning_;
}

std::optional<size_t> choose_buffer(const std::vector<bool>& busy, size_t max_buffers) {
  for (size_t i = 0; i < busy.size(); ++i) {
    if (!busy[i]) return i;
  }
  if (busy.size() < max_buffers) return busy.size();
  return std::nullopt;
}

}  // namespace grape::core
