#include "core/executable_slots.h"

namespace grape::core {

SlotChoice choose_slot(const std::vector<ExecutableSlot>& slots, uint32_t shape, bool room,
                       const std::vector<size_t>* swaps) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].shape == shape) return {SlotChoice::Kind::kHit, i};
  }
  if (slots.empty()) return {SlotChoice::Kind::kNewSlot, 0};
  size_t last = 0;  // launched last
  for (size_t i = 1; i < slots.size(); ++i) {
    if (slots[i].last_used > slots[last].last_used) last = i;
  }
  size_t chosen = slots.size();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i == last && slots.size() > 1) continue;
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
