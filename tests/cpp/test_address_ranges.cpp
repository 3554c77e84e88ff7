#include <gtest/gtest.h>

#include "core/address_ranges.h"

using grape::core::AddressRange;
using grape::core::AddressRangeSet;

TEST(AddressRangeSet, MergesTouchingAndOverlapping) {
  AddressRangeSet set;
  set.add({100, 200});
  set.add({300, 400});
  EXPECT_EQ(set.ranges().size(), 2u);
  set.add({200, 300});  // touches both
  ASSERT_EQ(set.ranges().size(), 1u);
  EXPECT_EQ(set.ranges()[0], (AddressRange{100, 400}));
  set.add({50, 120});
  EXPECT_EQ(set.ranges()[0], (AddressRange{50, 400}));
  EXPECT_EQ(set.total_bytes(), 350u);
}

TEST(AddressRangeSet, KeepsSortedDisjointRanges) {
  AddressRangeSet set;
  set.add({500, 600});
  set.add({100, 200});
  set.add({300, 400});
  ASSERT_EQ(set.ranges().size(), 3u);
  EXPECT_EQ(set.ranges()[0].begin, 100u);
  EXPECT_EQ(set.ranges()[2].begin, 500u);
  set.add({150, 550});
  ASSERT_EQ(set.ranges().size(), 1u);
  EXPECT_EQ(set.ranges()[0], (AddressRange{100, 600}));
}

TEST(AddressRangeSet, OverlapsAndContains) {
  AddressRangeSet set;
  set.add({100, 200});
  set.add({300, 400});
  EXPECT_TRUE(set.overlaps({150, 160}));
  EXPECT_TRUE(set.overlaps({190, 310}));
  EXPECT_FALSE(set.overlaps({200, 300}));  // ends are exclusive
  EXPECT_FALSE(set.overlaps({0, 100}));
  EXPECT_FALSE(set.overlaps({400, 500}));
  EXPECT_TRUE(set.contains({100, 200}));
  EXPECT_TRUE(set.contains({310, 390}));
  EXPECT_FALSE(set.contains({190, 310}));  // spans a gap
  EXPECT_FALSE(set.contains({150, 150}));  // empty
}

TEST(AddressRangeSet, IgnoresEmptyRanges) {
  AddressRangeSet set;
  set.add({10, 10});
  EXPECT_TRUE(set.ranges().empty());
  EXPECT_FALSE(set.overlaps({0, 100}));
}
