#pragma once
// A compiled function's memory budget (grape.compile's memory_budget): one number for its graph
// memory, the arena and the resident executables together. Each side may take what the other
// leaves: a capture grows the arena up to the budget less the executables, and executables are
// evicted (least recently used first) down to the budget less the arena.

#include <cstddef>
#include <cstdint>

namespace grape::core {

class MemoryBudget {
 public:
  // `bytes` < 0: no budget.
  explicit MemoryBudget(int64_t bytes) : bytes_(bytes) {}
  bool limited() const { return bytes_ >= 0; }
  int64_t bytes() const { return bytes_; }  // < 0: none
  // What the arena may map while resident executables hold `executable_bytes` (SIZE_MAX: no limit).
  size_t arena_limit(size_t executable_bytes) const { return rest(executable_bytes); }
  // What resident executables may hold while the arena maps `arena_bytes` (SIZE_MAX: no limit).
  size_t executable_limit(size_t arena_bytes) const { return rest(arena_bytes); }

 private:
  size_t rest(size_t taken) const {
    if (!limited()) return SIZE_MAX;
    const auto budget = static_cast<size_t>(bytes_);
    return budget > taken ? budget - taken : 0;
  }
  int64_t bytes_;
};

}  // namespace grape::core
