#include "torch/python/pytree.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

namespace grape {

using core::Tag;

namespace {

struct TorchTypes {
  PyObject* parameter = nullptr;
  PyObject* module = nullptr;
  PyObject* dtype = nullptr;
  PyObject* device = nullptr;
  PyObject* enum_base = nullptr;
};

const TorchTypes& torch_types() {
  static TorchTypes types = [] {
    TorchTypes t;
    py::gil_scoped_acquire gil;
    t.parameter = py::object(py::module_::import("torch.nn.parameter").attr("Parameter")).release().ptr();
    t.module = py::object(py::module_::import("torch.nn").attr("Module")).release().ptr();
    t.dtype = py::object(py::module_::import("torch").attr("dtype")).release().ptr();
    t.device = py::object(py::module_::import("torch").attr("device")).release().ptr();
    t.enum_base = py::object(py::module_::import("enum").attr("Enum")).release().ptr();
    return t;
  }();
  return types;
}

bool is_namedtuple_type(PyTypeObject* type) {
  return PyType_IsSubtype(type, &PyTuple_Type) &&
         PyObject_HasAttrString(reinterpret_cast<PyObject*>(type), "_fields");
}

bool is_dataclass_type(PyTypeObject* type) {
  return PyObject_HasAttrString(reinterpret_cast<PyObject*>(type), "__dataclass_fields__");
}

// Values whose equality is their value and that cannot hold tensors.
bool is_plain_constant(PyObject* obj, const TorchTypes& tt) {
  PyTypeObject* type = Py_TYPE(obj);
  if (PyUnicode_CheckExact(obj) || PyBytes_CheckExact(obj) || PyType_Check(obj) ||
      PyFunction_Check(obj) || PyCFunction_Check(obj) || obj == Py_Ellipsis ||
      PySlice_Check(obj) || PyComplex_CheckExact(obj)) {
    return true;
  }
  PyObject* t = reinterpret_cast<PyObject*>(type);
  return t == tt.dtype || t == tt.device ||
         PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(tt.enum_base));
}

std::string type_name(PyObject* obj) { return Py_TYPE(obj)->tp_name; }

// A 0-dim CPU tensor of a real or bool dtype, which no autograd graph needs (Note [Host scalars]).
bool is_host_scalar(const at::Tensor& t) {
  return t.device().is_cpu() && t.dim() == 0 && !t.requires_grad() && !t.is_complex();
}

// A host scalar's value as one signature word: the integer, or the bits of the double.
int64_t host_scalar_word(const at::Tensor& t) {
  if (t.is_floating_point()) {
    const double v = t.item<double>();
    int64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
  }
  return t.item<int64_t>();
}

// A leaf kept in the spec as the object itself (rebuilt as is).
void constant_leaf(py::handle obj, TreeSpec* spec) {
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kConstant;
    spec->constant = py::reinterpret_borrow<py::object>(obj);
  }
}

std::string index_path(Py_ssize_t i) { return "[" + std::to_string(i) + "]"; }

}  // namespace

Flattener::Flattener() { (void)torch_types(); }

void Flattener::mark_unsupported(FlatCall& out, std::string reason) {
  if (!out.unsupported.empty()) return;
  out.unsupported = std::move(reason);
  if (with_paths_) {
    std::string path;
    for (const auto& p : path_) path += p;
    out.unsupported_path = path;
  }
}

const std::vector<std::pair<std::string, bool>>& Flattener::dataclass_fields(py::handle type) {
  auto it = dataclass_fields_.find(type.ptr());
  if (it != dataclass_fields_.end()) return it->second;
  std::vector<std::pair<std::string, bool>> fields;
  py::object all = py::module_::import("dataclasses").attr("fields")(type);
  for (py::handle f : all) {
    fields.emplace_back(f.attr("name").cast<std::string>(), f.attr("init").cast<bool>());
  }
  identity_objects_.push_back(py::reinterpret_borrow<py::object>(type));  // keep the key alive
  return dataclass_fields_.emplace(type.ptr(), std::move(fields)).first->second;
}

