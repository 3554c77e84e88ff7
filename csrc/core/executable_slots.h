#pragma once
// Note [Executable slots]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A topology group (Note [Shared executables]) may keep more than one executable ("slots"), each
// holding one shape's parameters. A shape with a slot of its own replays without patching; the
// others are patched into a slot. Patching costs CPU time per changed node that delays the next
// launch whenever the host, not the GPU, is the bottleneck,
// and patching the executable that is still running may have to wait for it. So:
//   - a shape gets a slot of its own while the function's executable cache has room, and, in
//     grape's runtime (SharedExecutables::SlotGrowth::kWhenGpuWaits), only where the host is the
//     bottleneck: for a launch that follows launches only, on a stream with no work queued, as
//     nearly all recent such launches found it. Then the GPU waits for the host and patching
//     would delay the launch. Where work is queued, patching overlaps it and a slot would only
//     take memory;
//   - and there only once the shape has paid for it (SlotRent, rent or buy): until what its
//     patches cost while the GPU waited reaches what an instantiation of its group cost, it is
//     patched. Whether a slot pays depends on how often the shape comes back, unknown at its
//     first replay: a shape that comes back a few times (a prompt's lengths) then costs no
//     instantiation, one that comes back for ever costs at most about twice the cheaper choice,
//     and a loop's second pass over its shapes (a generation's lengths) patches them instead of
//     instantiating every slot at once, which made that pass several times slower than the next;
//   - once it is full, a shape without a slot is patched into the most recently used slot other
//     than the last launched one. Replacing the most recently used (not the least) keeps a cyclic
//     order of shapes (a generation's growing lengths, an epoch's batches) from evicting each slot
//     just before it is needed again: the slots hold a stable part of the cycle and the rest
//     alternates between two slots, so the one just launched is never patched under a replay.
//   - a slot whose shape was removed is used before any other, and before a new slot.
//   - among the slots a shape may be patched into, the one whose shape runs the most of the same
//     kernels wins: a patch that changes a node's kernel makes the next launch slower for each
//     such node, where one that changes arguments only costs nothing at launch. Union
//     members differ in kernels (Note [Near topologies]).
// This file decides; csrc/cuda/shared_executables.cpp instantiates and patches.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace grape::core {

struct ExecutableSlot {
  static constexpr uint32_t kNoShape = UINT32_MAX;  // holds no live shape (removed or unknown)
  uint32_t shape = kNoShape;
  uint64_t last_used = 0;  // a clock value; the largest is the slot launched last
};

struct SlotChoice {
  enum class Kind { kHit, kNewSlot, kPatch };
  Kind kind;
  size_t slot = 0;  // kHit and kPatch: which slot
};

// What one shape without a slot of its own has paid in patches (Note [Executable slots]).
struct SlotRent {
  // A patch delays the launch it serves by its own time and, measured, by about as much again at
  // that launch (docs/results.md, "Figures behind design rules"), so it is charged twice.
  static constexpr int64_t kChargePerPatchTime = 2;
  int64_t paid_ns = 0;
  // A patch of `patch_ns` while the GPU waited for the host.
  void patched(int64_t patch_ns) { paid_ns += kChargePerPatchTime * patch_ns; }
  // Whether a slot costing `slot_ns` to make (its group's latest instantiation) is paid for.
  bool paid_for(int64_t slot_ns) const { return paid_ns >= slot_ns; }
};

// Where `shape` should run among a group's resident `slots`. `room`: the executable cache can take
// another slot of this group.
// `swaps`, where given: per slot, how many kernel nodes would run another kernel once the slot is
// patched to `shape`; a patch then takes the slot with the fewest, ties broken as without.
SlotChoice choose_slot(const std::vector<ExecutableSlot>& slots, uint32_t shape, bool room,
                       const std::vector<size_t>* swaps = nullptr);

}  // namespace grape::core
