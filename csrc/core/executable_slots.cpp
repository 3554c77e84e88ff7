#include "core/executable_slots.h"

namespace grape::core {

SlotChoice choose_slot(const std::vector<ExecutableSlot>& slots, uint32_t shape, bool room,
                       const std::vector<size_t>* swaps) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].shape == shape) return {SlotChoice::Kind::kHit, i};
  }
  if (slots.empty()) return {SlotChoice::Kind::kNewSlot, 0};
  size_t last = 0;  // launched last
  size_t unbought = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].last_used > slots[last].last_used) last = i;
    if (!slots[i].bought) ++unbought;
  }
  // The slots a shape without one of its own may be patched into: those no shape bought, or all.
  auto open = [&](size_t i) { return unbought == 0 || !slots[i].bought; };
  const size_t candidates = unbought == 0 ? slots.size() : unbought;
  size_t chosen = slots.size();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!open(i) || (i == last && candidates > 1)) continue;
    if (slots[i].shape == ExecutableSlot::kNoShape) return {SlotChoice::Kind::kPatch, i};
    if (chosen == slots.size()) {
      chosen = i;
    } else if (swaps != nullptr && (*swaps)[i] != (*swaps)[chosen]) {
      if ((*swaps)[i] < (*swaps)[chosen]) chosen = i;
    } else if (slots[i].last_used > slots[chosen].last_used) {
      chosen = i;
    }
  }
  if (room) return {SlotChoice::Kind::kNewSlot, 0};
  return {SlotChoice::Kind::kPatch, chosen};
}

}  // namespace grape::core