int64_t Flattener::identity_id(py::handle obj) {
  auto it = identity_ids_.find(obj.ptr());
  if (it != identity_ids_.end()) return it->second;
  const auto id = static_cast<int64_t>(identity_ids_.size());
  identity_ids_.emplace(obj.ptr(), id);
  identity_objects_.push_back(py::reinterpret_borrow<py::object>(obj));
  return id;
}

void Flattener::push_interned(py::handle obj, FlatCall& out) {
  // Subclasses of int/float (IntEnum, numpy scalars...) compare equal to plain numbers; the type
  // keeps them apart.
  py::object key = (PyUnicode_CheckExact(obj.ptr()) || PyBytes_CheckExact(obj.ptr()))
                       ? py::reinterpret_borrow<py::object>(obj)
                       : py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))),
                                        obj);
  PyObject* found = PyDict_GetItemWithError(interned_ids_.ptr(), key.ptr());
  int64_t id;
  if (found != nullptr) {
    id = PyLong_AsLongLong(found);
  } else {
    if (PyErr_Occurred()) throw py::error_already_set();
    id = static_cast<int64_t>(PyDict_Size(interned_ids_.ptr()));
    interned_ids_[key] = py::int_(id);
  }
  out.signature.push(Tag::kInterned);
  out.signature.push_local(id);
}

std::string Flattener::describe_local(int64_t tag, int64_t id) const {
  // Computed only where a stored signature is learned or written, never per call.
  auto text = [](const py::object& value) {
    py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())));
    return py::str(type.attr("__module__")).cast<std::string>() + "." +
           py::str(type.attr("__qualname__")).cast<std::string>();
  };
  if (tag == static_cast<int64_t>(Tag::kInterned)) {
    for (const auto& [key, key_id] : interned_ids_) {
      if (key_id.cast<int64_t>() != id) continue;
      // push_interned's key: a string or bytes itself, else (its type, the value).
      const py::object value = py::isinstance<py::tuple>(key)
                                   ? py::object(py::reinterpret_borrow<py::tuple>(key)[1])
                                   : py::reinterpret_borrow<py::object>(key);
      return "interned " + text(value) + " " + py::repr(value).cast<std::string>();
    }
    return {};
  }
  for (const auto& [object, object_id] : identity_ids_) {  // held alive by identity_objects_
    if (object_id == id) return "identity " + text(py::reinterpret_borrow<py::object>(object));
  }
  return {};
}

void Flattener::visit_tensor(py::handle obj, FlatCall& out, TreeSpec* spec) {
  const TorchTypes& tt = torch_types();
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()));
  if (!THPVariable_CheckExact(obj.ptr()) && type != tt.parameter) {
    mark_unsupported(out, std::string("tensor subclass ") + type_name(obj.ptr()));
  }
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  auto& sig = out.signature;
  sig.push(Tag::kTensor);
  sig.push(static_cast<int64_t>(t.scalar_type()));
  sig.push(static_cast<int64_t>(t.device().type()) * 1024 + t.device().index());
  sig.push(static_cast<int64_t>(t.layout()));
  const int64_t dim = t.dim();
  sig.push(dim);
  if (t.layout() == c10::kStrided) {
    for (int64_t d = 0; d < dim; ++d) sig.push(t.sizes()[d]);
    for (int64_t d = 0; d < dim; ++d) sig.push(t.strides()[d]);
  }
  sig.push(static_cast<int64_t>(t.requires_grad()) | (static_cast<int64_t>(t.is_conj()) << 1) |
           (static_cast<int64_t>(t.is_neg()) << 2));
  const bool trained = t.requires_grad() && !in_value_;
  if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested()) {
    mark_unsupported(out, "sparse, quantized or nested tensor (only strided tensors)");
  } else if (trained && !t.is_leaf()) {
    mark_unsupported(out, "tensor that requires grad and is not a leaf (a graph cannot join an "
                          "autograd graph built outside it: compute it inside the function, or "
                          "pass it detached)");
  } else if (!t.is_cuda() && !in_value_ && is_host_scalar(t)) {
    // Note [Host scalars]: its value keys the signature; the capture reads it as f does.
    sig.push(host_scalar_word(t));
    constant_leaf(obj, spec);
    out.host_scalars.emplace_back(t, t._version());
    return;
  } else if (!t.is_cuda()) {
    mark_unsupported(out, "tensor on " + t.device().str() + " (graphs read CUDA tensors only)");
  } else if (trained) {
    // A parameter passed as an argument: keyed by identity and used in place, like a module's
    // parameters, so that a backward pass inside the function reaches its .grad.
    sig.push(Tag::kStaticTensor);
    sig.push_local(identity_id(obj));
    constant_leaf(obj, spec);
    out.static_leaves.push_back(t);
    return;
  } else if (t.is_conj() || t.is_neg()) {
    mark_unsupported(out, "tensor with a lazy conjugate/negative bit");
  }
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kTensor;
    spec->tensor_index = static_cast<int>(out.tensors.size());
  }
  out.tensors.push_back(t);
}

