// The slot policy of shared executables (Note [Executable slots]), simulated without a GPU.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/executable_slots.h"

using grape::core::choose_slot;
using grape::core::ExecutableSlot;
using grape::core::SlotChoice;
using grape::core::SlotAdmission;

namespace {

// A group of at most `capacity` slots none of which is held as its shape's own (every slot made
// while the cache has room and patched since, as after an eviction), replaying shapes as
// SharedExecutables would; counts the replays that patched a slot and checks none patched the
// slot launched last.
struct Simulation {
  explicit Simulation(size_t capacity) : capacity(capacity) {}
  size_t capacity;
  std::vector<ExecutableSlot> slots;
  uint64_t clock = 0;
  int patches = 0;
  int launches = 0;

  void replay(uint32_t shape) {
    const SlotChoice c = choose_slot(slots, shape, slots.size() < capacity);
    size_t slot = c.slot;
    if (c.kind == SlotChoice::Kind::kNewSlot) {
      slots.push_back({shape, 0});
      slot = slots.size() - 1;
    } else if (c.kind == SlotChoice::Kind::kPatch) {
      if (slots.size() > 1) {
        for (const auto& s : slots) {
          ASSERT_LE(s.last_used, clock);
        }
        ASSERT_NE(slots[slot].last_used, clock) << "patched the executable launched last";
      }
      slots[slot].shape = shape;
      ++patches;
    }
    slots[slot].last_used = ++clock;
    ++launches;
  }
};

// The same group as grape's runtime grows it (SharedExecutables::SlotGrowth::kWhenGpuWaits): a
// shape gets a slot of its own, while there is room, at its launch after a patch the GPU waited
// for (every patch made while there was room, as in a host-bound generation), or at the launch
// right after such a patch of another, and keeps it.
struct AdmittingSimulation {
  AdmittingSimulation(size_t capacity, uint32_t first_shape) : capacity(capacity) {
    slots.push_back({first_shape, 0, false});  // the group's first executable
  }
  size_t capacity;
  std::vector<ExecutableSlot> slots;
  SlotAdmission admission;
  uint64_t clock = 0;
  int patches = 0;
  int new_slots = 0;

  void replay(uint32_t shape) {
    SlotChoice c = choose_slot(slots, shape, false);
    const bool room = slots.size() < capacity;
    if (c.kind == SlotChoice::Kind::kPatch) {
      c = choose_slot(slots, shape, room && admission.admits(shape));
    }
    size_t slot = c.slot;
    bool costly = false;
    if (c.kind == SlotChoice::Kind::kNewSlot) {
      slots.push_back({shape, 0, true});
      slot = slots.size() - 1;
      ++new_slots;
    } else if (c.kind == SlotChoice::Kind::kPatch) {
      slots[slot] = {shape, slots[slot].last_used, false};
      costly = room;  // a patch counts only where a slot could have been made instead
      ++patches;
    }
    admission.launched(shape, costly);
    slots[slot].last_used = ++clock;
  }
  // One pass over shapes [0, n), as a generation's forwards; returns {patches, new slots}.
  std::pair<int, int> pass(uint32_t n) {
    const int p = patches, s = new_slots;
    for (uint32_t shape = 0; shape < n; ++shape) replay(shape);
    return {patches - p, new_slots - s};
  }
};

}  // namespace

TEST(ExecutableSlots, AShapeWithASlotReplaysWithoutPatching) {
  Simulation sim(4);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t shape : {0u, 1u, 2u, 3u}) sim.replay(shape);
  }
  EXPECT_EQ(sim.slots.size(), 4u);
  EXPECT_EQ(sim.patches, 0);
}

TEST(ExecutableSlots, ACycleLongerThanTheCacheKeepsMostOfItResident) {
  // A generation of 128 growing lengths, replayed 5 times, with room for 80 executables.
  Simulation sim(80);
  std::vector<int> patches_per_round;
  for (int round = 0; round < 5; ++round) {
    const int before = sim.patches;
    for (uint32_t shape = 0; shape < 128; ++shape) sim.replay(shape);
    patches_per_round.push_back(sim.patches - before);
  }
  EXPECT_EQ(patches_per_round[0], 128 - 80);  // the first round fills the cache
  // Least-recently-used replacement would patch all 128 every round after the first.
  for (size_t r = 1; r < patches_per_round.size(); ++r) {
    EXPECT_LE(patches_per_round[r], 128 - 80 + 2) << "round " << r;
  }
}

TEST(ExecutableSlots, WithoutRoomTwoSlotsAlternateSoTheRunningOneIsNeverPatched) {
  Simulation sim(2);
  for (uint32_t shape = 0; shape < 50; ++shape) sim.replay(shape);
  EXPECT_EQ(sim.slots.size(), 2u);
  EXPECT_EQ(sim.patches, 48);
}

TEST(ExecutableSlots, OneSlotIsPatchedForEveryOtherShape) {
  Simulation sim(1);
  for (uint32_t shape : {0u, 1u, 1u, 2u, 0u}) sim.replay(shape);
  EXPECT_EQ(sim.slots.size(), 1u);
  EXPECT_EQ(sim.patches, 3);
}

