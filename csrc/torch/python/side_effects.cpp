#include "torch/python/side_effects.h"

#include <torch/csrc/autograd/python_variable.h>

namespace grape {

namespace {

py::dict attributes_of(const py::object& obj) {
  PyObject* dict = PyObject_GenericGetDict(obj.ptr(), nullptr);
  if (dict == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::dict>(dict);
}

py::dict copy_of(const py::dict& d) {
  PyObject* copy = PyDict_Copy(d.ptr());
  if (copy == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::dict>(copy);
}

std::string attribute_text(const py::object& record, const py::handle& name) {
  return std::string(Py_TYPE(record.ptr())->tp_name) + "." + py::str(name).cast<std::string>();
}

// Whether a container that unflatten() built holds other items than it was built with.
bool changed(const UnflattenLog::Container& c) {
  PyObject* now = c.container.ptr();
  PyObject* then = c.contents.ptr();
  if (PyList_Check(now)) {
    const Py_ssize_t n = PyList_GET_SIZE(now);
    if (n != PyTuple_GET_SIZE(then)) return true;
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (PyList_GET_ITEM(now, i) != PyTuple_GET_ITEM(then, i)) return true;
    }
    return false;
  }
  if (PyDict_Size(now) != PyDict_Size(then)) return true;
  PyObject* key;
  PyObject* value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(now, &pos, &key, &value)) {
    PyObject* before = PyDict_GetItemWithError(then, key);
    if (before == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return true;
    }
    if (before != value) return true;
  }
  return false;
}

}  // namespace

CaptureEffects::CaptureEffects(const std::vector<py::object>& records) : records_(records) {
  original_.reserve(records_.size());
  for (const auto& r : records_) original_.push_back(copy_of(attributes_of(r)));
}

CaptureEffects::~CaptureEffects() {
  for (size_t i = 0; i < records_.size() && i < original_.size(); ++i) {
    PyObject* dict = PyObject_GenericGetDict(records_[i].ptr(), nullptr);
    if (dict == nullptr) {
      PyErr_Clear();
      continue;
    }
    PyDict_Clear(dict);
    if (PyDict_Update(dict, original_[i].ptr()) != 0) PyErr_Clear();
    Py_DECREF(dict);
  }
}

void CaptureEffects::arguments_ready() {
  received_.clear();
  for (const auto& r : records_) received_.push_back(copy_of(attributes_of(r)));
}

bool CaptureEffects::collect(const UnflattenLog& log, std::vector<Effect>& effects,
                             py::list& values, std::string& reason) const {
  effects.clear();
  auto has_effect = [&](int record, const py::object& name) {
    for (const auto& e : effects) {
      if (e.record == record && e.attribute.equal(name)) return true;
    }
    return false;
  };
  for (size_t i = 0; i < records_.size(); ++i) {
    const py::dict now = attributes_of(records_[i]);
    const py::dict& received = received_[i];
    for (auto item : received) {
      if (!now.contains(item.first)) {
        reason = "deletes the attribute " + attribute_text(records_[i], item.first) +
                 " of an argument (a replay cannot repeat it)";
        return false;
      }
    }
    PyObject* key;
    PyObject* value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(now.ptr(), &pos, &key, &value)) {
      PyObject* before = PyDict_GetItemWithError(received.ptr(), key);
      if (before == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (before == value) continue;
      effects.push_back({static_cast<int>(i), py::reinterpret_borrow<py::object>(key)});
      values.append(py::reinterpret_borrow<py::object>(value));
    }
  }
  for (const auto& c : log.containers) {
    if (!changed(c)) continue;
    if (c.record < 0) {
      reason = std::string("changes a ") + Py_TYPE(c.container.ptr())->tp_name +
               " argument in place (a replay cannot repeat it; return the new value instead)";
      return false;
    }
    if (has_effect(c.record, c.attribute)) continue;
    // The attribute still holds the container f changed: its new contents are the effect.
    const py::dict now = attributes_of(records_[static_cast<size_t>(c.record)]);
    effects.push_back({c.record, c.attribute});
    values.append(now[c.attribute]);
  }
  return true;
}

py::tuple rebuild_arguments(const FlatCall& flat, const std::vector<py::object>& leaves,
                            CaptureEffects& state, UnflattenLog& log) {
  py::tuple call = unflatten(flat.spec, leaves, &flat.records, &log);
  state.arguments_ready();
  return call;
}

void apply_effects(const std::vector<py::object>& records, const std::vector<Effect>& effects,
                   py::handle values) {
  for (size_t i = 0; i < effects.size(); ++i) {
    const Effect& e = effects[i];
    PyObject* value = PyTuple_GET_ITEM(values.ptr(), i);
    if (e.leaf.defined()) {
      if (value == Py_None) {
        e.leaf.mutable_grad().reset();
      } else {
        e.leaf.mutable_grad() = THPVariable_Unpack(value);
      }
      continue;
    }
    py::dict dict = attributes_of(records.at(static_cast<size_t>(e.record)));
    if (PyDict_SetItem(dict.ptr(), e.attribute.ptr(), value) != 0) {
      throw py::error_already_set();
    }
  }
}

}  // namespace grape
