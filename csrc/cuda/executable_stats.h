#pragma once
// Counters of a SharedExecutables (cuda/shared_executables.h); plain data, so that builds without
// CUDA report them too (as zeros).

#include <cstddef>
#include <cstdint>

namespace grape::cuda {

struct ExecutableStats {
  int64_t groups = 0;          // topology groups
  int64_t members = 0;         // graphs held
  int64_t unshareable = 0;     // groups of a graph that cannot share (see the Note)
  int64_t resident = 0;        // executables instantiated now (slots, over all groups)
  int64_t instantiations = 0;  // executables instantiated, again after an eviction included
  int64_t evictions = 0;
  int64_t joins = 0;            // graphs that joined a group instead of being instantiated
  int64_t near_joins = 0;       // ... of them, joined by alignment (Note [Near topologies])
  int64_t unions = 0;           // ... of those, joins that grew the group's graph
  int64_t near_swaps = 0;       // kernel nodes near joins paired with a node of another kernel
  int64_t union_extra_nodes = 0;  // unions' nodes beyond their smallest member's (its no-ops)
  // Why graphs of a new topology did not join a near group (Note [Near topologies]): per graph,
  // no group's node count near its own; per group tried, the graph or group has no alignment
  // order, the alignment differs in too many nodes, a node that would be absent has no no-op
  // (a copy, a 2-D memset), or the driver refused the joined parameters.
  int64_t near_refused_far = 0;
  int64_t near_refused_unaligned = 0;
  int64_t near_refused_edits = 0;
  int64_t near_refused_no_noop = 0;
  int64_t near_refused_driver = 0;
  int64_t switches = 0;         // patches of the executable to another shape
  int64_t patches_ahead = 0;    // ... of them made right after a launch, for the predicted next
  int64_t nodes_patched = 0;
  int64_t kernels_swapped = 0;  // ... of them, kernel nodes patched to run another kernel
  int64_t patch_ns = 0;
  // Host time of add(): reading a captured graph node by node, joining a group (executable
  // updates, alignment, unions), and instantiating executables (add's and later rebuilds).
  int64_t read_ns = 0;
  int64_t join_ns = 0;
  int64_t instantiate_ns = 0;
  // Host time after launches, finishing joins: compressing the new shapes' parameters and
  // destroying the joined graphs (SharedExecutables::settle).
  int64_t settle_ns = 0;
  size_t device_bytes = 0;      // resident executables: their nodes' share of the driver memory
                                // that instantiations were measured to take
  size_t cached_bytes = 0;      // ... of them, the executables beyond one per group
  size_t params_bytes = 0;      // members' parameters as held (compressed)
  size_t params_raw_bytes = 0;  // the same, uncompressed
};

}  // namespace grape::cuda
