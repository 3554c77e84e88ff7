#pragma once
// Note [Shared executables]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// An instantiated graph costs device memory (~0.8 MB for a GPT-2 step: ~4 KB per kernel node)
// and host memory; one per shape is gigabytes at a thousand shapes. But the graphs one function
// captures at different shapes mostly have one topology, and CUDA lets an executable take another
// graph's parameters: cudaGraphExecUpdate (a whole graph), cudaGraphExec*NodeSetParams (a node).
// So graphs are grouped by topology, and a group holds:
//   - its base graph (the first captured) and one executable instantiated from it, or none while
//     evicted (it is instantiated again from the base graph on demand);
//   - every member's node parameters, compressed (Note [Graph parameter codec]).
// A new graph joins a group whose topology key matches if cudaGraphExecUpdate of the group's
// executable with it succeeds: the driver, not this file, decides what may share. The graph is
// then read and destroyed; only its parameters stay. Launching a member first patches the nodes
// whose parameters differ from what the executable holds. Patching never touches launches already
// queued ("modifications only affect future launches"), so a replay may patch while the previous
// one still runs, and memory stays one executable per topology.
// Graphs that cannot be read (conditional or event nodes, kernels whose parameter layout the
// driver does not report) get a group of their own, as do all graphs when sharing is off.
// Node order is the graphs' creation order (cudaGraphGetNodes), the order cudaGraphExecUpdate
// matches nodes by.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/executable_stats.h"

namespace grape::cuda {

class SharedExecutables {
 public:
  struct Member {
    uint32_t group = UINT32_MAX;
    uint32_t shape = 0;
    bool valid() const { return group != UINT32_MAX; }
  };

  // `share`: group graphs by topology; false gives every graph an executable of its own.
  explicit SharedExecutables(bool share);
  ~SharedExecutables();
  SharedExecutables(const SharedExecutables&) = delete;
  SharedExecutables& operator=(const SharedExecutables&) = delete;

  // Takes ownership of `graph` (a finished capture) and returns the member it became. The
  // executable that serves it is resident afterwards (`stream` receives its upload). Throws
  // std::runtime_error (the graph destroyed) when it cannot be instantiated.
  Member add(cudaGraph_t graph, cudaStream_t stream);
  // Releases a member; a group left without members frees its executable and base graph.
  void remove(Member member);
  // The executable holding `member`'s parameters, instantiated (`stream` receives its upload) and
  // patched as needed. Throws std::runtime_error when the driver refuses.
  cudaGraphExec_t prepare(Member member, cudaStream_t stream);
  // Patches `member`'s executable to its parameters now, if it is resident, so that the next
  // prepare() of it has nothing to write: called right after a launch with the member predicted
  // to come next, the patching overlaps the launched work instead of delaying the next launch.
  // Does nothing for an ended group or an evicted executable.
  void prepare_ahead(Member member);
  // Destroys resident executables, least recently prepared first, until they hold at most `bytes`
  // of device memory; never `keep`'s. Returns how many it destroyed.
  int evict_to(size_t bytes, Member keep);
  size_t device_bytes() const { return device_bytes_; }
  ExecutableStats stats() const;
  // Why the last graph that could not share was given an executable of its own ("" if none).
  const std::string& unshareable_reason() const { return unshareable_reason_; }

 private:
  struct Group;
  void instantiate(Group& group, cudaStream_t stream);
  void patch(Group& group, uint32_t shape);  // requires a resident, shareable group
  void destroy_executable(Group& group);

  bool share_;
  std::vector<std::unique_ptr<Group>> groups_;  // null where a group ended
  std::unordered_multimap<uint64_t, uint32_t> by_topology_;
  uint64_t clock_ = 0;
  size_t device_bytes_ = 0;
  ExecutableStats counters_;
  std::string unshareable_reason_;
};

}  // namespace grape::cuda