void Flattener::visit(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  if (THPVariable_Check(obj)) {
    visit_tensor(obj_h, out, spec);
    return;
  }
  if (visit_number(obj_h, out, spec)) return;
  if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
    visit_sequence(obj_h, out, spec);
  } else if (PyDict_CheckExact(obj) || (PyDict_Check(obj) && !is_dataclass_type(Py_TYPE(obj)))) {
    visit_dict(obj_h, out, spec);
  } else if (is_plain_constant(obj, torch_types())) {
    push_interned(obj_h, out);
    constant_leaf(obj_h, spec);
  } else if (is_namedtuple_type(Py_TYPE(obj))) {
    visit_namedtuple(obj_h, out, spec);
  } else if (!PyType_Check(obj) && is_dataclass_type(Py_TYPE(obj))) {
    visit_dataclass(obj_h, out, spec);
  } else {
    visit_object(obj_h, out, spec);
  }
}

bool Flattener::visit_number(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  auto& sig = out.signature;
  if (obj == Py_None) {
    sig.push(Tag::kNone);
  } else if (PyBool_Check(obj)) {
    sig.push(Tag::kBool);
    sig.push(obj == Py_True ? 1 : 0);
  } else if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0) {
      push_interned(obj_h, out);
    } else {
      sig.push(Tag::kInt);
      sig.push(static_cast<int64_t>(v));
    }
  } else if (PyFloat_CheckExact(obj)) {
    double v = PyFloat_AS_DOUBLE(obj);
    int64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    sig.push(Tag::kFloat);
    sig.push(bits);
  } else {
    return false;
  }
  constant_leaf(obj_h, spec);
  return true;
}

template <typename GetChild, typename PathOf>
void Flattener::visit_children(GetChild get_child, Py_ssize_t n, PathOf path_of, FlatCall& out,
                               TreeSpec* spec) {
  if (spec != nullptr) spec->children.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (with_paths_) path_.push_back(path_of(i));
    visit(get_child(i), out, spec != nullptr ? &spec->children[static_cast<size_t>(i)] : nullptr);
    if (with_paths_) path_.pop_back();
  }
}

void Flattener::visit_sequence(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  const bool is_tuple = PyTuple_CheckExact(obj);
  const Py_ssize_t n = is_tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
  out.signature.push(is_tuple ? Tag::kTuple : Tag::kList);
  out.signature.push(static_cast<int64_t>(n));
  if (spec != nullptr) spec->kind = is_tuple ? TreeSpec::Kind::kTuple : TreeSpec::Kind::kList;
  visit_children(
      [&](Py_ssize_t i) {
        return py::handle(is_tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i));
      },
      n, index_path, out, spec);
}

void Flattener::visit_dict(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  const Py_ssize_t n = PyDict_Size(obj);
  out.signature.push(Tag::kDict);
  out.signature.push(static_cast<int64_t>(n));
  std::vector<PyObject*> values;
  values.reserve(static_cast<size_t>(n));
  py::tuple keys(n);
  PyObject* key;
  PyObject* value;
  Py_ssize_t pos = 0;
  Py_ssize_t i = 0;
  while (PyDict_Next(obj, &pos, &key, &value)) {
    push_interned(key, out);
    keys[i++] = py::reinterpret_borrow<py::object>(key);
    values.push_back(value);
  }
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kDict;
    spec->keys = keys;
  }
  visit_children([&](Py_ssize_t j) { return py::handle(values[static_cast<size_t>(j)]); }, n,
                 [&](Py_ssize_t j) { return "[" + py::repr(keys[j]).cast<std::string>() + "]"; },
                 out, spec);
}

