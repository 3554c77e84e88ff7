#pragma once
// Note [Gradients of a captured step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training step (forward, loss.backward(), optimizer.step()) captures like any function: the
// backward pass runs on the autograd engine's device thread, on the capture stream, and its
// allocations go to the arena too (AllocationRoute for_all_threads). What needs care is the state
// it leaves outside the arguments:
// - Parameters and optimizer state are static, like a module's parameters: the graph reads and
//   writes them in place, and a replay whose parameters or optimizer state moved captures again.
//   The *tracked leaves* are the parameter arguments that require grad and, once a warm-up or
//   capture saw the function run a backward pass or step an optimizer, or once a parameter of
//   its modules has a gradient, the parameters that
//   require grad of the compiled module, of module arguments, of every optimizer the function
//   stepped during its warm-up (grape._training.StepWatch, which also sets capturable=True on
//   them), and every leaf a backward pass of the function reached (a closure's model stepped
//   outside the function). An inference function's captures track no module's parameters. A
//   capture whose backward pass reached a leaf it did not track, one that outlives the call,
//   fails, and the signature warms up and captures again, tracking it: an untracked gradient
//   would be written by replays where the capture left it, whatever the caller did with .grad
//   since. A leaf the function makes (an input it sets requires_grad on) dies with the call.
// - A gradient the step replaces (optimizer.zero_grad() sets it to None, backward makes a new
//   one) is an effect, like a rebound attribute: the new gradient is an output of the graph, and
//   each replay sets leaf.grad to its own. A gradient the step accumulates into in place is
//   static, moved out of the pool before the capture. A replay whose gradients are not where the
//   capture found them (or not None where they were None) captures again.
// - Optimizer settings that are Python values are baked into the kernels: a replay after one
//   changed captures again (a setting given as a CUDA tensor is read by the kernels and stays
//   valid). A float setting the optimizer can read from device memory (a scheduler's lr of
//   AdamW) is read from a tensor grape writes before each replay instead (Note [Device settings],
//   grape/_training.py).
// An output that requires grad (the loss) is returned detached, once the step ran a backward pass;
// without one the graph could not join the caller's autograd graph, and the capture fails.

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "torch/python/module_tensors.h"
#include "torch/python/python_hooks.h"
#include "torch/python/pytree.h"
#include "torch/python/optimizer_settings.h"
#include "torch/python/side_effects.h"

// The CUDA runtime's stream handle, without its header (this one is read by CPU-only builds too).
typedef struct CUstream_st* cudaStream_t;

namespace grape {

namespace py = pybind11;

class GraphPool;

// A gradient a graph reads or accumulates into where it is: leaf.grad must still be at `grad`
// (nullptr: None) when the graph is replayed.
struct GradGuard {
  at::Tensor leaf;
  const void* grad = nullptr;
};

// What one compiled function knows of the training steps it runs.
class TrainingState {
 public:
  // `hooks`: the runtime's, which outlive this state.
  explicit TrainingState(const PythonHooks& hooks) : hooks_(hooks) {}

  // A context manager for a warm-up or capture call: the optimizers stepped inside it are
  // remembered (weakly) and made capturable (grape._training.StepWatch).
  py::object step_watch();
  // After a warm-up call run in `watch` (a step_watch()): why no capture of the function can
  // succeed, where the warm-up saw a reason (StepWatch.refusal); empty: none so far.
  void remember_refusal(const py::object& watch);
  const std::string& refusal() const { return refusal_; }
  // Whether a call that would capture now runs as a warm-up instead: a module it ran times its
  // first iterations with host synchronizations (Seen.defers_capture, Note [DDP under capture]).
  bool defers_capture();
  // The leaves whose gradients a capture of `flat` watches: parameter arguments, then, once the
  // function was seen training, the parameters that require grad of the known optimizers and of
  // `modules` (the call's, read once per capture). Where a backward pass may reach any of those
  // (core::prepares_backward; `warmed_up`: the function ran a warm-up call), prepares `pool`'s
  // capture stream for it first (once per function): a small backward pass on it, outside any
  // capture (grape._training.prepare_backward).
  std::vector<at::Tensor> tracked_leaves(const std::vector<CallModule>& modules,
                                         const FlatCall& flat, GraphPool& pool, bool warmed_up);
  // A context manager for a capture, entered outside the CUDA capture: the float settings of the
  // known optimizers that they can read from device memory are tensors while entered
  // (grape._training.DeviceSettingsSwap, Note [Device settings]).
  py::object device_settings_swap();

  // What a capture baked in of the optimizers that `watch` (a step_watch() it ran in) saw
  // stepped: their state tensors, appended to `statics` with their addresses (static, like
  // parameters); the Python settings, for optimizer_settings_hold; and the DeviceSettings the
  // graph reads, for write_device_settings. `swap`: the device_settings_swap() it ran in.
  struct BakedSettings {
    py::list hyperparameters;
    py::list device_settings;
  };
  BakedSettings bake_optimizers(const py::object& watch, const py::object& swap,
                                std::vector<std::pair<at::Tensor, const void*>>& statics) const;

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(seen_.ptr());
    Py_VISIT(device_settings_.ptr());
    return 0;
  }
  void clear() {
    seen_ = py::none();
    device_settings_ = py::none();
  }

 private:
  const PythonHooks& hooks_;
  // What warm-ups and captures saw stepped and reached (a grape._training.Seen), made on first use.
  const py::object& seen();
  // Before the first capture that may run a backward pass: a small backward pass on `pool`'s
  // capture stream, outside any capture (grape._training.prepare_backward).
  void prepare_backward(GraphPool& pool);

  py::object seen_ = py::none();
  py::object device_settings_ = py::none();  // a grape._training.DeviceSettings

  std::string refusal_;
  bool backward_prepared_ = false;
};

// Whether nothing but its leaf's .grad holds `grad` (no other tensor, view or Python name).
bool held_by_leaf_only(const at::Tensor& grad);

// The tracked leaves' gradients across one capture: taken before f (in-place ones moved out of
// the pool), compared after f, put back when the capture ends.
class CaptureGradients {
 public:
  CaptureGradients(std::vector<at::Tensor> leaves, GraphPool& pool, cudaStream_t stream);
  ~CaptureGradients();
  CaptureGradients(const CaptureGradients&) = delete;
  CaptureGradients& operator=(const CaptureGradients&) = delete;

  const std::vector<at::Tensor>& leaves() const { return leaves_; }
  // After f: a gradient f replaced is an effect (its new value appended to `values`); one it left
  // in place, or wrote before replacing it, is guarded. Returns whether f ran a backward pass
  // that reached the leaves.
  bool collect(std::vector<Effect>& effects, py::list& values,
               std::vector<GradGuard>& guards) const;

 private:
  std::vector<at::Tensor> leaves_;
  std::vector<at::Tensor> before_;
  std::vector<int64_t> versions_;
};

}  // namespace grape
