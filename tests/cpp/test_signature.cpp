#include <gtest/gtest.h>

#include <unordered_set>

#include "core/signature.h"

using grape::core::Signature;
using grape::core::Tag;

namespace {
Signature make(std::initializer_list<int64_t> words) {
  Signature s;
  for (auto w : words) s.push(w);
  s.finish();
  return s;
}
}  // namespace

TEST(Signature, EqualWordsAreEqualAndHashAlike) {
  auto a = make({1, 2, 3});
  auto b = make({1, 2, 3});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
}

TEST(Signature, OrderAndLengthMatter) {
  EXPECT_NE(make({1, 2, 3}), make({3, 2, 1}));
  EXPECT_NE(make({1, 2}), make({1, 2, 0}));
  EXPECT_NE(make({}), make({0}));
}

TEST(Signature, ClearResets) {
  Signature s = make({7, 8});
  s.clear();
  s.push(Tag::kNone);
  s.finish();
  EXPECT_EQ(s, make({static_cast<int64_t>(Tag::kNone)}));
}

TEST(Signature, HashSpreadsNeighbouringShapes) {
  // The decode loop's keys differ in one size word; they must not collide.
  std::unordered_set<uint64_t> hashes;
  for (int64_t len = 1; len <= 4096; ++len) {
    hashes.insert(make({static_cast<int64_t>(Tag::kTensor), 5, 0, 4, 1, 12, len, 64}).hash());
  }
  EXPECT_EQ(hashes.size(), 4096u);
}

TEST(Signature, UnorderedMapLookup) {
  std::unordered_map<Signature, int, grape::core::SignatureHash> map;
  map.emplace(make({1, 2}), 12);
  map.emplace(make({2, 1}), 21);
  EXPECT_EQ(map.at(make({1, 2})), 12);
  EXPECT_EQ(map.at(make({2, 1})), 21);
  EXPECT_EQ(map.count(make({1, 2, 3})), 0u);
}