void Flattener::visit_namedtuple(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  const Py_ssize_t n = PyTuple_GET_SIZE(obj);
  out.signature.push(Tag::kNamedTuple);
  push_interned(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj))), out);
  out.signature.push(static_cast<int64_t>(n));
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kNamedTuple;
    spec->type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
  }
  visit_children([&](Py_ssize_t i) { return py::handle(PyTuple_GET_ITEM(obj, i)); }, n,
                 index_path, out, spec);
}

void Flattener::visit_dataclass(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(obj_h.ptr())));
  const auto& fields = dataclass_fields(type);
  out.signature.push(Tag::kDataclass);
  push_interned(type, out);
  out.signature.push(static_cast<int64_t>(fields.size()));
  std::vector<py::object> values;
  values.reserve(fields.size());
  for (const auto& f : fields) values.push_back(obj_h.attr(f.first.c_str()));
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kDataclass;
    spec->type = py::reinterpret_borrow<py::object>(type);
    py::tuple names(fields.size());
    spec->field_init.resize(fields.size());
    for (size_t i = 0; i < fields.size(); ++i) {
      names[i] = py::str(fields[i].first);
      spec->field_init[i] = fields[i].second;
    }
    spec->keys = names;
  }
  visit_children([&](Py_ssize_t i) { return py::handle(values[static_cast<size_t>(i)]); },
                 static_cast<Py_ssize_t>(fields.size()),
                 [&](Py_ssize_t i) { return "." + fields[static_cast<size_t>(i)].first; }, out,
                 spec);
}

void Flattener::visit_object(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  auto& sig = out.signature;
  if (PyObject_IsInstance(obj, torch_types().module) == 1) {
    // A module's parameters and buffers are static state of the graph, checked on every replay.
    sig.push(Tag::kModule);
    sig.push_local(identity_id(obj_h));
    out.modules.push_back(py::reinterpret_borrow<py::object>(obj));
  } else {
    if (visit_record(obj_h, out, spec)) return;
    if (PyObject_Hash(obj) != -1) {
      push_interned(obj_h, out);
    } else {
      PyErr_Clear();
      sig.push(Tag::kObject);
      sig.push_local(identity_id(obj_h));
    }
  }
  constant_leaf(obj_h, spec);
}

