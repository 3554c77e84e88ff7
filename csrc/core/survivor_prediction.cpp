#include "core/survivor_prediction.h"

#include <utility>

namespace grape::core {

void SurvivorPrediction::begin() {
  if (ended_) {
    last_ = std::move(*ended_);
    ended_.reset();
  }
  next_ = 0;
}

bool SurvivorPrediction::next_apart(size_t bytes) {
  const size_t n = next_++;
  return n < last_.size() && (last_[n].survived || last_[n].bytes != bytes);
}

void SurvivorPrediction::end(std::vector<Allocation> allocations) {
  ended_ = std::move(allocations);
}

}  // namespace grape::core
