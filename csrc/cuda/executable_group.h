#pragma once
// A topology group of SharedExecutables (Note [Shared executables]), private to grape_cuda: its
// registry (cuda/shared_executables.cpp) and the unions it grows into (cuda/union_graphs.cpp)
// both edit it.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/executable_slots.h"
#include "core/param_codec.h"
#include "core/topology_union.h"
#include "cuda/graph_nodes.h"

namespace grape::cuda {

struct Executable {
  cudaGraphExec_t exec = nullptr;
};

struct ExecutableGroup {
  cudaGraph_t graph = nullptr;  // the base graph, or the union of its members' graphs; owned
  std::vector<cudaGraphNode_t> nodes;
  std::vector<NodeKind> kinds;
  std::unique_ptr<core::ParamTable> params;  // null: this group has one graph and never shares
  // Note [Near topologies]: the graph as aligned, and the nodes the base lacks (a union's added
  // nodes, empty ones aside), made no-ops at instantiation.
  core::NodeGraph shape;
  std::vector<uint32_t> absent_in_base;
  // The union's start and end anchors, no-op kernels (cuda/noop_nodes.h),
  // null until the group first becomes a union (from then on members join by alignment only,
  // SharedExecutables::add); and per node whether an edge from the start (kFromStart) or to the
  // end (kToEnd) holds it.
  cudaGraphNode_t start = nullptr;
  cudaGraphNode_t end = nullptr;
  std::vector<uint8_t> anchored;
  static constexpr uint8_t kFromStart = 1, kToEnd = 2;  // flags of `anchored`
  size_t smallest_member = 0;    // node count of its smallest member
  std::vector<uint64_t> topologies;  // its keys in SharedExecutables::by_topology_
  // Per topology of its members, their nodes' union nodes (UnionPlan::node_of; the base's: its
  // alignment order, node i itself), so that another graph of that topology joins as it did,
  // without aligning (which may pair it otherwise), and the graph cache reads a member out in
  // its own node order.
  std::unordered_map<uint64_t, std::vector<uint32_t>> node_of_topology;
  // Per shape, the topology of the graph it came from: the graph cache reads a union's member
  // out in its own topology's node order (SharedExecutables::params_of).
  std::unordered_map<uint32_t, uint64_t> topology_of_shape;
  int64_t members = 0;
  // Resident slots (Note [Executable slots]): which shape each holds and when it was last
  // prepared, and its executable, by the same index. Empty while evicted.
  std::vector<core::ExecutableSlot> slots;
  std::vector<Executable> executables;
  size_t executable_bytes = 0;  // each executable's charge (SharedExecutables::instantiate)
  // Which shapes get a slot of their own at a host-paced launch (core::SlotAdmission).
  core::SlotAdmission admission;
  // Per shape, the kernel each node runs (cuda/union_graphs.cpp, kernel_swaps).
  std::unordered_map<uint32_t, std::vector<uint64_t>> kernels;
};

}  // namespace grape::cuda
