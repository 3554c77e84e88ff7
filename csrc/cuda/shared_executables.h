#pragma once
// Note [Shared executables]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// An instantiated graph costs device and host memory in proportion to its nodes
// (docs/results.md); one per shape grows with every shape a function sees. But the graphs one
// function captures at different shapes mostly have one topology, and CUDA lets an executable
// take another graph's parameters: cudaGraphExecUpdate (a whole graph),
// cudaGraphExec*NodeSetParams (a node). So graphs are grouped by topology, and a group holds:
//   - its base graph (the first captured) and the executables instantiated from it ("slots"), as
//     many as the executable cache allows and at least one while the group replays (an evicted
//     one is instantiated again from the base graph on demand); which shape runs in which slot is
//     Note [Executable slots];
//   - every member's node parameters, compressed (Note [Graph parameter codec]).
// A new graph joins a group whose topology key matches if the driver takes its parameters,
// patched node by node into the executable it will replay in: the driver, not this file, decides
// what may share. The graph is then read, and destroyed once its first launch is queued; only
// its parameters stay, compressed then too (settle; on a worker thread, since the host is the
// bottleneck while a function captures and compressing on the caller's thread delayed its next
// capture), so that a new shape's first launch waits for neither. Launching a member without a
// slot of its own first patches the nodes whose parameters differ from what its slot holds.
// Patching never touches launches already queued ("modifications only affect future launches"),
// so with the cache empty (`cache_bytes` 0) memory stays one executable per topology.
// A graph of no group's topology may still join a group of a near one, whose graph becomes the
// union of both (Note [Near topologies]).
// Graphs that cannot be read (conditional or event nodes, kernels whose parameter layout the
// driver does not report) get a group of their own, as do all graphs when sharing is off.
// Node order is the graphs' creation order (cudaGraphGetNodes), the order cudaGraphExecUpdate
// matches nodes by.

// This file keeps the groups (cuda/executable_group.h), their slots and the accounting; nodes are
// read and written by cuda/graph_nodes.h, and unions grown by cuda/union_graphs.h.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/background_worker.h"
#include "core/memory_budget.h"
#include "core/executable_slots.h"
#include "core/param_codec.h"
#include "core/topology_union.h"
#include "cuda/executable_stats.h"

namespace grape::cuda {

struct GraphContents;    // a graph as read node by node (cuda/graph_nodes.h)
struct GraphOwner;       // a cudaGraph_t destroyed with it unless released (cuda/graph_nodes.h)
struct ExecutableGroup;  // a topology group (cuda/executable_group.h)
enum class NodeKind : uint8_t;  // cuda/graph_nodes.h

class SharedExecutables {
 public:
  struct Member {
    uint32_t group = UINT32_MAX;
    uint32_t shape = 0;
    bool valid() const { return group != UINT32_MAX; }
  };

  // Which graphs share an executable.
  enum class Sharing {
    kNone,            // every graph has an executable of its own
    kTopology,        // graphs of one topology (Note [Shared executables])
    kNearTopologies,  // and graphs of near topologies, in unions (Note [Near topologies])
  };

  // When a shape without a slot of its own gets a new one (Note [Executable slots]).
  enum class SlotGrowth {
    kWhileRoom,     // whenever the executable cache has room
    kWhenGpuWaits,  // and only for a shape patched before for a launch that followed launches
                    // only, with the stream idle once patched (the GPU waited for the host, so
                    // patching delayed the launch), or at the group's launch right after such a
                    // patch of another: core::SlotAdmission
  };

  // `cache_bytes`: device memory that the executables beyond one per group may take
  // (Note [Executable slots]); core::kNoLimit: no limit.
  SharedExecutables(Sharing sharing, size_t cache_bytes,
                    SlotGrowth growth = SlotGrowth::kWhileRoom);
  ~SharedExecutables();
  SharedExecutables(const SharedExecutables&) = delete;
  SharedExecutables& operator=(const SharedExecutables&) = delete;

