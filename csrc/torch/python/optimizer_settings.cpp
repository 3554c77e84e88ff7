#include "torch/python/optimizer_settings.h"

#include <torch/csrc/autograd/python_variable.h>

namespace grape {

bool optimizer_settings_hold(const py::list& settings, std::string& changed) {
  for (py::handle item : settings) {
    PyObject* group = PyTuple_GET_ITEM(item.ptr(), 0);
    PyObject* key = PyTuple_GET_ITEM(item.ptr(), 1);
    PyObject* value = PyTuple_GET_ITEM(item.ptr(), 2);
    PyObject* now = PyDict_GetItemWithError(group, key);  // borrowed
    if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (now == value) continue;
    // A tensor setting is read by the kernels: only its identity matters (and == would sync).
    const int equal = now == nullptr || THPVariable_Check(now) || THPVariable_Check(value)
                          ? 0
                          : PyObject_RichCompareBool(now, value, Py_EQ);
    if (equal < 0) throw py::error_already_set();
    if (equal == 0) {
      changed = "the optimizer setting '" + py::str(key).cast<std::string>() +
                "' changed since the step was captured (the graph baked it in)";
      return false;
    }
  }
  return true;
}

bool write_device_settings(const py::list& settings, std::string& changed) {
  for (py::handle setting : settings) {
    const py::object group = setting.attr("group");
    const py::object key = setting.attr("key");
    PyObject* now = PyDict_GetItemWithError(group.ptr(), key.ptr());  // borrowed
    if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (now != nullptr && now == setting.attr("written").ptr()) continue;  // written already
    const py::object value = now == nullptr ? py::none() : py::reinterpret_borrow<py::object>(now);
    if (!setting.attr("write")(value).cast<bool>()) {
      changed = "the optimizer setting '" + key.cast<std::string>() +
                "' is no longer a number (the graph read it from device memory)";
      return false;
    }
  }
  return true;
}

}  // namespace grape
