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

#include <vector>

namespace grape {

namespace py = pybind11;

struct ModuleTensors {
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
};

ModuleTensors module_tensors(py::handle module);

}  // namespace grape