  // Takes ownership of `graph` (a finished capture) and returns the member it became. The
  // executable that serves it is resident afterwards (`stream` receives its upload). Throws
  // std::runtime_error (the graph destroyed) when it cannot be instantiated.
  Member add(cudaGraph_t graph, cudaStream_t stream);
  // A member's parameters as a stored graph needs them (the graph cache, Note [Relocating stored
  // graphs]): the topology of the graph it came from, and that graph's node kinds and blobs in
  // its node order (a union's member too); nothing where its group cannot give them
  // (unshareable, removed, or no node order kept for its topology), and then `why` (where
  // given) says which.
  struct MemberParams {
    uint64_t topology = 0;
    std::vector<NodeKind> kinds;
    std::vector<core::Blob> blobs;
  };
  std::optional<MemberParams> params_of(Member member, std::string* why = nullptr);
  // A new member of `like`'s group with parameters `blobs` (a shape restored from the graph
  // cache, never captured here: a graph of `topology`, which the group holds, in its node order),
  // patched in as a join is, so the driver says now whether it takes them. Throws
  // std::runtime_error where it does not, or where the group cannot take one.
  Member add_shape(Member like, uint64_t topology, const std::vector<core::Blob>& blobs,
                   cudaStream_t stream);
  // Releases a member; a group left without members frees its executable and base graph.
  void remove(Member member);
  // The executable holding `member`'s parameters, instantiated (`stream` receives its upload) and
  // patched as needed. `host_paced`: the caller did nothing but launch graphs since its previous
  // launch, so an idle stream means the GPU waits for the launches (kWhenGpuWaits may grow a slot)
  // and not for a capture or an eager run. Throws std::runtime_error when the driver refuses.
  cudaGraphExec_t prepare(Member member, cudaStream_t stream, bool host_paced = true);
  // Patches a slot to `member`'s parameters now, if `member` has no slot of its own and no new
  // slot would be made for it, so that the next prepare() of it has nothing to write: called right
  // after a launch with the member predicted to come next, the patching overlaps the launched work
  // instead of delaying the next launch. Does nothing for an ended or evicted group.
  void prepare_ahead(Member member);
  // After a launch of `member`: settles the joins made since the last launch (settle), remembers
  // which member followed the previously launched one and, where the same one followed `member`
  // the last two times, patches its slot now via prepare_ahead, so both overlap the launched
  // work. A successor seen once is not trusted:
  // in a shuffled order (an epoch's batches) it rarely repeats.
  void launched(Member member);
  // Destroys resident executables, least recently prepared first, until they hold at most `bytes`
  // of device memory; never the one serving `keep`. Returns how many it destroyed.
  int evict_to(size_t bytes, Member keep);
  // Device memory all resident executables may take (a memory budget's share); a slot beyond one
  // per group is made only within it, so that a tight budget patches instead of instantiating
  // slots that it evicts again at once.
  void set_device_limit(size_t bytes) { device_limit_ = bytes; }
  void set_cache_bytes(size_t bytes) { cache_bytes_ = bytes; }
  size_t device_bytes() const { return device_bytes_; }
  // Every counter, the groups' figures summed (a walk over the groups).
  ExecutableStats stats();
  // The running counters alone, without the groups' figures: cheap enough to read around a
  // capture.
  const ExecutableStats& counters() const { return counters_; }
  // Why the last graph that could not share was given an executable of its own ("" if none).
  const std::string& unshareable_reason() const { return unshareable_reason_; }

