#pragma once
// Note [Executable slots]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A topology group (Note [Shared executables]) may keep more than one executable ("slots"), each
// holding one shape's parameters. A shape with a slot of its own replays without patching; the
// others are patched into a slot. Patching costs CPU time per changed node that delays the next
// launch whenever the host, not the GPU, is the bottleneck,
// and patching the executable that is still running may have to wait for it. So:
//   - a shape gets a slot of its own while the function's executable cache has room, and, in
//     grape's runtime (SharedExecutables::SlotGrowth::kWhenGpuWaits), only once it has shown that
//     it comes back at launches where patching costs (SlotAdmission): where the host is the
//     bottleneck, for a launch that follows launches only and finds the stream idle once the
//     patch is written, the GPU waited for the host and the patch delayed the launch. Where work
//     is queued, the patch overlaps it and costs nothing, and a slot would only take memory. A
//     shape is patched at its first such launch and gets its slot at the next. A loop's second
//     pass over its shapes (a generation's lengths) would then patch every shape and its third
//     instantiate every slot, which made the third pass much slower than the second;
//     instantiating them all in the second made that one several times slower than the next. So
//     the instantiations are spread over the two passes: the launch right after a costly patch
//     of the group most likely finds the GPU waiting too (a host-bound loop), and its shape gets
//     a slot there instead of a patch, whatever its own history. Every other shape of such a pass
//     gets its slot in the second, the rest in the third. The price, at most one slot per costly
//     patch: a shape seen once (a prompt's length) may get a slot where it follows such a patch,
//     and so may a shape launched with work queued, where a loop's pace changes (a long clip
//     after short ones);
//   - a shape without a slot of its own is patched into a slot not made for a shape, while there
//     is one (the group's first executable): patching a slot made for a shape would make that
//     shape, admitted already, take another. Where that slot is the one just launched, the patch
//     changes only later launches (CUDA keeps a queued launch's parameters), and a patch ahead
//     leaves it to the next launch;
//   - where every slot was made for a shape (the cache full, after an eviction), a shape is
//     patched into the most recently used slot other than the last launched one. Replacing the
//     most recently used (not the least) keeps a cyclic order of shapes (a generation's growing
//     lengths, an epoch's batches) from evicting each slot just before it is needed again: the
//     slots hold a stable part of the cycle and the rest alternates between two slots, so the
//     one just launched is not patched under a replay.
//   - a slot whose shape was removed is used before any other, and before a new slot.
//   - among the slots a shape may be patched into, the one whose shape runs the most of the same
//     kernels wins: a patch that changes a node's kernel makes the next launch slower for each
//     such node, where one that changes arguments only costs nothing at launch. Union
//     members differ in kernels (Note [Near topologies]).
// This file decides; csrc/cuda/shared_executables.cpp instantiates and patches.

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace grape::core {

struct ExecutableSlot {
  static constexpr uint32_t kNoShape = UINT32_MAX;  // holds no live shape (removed or unknown)
  uint32_t shape = kNoShape;
  uint64_t last_used = 0;  // a clock value; the largest is the slot launched last
  // Made for `shape` (admitted, SlotAdmission, or while the cache had room): shapes without a
  // slot of their own are patched into the other slots while there are any.
  bool bought = false;
};

struct SlotChoice {
  enum class Kind { kHit, kNewSlot, kPatch };
  Kind kind;
  size_t slot = 0;  // kHit and kPatch: which slot
};

// A group's choice of which shapes without a slot of their own get one (Note [Executable slots]),
// at launches that follow launches only: a shape at its launch after a costly patch of it (one the
// GPU waited for), which shows it comes back, as a cache that admits an entry at its second access
// does; and any shape at the launch right after a costly patch of another, which the GPU waits for
// as well, so that a loop's new shapes get their slots over two passes instead of one.
class SlotAdmission {
 public:
  // Whether `shape`, which would be patched at this launch, gets a slot of its own instead.
  bool admits(uint32_t shape) const {
    return after_costly_patch_ || patched_costly_.count(shape) != 0;
  }
  // After each launch, and each join (which drains the stream): `costly_patch`, whether `shape`
  // was patched for it and the GPU waited.
  void launched(uint32_t shape, bool costly_patch) {
    after_costly_patch_ = costly_patch;
    if (costly_patch) patched_costly_.insert(shape);
  }
  void forget(uint32_t shape) { patched_costly_.erase(shape); }  // the shape was removed

 private:
  std::unordered_set<uint32_t> patched_costly_;  // shapes patched at a costly launch, ever
  bool after_costly_patch_ = false;
};

// Where `shape` should run among a group's resident `slots`. `room`: the executable cache can take
// another slot of this group.
// `swaps`, where given: per slot, how many kernel nodes would run another kernel once the slot is
// patched to `shape`; a patch then takes the slot with the fewest, ties broken as without.
SlotChoice choose_slot(const std::vector<ExecutableSlot>& slots, uint32_t shape, bool room,
                       const std::vector<size_t>* swaps = nullptr);

}  // namespace grape::core
