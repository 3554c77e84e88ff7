#include <gtest/gtest.h>

#include <vector>

#include "core/arena_layout.h"
#include "core/survivor_prediction.h"

using namespace grape::core;
using Allocation = SurvivorPrediction::Allocation;

TEST(SurvivorPrediction, NothingGoesApartBeforeAnyCaptureEnded) {
  SurvivorPrediction p;
  p.begin();
  EXPECT_FALSE(p.next_apart(512));
  EXPECT_FALSE(p.next_apart(1024));
}

TEST(SurvivorPrediction, FollowsTheLastCaptureByAllocationOrder) {
  SurvivorPrediction p;
  p.begin();
  p.end({{512, false}, {512, true}, {1024, false}});
  p.begin();
  EXPECT_FALSE(p.next_apart(512));   // a temporary of the same size
  EXPECT_TRUE(p.next_apart(512));    // survived the last capture
  EXPECT_TRUE(p.next_apart(1536));   // a temporary that grew
  EXPECT_FALSE(p.next_apart(512));   // beyond the last capture's allocations
  p.end({{512, true}});
  p.begin();
  EXPECT_TRUE(p.next_apart(512));
  EXPECT_FALSE(p.next_apart(512));
}

TEST(SurvivorPrediction, ADroppedCaptureIsTakenAgainAsItWasPredicted) {
  SurvivorPrediction p;
  p.begin();
  p.end({{512, true}, {512, false}});
  p.begin();  // predicted from the first capture
  p.end({{512, false}, {512, false}});
  p.forget();  // dropped: its retake must allocate as it did
  p.begin();
  EXPECT_TRUE(p.next_apart(512));
  EXPECT_FALSE(p.next_apart(512));
  p.end({{512, false}, {512, true}});  // the retake was kept
  p.begin();
  EXPECT_FALSE(p.next_apart(512));
  EXPECT_TRUE(p.next_apart(512));
}

namespace {

// Offsets of a decode step's fixed-size temporaries, the step laid out as a capture sees it: the
// last step's outputs (the cache) still allocated, each layer appending a token to its cache (an
// output), repeating it over grouped heads (a temporary that grows too) and computing with two
// temporaries of one size; the last step's outputs are freed once the step is done.
struct DecodeSteps {
  static constexpr int kLayers = 4;
  static constexpr size_t kTokenBytes = 512;
  ArenaLayout small{size_t{1} << 30};
  ArenaLayout outputs{size_t{1} << 30};
  std::vector<std::pair<ArenaLayout*, size_t>> cache;  // the last step's outputs

  std::vector<size_t> step(size_t tokens, SurvivorPrediction* prediction) {
    if (prediction != nullptr) prediction->begin();
    std::vector<Allocation> traced;
    std::vector<std::pair<ArenaLayout*, size_t>> made, temporaries;
    std::vector<size_t> temporary_offsets;
    auto allocate = [&](size_t bytes, bool output) {
      const bool apart = prediction != nullptr && prediction->next_apart(bytes);
      ArenaLayout* lane = apart ? &outputs : &small;
      const size_t offset = *lane->allocate(bytes);
      traced.push_back({bytes, output});
      (output ? made : temporaries).emplace_back(lane, offset);
      if (!output && bytes <= 8192) temporary_offsets.push_back(offset);
    };
    for (int layer = 0; layer < kLayers; ++layer) {
      allocate(tokens * kTokenBytes, /*output=*/true);
      allocate(4 * tokens * kTokenBytes, false);
      allocate(4096, false);
      allocate(8192, false);
      for (const auto& [lane, offset] : temporaries) lane->free(offset);
      temporaries.clear();
    }
    if (prediction != nullptr) prediction->end(traced);
    for (const auto& [lane, offset] : cache) lane->free(offset);
    cache = made;
    return temporary_offsets;
  }
};

}  // namespace

TEST(SurvivorPrediction, TemporariesKeepTheirOffsetsAsTheOutputsGrow) {
  DecodeSteps steps;
  SurvivorPrediction prediction;
  steps.step(8, &prediction);  // nothing predicted yet
  steps.step(9, &prediction);  // its temporaries lay out around the cache the last step left
  const std::vector<size_t> first = steps.step(10, &prediction);
  EXPECT_EQ(first.size(), 2u * DecodeSteps::kLayers);
  for (size_t tokens = 11; tokens < 40; ++tokens) {
    EXPECT_EQ(steps.step(tokens, &prediction), first) << tokens << " tokens";
  }
}

TEST(SurvivorPrediction, WithoutItGrowingOutputsMoveTheTemporaries) {
  // The layout the prediction avoids: the same steps in one lane.
  DecodeSteps steps;
  std::vector<size_t> last = steps.step(8, nullptr);
  int moved = 0;
  for (size_t tokens = 9; tokens < 40; ++tokens) {
    std::vector<size_t> now = steps.step(tokens, nullptr);
    moved += now != last ? 1 : 0;
    last = std::move(now);
  }
  EXPECT_GT(moved, 25);
}
