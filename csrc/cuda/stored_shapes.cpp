// The graph cache's way into shared executables (docs/design.md, "The graph cache"): a member's
// parameters read out for storing, and a stored shape added to the group of a live capture that
// validated it.
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/executable_group.h"
#include "cuda/shared_executables.h"

namespace grape::cuda {

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
  if (group.start != nullptr || group.topologies.size() != 1) {
    // Its node order is the union's, which a later process has no capture of.
    return refuse("is a union of " + std::to_string(group.topologies.size()) +
                  " near topologies");
  }
  if (!group.params->contains(member.shape)) return refuse("holds no parameters for it");
  MemberParams out;
  out.topology = group.topologies.front();
  out.kinds = group.kinds;
  out.blobs.resize(group.nodes.size());
  for (uint32_t node = 0; node < group.nodes.size(); ++node) {
    group.params->decode(member.shape, node, out.blobs[node]);
  }
  return out;
}

SharedExecutables::Member SharedExecutables::add_shape(Member like,
                                                       const std::vector<core::Blob>& blobs,
                                                       cudaStream_t stream) {
  settle();
  wait_settled();
  if (!like.valid() || like.group >= groups_.size() || !groups_[like.group]) {
    throw std::runtime_error("grape: the group to restore a shape into has ended");
  }
  Group& group = *groups_[like.group];
  if (!group.params || group.start != nullptr || group.topologies.size() != 1 ||
      blobs.size() != group.nodes.size()) {
    throw std::runtime_error("grape: a restored shape's nodes do not fit its group");
  }
  const uint32_t shape = join_as_is(like.group, blobs, stream);
  ++group.members;
  ++counters_.joins;
  return {like.group, shape};
}

}  // namespace grape::cuda
