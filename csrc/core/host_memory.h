#pragma once
// The host memory this process can read, from /proc/self/maps: where a stored graph's word is a
// pageable host address, which no kernel can dereference, so the word is bytes no code set for the
// GPU (Note [Relocating stored graphs], kHost). Torch-free; empty where /proc is not there.

#include <cstdint>
#include <string>

#include "core/address_ranges.h"

namespace grape::core {

// The readable mappings listed in `maps` (the text of /proc/<pid>/maps).
AddressRangeSet readable_ranges(const std::string& maps);
// This process's readable mappings, read now.
AddressRangeSet readable_host_memory();

}  // namespace grape::core