TEST(ExecutableSlots, ASlotWithoutALiveShapeIsUsedFirst) {
  std::vector<ExecutableSlot> slots = {{0, 5}, {ExecutableSlot::kNoShape, 1}, {2, 3}, {3, 4}};
  const SlotChoice c = choose_slot(slots, 9, /*room=*/false);
  EXPECT_EQ(c.kind, SlotChoice::Kind::kPatch);
  EXPECT_EQ(c.slot, 1u);
  // ... even with room for a new one; without such a slot, room makes a new one.
  EXPECT_EQ(choose_slot(slots, 9, true).slot, 1u);
  slots[1].shape = 1;
  EXPECT_EQ(choose_slot(slots, 9, true).kind, SlotChoice::Kind::kNewSlot);
  // A hit wins over everything.
  const SlotChoice hit = choose_slot(slots, 2, true);
  EXPECT_EQ(hit.kind, SlotChoice::Kind::kHit);
  EXPECT_EQ(hit.slot, 2u);
}

TEST(ExecutableSlots, APatchTakesTheSlotWhoseShapeRunsTheMostOfTheSameKernels) {
  // Slot 3 was launched last and is never patched; of the others, slot 1 changes the fewest
  // kernels, though slot 2 was used more recently.
  const std::vector<ExecutableSlot> slots = {{0, 1}, {1, 2}, {2, 3}, {3, 4}};
  const std::vector<size_t> swaps = {7, 2, 5, 0};
  SlotChoice c = choose_slot(slots, 9, /*room=*/false, &swaps);
  EXPECT_EQ(c.kind, SlotChoice::Kind::kPatch);
  EXPECT_EQ(c.slot, 1u);
  // Ties go to the most recently used, as without swaps.
  const std::vector<size_t> even = {2, 2, 2, 0};
  EXPECT_EQ(choose_slot(slots, 9, false, &even).slot, 2u);
  EXPECT_EQ(choose_slot(slots, 9, false).slot, 2u);
  // A hit and room come first.
  EXPECT_EQ(choose_slot(slots, 0, false, &swaps).kind, SlotChoice::Kind::kHit);
  EXPECT_EQ(choose_slot(slots, 9, true, &swaps).kind, SlotChoice::Kind::kNewSlot);
}

TEST(ExecutableSlots, AShapeIsAdmittedAfterACostlyPatchOfItOrRightAfterOneOfAnother) {
  SlotAdmission admission;
  EXPECT_FALSE(admission.admits(5)) << "a shape seen once would cost an instantiation";
  admission.launched(5, /*costly_patch=*/true);
  EXPECT_TRUE(admission.admits(5));
  EXPECT_TRUE(admission.admits(6)) << "the launch right after a costly patch finds the GPU waiting";
  admission.launched(6, false);
  EXPECT_FALSE(admission.admits(6)) << "admitted only right after another's costly patch";
  EXPECT_TRUE(admission.admits(5)) << "a shape's own costly patch admits it for good";
  admission.forget(5);
  EXPECT_FALSE(admission.admits(5)) << "a removed shape's count is gone";
}

TEST(ExecutableSlots, AShapeWithoutASlotIsPatchedIntoASlotMadeForNoShape) {
  // Slots 1 and 2 were made for their shapes; shape 9, without one, is patched into slot 0 even
  // though slot 2 was used more recently, and even when slot 0 was launched last.
  std::vector<ExecutableSlot> slots = {{0, 1, false}, {1, 2, true}, {2, 3, true}};
  SlotChoice c = choose_slot(slots, 9, /*room=*/false);
  EXPECT_EQ(c.kind, SlotChoice::Kind::kPatch);
  EXPECT_EQ(c.slot, 0u);
  slots[0].last_used = 4;
  EXPECT_EQ(choose_slot(slots, 9, false).slot, 0u);
  // Room, where the shape is admitted to a slot of its own, makes a new one.
  EXPECT_EQ(choose_slot(slots, 9, true).kind, SlotChoice::Kind::kNewSlot);
  // Every slot made for its shape (the cache full): the most recently used other than the last
  // launched.
  slots[0].bought = true;
  EXPECT_EQ(choose_slot(slots, 9, false).slot, 2u);
}

TEST(ExecutableSlots, AGenerationMakesItsSlotsOverTwoPassesThenPatchesNothing) {
  // 128 shapes, the first executable holding the last one captured (127). The second call (pass
  // 1) patches every other shape into it and makes a slot for each shape after such a patch; the
  // third makes a slot for each patched shape but the one the first executable holds then (126);
  // the fourth patches nothing and makes nothing. Neither pass makes every slot alone.
  AdmittingSimulation sim(/*capacity=*/1000, /*first_shape=*/127);
  EXPECT_EQ(sim.pass(128), std::make_pair(64, 64));
  EXPECT_EQ(sim.pass(128), std::make_pair(0, 63));
  EXPECT_EQ(sim.pass(128), std::make_pair(0, 0));
  EXPECT_EQ(sim.slots.size(), 128u);
}

TEST(ExecutableSlots, BeyondTheCacheAdmittedShapesKeepTheirSlotsAndTheRestShareTheFirst) {
  // Room for 64 executables, 128 shapes: the 63 given slots in the first pass keep them pass
  // after pass; the other 65 take turns in the first executable instead of patching an admitted
  // shape's slot, which would make that shape take another.
  AdmittingSimulation sim(/*capacity=*/64, /*first_shape=*/127);
  EXPECT_EQ(sim.pass(128), std::make_pair(65, 63));
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(sim.pass(128), std::make_pair(65, 0)) << "round " << round;
  }
  EXPECT_EQ(sim.slots.size(), 64u);
}
