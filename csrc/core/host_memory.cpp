#include "core/host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace grape::core {

AddressRangeSet readable_ranges(const std::string& maps) {
  AddressRangeSet ranges;
  std::istringstream lines(maps);
  std::string line;
  while (std::getline(lines, line)) {
    // "begin-end perms offset dev inode path", addresses in hex.
    unsigned long long begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &begin, &end, perms) != 3) continue;
    if (perms[0] != 'r' || end <= begin) continue;
    ranges.add({static_cast<uintptr_t>(begin), static_cast<uintptr_t>(end)});
  }
  return ranges;
}

AddressRangeSet readable_host_memory() {
  std::ifstream file("/proc/self/maps");
  if (!file) return {};
  std::stringstream text;
  text << file.rdbuf();
  return readable_ranges(text.str());
}

}  // namespace grape::core