 private:
  using Group = ExecutableGroup;
  // How many groups, most recent first, a graph of no group's topology is aligned with.
  static constexpr int kNearGroupsTried = 4;
  class LazyAlignment;  // a graph's alignment view, made when first asked for
  // The group a shareable graph (read as `contents`) joins: one of its own topology, as it is or
  // by alignment, else (kNearTopologies) one of the most recent groups of a near topology; none
  // where no group takes it. `view`: the graph's alignment view.
  std::optional<Member> join_a_group(const GraphContents& contents, LazyAlignment& view,
                                     cudaStream_t stream);
  std::optional<Member> join_near_topology(const GraphContents& contents, LazyAlignment& view,
                                           const std::vector<uint32_t>& tried,
                                           cudaStream_t stream);
  // A group of its own for the graph `owner` holds (read as `contents`, which it takes), its
  // executable instantiated; `view` where it is shareable, null where not.
  Member start_group(GraphOwner& owner, GraphContents& contents, LazyAlignment* view,
                     cudaStream_t stream);
  // Joins `contents` (a shareable graph; `graph` its alignment view) to group `index`, by
  // alignment (Note [Near topologies]); false where it is too far or the driver refuses.
  bool join_aligned(uint32_t index, const core::NodeGraph& graph, const GraphContents& contents,
                    cudaStream_t stream, Member& joined);
  // The new shape of group `index` (or of the union it is, which already holds the joining
  // graph's nodes, edges and anchors), its blobs compressed by the next settle().
  uint32_t join_as_is(uint32_t index, const std::vector<core::Blob>& blobs, cudaStream_t stream);
  // The new shape of group `index`, whose graph becomes its union with the joining graph.
  uint32_t join_grown(uint32_t index, const GraphContents& contents,
                      const core::UnionPlan& plan, const std::vector<core::Blob>& blobs,
                      cudaStream_t stream);
  // What joins leave until a launch has been queued: destroys the joined graphs and hands the new
  // shapes' compression to the worker (settler_), which touches nothing but those shapes'
  // parameter tables and makes no CUDA call. Called after a launch (launched) and before a join
  // (add).
  void settle();
  // Waits until the worker has settled what it was handed: every method that reads or changes a
  // parameter table calls it first, so that no table is read while the worker writes it.
  void wait_settled();
  // A new slot of `group`, instantiated from its base graph (holding the base's parameters);
  // returns its index.
  size_t instantiate(Group& group, cudaStream_t stream);
  void patch(Group& group, size_t slot, uint32_t shape);  // requires a shareable group
  void destroy_slot(Group& group, size_t slot);
  // The slot `shape` runs in (Note [Executable slots]), instantiated if new; where instantiation
  // fails (out of memory) and the group has slots, one of them. `host_paced`: chosen for a launch
  // that follows launches only (prepare), not for a capture's join. `costly`: set where `shape`
  // is to be patched while the GPU may wait (core::SlotAdmission).
  size_t slot_for(Group& group, uint32_t shape, cudaStream_t stream, bool host_paced,
                  bool& costly);
  // slot_for, then the shape's parameters patched in where the slot holds another's (a slot made
  // for it and refused by the driver is destroyed), its costly patches counted
  // (core::SlotAdmission), and the slot marked as used last. Returns the slot.
  size_t load(Group& group, uint32_t shape, cudaStream_t stream, bool host_paced);
  // choose_slot for `shape`, told which slots would change the fewest kernels.
  core::SlotChoice choose(Group& group, uint32_t shape, bool room);
  // Whether the executable cache can take another slot of `group`.
  bool room_for_slot(const Group& group) const;
  // For kWhenGpuWaits, right after a patch for a host-paced launch on `stream`: whether the GPU
  // waited for it (the stream has no work queued).
  bool gpu_waits(cudaStream_t stream);

  Sharing sharing_;
  size_t cache_bytes_;
  SlotGrowth growth_;
  size_t cached_bytes_ = 0;  // the executables beyond the first of each group
  size_t device_limit_ = core::kNoLimit;
  bool slots_refused_ = false;  // an instantiation failed: no new slots until memory is freed
  std::vector<std::unique_ptr<Group>> groups_;  // null where a group ended
  std::unordered_multimap<uint64_t, uint32_t> by_topology_;
  uint64_t clock_ = 0;
  size_t device_bytes_ = 0;
  ExecutableStats counters_;
  std::string unshareable_reason_;
  // launched(): the member launched last, and per launched member (by group and shape; neither
  // index is reused) the one launched after it last time, confirmed where the same one followed
  // it the time before too.
  struct Successor {
    Member next;
    bool confirmed = false;
  };
  Member last_launched_;
  std::unordered_map<uint64_t, Successor> successor_;
  // settle()'s work: shapes not yet compressed, and graphs joined since the last launch.
  std::vector<Member> uncompressed_;
  std::vector<cudaGraph_t> joined_graphs_;
  std::atomic<int64_t> settle_ns_{0};  // the worker's time, not yet in counters_
  // Last: destroyed (its thread ended) before the groups it works on.
  core::BackgroundWorker settler_;
};

}  // namespace grape::cuda
