#include "torch/python/module_tensors.h"

#include <torch/csrc/autograd/python_variable.h>

#include <unordered_set>

namespace grape {

namespace {

// The names read from every module, interned once: a lookup by them makes no string and hashes
// nothing (a capture walks every module twice).
PyObject* interned(const char* name) {
  PyObject* s = PyUnicode_InternFromString(name);
  if (s == nullptr) throw py::error_already_set();
  return s;  // kept for the process's lifetime
}

// A module's dict of parameters, buffers or submodules.
enum class ModuleDict { kParameters, kBuffers, kModules };

py::object module_dict(py::handle module, ModuleDict which) {
  static PyObject* const names[] = {interned("_parameters"), interned("_buffers"),
                                    interned("_modules")};
  PyObject* name = names[static_cast<int>(which)];
  // Read from the instance's __dict__, where Module.__init__ puts them: the attribute lookup goes
  // through Module's __getattr__ hook and the class's attributes first, at several times the cost.
  PyObject* instance_dict = PyObject_GenericGetDict(module.ptr(), nullptr);
  if (instance_dict == nullptr) {
    PyErr_Clear();  // no __dict__ (a ScriptModule's wrapper): asked as an attribute below
  } else {
    PyObject* found = PyDict_GetItemWithError(instance_dict, name);  // borrowed
    Py_DECREF(instance_dict);
    if (found != nullptr) return py::reinterpret_borrow<py::object>(found);
    if (PyErr_Occurred()) throw py::error_already_set();
  }
  PyObject* value = PyObject_GetAttr(module.ptr(), name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

struct Walk {
  ModuleTensors out;
  std::unordered_set<PyObject*> modules, parameters, buffers;

  // The tensors of a module's dict `which` (_parameters or _buffers), in its order; None
  // skipped. False where it is no dict (a ScriptModule's wrappers): the walk cannot read this
  // module.
  bool add(py::handle module, ModuleDict which, std::unordered_set<PyObject*>& seen,
           std::vector<at::Tensor>& into) {
    const py::object dict = module_dict(module, which);
    if (!PyDict_Check(dict.ptr())) return false;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dict.ptr(), &pos, &key, &value)) {
      if (value == Py_None || !THPVariable_Check(value) || !seen.insert(value).second) continue;
      into.push_back(THPVariable_Unpack(value));
    }
    return true;
  }

  // Module.named_modules' order: the module, then each submodule's walk in registration order.
  bool visit(py::handle module) {
    if (!modules.insert(module.ptr()).second) return true;
    if (!add(module, ModuleDict::kParameters, parameters, out.parameters) ||
        !add(module, ModuleDict::kBuffers, buffers, out.buffers)) {
      return false;
    }
    const py::object children = module_dict(module, ModuleDict::kModules);
    if (!PyDict_Check(children.ptr())) return false;
    PyObject* key = nullptr;
    PyObject* child = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(children.ptr(), &pos, &key, &child)) {
      if (child != Py_None && !visit(child)) return false;
    }
    return true;
  }
};

}  // namespace

ModuleTensors module_tensors(py::handle module) {
  Walk walk;
  if (walk.visit(module)) return std::move(walk.out);
  // A module whose dicts are not dicts: asked through Module.parameters() and .buffers().
  ModuleTensors out;
  for (py::handle t : module.attr("parameters")()) {
    out.parameters.push_back(THPVariable_Unpack(t.ptr()));
  }
  for (py::handle t : module.attr("buffers")()) out.buffers.push_back(THPVariable_Unpack(t.ptr()));
  return out;
}

namespace {

// The Python type's name of a tensor of grape's (DTensor, Parameter).
std::string type_name_of(const at::Tensor& t) {
  const py::object wrapped = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  return py::str(py::type::handle_of(wrapped).attr("__name__"));
}

bool dispatches_in_python(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python);
}

}  // namespace

std::vector<CallModule> call_modules(py::handle static_module,
                                     const std::vector<py::object>& modules) {
  std::vector<CallModule> out;
  if (!static_module.is_none()) out.push_back({static_module, module_tensors(static_module)});
  for (const auto& m : modules) out.push_back({m, module_tensors(m)});
  return out;
}

std::string unwatchable_state(const std::vector<CallModule>& modules,
                              const std::vector<at::Tensor>& leaves) {
  auto why = [](const at::Tensor& t, const std::string& what) {
    return what + " is a " + type_name_of(t) +
           ", a tensor subclass with a dispatch of its own (its data lies in the tensors it "
           "wraps, which a graph's replay cannot watch)";
  };
  for (const auto& [module, tensors] : modules) {
    const std::string owner = " of " + std::string(py::str(py::type::handle_of(module).attr(
                                           "__name__"))) + " (or of a submodule)";
    for (const auto& t : tensors.parameters) {
      if (dispatches_in_python(t)) return why(t, "a parameter" + owner);
    }
    for (const auto& t : tensors.buffers) {
      if (dispatches_in_python(t)) return why(t, "a buffer" + owner);
    }
  }
  for (const auto& leaf : leaves) {
    if (dispatches_in_python(leaf)) return why(leaf, "a tensor whose gradient the step sets");
  }
  return "";
}

}  // namespace grape
