#include "torch/python/python_hooks.h"

#include <string>

namespace grape {

void PythonHooks::report_fallback(const std::string& signature, const core::Reason& reason,
                                  const py::object& error) const {
  if (hooks_.is_none()) return;  // cleared by the garbage collector
  hooks_.attr("report_fallback")(signature, core::reason_kind_name(reason.kind), reason.text,
                                 error);
}

bool PythonHooks::propagates(const py::error_already_set& error) const {
  return !hooks_.is_none() && error.matches(hooks_.attr("propagated_errors"));
}

std::string PythonHooks::capture_cause(const py::error_already_set& error) const {
  if (hooks_.is_none()) return "";
  try {
    return hooks_.attr("capture_cause")(error.value()).cast<std::string>();
  } catch (py::error_already_set& failed) {
    failed.discard_as_unraisable(__func__);  // f's exception goes on, as f's own
    return "";
  }
}

py::object PythonHooks::pinned_host_constants() const {
  return hooks_.attr("pinned_host_constants")();
}

py::object PythonHooks::capture_settings() const { return hooks_.attr("capture_settings")(); }

py::object PythonHooks::graph_cache_file() const {
  if (hooks_.is_none()) return py::none();
  return hooks_.attr("graph_cache_file")();
}

py::object PythonHooks::graph_cache_tensors() const {
  if (hooks_.is_none()) return py::list();
  return hooks_.attr("graph_cache_tensors")();
}

py::object PythonHooks::kept_host_constants(const py::object& mode) { return mode.attr("kept"); }

bool PythonHooks::seen_training(const py::object& seen) {
  return seen.attr("training").cast<bool>();
}

bool PythonHooks::defers_capture(const py::object& seen) {
  return seen.attr("defers_capture")().cast<bool>();
}

py::object PythonHooks::watch_refusal(const py::object& watch) { return watch.attr("refusal"); }

py::list PythonHooks::stepped(const py::object& watch) { return watch.attr("stepped"); }

py::object PythonHooks::untracked_leaves_kept(const py::object& watch) {
  return watch.attr("untracked_leaves_kept")();
}

py::object PythonHooks::changed_by_function(const py::object& swap) {
  return swap.attr("changed_by_function")();
}

py::object PythonHooks::settings_swap(const py::object& device_settings, const py::object& seen) {
  return device_settings.attr("swap")(seen.attr("optimizers"));
}

py::tuple PythonHooks::bake(const py::object& swap, const py::list& stepped) {
  return swap.attr("bake")(stepped);
}

py::object PythonHooks::training_seen() const { return hooks_.attr("training_seen")(); }

py::object PythonHooks::step_watch(const py::object& seen) const {
  return hooks_.attr("step_watch")(seen);
}

py::object PythonHooks::leaves_of(const py::list& arguments, const py::object& seen,
                                  const py::list& parameters) const {
  return hooks_.attr("leaves_of")(arguments, seen, parameters);
}

void PythonHooks::prepare_backward(int device_index) const {
  hooks_.attr("prepare_backward")(device_index);
}

py::object PythonHooks::state_tensors(const py::object& optimizers) const {
  return hooks_.attr("state_tensors")(optimizers);
}

py::object PythonHooks::device_settings() const { return hooks_.attr("device_settings")(); }

}  // namespace grape
