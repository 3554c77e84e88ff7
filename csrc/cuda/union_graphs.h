#pragma once
// A topology group's graph as the union of near topologies (Note [Near topologies]), in CUDA
// graphs: how near a captured graph must be to join, the plan by which it joins (aligned by
// core/topology_union.h, which knows no CUDA), the union's graph grown by that plan, and the
// kernels its shapes swap. What a group holds besides (executables, parameters, counters) is
// cuda/shared_executables.cpp's.

#include <cstddef>
#include <memory>
#include <optional>

#include "core/topology_union.h"
#include "cuda/executable_group.h"
#include "cuda/graph_nodes.h"

namespace grape::cuda {

// How near a graph must be to join a union: it may bring near_inserts(its nodes) nodes the union
// lacks, and the union may hold union_growth(smallest) nodes more than its smallest member, which
// runs them all, as no-ops. Deleted nodes (the union's that the graph lacks) are bounded by the
// growth alone: a union is meant to hold many variants. Each no-op is a launch on the GPU, so the
// growth is a small share of the member (docs/design.md, "Near topologies", says why this share).
size_t near_inserts(size_t nodes);
size_t union_growth(size_t smallest);

// Whether a graph of m nodes that brings `added` new ones is near enough to join a union of n
// nodes whose smallest member has `smallest_member`.
bool near_enough(size_t n, size_t m, size_t smallest_member, size_t added);

// A captured graph as plan_union sees it, its creation order as its order. No order (no
// alignment) where an edge is not a plain dependency, since alignment reasons about full
// dependencies only, or where creation order is not topological.
core::NodeGraph alignment_view(const GraphContents& contents);

// Why a graph does not join a group by alignment (ExecutableStats::near_refused_*).
enum class NearRefusal { kNone, kUnaligned, kEdits, kNoNoop };

// How the graph read as `contents` (`graph`, its alignment_view) joins `group`: as a graph of its
// topology joined before, else by alignment. Nothing, with `refused` set, where the group or the
// graph has no alignment order, the union would grow too far, or a node that either lacks would
// have no no-op.
std::optional<core::UnionPlan> plan_join(const ExecutableGroup& group, const core::NodeGraph& graph,
                                         const GraphContents& contents, NearRefusal& refused);

// Whether `group` is a union that holds the joining graph as it is: its nodes, its edges, and its
// first and last nodes anchored.
bool union_holds(const ExecutableGroup& group, const core::UnionPlan& plan);

// `group`'s graph grown by `plan`: a clone with the joining graph's nodes and edges that it lacks,
// and anchors before the first and after the last nodes of every member (made where `group` is no
// union yet). The result holds that graph (owned by the caller from now on), its nodes, kinds,
// alignment shape, absent_in_base and anchors; no executables, parameters or members yet.
// Throws std::runtime_error where the runtime fails, the clone destroyed.
std::unique_ptr<ExecutableGroup> grow_union(const ExecutableGroup& group,
                                            const GraphContents& contents,
                                            const core::UnionPlan& plan);

// How many of `group`'s kernel nodes run another kernel in shape `to` than in shape `from` (a
// union pairs kernel nodes of other kernels: swaps), from each shape's kernels, cached in
// `group.kernels`.
size_t kernel_swaps(ExecutableGroup& group, uint32_t from, uint32_t to);

}  // namespace grape::cuda
