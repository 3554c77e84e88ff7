// The graph cache's way into shared executables (docs/design.md, "The graph cache"): a member's
// parameters read out for storing, and a stored shape added to the group of a live capture that
// validated it.
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/executable_group.h"
#include "cuda/shared_executables.h"

namespace grape::cuda {

namespace {

// Group node of each node of a graph of `topology` in `group`: node i itself where the group is
// that topology's graph; else the mapping its join kept (a union's member). Null where unknown.
const std::vector<uint32_t>* nodes_of(const ExecutableGroup& group, uint64_t topology,
                                      std::vector<uint32_t>& identity) {
  if (group.start == nullptr && group.topologies.size() == 1 &&
      group.topologies.front() == topology) {
    identity.resize(group.nodes.size());
    for (uint32_t i = 0; i < identity.size(); ++i) identity[i] = i;
    return &identity;
  }
  const auto known = group.node_of_topology.find(topology);
  if (known == group.node_of_topology.end()) return nullptr;
  for (uint32_t node : known->second) {
    if (node >= group.nodes.size()) return nullptr;
  }
  return &known->second;
}

}  // namespace

std::optional<SharedExecutables::MemberParams> SharedExecutables::params_of(Member member,
                                                                            std::string* why) {
  wait_settled();
  auto refuse = [why](std::string reason) -> std::optional<MemberParams> {
    if (why != nullptr) *why = "its executable group " + std::move(reason);
    return std::nullopt;
  };
  if (!member.valid() || member.group >= groups_.size() || !groups_[member.group]) {
    return refuse("has ended");
  }
  const Group& group = *groups_[member.group];
  if (!group.params) return refuse("is unshareable");
  const auto topology = group.topology_of_shape.find(member.shape);
  if (!group.params->contains(member.shape) || topology == group.topology_of_shape.end()) {
    return refuse("holds no parameters for it");
  }
  // A union's member is read out in its own graph's node order: a later process's capture of
  // that topology holds the same nodes, whatever union this process grew.
  std::vector<uint32_t> identity;
  const std::vector<uint32_t>* nodes = nodes_of(group, topology->second, identity);
  if (nodes == nullptr) return refuse("kept no node order for its topology");
  MemberParams out;
  out.topology = topology->second;
  out.kinds.reserve(nodes->size());
  out.blobs.resize(nodes->size());
  for (size_t i = 0; i < nodes->size(); ++i) {
    out.kinds.push_back(group.kinds[(*nodes)[i]]);
    group.params->decode(member.shape, (*nodes)[i], out.blobs[i]);
  }
  return out;
}

SharedExecutables::Member SharedExecutables::add_shape(Member like, uint64_t topology,
                                                       const std::vector<core::Blob>& blobs,
                                                       cudaStream_t stream) {
  settle();
  wait_settled();
  if (!like.valid() || like.group >= groups_.size() || !groups_[like.group]) {
    throw std::runtime_error("grape: the group to restore a shape into has ended");
  }
  Group& group = *groups_[like.group];
  std::vector<uint32_t> identity;
  const std::vector<uint32_t>* nodes =
      group.params ? nodes_of(group, topology, identity) : nullptr;
  if (nodes == nullptr || nodes->size() != blobs.size()) {
    throw std::runtime_error("grape: a restored shape's nodes do not fit its group");
  }
  // Where a graph of `topology` joined: a union's nodes it lacks are left empty, run as no-ops,
  // as for a graph of that topology joining it (the union holds one already).
  std::vector<core::Blob> placed;
  if (nodes != &identity) {
    placed.resize(group.nodes.size());
    for (size_t i = 0; i < blobs.size(); ++i) placed[(*nodes)[i]] = blobs[i];
  }
  const uint32_t shape = join_as_is(like.group, nodes == &identity ? blobs : placed, stream);
  group.topology_of_shape[shape] = topology;
  ++group.members;
  ++counters_.joins;
  return {like.group, shape};
}

}  // namespace grape::cuda
