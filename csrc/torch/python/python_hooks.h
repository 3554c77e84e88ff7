#pragma once
// The runtime's one way into Python: the hooks object (grape/_hooks.py RuntimeHooks) that
// grape.CompiledFunction hands its Runtime at construction. Typed calls here, so no other C++
// file names a Python module or method of grape's.

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "core/reasons.h"

namespace grape {

namespace py = pybind11;

class PythonHooks {
 public:
  explicit PythonHooks(py::object hooks) : hooks_(std::move(hooks)) {}

  // A signature runs eagerly (or a replay was refused) for `reason`; `error`: the exception a
  // capture raised, or None. Warns (grape.FallbackWarning) and keeps it for grape.stats.
  void report_fallback(const std::string& signature, const core::Reason& reason,
                       const py::object& error) const;
  // Whether a capture lets `error` through to the caller instead of falling back to eager (a
  // branch the rewriter cannot predicate, a misused grape.Predicate: the user's to fix).
  bool propagates(const py::error_already_set& error) const;
  // Where an exception f raised under capture comes from the capture's own doing, as Python
  // knows it (Note [Exceptions under capture]): "compiler" (torch.compile compiling inside the
  // capture), "predicated_body" (it left a grape.Predicate or while_loop body), or "".
  std::string capture_cause(const py::error_already_set& error) const;
  // A new PinnedHostConstants mode (Note [Host constants]), and the pinned tensors one kept.
  py::object pinned_host_constants() const;
  // The context every capture of the function runs in (Note [Attention without plans under
  // capture]), or None.
  py::object capture_settings() const;
  static py::object kept_host_constants(const py::object& mode);
  // The function's graph cache file (Note [The graph cache in the runtime]), computed now: None
  // where it has none, else (path, key).
  py::object graph_cache_file() const;
  // Its modules' tensors by name, as they are now: [(name, tensor)].
  py::object graph_cache_tensors() const;

  // Training steps (Note [Gradients of a captured step]).
  py::object training_seen() const;  // a grape._training.Seen
  py::object step_watch(const py::object& seen) const;
  py::object leaves_of(const py::list& arguments, const py::object& seen,
                       const py::list& parameters) const;
  void prepare_backward(int device_index) const;
  py::object state_tensors(const py::object& optimizers) const;
  py::object device_settings() const;  // Note [Device settings]: a DeviceSettings registry
  // What training state objects say (grape._training: Seen, StepWatch, DeviceSettings and its
  // swap); static, as they need no hooks object, but named here, the one place C++ asks Python.
  static bool seen_training(const py::object& seen);            // Seen.training
  static bool defers_capture(const py::object& seen);           // Seen.defers_capture()
  static py::object watch_refusal(const py::object& watch);     // StepWatch.refusal: str or None
  static py::list stepped(const py::object& watch);             // StepWatch.stepped
  // StepWatch.untracked_leaves_kept() and DeviceSettingsSwap.changed_by_function(): why a capture
  // cannot be used, or None.
  static py::object untracked_leaves_kept(const py::object& watch);
  static py::object changed_by_function(const py::object& swap);
  static py::object settings_swap(const py::object& device_settings, const py::object& seen);
  static py::tuple bake(const py::object& swap, const py::list& stepped);  // (hyper, on device)

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(hooks_.ptr());
    return 0;
  }
  void clear() { hooks_ = py::none(); }

 private:
  py::object hooks_;
};

}  // namespace grape
