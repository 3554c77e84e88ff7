#include "core/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace grape::core {

namespace {

// The first high half counted: addresses from 16 TiB up.
constexpr uint64_t kLowestHighHalf = 0x1000;

template <typename Visit>
void for_each_readable(const std::string& maps, Visit visit) {
  std::istringstream lines(maps);
  std::string line;
  while (std::getline(lines, line)) {
    // "begin-end perms offset dev inode path", addresses in hex.
    unsigned long long begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &begin, &end, perms) != 3) continue;
    if (perms[0] != 'r' || end <= begin) continue;
    visit(AddressRange{static_cast<uintptr_t>(begin), static_cast<uintptr_t>(end)}, line);
  }
}

}  // namespace

std::string this_process_maps() {
  std::ifstream file("/proc/self/maps");
  if (!file) return "";
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

AddressRangeSet readable_ranges(const std::string& maps) {
  AddressRangeSet ranges;
  for_each_readable(maps, [&](AddressRange range, const std::string&) { ranges.add(range); });
  return ranges;
}

bool HostAddresses::is_high_half(uint32_t unit) const {
  return std::binary_search(high_halves.begin(), high_halves.end(), unit);
}

bool HostAddresses::is_stack_low_half(uint32_t unit) const {
  if (stack.empty()) return false;
  for (uint64_t high : {uint64_t{stack.begin} >> 32, uint64_t{stack.end - 1} >> 32}) {
    const uint64_t address = high << 32 | unit;
    if (address >= stack.begin && address < stack.end) return true;
  }
  return false;
}

HostAddresses host_addresses(const std::string& maps) {
  HostAddresses host;
  for_each_readable(maps, [&](AddressRange range, const std::string& line) {
    if (line.size() >= 7 && line.compare(line.size() - 7, 7, "[stack]") == 0) host.stack = range;
    for (uint64_t high = range.begin >> 32; high <= (range.end - 1) >> 32; ++high) {
      if (high >= kLowestHighHalf && high <= UINT32_MAX) {
        host.high_halves.push_back(static_cast<uint32_t>(high));
      }
    }
  });
  std::sort(host.high_halves.begin(), host.high_halves.end());
  host.high_halves.erase(std::unique(host.high_halves.begin(), host.high_halves.end()),
                         host.high_halves.end());
  return host;
}

HostAddresses this_process_host_addresses() { return host_addresses(this_process_maps()); }

}  // namespace grape::core
