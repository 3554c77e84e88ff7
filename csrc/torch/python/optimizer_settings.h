#pragma once
// The optimizer settings a training step's graph depends on (Note [Gradients of a captured step],
// Note [Device settings]): those it baked in, which must still hold at a replay, and those it
// reads from device memory, written before a replay. Python objects only, no CUDA: the CPU-only
// build has them too, for the tests of the Python side.

#include <pybind11/pybind11.h>

#include <string>

namespace grape {

namespace py = pybind11;

// Whether the optimizer settings a graph baked in, (param group, key, value) tuples, still hold;
// if not, `changed` says which.
bool optimizer_settings_hold(const py::list& settings, std::string& changed);
// Before a replay, on its stream: writes into each of a graph's DeviceSettings the current value
// of its setting where that changed (Note [Device settings]). False, with `changed` saying which,
// where a setting is no longer a number.
bool write_device_settings(const py::list& settings, std::string& changed);

}  // namespace grape
