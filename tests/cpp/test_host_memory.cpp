#include <gtest/gtest.h>

#include <string>
#include <vector>

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
  const auto ranges = readable_ranges(grape::core::this_process_maps());
  EXPECT_TRUE(ranges.contains(grape::core::make_range(&local, sizeof local)));
}

TEST(HostMemory, HalvesOfHostAddresses) {
  const std::string maps =
      "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/python3\n"
      "55d2f000-55d34000 rw-p 00000000 00:00 0 [heap]\n"
      "7f3a12000000-7f3a12400000 r--p 00000000 08:02 1 /usr/lib/libcudnn.so\n"
      "7ffd22360000-7ffd22381000 rw-p 00000000 00:00 0                          [stack]\n";
  const grape::core::HostAddresses host = grape::core::host_addresses(maps);
  EXPECT_EQ(host.stack.begin, 0x7ffd22360000u);
  EXPECT_EQ(host.high_halves, (std::vector<uint32_t>{0x7f3a, 0x7ffd}));
  EXPECT_TRUE(host.is_high_half(0x7ffd));
  EXPECT_FALSE(host.is_high_half(0)) << "a mapping below 16 TiB gives no high half: 0 is a number";
  EXPECT_TRUE(host.is_stack_low_half(0x2237f5e8));
  EXPECT_FALSE(host.is_stack_low_half(0x22381000)) << "one past the stack";
  EXPECT_FALSE(host.is_stack_low_half(0x12000000)) << "libcudnn's low half: not the stack";
  EXPECT_FALSE(grape::core::host_addresses("").is_stack_low_half(0));
}