bool Flattener::visit_record(py::handle obj_h, FlatCall& out, TreeSpec* spec) {
  PyObject* obj = obj_h.ptr();
  auto& sig = out.signature;
  auto reference = [&](size_t index) {
    sig.push(Tag::kRecordRef);
    sig.push(static_cast<int64_t>(index));
    if (spec != nullptr) {
      spec->kind = TreeSpec::Kind::kRecordRef;
      spec->index = static_cast<int>(index);
    }
    return true;
  };
  // An object met again (shared, or a cycle) is a reference, so aliasing is part of the signature.
  for (size_t i = 0; i < out.records.size(); ++i) {
    if (out.records[i].ptr() == obj) return reference(i);
  }
  if (in_value_ && call_records_ != nullptr) {
    for (size_t i = 0; i < call_records_->size(); ++i) {
      if ((*call_records_)[i].ptr() == obj) return reference(i);
    }
  }
  PyObject* dict_ptr = PyObject_GenericGetDict(obj, nullptr);
  if (dict_ptr == nullptr) {
    PyErr_Clear();
    return false;
  }
  py::dict dict = py::reinterpret_steal<py::dict>(dict_ptr);
  const size_t words_before = sig.size();
  const size_t tensors_before = out.tensors.size();
  const size_t modules_before = out.modules.size();
  const size_t index = out.records.size();
  out.records.push_back(py::reinterpret_borrow<py::object>(obj));
  const Py_ssize_t n = PyDict_Size(dict.ptr());
  sig.push(Tag::kRecord);
  push_interned(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj))), out);
  sig.push(static_cast<int64_t>(n));
  py::tuple names(n);
  std::vector<py::object> values;
  values.reserve(static_cast<size_t>(n));
  PyObject* key;
  PyObject* value;
  Py_ssize_t pos = 0;
  Py_ssize_t i = 0;
  while (PyDict_Next(dict.ptr(), &pos, &key, &value)) {
    push_interned(key, out);
    names[i++] = py::reinterpret_borrow<py::object>(key);
    values.push_back(py::reinterpret_borrow<py::object>(value));
  }
  if (spec != nullptr) {
    spec->kind = TreeSpec::Kind::kRecord;
    spec->constant = py::reinterpret_borrow<py::object>(obj);
    spec->keys = names;
    spec->index = static_cast<int>(index);
    spec->children.resize(static_cast<size_t>(n));
  }
  for (Py_ssize_t j = 0; j < n; ++j) {
    if (with_paths_) path_.push_back("." + names[j].cast<std::string>());
    visit(values[static_cast<size_t>(j)], out,
          spec != nullptr ? &spec->children[static_cast<size_t>(j)] : nullptr);
    if (with_paths_) path_.pop_back();
  }
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  if (out.tensors.size() == tensors_before) {
    if (record_types_.count(type) == 0) {
      // No tensor inside: an ordinary object, keyed by hash or identity.
      sig.truncate(words_before);
      out.records.resize(index);
      out.modules.resize(modules_before);
      if (spec != nullptr) *spec = TreeSpec{};
      return false;
    }
  } else if (record_types_.insert(type).second) {
    identity_objects_.push_back(py::reinterpret_borrow<py::object>(type));  // keep the key alive
  }
  if (in_value_) {
    mark_unsupported(out, "new object of type " + type_name(obj) +
                              " that holds tensors (a graph returns tensors, containers, "
                              "dataclasses, namedtuples and the objects it was passed)");
  }
  return true;
}

void Flattener::flatten_call(py::handle args, py::handle kwargs, FlatCall& out, bool with_spec,
                             bool with_paths) {
  out.clear();
  with_paths_ = with_paths;
  path_.clear();
  if (with_spec) {
    out.spec = TreeSpec{};
    out.spec.kind = TreeSpec::Kind::kTuple;
    out.spec.children.resize(2);
  }
  if (with_paths_) path_.push_back("args");
  visit(args, out, with_spec ? &out.spec.children[0] : nullptr);
  if (with_paths_) path_.back() = "kwargs";
  if (kwargs.ptr() != nullptr && kwargs.ptr() != Py_None) {
    visit(kwargs, out, with_spec ? &out.spec.children[1] : nullptr);
  } else {
    visit(py::dict(), out, with_spec ? &out.spec.children[1] : nullptr);
  }
  with_paths_ = false;
  push_global_state(out.signature);
  out.signature.finish();
}

void Flattener::flatten_value(py::handle value, FlatCall& out,
                              const std::vector<py::object>* call_records) {
  out.clear();
  out.spec = TreeSpec{};
  with_paths_ = true;
  in_value_ = true;
  call_records_ = call_records;
  path_.assign(1, "output");
  visit(value, out, &out.spec);
  with_paths_ = false;
  in_value_ = false;
  call_records_ = nullptr;
  out.signature.finish();
}

void push_global_state(core::Signature& signature) {
  signature.push(Tag::kGlobalState);
  signature.push(static_cast<int64_t>(at::GradMode::is_enabled()) |
                 (static_cast<int64_t>(c10::InferenceMode::is_enabled()) << 1) |
                 (static_cast<int64_t>(at::autocast::is_autocast_enabled(at::kCUDA)) << 2));
  signature.push(static_cast<int64_t>(at::autocast::get_autocast_dtype(at::kCUDA)));
}

namespace {
// While unflatten() rebuilds a record's attribute, the containers it builds belong to it.
struct OwnerScope {
  UnflattenLog* log;
  int record;
  py::object attribute;
  OwnerScope(UnflattenLog* l, int r, py::object a) : log(l) {
    if (log == nullptr) return;
    record = log->current_record;
    attribute = std::move(log->current_attribute);
    log->current_record = r;
    log->current_attribute = std::move(a);
  }
  ~OwnerScope() {
    if (log == nullptr) return;
    log->current_record = record;
    log->current_attribute = std::move(attribute);
  }
};
}  // namespace

