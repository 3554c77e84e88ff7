#pragma once
// Note [Near topologies]
// ~~~~~~~~~~~~~~~~~~~~~~
// Graphs that one function captures at different shapes may differ in a few nodes, not only in
// parameters: a library picks an algorithm per shape, and one algorithm has a kernel or a memset
// more than another (cuDNN's convolutions over audio lengths: 220 to 223 nodes). Each such graph
// would need a topology group and an executable of its own (Note [Shared executables]). Instead a
// group may hold the union of its members' graphs: nodes aligned in order, edges of all, and each
// member runs the union's nodes it lacks as no-ops: a kernel that does nothing, a memset of a
// byte nothing reads (cuda/noop_nodes.h). A node's no-op is one more value of its parameters,
// patched like the others. A copy has no such no-op (its memory kinds are fixed), nor has a
// two-dimensional memset: graphs whose union would need one absent do not join.
//
// Running a member's shape in the union is correct when the union orders every pair of nodes that
// the member orders, when the member's first nodes wait for work queued before the launch, and
// when work queued after it waits for the member's last nodes. CUDA can also disable nodes
// (cudaGraphNodeSetEnabled, documented to run them as empty nodes, their dependencies holding),
// which unions did first; on an H100 (CUDA 13) that did not hold: work queued after a member's
// launch did not wait for its last kernel when a disabled node followed that kernel (16 of 16
// launches), and a member's kernel did not wait for work queued before its launch when a disabled
// node preceded it, empty nodes before and after every member's nodes notwithstanding (GoogleTests
// AMembersLaunchEnds... and AMembersLaunchStarts...; HIP's driver is known to drop dependencies
// through disabled nodes across streams). So no node is disabled; and every member's edges are
// edges of the union (a path through absent nodes is not relied on), and the union has two
// anchors, no-op kernels: a start before every member's first nodes and an end after every
// member's last. Extra union edges only serialize more. The union's node order stays
// topological: every edge of a captured graph goes from an earlier-created node to a later one,
// and the aligned order keeps both orders.
//
// With disabled nodes and both anchors, wav2vec2's feature encoder (benchmarks.alias_sites)
// still faulted on an H100 within its first 64 calls when calls were not waited for (4 of 4
// runs), and was correct when every call was waited for. With no-ops in place of disabled nodes
// it ran correct (4 passes of 64 calls, twice), as did hf_wav2vec2's inference on all its shapes,
// so unions are grape.compile's default (SharedExecutables::Sharing::kNearTopologies).
//
// Alignment is the cheapest edit script: nodes are matched only where their keys are equal, and
// each node inserted or deleted costs 1. A key holds what an update may not change: the node's
// type, its launch attributes, and a copy's or memset's memory types and dimensions (not its
// addresses, which differ between shapes wherever the arena's layout does, as kernels'
// arguments do). A kernel node's function is its variant: nodes of other kernels pair as a swap
// (a member's parameters change the node's function, as executable updates within one topology
// do), and of the alignments with the fewest edits, the one with the fewest swaps wins. Swaps were
// refused at first, because joins that made them gave wrong wav2vec2 logits on an H100; that was
// while unions relied on disabled nodes, whose dependencies did not hold. With no-ops, swaps give
// results equal to eager's (hf_wav2vec2, every inference batch and 50 training losses, H100 and
// H200).
// It is searched within a band of `max_edits` (at most kMaxEdits): O(nodes * max_edits) time and
// memory. Where alignments tie, a graph may pair with other nodes of its keys than an earlier
// graph of its topology did, and then need edges that one did not; so a graph of a topology that
// already joined is mapped as that one was (plan_as_mapped), in O(nodes + edges). This file knows
// neither torch nor CUDA.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace grape::core {

using Edge = std::pair<uint32_t, uint32_t>;  // (from, to), node indices

// The widest alignment band plan_union searches.
inline constexpr size_t kMaxEdits = 256;

struct NodeGraph {
  std::vector<uint64_t> keys;   // per node (by index): what two aligned nodes must share
  // Per node, or empty: what two aligned nodes had better share (a kernel node's function).
  // Nodes that differ in it still pair, as a swap; alignment takes the fewest swaps among the
  // alignments with the fewest edits.
  std::vector<uint64_t> variants;
  std::vector<uint32_t> order;  // every node, in a topological order
  std::vector<Edge> edges;      // sorted; each goes forward in `order`
};

struct UnionPlan {
  // The joining graph's node i is union node node_of[i]: an existing index, or
  // union.keys.size() + k for the k-th added node.
  std::vector<uint32_t> node_of;
  std::vector<uint32_t> added;      // the joining graph's nodes the union lacks, in order
  std::vector<Edge> added_edges;    // the joining graph's edges (union indices) the union lacks
  std::vector<uint32_t> order;      // the union's nodes afterwards, in a topological order
  std::vector<uint32_t> sources;    // the joining graph's first nodes (without predecessors)
  std::vector<uint32_t> sinks;      // and its last (without successors), both union indices
  size_t absent = 0;                // union nodes the joining graph lacks
  size_t swaps = 0;                 // the graph's nodes paired with a node of another variant
};

// `graph`'s nodes without predecessors (first) and without successors (last), by index.
void first_and_last_nodes(const NodeGraph& graph, std::vector<uint32_t>& first,
                          std::vector<uint32_t>& last);

// How `graph` (a captured graph: `order` is its creation order) joins `group` (a union built so
// far), or nothing where the cheapest alignment inserts plus deletes more than `max_edits` nodes
// (or kMaxEdits), or an edge of `graph` does not go forward in its order.
std::optional<UnionPlan> plan_union(const NodeGraph& group, const NodeGraph& graph,
                                    size_t max_edits);

// How `graph` joins `group` as a graph of its topology did before, without aligning: its node i is
// union node node_of[i] (that join's UnionPlan::node_of; union nodes keep their indices as a union
// grows). Nothing where the mapping does not fit `graph`: a node mapped to one of another key or
// to a node mapped already, or an edge that would go backward in the union's order.
std::optional<UnionPlan> plan_as_mapped(const NodeGraph& group, const NodeGraph& graph,
                                        const std::vector<uint32_t>& node_of);

}  // namespace grape::core
