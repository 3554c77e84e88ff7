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
  // branch the rewriter cannot predicate, a collective in a predicated body: the user's to fix).
  bool propagates(const py::error_already_set& error) const;
  // Where an exception f raised under capture comes from the capture's own doing, as Python
  // knows it (Note [Exceptions under capture]): "compiler" (torch.compile compiling inside the
  // capture), "predicated_body" (it left a grape.Predicate or while_loop body), or "".
  std::string capture_cause(const py::error_already_set& error) const;
  // A new PinnedHostConstants mode (Note [Host constants]); its `kept` holds the pinned tensors.
  py::object pinned_host_constants() const;

  // Training steps (Note [Gradients of a captured step]).
  py::object training_seen() const;  // a grape._training.Seen
  py::object step_watch(const py::object& seen) const;
  py::object leaves_of(const py::list& arguments, const py::object& seen,
                       const py::list& parameters) const;
  void prepare_backward(int device_index) const;
  py::object state_tensors(const py::object& optimizers) const;
  py::object device_settings() const;  // Note [Device settings]: a DeviceSettings registry

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(hooks_.ptr());
    return 0;
  }
  void clear() { hooks_ = py::none(); }

 private:
  py::object hooks_;
};

}  // namespace grape
