// Note [Signatures of stored graphs]: a stored signature's local words mapped to a later
// process's ids, learned from its live calls.
#include <gtest/gtest.h>

#include "core/signature.h"
#include "core/stored_signatures.h"

namespace {

using grape::core::LocalWordMap;
using grape::core::StoredSignature;
using grape::core::Tag;

constexpr int64_t kInterned = static_cast<int64_t>(Tag::kInterned);
constexpr int64_t kModule = static_cast<int64_t>(Tag::kModule);
constexpr int64_t kTensor = static_cast<int64_t>(Tag::kTensor);

// A call f(module, {"x": tensor of `length`}) as the Flattener writes it: the module by identity,
// the dict's key interned, then the tensor's words. `module` and `key` are the local ids.
StoredSignature call(int64_t module, int64_t key, int64_t length,
                     const std::string& key_text = "interned builtins.str 'x'") {
  grape::core::Signature s;
  s.push(Tag::kTuple);
  s.push(2);
  s.push(Tag::kModule);
  s.push_local(module);
  s.push(Tag::kDict);
  s.push(1);
  s.push(Tag::kInterned);
  s.push_local(key);
  s.push(Tag::kTensor);
  s.push(length);
  s.finish();
  return {s.words(), s.local_positions(), {"identity torch.nn.Linear", key_text}};
}

TEST(StoredSignatures, PushLocalRecordsWhereTheLocalWordsAre) {
  const StoredSignature s = call(0, 0, 8);
  EXPECT_EQ(s.local_positions, (std::vector<uint32_t>{3, 7}));
  EXPECT_EQ(s.words[2], kModule);
  EXPECT_EQ(s.words[6], kInterned);
  EXPECT_EQ(s.words[8], kTensor);
  grape::core::Signature t;
  t.push(Tag::kInterned);
  t.push_local(4);
  t.push(Tag::kInterned);
  t.push_local(5);
  t.truncate(2);
  EXPECT_EQ(t.local_positions(), (std::vector<uint32_t>{1})) << "a truncated word's position goes";
  t.clear();
  EXPECT_TRUE(t.local_positions().empty());
}

TEST(StoredSignatures, AShapeNeverCalledLiveTakesTheIdsItsGroupsLiveCallShowed) {
  // The storing process numbered the module 0 and the key 0; this one, 2 and 5.
  LocalWordMap map;
  EXPECT_FALSE(map.live_words(call(0, 0, 16)).has_value()) << "nothing learned yet";
  ASSERT_TRUE(map.learn(call(0, 0, 8), call(2, 5, 8)));
  const auto words = map.live_words(call(0, 0, 16));
  ASSERT_TRUE(words.has_value());
  EXPECT_EQ(*words, call(2, 5, 16).words);
  EXPECT_EQ(map.size(), 2u);
}

TEST(StoredSignatures, EqualNumberingTranslatesToItselfAndTagsKeepTheirIdsApart) {
  // (stored module, stored key) -> (live module, live key). Module 3 and interned key 3 are two
  // things: learning one says nothing of the other.
  const std::vector<std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>> cases = {
      {{1, 3}, {1, 3}}, {{3, 3}, {4, 9}}};
  for (const auto& [stored, live] : cases) {
    LocalWordMap map;
    ASSERT_TRUE(map.learn(call(stored.first, stored.second, 8), call(live.first, live.second, 8)));
    EXPECT_EQ(*map.live_words(call(stored.first, stored.second, 1)),
              call(live.first, live.second, 1).words);
  }
}

TEST(StoredSignatures, ACallThatDiffersInAValueIsNotTheStoredOneAndTeachesNothing) {
  LocalWordMap map;
  EXPECT_FALSE(map.learn(call(0, 0, 8), call(2, 5, 9)));
  EXPECT_EQ(map.size(), 0u);
  EXPECT_FALSE(map.live_words(call(0, 0, 8)).has_value());
}

TEST(StoredSignatures, LocalWordsThatStandForOtherThingsDoNotMatch) {
  LocalWordMap map;
  EXPECT_FALSE(map.learn(call(0, 0, 8), call(2, 5, 8, "interned builtins.str 'y'")))
      << "another key";
  EXPECT_FALSE(map.learn(call(0, 0, 8, ""), call(2, 5, 8, ""))) << "an unknown id matches nothing";
  EXPECT_EQ(map.size(), 0u);
}

TEST(StoredSignatures, TheMapIsOneToOne) {
  LocalWordMap map;
  ASSERT_TRUE(map.learn(call(0, 0, 8), call(2, 5, 8)));
  EXPECT_FALSE(map.learn(call(0, 0, 9), call(2, 6, 9))) << "stored key 0 is live 5 already";
  EXPECT_FALSE(map.learn(call(0, 1, 9), call(2, 5, 9))) << "live key 5 is stored 0 already";
  EXPECT_TRUE(map.learn(call(0, 1, 9), call(2, 6, 9))) << "a new pair";
  EXPECT_EQ(*map.live_words(call(0, 1, 10)), call(2, 6, 10).words);
}

TEST(StoredSignatures, OneCallCannotPairAWordTwice) {
  // Two local words of one tag in one call: stored ids 0 and 1 would both become live 7.
  auto two_keys = [](int64_t a, int64_t b) {
    grape::core::Signature s;
    s.push(Tag::kInterned);
    s.push_local(a);
    s.push(Tag::kInterned);
    s.push_local(b);
    return StoredSignature{s.words(), s.local_positions(),
                           {"interned builtins.int 1", "interned builtins.int 1"}};
  };
  LocalWordMap map;
  EXPECT_FALSE(map.learn(two_keys(0, 1), two_keys(7, 7)));
  EXPECT_FALSE(map.learn(two_keys(7, 7), two_keys(0, 1)));
  EXPECT_EQ(map.size(), 0u);
}

TEST(StoredSignatures, LocalWordsMustSitAtTheSamePlaces) {
  StoredSignature live = call(2, 5, 8);
  live.local_positions = {3};
  live.local_descriptions = {"identity torch.nn.Linear"};
  LocalWordMap map;
  EXPECT_FALSE(map.learn(call(0, 0, 8), live));
}

TEST(StoredSignatures, MalformedStoredSignaturesAreRefused) {
  StoredSignature s = call(0, 0, 8);
  ASSERT_TRUE(grape::core::valid_stored_signature(s));
  StoredSignature at_start = s;
  at_start.local_positions[0] = 0;
  StoredSignature beyond = s;
  beyond.local_positions[1] = static_cast<uint32_t>(s.words.size());
  StoredSignature unsorted = s;
  unsorted.local_positions = {7, 3};
  StoredSignature adjacent = s;
  adjacent.local_positions = {3, 4};
  StoredSignature undescribed = s;
  undescribed.local_descriptions.pop_back();
  LocalWordMap map;
  for (const StoredSignature* bad : {&at_start, &beyond, &unsorted, &adjacent, &undescribed}) {
    EXPECT_FALSE(grape::core::valid_stored_signature(*bad));
    EXPECT_FALSE(map.learn(*bad, call(2, 5, 8)));
    EXPECT_FALSE(map.live_words(*bad).has_value());
  }
}

}  // namespace
