#pragma once
// Note [Argument objects]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Models keep state in objects they are passed: a Hugging Face DynamicCache holds one object per
// layer whose `keys` and `values` each forward rebinds to longer tensors
// (`self.keys = torch.cat([self.keys, k], -2)`). An argument object that holds tensors at any
// depth is a *record*: its type and attributes are part of the signature, its tensors are inputs
// like any other, and an object met twice in one call is a reference to the first (objects that
// hold no tensor stay keyed by hash or identity).
//
// A capture runs f on the caller's objects themselves, with their tensor attributes swapped for
// the placeholders. Afterwards every record is compared with what f received: an attribute that f
// rebound or added, or whose list or dict f changed in place, is an *effect*, and its new value is
// one more output of the graph. The records are then put back as they were, and every replay (the
// capturing call's included) sets the effects' attributes to that replay's outputs. After a
// replay the objects hold what eager would have left in them: new tensors where eager made new
// tensors, in pool memory that the liveness rules protect like any output. A returned argument
// object is returned as itself.
//
// What a replay cannot repeat fails the capture, with the reason (the signature runs eagerly):
// an attribute deleted, a list or dict argument outside any record changed in place.

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "torch/python/pytree.h"

namespace grape {

namespace py = pybind11;

// An attribute of a record that f rebinds: records[record].<attribute> = the next value; or, when
// `leaf` is defined, the gradient of a leaf tensor (a parameter) that f's backward pass set:
// leaf.grad = the next value (Note [Gradients of a captured step] in torch/graphs/training.h).
struct Effect {
  int record = -1;
  py::object attribute;
  at::Tensor leaf;
  bool reads_replaced = false;  // leaf: the graph reads the gradient it replaces (it is guarded)
};

// The records' state across one capture; the destructor puts them back as they were.
class CaptureEffects {
 public:
  explicit CaptureEffects(const std::vector<py::object>& records);
  ~CaptureEffects();
  CaptureEffects(const CaptureEffects&) = delete;
  CaptureEffects& operator=(const CaptureEffects&) = delete;

  // Once the arguments are rebuilt (placeholders set in the records): what f receives.
  void arguments_ready();
  // After f returned: the effects, and their values in `values`. False, with the reason, when a
  // replay could not repeat what f did. `log` is the arguments' unflatten() log.
  bool collect(const UnflattenLog& log, std::vector<Effect>& effects, py::list& values,
               std::string& reason) const;

 private:
  const std::vector<py::object>& records_;
  std::vector<py::dict> original_;  // each record's attributes as the caller left them
  std::vector<py::dict> received_;  // ... and as f received them
};

// The (args, kwargs) that f is called with in a capture, rebuilt from `flat.spec` with `leaves`
// for its tensors: records get their attributes set (the caller's `state` puts them back), and
// `log` receives what the rebuild built, for state.collect() after the call.
py::tuple rebuild_arguments(const FlatCall& flat, const std::vector<py::object>& leaves,
                            CaptureEffects& state, UnflattenLog& log);

// Sets every effect's attribute (or gradient) to its value (`values[i]` for effects[i]).
void apply_effects(const std::vector<py::object>& records, const std::vector<Effect>& effects,
                   py::handle values);

}  // namespace grape
