#pragma once
// The parameters and buffers of an nn.Module and its submodules, read from the modules' own
// dictionaries (_modules, _parameters, _buffers) rather than through Module.parameters() and
// Module.buffers(), whose Python generators cost a capture about as much as a kernel launch per
// module: every capture reads them (the graph's static state, the leaves of a training step).
// The same tensors in the same order: modules depth first, each once, and each tensor once. A
// module class that overrides parameters() or buffers() is not asked; a module whose dicts are
// not dicts (a ScriptModule's) is read through parameters() and buffers().

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace grape {

namespace py = pybind11;

struct ModuleTensors {
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
};

ModuleTensors module_tensors(py::handle module);

// A call's modules with what they hold, read once per capture: the compiled module (where
// `static_module` is not None), then the module arguments `modules`.
struct CallModule {
  py::handle module;
  ModuleTensors tensors;
};
std::vector<CallModule> call_modules(py::handle static_module,
                                     const std::vector<py::object>& modules);

// Why a capture cannot watch the static state of `modules` and the training step's `leaves`, or
// "" where it can. A capture watches parameters, buffers and leaves by their memory (a replay
// whose tensors moved captures again), and a tensor subclass with a dispatch of its own (a
// DTensor: FSDP2's sharded parameters, parallelize_module's) holds none: its data lies in the
// tensors it wraps.
std::string unwatchable_state(const std::vector<CallModule>& modules,
                              const std::vector<at::Tensor>& leaves);

}  // namespace grape
