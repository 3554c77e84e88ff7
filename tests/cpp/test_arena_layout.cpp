#include <gtest/gtest.h>

#include <algorithm>

#include "core/arena_layout.h"

using grape::core::ArenaLayout;

TEST(ArenaLayout, FirstFitReusesFreedGapsAndAligns) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(100);
  auto b = lane.allocate(1000);
  auto c = lane.allocate(512);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 512u);   // 100 rounds up to one 512-byte unit
  EXPECT_EQ(*c, 1536u);  // 1000 rounds up to 1024
  EXPECT_EQ(lane.extent(), 2048u);
  EXPECT_TRUE(lane.free(*b));
  EXPECT_FALSE(lane.free(*b));  // double free is refused, not corrupting
  auto d = lane.allocate(600);  // fits the freed gap
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 512u);
  EXPECT_EQ(lane.extent(), 2048u);
}

TEST(ArenaLayout, FreedNeighboursCoalesce) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(512), b = lane.allocate(512), c = lane.allocate(512);
  lane.allocate(512);
  lane.free(*a);
  lane.free(*c);
  EXPECT_EQ(lane.allocate(1536), std::optional<size_t>(2048));  // no gap holds it yet
  lane.free(*b);
  EXPECT_EQ(lane.allocate(1536), std::optional<size_t>(0));  // a, b, c merged
}

TEST(ArenaLayout, PinsAreAvoidedUntilUnpinned) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(4096);
  lane.free(*a);
  lane.pin(1024, 1024);  // live memory inside the free gap
  auto b = lane.allocate(1024);
  auto c = lane.allocate(2048);
  EXPECT_EQ(*b, 0u);
  EXPECT_EQ(*c, 2048u);
  lane.free(*b);
  lane.free(*c);
  lane.unpin_all();
  EXPECT_EQ(lane.allocate(4096), std::optional<size_t>(0));
}

TEST(ArenaLayout, RefusesWhenAddressSpaceIsFull) {
  ArenaLayout lane(4096, 512);
  EXPECT_TRUE(lane.allocate(4096));
  EXPECT_FALSE(lane.allocate(1));
  EXPECT_FALSE(lane.allocate(0));
}

TEST(ArenaLayout, BlockContaining) {
  ArenaLayout lane(1 << 20, 512);
  lane.allocate(512);
  auto b = lane.allocate(2000);
  EXPECT_EQ(lane.block_containing(*b + 100), std::make_optional(std::make_pair(*b, size_t{2048})));
  EXPECT_FALSE(lane.block_containing(*b + 2048));
}

// A decode loop: each step reads the live cache of the previous step (pinned, as a handed-out
// output is) and writes a cache one position longer, plus small temporaries. The lane must stay
// within three times the largest cache, however many shapes go by.
TEST(ArenaLayout, GrowingPingPongStaysNearTheLargestBuffer) {
  ArenaLayout lane(size_t{1} << 40, 512);
  const size_t per_position = 294912;  // GPT-2 small, batch 8, fp16 K and V
  size_t live_offset = 0, live_bytes = 0;
  size_t largest = 0;
  for (size_t t = 1; t <= 1024; ++t) {
    lane.pin(live_offset, live_bytes);
    const size_t bytes = per_position * t;
    auto out = lane.allocate(bytes);
    ASSERT_TRUE(out);
    auto temp = lane.allocate(64 * 1024);  // freed when the capture ends
    lane.free(*temp);
    lane.unpin_all();
    lane.free(*out);  // the capture's tensors die; the graph keeps the address
    live_offset = *out;
    live_bytes = bytes;
    largest = std::max(largest, bytes);
  }
  EXPECT_LE(lane.extent(), 3 * largest + (1 << 20));
  EXPECT_EQ(lane.allocated_bytes(), 0u);
}
