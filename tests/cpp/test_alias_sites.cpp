#include <gtest/gtest.h>

#include "core/alias_sites.h"

using namespace grape::core;

namespace {
const char kCode = 'a';  // stands for a code object
const char kOtherCode = 'b';
CodePosition at(int offset, const void* code = &kCode) { return {code, offset}; }
}  // namespace

TEST(SizeClass, PowersOfTwoFrom512Bytes) {
  EXPECT_EQ(size_class(1), kMinSizeClass);
  EXPECT_EQ(size_class(512), 9);
  EXPECT_EQ(size_class(513), 10);
  EXPECT_EQ(size_class(1024), 10);
  EXPECT_EQ(size_class(size_t{3} << 20), 22);
  EXPECT_EQ(class_capacity(size_class(5000)), 8192u);
  for (size_t bytes : {size_t{1}, size_t{777}, size_t{1} << 20, (size_t{1} << 20) + 1}) {
    EXPECT_GE(class_capacity(size_class(bytes)), bytes);
    EXPECT_LT(class_capacity(size_class(bytes)), 2 * bytes + 1024);
  }
}

TEST(OccurrenceCounter, CountsPerPositionAndClassUntilReset) {
  OccurrenceCounter counter;
  EXPECT_EQ(counter.next(at(10), 12), 0);
  EXPECT_EQ(counter.next(at(10), 12), 1);
  EXPECT_EQ(counter.next(at(10), 13), 0);  // another class at the same position
  EXPECT_EQ(counter.next(at(12), 12), 0);  // another position
  EXPECT_EQ(counter.next(at(10, &kOtherCode), 12), 0);  // another code object
  counter.reset();
  EXPECT_EQ(counter.next(at(10), 12), 0);
}

TEST(AllocationLog, FindsTheLatestSiteOfAPointer) {
  AllocationLog log;
  int memory[2];
  log.record(&memory[0], 64, {at(4), 0});
  log.record(&memory[1], 64, {at(8), 0});
  log.record(&memory[0], 128, {at(6), 1});  // the first block freed and reused
  auto site = log.find(&memory[0], 128);
  ASSERT_TRUE(site.has_value());
  EXPECT_EQ(site->position.offset, 6);
  EXPECT_EQ(site->occurrence, 1);
  EXPECT_FALSE(log.find(&memory[0], 64).has_value());  // that allocation is gone
  EXPECT_EQ(log.find(&memory[1], 64)->position.offset, 8);
  EXPECT_FALSE(log.find(&memory[1], 32).has_value());  // a storage of another size
  EXPECT_FALSE(log.find(nullptr, 64).has_value());
}

TEST(AllocationLog, KeepsTheMostRecentWhenFull) {
  AllocationLog log;
  std::vector<char> memory(AllocationLog::kCapacity + 10);
  for (size_t i = 0; i < memory.size(); ++i) log.record(&memory[i], 8, {at(static_cast<int>(i)), 0});
  EXPECT_EQ(log.size(), AllocationLog::kCapacity);
  EXPECT_FALSE(log.find(&memory[0], 8).has_value());
  EXPECT_EQ(log.find(&memory.back(), 8)->position.offset, static_cast<int>(memory.size() - 1));
  EXPECT_EQ(log.find(&memory[10], 8)->position.offset, 10);
  log.clear();
  EXPECT_TRUE(log.empty());
}

TEST(SiteTable, ASiteFeedsTheFunctionThatSawItLast) {
  SiteTable table;
  const Site ids{at(20), 0};
  const Site second_ids{at(20), 1};
  EXPECT_TRUE(table.assign(ids, 1));
  EXPECT_FALSE(table.assign(ids, 1));  // again: no change
  EXPECT_EQ(table.target_of(ids), 1);
  EXPECT_FALSE(table.target_of(second_ids).has_value());
  EXPECT_TRUE(table.assign(second_ids, 1));
  EXPECT_TRUE(table.assign(second_ids, 2));  // a function compiled again takes it over
  EXPECT_EQ(table.target_of(second_ids), 2);
  table.forget(1);
  EXPECT_FALSE(table.target_of(ids).has_value());
  EXPECT_EQ(table.target_of(second_ids), 2);
  EXPECT_EQ(table.size(), 1u);
}

