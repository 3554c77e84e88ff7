#include "torch/graphs/training.h"

#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/python_variable.h>

#include "core/capture_policy.h"
#include "torch/memory/graph_pool.h"
#include "torch/python/module_tensors.h"
#include "torch/memory/torch_version.h"

namespace grape {

const py::object& TrainingState::seen() {
  if (seen_.is_none()) seen_ = hooks_.training_seen();
  return seen_;
}

py::object TrainingState::step_watch() { return hooks_.step_watch(seen()); }

void TrainingState::remember_refusal(const py::object& watch) {
  const py::object refusal = PythonHooks::watch_refusal(watch);
  if (!refusal.is_none()) refusal_ = refusal.cast<std::string>();
}

bool TrainingState::defers_capture() {
  return !seen_.is_none() && PythonHooks::defers_capture(seen_);
}

std::vector<at::Tensor> TrainingState::tracked_leaves(const std::vector<CallModule>& modules,
                                                      const FlatCall& flat, GraphPool& pool,
                                                      bool warmed_up) {
  std::vector<at::Tensor> parameters;
  bool any_gradient = false;  // set by a backward pass, or by the caller (.grad = ...)
  for (const auto& m : modules) {
    for (const at::Tensor& p : m.tensors.parameters) {
      if (!p.requires_grad()) continue;
      any_gradient = any_gradient || p.grad().defined();
      parameters.push_back(p);
    }
  }
  // Until a warm-up or capture saw the function train, or one of its modules' parameters has a
  // gradient (which f may read or replace: clip_grad_norm_, zero_grad), those parameters are not
  // tracked: checking them cost an inference function's every capture more than reading its
  // graph (docs/results.md), and a backward pass that reaches them all the same fails that
  // capture once and tracks them from then on (StepWatch.untracked_leaves_kept).
  const bool training = any_gradient || PythonHooks::seen_training(seen());
  std::vector<at::Tensor> leaves;
  if (training || !flat.static_leaves.empty()) {
    py::list arguments, parameter_list;
    for (const auto& t : flat.static_leaves) {
      arguments.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
    }
    if (training) {
      for (const auto& p : parameters) {
        parameter_list.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(p)));
      }
    }
    for (py::handle t : hooks_.leaves_of(arguments, seen(), parameter_list)) {
      leaves.push_back(THPVariable_Unpack(t.ptr()));
    }
  }
  // A backward pass may reach the parameters, tracked or not: its lazy initialization happens
  // before the function's first capture that may run one, as for a training step.
  if (core::prepares_backward(!parameters.empty() || !leaves.empty(), training,
                              at::GradMode::is_enabled(), warmed_up)) {
    prepare_backward(pool);
  }
  return leaves;
}

void TrainingState::prepare_backward(GraphPool& pool) {
  if (backward_prepared_) return;
  at::cuda::CUDAStreamGuard on_capture_stream(pool.capture_stream());
  hooks_.prepare_backward(static_cast<int>(pool.device()));
  backward_prepared_ = true;
}

py::object TrainingState::device_settings_swap() {
  if (device_settings_.is_none()) device_settings_ = hooks_.device_settings();
  return PythonHooks::settings_swap(device_settings_, seen());
}

TrainingState::BakedSettings TrainingState::bake_optimizers(
    const py::object& watch, const py::object& swap,
    std::vector<std::pair<at::Tensor, const void*>>& statics) const {
  const py::list stepped = PythonHooks::stepped(watch);
  for (py::handle t : hooks_.state_tensors(stepped)) {
    const at::Tensor& tensor = THPVariable_Unpack(t.ptr());
    statics.emplace_back(tensor, tensor.data_ptr());
  }
  const py::tuple baked = PythonHooks::bake(swap, stepped);
  return {baked[0], baked[1]};
}


bool held_by_leaf_only(const at::Tensor& grad) {
  if (grad.storage().use_count() != 1) return false;
  const auto count = grad.use_count();
  if (count == 1) return true;
#if GRAPE_TORCH_AT_LEAST(2, 10)
  // The tensor's Python object holds it too, and is itself held by the tensor alone when no
  // Python name refers to it.
  PyObject* obj = grad.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  return count == 2 && obj != nullptr && Py_REFCNT(obj) == 1;
#else
  return false;
#endif
}

CaptureGradients::CaptureGradients(std::vector<at::Tensor> leaves, GraphPool& pool,
                                   cudaStream_t stream)
    : leaves_(std::move(leaves)) {
  for (const auto& leaf : leaves_) {
    const at::Tensor& grad = leaf.grad();
    // A gradient that a graph accumulates into in place must not be memory that other graphs'
    // replays may write.
    if (grad.defined() && grad.is_cuda() &&
        pool.find_live(grad.storage().unsafeGetStorageImpl()) != nullptr) {
      pool.evacuate({grad.storage().unsafeGetStorageImpl()}, stream);
    }
    before_.push_back(grad);
    versions_.push_back(grad.defined() ? grad._version() : 0);
  }
}

CaptureGradients::~CaptureGradients() {
  for (size_t i = 0; i < leaves_.size(); ++i) leaves_[i].mutable_grad() = before_[i];
}

bool CaptureGradients::collect(std::vector<Effect>& effects, py::list& values,
                               std::vector<GradGuard>& guards) const {
  bool backward_ran = false;
  for (size_t i = 0; i < leaves_.size(); ++i) {
    const at::Tensor& grad = leaves_[i].grad();
    if (grad.unsafeGetTensorImpl() != before_[i].unsafeGetTensorImpl()) {
      effects.push_back({-1, py::none(), leaves_[i]});
      values.append(grad.defined() ? py::reinterpret_steal<py::object>(THPVariable_Wrap(grad))
                                   : py::object(py::none()));
      backward_ran = true;
      // Where there was no gradient, eager makes one. Where there was one and f wrote it before
      // replacing it (accumulated a micro-batch into it, then zero_grad(set_to_none=True): the
      // optimizer step of gradient accumulation), the graph reads it: it must be where it was.
      if (!before_[i].defined()) {
        guards.push_back({leaves_[i], nullptr});
      } else if (before_[i]._version() != versions_[i]) {
        guards.push_back({leaves_[i], before_[i].data_ptr()});
        effects.back().reads_replaced = true;
      }
    } else {
      backward_ran |= grad.defined() && grad._version() != versions_[i];
      guards.push_back({leaves_[i], grad.defined() ? grad.data_ptr() : nullptr});
    }
  }
  return backward_ran;
}

}  // namespace grape