py::object unflatten(const TreeSpec& spec, const std::vector<py::object>& leaves,
                     const std::vector<py::object>* records, UnflattenLog* log) {
  using Kind = TreeSpec::Kind;
  auto child = [&](size_t i) { return unflatten(spec.children[i], leaves, records, log); };
  // Only a logging unflatten (a capture's arguments) copies what a container holds.
  auto logged = [&](py::object container, auto contents_of) {
    if (log != nullptr) {
      log->containers.push_back({container, contents_of(container), log->current_record,
                                 log->current_attribute});
    }
    return container;
  };
  switch (spec.kind) {
    case Kind::kTensor:
      return leaves.at(static_cast<size_t>(spec.tensor_index));
    case Kind::kConstant:
      return spec.constant;
    case Kind::kTuple:
    case Kind::kNamedTuple: {
      py::tuple items(spec.children.size());
      for (size_t i = 0; i < spec.children.size(); ++i) items[i] = child(i);
      if (spec.kind == Kind::kTuple) return std::move(items);
      return spec.type(*items);
    }
    case Kind::kList: {
      py::list items(spec.children.size());
      for (size_t i = 0; i < spec.children.size(); ++i) items[i] = child(i);
      return logged(items, [](const py::object& list) { return py::object(py::tuple(list)); });
    }
    case Kind::kDict: {
      py::dict d;
      auto keys = py::reinterpret_borrow<py::tuple>(spec.keys);
      for (size_t i = 0; i < spec.children.size(); ++i) d[keys[i]] = child(i);
      return logged(d, [](const py::object& dict) {
        PyObject* contents = PyDict_Copy(dict.ptr());
        if (contents == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(contents);
      });
    }
    case Kind::kRecord: {
      // The object itself, its attributes set to the rebuilt values (placeholders, in a capture).
      PyObject* dict_ptr = PyObject_GenericGetDict(spec.constant.ptr(), nullptr);
      if (dict_ptr == nullptr) throw py::error_already_set();
      py::object dict = py::reinterpret_steal<py::object>(dict_ptr);
      auto names = py::reinterpret_borrow<py::tuple>(spec.keys);
      for (size_t i = 0; i < spec.children.size(); ++i) {
        OwnerScope owner(log, spec.index, names[i]);
        py::object value = child(i);
        if (PyDict_SetItem(dict.ptr(), names[i].ptr(), value.ptr()) != 0) {
          throw py::error_already_set();
        }
      }
      return spec.constant;
    }
    case Kind::kRecordRef:
      TORCH_CHECK(records != nullptr && spec.index >= 0 &&
                      static_cast<size_t>(spec.index) < records->size(),
                  "grape: an argument object reference without the call's objects");
      return (*records)[static_cast<size_t>(spec.index)];
    case Kind::kDataclass: {
      // Fields accepted by __init__ go through it (so __post_init__ runs, as for HF ModelOutput);
      // the others are set afterwards.
      py::dict init_kwargs;
      std::vector<std::pair<py::object, py::object>> later;
      auto names = py::reinterpret_borrow<py::tuple>(spec.keys);
      for (size_t i = 0; i < spec.children.size(); ++i) {
        py::object value = child(i);
        if (spec.field_init.at(i)) {
          init_kwargs[names[i]] = value;
        } else {
          later.emplace_back(names[i], value);
        }
      }
      py::object obj = spec.type(**init_kwargs);
      if (!later.empty()) {
        py::object setattr = py::module_::import("builtins").attr("object").attr("__setattr__");
        for (auto& kv : later) setattr(obj, kv.first, kv.second);
      }
      return obj;
    }
  }
  return py::none();
}

namespace {
// "[2, 3]". Strings are built by hand: iostreams instantiated in this library have crashed when the
// process's libstdc++ is older than the compiler's.
std::string join_ints(c10::IntArrayRef values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(values[i]);
  }
  return s + "]";
}
}  // namespace

std::string describe_tensor(const at::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + join_ints(t.sizes()) + " " +
                  t.device().str();
  if (!t.is_contiguous()) s += " strides" + join_ints(t.strides());
  return s;
}

}  // namespace grape
