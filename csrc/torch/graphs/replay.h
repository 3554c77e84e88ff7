#pragma once
// One replay of a captured graph for a call: plan the inputs (Note [Liveness of graph outputs] in
// core/replay_plan.h), evacuate live outputs in the way, feed the placeholders, launch, copy
// in-place updates back, and rebuild the outputs.

#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/memory_budget.h"
#include "torch/graphs/captured_graph.h"
#include "torch/python/pytree.h"
#include "torch/graphs/runtime_counters.h"

namespace grape {

namespace py = pybind11;

class InputSites;

// Note [Outputs of several threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A live output is moved out of a replay's way by repointing its storage (Note [Liveness of graph
// outputs]). The thread that holds it may at that moment be inside a PyTorch op on it, without the
// GIL and outside grape's lock, having read the old address: its kernel would read what the replay
// wrote there. So a storage handed to one thread is never moved by another thread's call: that call
// runs eagerly instead (`eager_for_other_threads`). From the first such call on, the function
// copies its outputs out of the pool before each call returns (`outputs_copied_out`): no output
// then lies in the pool once its call is over, and calls from any thread replay again.

// What a replay reads and counts of its compiled function.
struct ReplayContext {
  GraphPool& pool;
  const core::MemoryBudget& budget;
  InputSites* sites;  // null when alias prediction is off
  RuntimeCounters& stats;
  // The caller did nothing but replay since its previous launch, so an idle stream means the GPU
  // waits for launches (Note [Executable slots]).
  bool host_paced;
  // The outputs leave the pool before the call returns (Note [Outputs of several threads]).
  bool copy_outputs_out;
};

struct ReplayOutcome {
  bool replayed = false;
  py::object result;    // replayed: f's result
  std::string refusal;  // not replayed: why this call must run eagerly (nothing was launched)
  bool spared_other_thread = false;  // ... an output another thread holds would have moved
};

ReplayOutcome replay(const CapturedGraph& graph, FlatCall& flat, ReplayContext& context);

// An input of a capture that f ended by raising (Note [Exceptions under capture]).
struct PartialInput {
  void* placeholder = nullptr;
  size_t bytes = 0;
  bool mutated = false;   // f changed it in place before raising
  bool in_place = false;  // the placeholder is the input's own memory (chained, a site buffer)
};

// Runs once, on the caller's stream, what a capture recorded before f raised, as a replay runs a
// graph: the inputs copied into their placeholders, and copied back where f changed them. Returns
// why it could not run (nothing was launched then), or "".
std::string replay_partial(ReplayGraph& graph, const std::vector<PartialInput>& inputs,
                           const FlatCall& flat, GraphPool& pool);

}  // namespace grape
