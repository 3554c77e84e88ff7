#include <gtest/gtest.h>

#include <string>

#include "core/host_memory.h"

using grape::core::readable_ranges;

TEST(HostMemory, ReadableMappingsOnly) {
  const std::string maps =
      "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/python3\n"
      "00651000-00652000 ---p 00051000 08:02 173521 /usr/bin/python3\n"
      "2831f000-28340000 rw-p 00000000 00:00 0 [heap]\n"
      "not a mapping line\n"
      "7ffd1000-7ffd0000 rw-p 00000000 00:00 0 [backwards]\n";
  const auto ranges = readable_ranges(maps);
  EXPECT_TRUE(ranges.contains({0x2831f170, 0x2831f178}));
  EXPECT_TRUE(ranges.contains({0x400000, 0x400008}));
  EXPECT_FALSE(ranges.overlaps({0x651000, 0x651008}));  // not readable
  EXPECT_FALSE(ranges.overlaps({0x7ffd0000, 0x7ffd1000}));
  EXPECT_EQ(ranges.ranges().size(), 2u);
}

TEST(HostMemory, ThisProcessReadsItsOwnStack) {
  int local = 0;
  const auto ranges = grape::core::readable_host_memory();
  EXPECT_TRUE(ranges.contains(grape::core::make_range(&local, sizeof local)));
}