TEST(SiteTable, LooksUpTheClassesSitesServeAndTheirNeighbours) {
  SiteTable table;
  EXPECT_FALSE(table.worth_lookup(12));
  table.assign({at(1), 0}, 1);
  table.note_class(12);
  EXPECT_TRUE(table.worth_lookup(11));
  EXPECT_TRUE(table.worth_lookup(12));
  EXPECT_TRUE(table.worth_lookup(13));  // a growing input reaches the next class
  EXPECT_FALSE(table.worth_lookup(14));
  EXPECT_FALSE(table.worth_lookup(10));
  table.forget(1);
  EXPECT_FALSE(table.worth_lookup(12));  // no sites left: nothing to look up
}

TEST(LearningBudget, StopsWhenSatisfiedAndResumesOnACopy) {
  LearningBudget budget;
  EXPECT_TRUE(budget.learning());
  EXPECT_TRUE(budget.after_call(/*unexplained=*/2, /*learned=*/0));  // nothing recorded yet
  EXPECT_TRUE(budget.after_call(0, 0));   // a call with nothing to judge keeps recording
  EXPECT_FALSE(budget.after_call(0, 2));  // learned, and every input explained: satisfied
  EXPECT_FALSE(budget.after_call(1, 0));  // not learning: no change
  EXPECT_TRUE(budget.resume());           // a replay copied an input
  EXPECT_TRUE(budget.after_call(1, 1));   // learned one, one still unknown
  EXPECT_FALSE(budget.exhausted());
}

TEST(LearningBudget, WarmUpCallsAreNeverFruitless) {
  LearningBudget budget;
  for (int i = 0; i < 3 * LearningBudget::kFruitlessWindows; ++i) {
    EXPECT_TRUE(budget.after_call(1, 0, /*warm_up=*/true));
  }
  EXPECT_TRUE(budget.after_call(1, 1, /*warm_up=*/true));  // learned, one input still unknown
  EXPECT_FALSE(budget.after_call(0, 1, /*warm_up=*/true));  // satisfied
}

TEST(LearningBudget, StopsAfterManyCallsWithNothingToLearn) {
  LearningBudget budget;
  for (int i = 1; i < LearningBudget::kQuietCalls; ++i) ASSERT_TRUE(budget.after_call(0, 0));
  EXPECT_FALSE(budget.after_call(0, 0));
  EXPECT_FALSE(budget.exhausted());
  EXPECT_TRUE(budget.resume());
  EXPECT_TRUE(budget.after_call(0, 0));  // resuming starts the count again
}

TEST(LearningBudget, StopsForGoodAfterFruitlessWindows) {
  LearningBudget budget;
  for (int i = 1; i < LearningBudget::kFruitlessWindows; ++i) EXPECT_TRUE(budget.after_call(1, 0));
  EXPECT_TRUE(budget.after_call(1, 1));  // learning resets the count
  for (int i = 1; i < LearningBudget::kFruitlessWindows; ++i) EXPECT_TRUE(budget.after_call(1, 0));
  EXPECT_FALSE(budget.after_call(1, 0));
  EXPECT_TRUE(budget.exhausted());
  EXPECT_FALSE(budget.resume());
  budget.restart();
  EXPECT_TRUE(budget.learning());
}

TEST(ChooseBuffer, FirstFreeThenNewThenNone) {
  EXPECT_EQ(choose_buffer({}, 2), 0u);                // create the first
  EXPECT_EQ(choose_buffer({true}, 2), 1u);            // the previous input is alive: a second
  EXPECT_EQ(choose_buffer({false, true}, 2), 0u);     // ping-pong
  EXPECT_EQ(choose_buffer({true, false}, 2), 1u);
  EXPECT_FALSE(choose_buffer({true, true}, 2).has_value());  // both held: no prediction
}
