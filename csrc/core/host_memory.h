#pragma once
// The host memory a process can read, from /proc/<pid>/maps, as the graph cache needs it: kernel
// arguments carry bytes no code set (struct padding, unused slots) copied from the launching
// code's stack or heap, so they hold host addresses, whole or in halves, which differ from
// process to process (Note [Relocating stored graphs], leftovers). Torch-free; empty where /proc
// is not there.

#include <cstdint>
#include <string>
#include <vector>

#include "core/address_ranges.h"

namespace grape::core {

// The readable mappings listed in `maps` (the text of /proc/<pid>/maps).
AddressRangeSet readable_ranges(const std::string& maps);
// The text of /proc/self/maps now ("" where there is none).
std::string this_process_maps();

// Where a process's host addresses lie, by what a 4-byte unit of a 4-byte-aligned struct field
// can show of one: its high half (the high 32 bits of a readable mapping at 16 TiB or above,
// where a PIE process's stack, heap and libraries lie: never a small number), or the low half of
// an address in the main thread's stack (a window of some hundred KiB out of 4 GiB).
struct HostAddresses {
  AddressRange stack;
  std::vector<uint32_t> high_halves;  // sorted, unique
  bool is_high_half(uint32_t unit) const;
  bool is_stack_low_half(uint32_t unit) const;
  friend bool operator==(const HostAddresses& a, const HostAddresses& b) {
    return a.stack == b.stack && a.high_halves == b.high_halves;
  }
};
HostAddresses host_addresses(const std::string& maps);
HostAddresses this_process_host_addresses();  // host_addresses(this_process_maps())

}  // namespace grape::core
