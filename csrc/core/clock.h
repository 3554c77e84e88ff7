#pragma once
// Host wall time for the counters that grape.stats() reports as seconds.

#include <chrono>
#include <cstdint>

namespace grape::core {

using Clock = std::chrono::steady_clock;

inline int64_t elapsed_ns(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
}

// A counter of nanoseconds as grape.stats() reports it.
inline double seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace grape::core
