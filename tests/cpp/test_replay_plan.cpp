#include <gtest/gtest.h>

#include "core/replay_plan.h"

using namespace grape::core;

namespace {
constexpr uintptr_t kPool = 0x10000;  // pool memory starts here
constexpr uintptr_t kUser = 0x90000;  // caller memory, outside the pool

PlanPlaceholder ph(uintptr_t begin, size_t bytes, bool mutated = false) {
  return {{begin, begin + bytes}, mutated};
}
PlanStorage storage(uintptr_t begin, size_t bytes, bool pool_resident) {
  return {{begin, begin + bytes}, pool_resident};
}
PlanInput whole(int s, uintptr_t begin, size_t bytes) { return {s, {begin, begin + bytes}, true}; }
}  // namespace

TEST(ReplayPlan, CallerTensorsAreCopiedIn) {
  auto plan = plan_replay({storage(kUser, 64, false)}, {whole(0, kUser, 64)}, {ph(kPool, 64)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  EXPECT_TRUE(plan.evacuate.empty());
  EXPECT_FALSE(plan.copy_back[0]);
}

TEST(ReplayPlan, MutatedCallerTensorIsCopiedBack) {
  auto plan =
      plan_replay({storage(kUser, 64, false)}, {whole(0, kUser, 64)}, {ph(kPool, 64, true)});
  ASSERT_TRUE(plan.safe());
  EXPECT_TRUE(plan.copy_back[0]);
}

TEST(ReplayPlan, LiveOutputFedBackMovesIntoItsPlaceholder) {
  // The decode loop: last step's output (pool memory, still referenced) is this step's input.
  auto plan = plan_replay({storage(kPool + 4096, 64, true)}, {whole(0, kPool + 4096, 64)},
                          {ph(kPool, 64)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kMoveIn);
  EXPECT_TRUE(plan.evacuate.empty());
}

TEST(ReplayPlan, LiveOutputIsNotMovedIntoASiteBuffer) {
  // The allocation site hands its buffer to the caller's next allocation, which would overwrite a
  // tensor moved there (found by tests/python/test_fuzz_gpu.py): evacuate, then copy in.
  PlanPlaceholder buffer = ph(kPool, 64, true);
  buffer.site_buffer = true;
  auto plan = plan_replay({storage(kPool + 4096, 64, true)}, {whole(0, kPool + 4096, 64)},
                          {buffer});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  EXPECT_EQ(plan.evacuate, std::vector<int>{0});
  EXPECT_TRUE(plan.copy_back[0]);  // a mutation reaches the caller's tensor, where it now is
}

TEST(ReplayPlan, MovedInputThatIsMutatedNeedsNoCopyBack) {
  auto plan = plan_replay({storage(kPool + 4096, 64, true)}, {whole(0, kPool + 4096, 64)},
                          {ph(kPool, 64, true)});
  EXPECT_EQ(plan.actions[0], InputAction::kMoveIn);
  EXPECT_FALSE(plan.copy_back[0]);
}

TEST(ReplayPlan, InputAlreadyInItsPlaceholderStays) {
  auto plan = plan_replay({storage(kPool, 64, true)}, {whole(0, kPool, 64)}, {ph(kPool, 64)});
  EXPECT_EQ(plan.actions[0], InputAction::kNone);
  EXPECT_TRUE(plan.evacuate.empty());
}

TEST(ReplayPlan, LiveOutputOverlappingAPlaceholderIsEvacuatedFirst) {
  // Copying a range into one that overlaps it would corrupt it: evacuate, then copy in.
  auto plan = plan_replay({storage(kPool + 32, 64, true)}, {whole(0, kPool + 32, 64)},
                          {ph(kPool, 64)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  ASSERT_EQ(plan.evacuate.size(), 1u);
  EXPECT_EQ(plan.evacuate[0], 0);
}

TEST(ReplayPlan, PartialViewOfLiveOutputIsEvacuated) {
  // A slice cannot be moved (the rest of its storage would be left in memory the replay writes).
  PlanInput slice{0, {kPool + 4096, kPool + 4096 + 32}, false};
  auto plan = plan_replay({storage(kPool + 4096, 64, true)}, {slice}, {ph(kPool, 32)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  EXPECT_EQ(plan.evacuate.size(), 1u);
}

TEST(ReplayPlan, StorageSharedByTwoInputsIsEvacuatedOnce) {
  auto plan = plan_replay({storage(kPool + 4096, 64, true)},
                          {whole(0, kPool + 4096, 64), whole(0, kPool + 4096, 64)},
                          {ph(kPool, 64), ph(kPool + 64, 64)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.evacuate.size(), 1u);
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  EXPECT_EQ(plan.actions[1], InputAction::kCopyIn);
}

TEST(ReplayPlan, MutatingAnAliasedInputIsRefused) {
  auto plan = plan_replay({storage(kUser, 64, false)},
                          {whole(0, kUser, 64), PlanInput{0, {kUser, kUser + 32}, false}},
                          {ph(kPool, 64, true), ph(kPool + 64, 32)});
  EXPECT_FALSE(plan.safe());
  EXPECT_NE(plan.unsafe_reason.find("shares memory"), std::string::npos);
}

TEST(ReplayPlan, ReadOnlyAliasedInputsAreFine) {
  auto plan = plan_replay({storage(kUser, 64, false)},
                          {whole(0, kUser, 64), PlanInput{0, {kUser, kUser + 32}, false}},
                          {ph(kPool, 64), ph(kPool + 64, 32)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
  EXPECT_EQ(plan.actions[1], InputAction::kCopyIn);
}

TEST(ReplayPlan, ForeignMemoryInsideAPlaceholderIsRefused) {
  // Memory we did not hand out can't be moved out of the way.
  auto plan = plan_replay({storage(kPool, 64, false)}, {whole(0, kPool + 8, 56)},
                          {ph(kPool + 16, 64)});
  EXPECT_FALSE(plan.safe());
}

TEST(ReplayPlan, MismatchedCountsAreRefused) {
  auto plan = plan_replay({storage(kUser, 64, false)}, {whole(0, kUser, 64)}, {});
  EXPECT_FALSE(plan.safe());
}

TEST(ReplayPlan, LiveOutputThatIsNoInputIsEvacuated) {
  // Any graph may write anywhere in the pool: an output the caller holds but does not pass moves.
  auto plan = plan_replay({storage(kUser, 64, false), storage(kPool + 4096, 64, true)},
                          {whole(0, kUser, 64)}, {ph(kPool, 64)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.evacuate, std::vector<int>{1});
  EXPECT_EQ(plan.actions[0], InputAction::kCopyIn);
}

TEST(ReplayPlan, AnotherThreadsOutputIsNeverMoved) {
  // That thread may be reading it at its old address right now (Note [Outputs of several
  // threads]): not evacuated when the call does not pass it...
  PlanStorage theirs = storage(kPool + 4096, 64, true);
  theirs.other_thread = true;
  auto plan = plan_replay({storage(kUser, 64, false), theirs}, {whole(0, kUser, 64)},
                          {ph(kPool, 64)});
  EXPECT_FALSE(plan.safe());
  EXPECT_TRUE(plan.spares_other_thread);
  // ...nor moved into its placeholder when it does...
  plan = plan_replay({theirs}, {whole(0, kPool + 4096, 64)}, {ph(kPool, 64)});
  EXPECT_FALSE(plan.safe());
  EXPECT_TRUE(plan.spares_other_thread);
  // ...but read where it lies when it is the placeholder.
  theirs.range = {kPool, kPool + 64};
  plan = plan_replay({theirs}, {whole(0, kPool, 64)}, {ph(kPool, 64, true)});
  ASSERT_TRUE(plan.safe());
  EXPECT_EQ(plan.actions[0], InputAction::kNone);
  EXPECT_TRUE(plan.evacuate.empty());
}

TEST(ReplayPlan, OtherRefusalsAreNotTheOtherThreads) {
  auto plan = plan_replay({storage(kPool, 64, false)}, {whole(0, kPool + 8, 56)},
                          {ph(kPool + 16, 64)});
  EXPECT_FALSE(plan.safe());
  EXPECT_FALSE(plan.spares_other_thread);
}
