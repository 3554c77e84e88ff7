#include "core/replay_plan.h"

namespace grape::core {

ReplayPlan plan_replay(const std::vector<PlanStorage>& storages,
                       const std::vector<PlanInput>& inputs,
                       const std::vector<PlanPlaceholder>& placeholders) {
  ReplayPlan plan;
  const size_t n = inputs.size();
  plan.actions.assign(n, InputAction::kCopyIn);
  plan.copy_back.assign(n, false);
  if (placeholders.size() != n) {
    plan.unsafe_reason = "internal error: inputs and placeholders differ in number";
    return plan;
  }

  // Eager semantics of an in-place update through one input are visible through every input that
  // shares its memory; separate placeholders would lose that.
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      if (!(placeholders[i].mutated || placeholders[j].mutated)) continue;
      if (inputs[i].storage == inputs[j].storage || inputs[i].data.overlaps(inputs[j].data)) {
        plan.unsafe_reason = "the function mutates an input that shares memory with another input";
        return plan;
      }
    }
  }

  // An input is already in place when it is its placeholder, whole.
  std::vector<int> users(storages.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const auto& in = inputs[i];
    ++users[in.storage];
    if (in.covers_storage && in.data == placeholders[i].range) {
      plan.actions[i] = InputAction::kNone;
    }
  }

  std::vector<bool> evacuate(storages.size(), false);
  for (size_t s = 0; s < storages.size(); ++s) {
    const auto& st = storages[s];
    // Does this storage overlap a placeholder other than one it exactly is?
    bool conflict = false;
    for (size_t i = 0; i < n && !conflict; ++i) {
      if (!st.range.overlaps(placeholders[i].range)) continue;
      bool self_alias = inputs[i].storage == static_cast<int>(s) &&
                        plan.actions[i] == InputAction::kNone;
      conflict = !self_alias;
    }
    if (!st.pool_resident) {
      if (conflict) {
        plan.unsafe_reason = "an input overlaps a graph placeholder but is not a grape output";
        return plan;
      }
      continue;
    }
    bool all_in_place = true;
    int sole_input = -1;
    for (size_t i = 0; i < n; ++i) {
      if (inputs[i].storage != static_cast<int>(s)) continue;
      if (plan.actions[i] != InputAction::kNone) all_in_place = false;
      sole_input = static_cast<int>(i);
    }
    // It stays where the graph only reads (or mutates) it.
    if (users[s] > 0 && all_in_place && !conflict) continue;
    if (st.other_thread) {
      plan.unsafe_reason = "an output another thread holds lies in memory the replay writes";
      plan.spares_other_thread = true;
      return plan;
    }
    if (!conflict && users[s] == 1 && inputs[sole_input].covers_storage &&
        !placeholders[sole_input].site_buffer) {
      plan.actions[sole_input] = InputAction::kMoveIn;
      continue;
    }
    evacuate[s] = true;
    for (size_t i = 0; i < n; ++i) {
      if (inputs[i].storage == static_cast<int>(s)) plan.actions[i] = InputAction::kCopyIn;
    }
  }
  for (size_t s = 0; s < storages.size(); ++s) {
    if (evacuate[s]) plan.evacuate.push_back(static_cast<int>(s));
  }
  for (size_t i = 0; i < n; ++i) {
    plan.copy_back[i] = placeholders[i].mutated && plan.actions[i] == InputAction::kCopyIn;
  }
  return plan;
}

}  // namespace grape::core
