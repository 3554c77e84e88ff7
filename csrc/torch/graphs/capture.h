#pragma once
// One try at capturing a compiled function's call: placeholders, f under stream capture, the
// checks of what it returned and changed, and the graph joining its shared executable. What to do
// with the outcome (take it again, warm up, fall back) is the runtime's (Note [Capture policy]).

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/arena_layout.h"
#include "core/capture_policy.h"
#include "core/memory_budget.h"
#include "core/reasons.h"
#include "torch/graphs/captured_graph.h"
#include "torch/python/python_hooks.h"
#include "torch/python/pytree.h"
#include "torch/graphs/training.h"

namespace grape {

namespace py = pybind11;

// Everything a capture reads of its compiled function.
struct CaptureContext {
  const py::object& fn;
  const py::object& static_module;  // an nn.Module or None
  Flattener& flattener;
  std::shared_ptr<GraphPool> pool;
  std::shared_ptr<cuda::SharedExecutables> executables;
  TrainingState& training;
  const PythonHooks& hooks;
  core::MemoryBudget budget;
  bool warmed_up;  // the function ran a warm-up call (core::prepares_backward)
  // Whether input i of a call can be its graph's placeholder in place (alias prediction); a
  // predicted allocation site's buffer goes to `buffer`.
  std::function<bool(const FlatCall&, size_t, std::shared_ptr<InputBuffer>* buffer)> can_alias;
};

// How one try at capturing ended.
struct CaptureOutcome {
  core::TryResult result = core::TryResult::kFailed;
  std::unique_ptr<CapturedGraph> graph;  // kGraph
  core::Reason reason;                   // kFailed
  py::object error = py::none();         // kFailed: the exception f raised, or None
  // kRaised: f's own exception, to go on to the caller; the work f queued before it has been
  // launched where it could be (Note [Exceptions under capture]).
  std::shared_ptr<py::error_already_set> raised;
  // kRetake: the layout to capture along (Note [Planned capture layouts]); the graph was dropped
  // before instantiation and its blocks are free.
  std::vector<core::LayoutPlan> plan;
  int64_t alias_predictions = 0;  // placeholders that are inputs used in place
  // Of the try's time, in f itself, between the CUDA capture's begin and end (kGraph, kRetake):
  // the rest is the capture's own work around it.
  int64_t function_ns = 0;
};

// Captures f on `flat` (flattened with its spec, so placeholders can stand in for its tensors).
// `pin_host_constants`: f runs under the hooks' PinnedHostConstants (Note [Host constants]).
// `follow`: the layout to place the capture's allocations along (empty: first fit).
// KeyboardInterrupt, SystemExit and the propagated error types reach the caller as exceptions, the
// capture dropped; an exception of f's own ends the try with kRaised (Note [Exceptions under
// capture]). Whatever ends a capture early leaves PyTorch's and CUDA's state as it was (no stream
// capturing, the generators out of capture mode, the allocators' pools balanced).
CaptureOutcome capture(const CaptureContext& context, FlatCall& flat, bool pin_host_constants,
                       const std::vector<core::LayoutPlan>& follow);

}  // namespace grape
