#pragma once
// A compiled function's memory budget (grape.compile's memory_budget): one number for its graph
// memory, the arena and the resident executables together. Each side may take what the other
// leaves: a capture grows the arena up to the budget less the executables, and executables are
// evicted (least recently used first) down to the budget less the arena.

#include <cstddef>
#include <cstdint>
#include <optional>

namespace grape::core {

// "No limit", the one way to say it in C++: a limit of bytes that nothing reaches. (Python says
// None, which the bindings pass as an empty std::optional.)
inline constexpr size_t kNoLimit = SIZE_MAX;

class MemoryBudget {
 public:
  // `bytes` empty: no budget.
  explicit MemoryBudget(std::optional<size_t> bytes) : bytes_(bytes) {}
  bool limited() const { return bytes_.has_value(); }
  std::optional<size_t> bytes() const { return bytes_; }
  // What the arena may map while resident executables hold `executable_bytes` (kNoLimit without
  // a budget).
  size_t arena_limit(size_t executable_bytes) const { return rest(executable_bytes); }
  // What resident executables may hold while the arena maps `arena_bytes` (kNoLimit without one).
  size_t executable_limit(size_t arena_bytes) const { return rest(arena_bytes); }

 private:
  size_t rest(size_t taken) const {
    if (!limited()) return kNoLimit;
    return *bytes_ > taken ? *bytes_ - taken : 0;
  }
  std::optional<size_t> bytes_;
};

}  // namespace grape::core
