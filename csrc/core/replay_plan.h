#pragma once
// Note [Liveness of graph outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// All graphs of one compiled function share one memory pool, and a replay writes wherever its
// capture placed its placeholders, temporaries and outputs. Outputs handed to the caller are views
// of that pool memory (no copy out). So before a replay, every storage that was handed out earlier
// and is still referenced must not be in memory the replay writes. We do not track per-graph
// footprints: any graph may write anywhere in the pool. The runtime therefore keeps a registry of
// live handed-out storages and, before each replay, makes sure none of them stays in the pool
// unless the replay only reads it:
//   - a live storage that is not an input of this call is *evacuated*: copied to fresh memory
//     outside the pool, and the storage is repointed there (every view of it follows);
//   - a live storage that is an input is *moved in*: copied into the graph's placeholder and
//     repointed there, so the one copy that feeds the graph also preserves the caller's tensor
//     (the graph reads a placeholder; it writes it only if the function mutates that input, which
//     is what the caller's tensor must see anyway). Not into an input buffer of a predicted
//     allocation site: the site hands that buffer to the caller's next allocation, which would
//     overwrite the moved tensor; such an input is evacuated and copied in;
//   - an input that already is the graph's placeholder needs nothing.
// A storage handed to another thread is never moved: that thread may be reading its address at
// this moment, outside any lock, and would read what the replay wrote there. A replay that would
// move one is refused (the call runs eagerly), and the function copies its outputs out of the pool
// from then on (Note [Outputs of several threads] in csrc/torch/graphs/replay.h).
// This file decides, without touching memory, which of these applies to each input. The decision
// is pure so that it is unit-tested without a GPU; csrc/torch/graphs/replay.cpp carries it out.

#include <string>
#include <vector>

#include "core/address_ranges.h"

namespace grape::core {

// A distinct storage referenced by one or more tensor inputs of a call.
// The call's storages come first; every other live storage of the pool follows, referenced by no
// input (any graph may write anywhere in the pool, so those are evacuated).
struct PlanStorage {
  AddressRange range;          // all bytes of the storage
  bool pool_resident = false;  // a live storage handed out by this function's pool
  bool other_thread = false;   // ... handed to another thread than the caller's
};

struct PlanInput {
  int storage = -1;             // index into the storages of the call
  AddressRange data;            // bytes the input view spans
  bool covers_storage = false;  // the view is its whole storage, laid out as its placeholder
};

struct PlanPlaceholder {
  AddressRange range;
  bool mutated = false;      // the captured function writes this input in place
  bool site_buffer = false;  // an input buffer the allocation sites hand out (no move in)
};

enum class InputAction {
  kNone,    // the input already is its placeholder
  kCopyIn,  // copy the input into its placeholder
  kMoveIn,  // copy into the placeholder and repoint the input's storage there
};

struct ReplayPlan {
  // Set when the call cannot be replayed safely (the caller runs it eagerly instead).
  std::string unsafe_reason;
  // ... because the replay would move a storage another thread holds.
  bool spares_other_thread = false;
  // Storages (indices into the storages) to evacuate before any copy-in.
  std::vector<int> evacuate;
  std::vector<InputAction> actions;  // one per input
  std::vector<bool> copy_back;       // one per input: copy the placeholder back after the replay
  bool safe() const { return unsafe_reason.empty(); }
};

// inputs[i] is fed to placeholders[i].
ReplayPlan plan_replay(const std::vector<PlanStorage>& storages,
                       const std::vector<PlanInput>& inputs,
                       const std::vector<PlanPlaceholder>& placeholders);

}  // namespace grape::core
