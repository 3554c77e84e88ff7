#pragma once
// Flattening of call arguments into (signature, tensors) and rebuilding of Python trees.
// See Note [Call signatures] in core/signature.h for what the signature holds.

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/signature.h"

namespace grape {

namespace py = pybind11;

// The shape of a Python tree whose tensor leaves were taken out; rebuilt by unflatten().
// Argument objects that hold tensors (an HF cache, say) are records: flattened by their
// attributes, and rebuilt in place, by setting those attributes on the object itself (see Note
// [Argument objects] in torch/python/side_effects.h).
struct TreeSpec {
  enum class Kind {
    kTuple, kList, kDict, kNamedTuple, kDataclass, kTensor, kConstant,
    kRecord,     // `constant` is the object, `keys` its attribute names, children their values
    kRecordRef,  // the call's argument object number `index` (in outputs: the object returned)
  };
  Kind kind = Kind::kConstant;
  py::object type;      // namedtuple / dataclass type
  py::object keys;      // dict keys, dataclass field names or record attribute names (a tuple)
  py::object constant;  // the leaf itself, for kConstant; the object, for kRecord
  int tensor_index = -1;
  int index = -1;  // kRecord, kRecordRef: the object's number among the call's records
  std::vector<bool> field_init;  // kDataclass: whether __init__ takes each field
  std::vector<TreeSpec> children;
};

// Note [Host scalars]
// ~~~~~~~~~~~~~~~~~~~
// A 0-dim CPU tensor among the arguments (a cache's `_sliding_window_tensor`, a step count kept
// on the host) is a value, not data a graph reads: kernels take it as a scalar when they launch.
// So it is part of the signature, by its value, and the capture bakes that value in, as it does a
// Python number; a replay runs only for calls that bring the same value. Other CPU tensors are
// refused (a graph would read their memory on the device). A capture whose function changes such
// a scalar in place fails (a replay would not change it).

// What flattening found. `unsupported` names the first leaf that prevents capture (then the call
// runs eagerly); its path is filled in only when flattening was asked for paths.
struct FlatCall {
  core::Signature signature;
  std::vector<at::Tensor> tensors;
  std::vector<py::object> modules;  // nn.Module arguments: their parameters are static state
  // Leaf tensor arguments that require grad (parameters): used in place, static state like a
  // module's parameters, so a backward inside the function reaches their .grad.
  std::vector<at::Tensor> static_leaves;
  std::vector<py::object> records;  // argument objects that hold tensors, in visiting order
  // CPU scalar tensors among the arguments (Note [Host scalars]), with their versions when
  // flattened: a capture checks that f left them as they were.
  std::vector<std::pair<at::Tensor, int64_t>> host_scalars;
  std::string unsupported;
  std::string unsupported_path;
  TreeSpec spec;  // only when asked for

  // Empties everything but `spec` (whose buffers a caller reuses where it asks for none), for the
  // next flattening.
  void clear() {
    signature.clear();
    tensors.clear();
    modules.clear();
    static_leaves.clear();
    records.clear();
    host_scalars.clear();
    unsupported.clear();
    unsupported_path.clear();
  }
};

// Flattens arguments for one compiled function. Interned constants and identity-keyed objects
// live as long as the Flattener, so interned ids are never reused for another value.
class Flattener {
 public:
  Flattener();
  void flatten_call(py::handle args, py::handle kwargs, FlatCall& out, bool with_spec,
                    bool with_paths);
  // Flattens a function's return value (signature words are produced but not used). The call's
  // argument objects (`call_records`) may be returned, as references; a new object that holds
  // tensors cannot (it is marked unsupported).
  void flatten_value(py::handle value, FlatCall& out,
                     const std::vector<py::object>* call_records = nullptr);
  size_t interned_count() const { return interned_ids_.size(); }
  // What the local word `id` after `tag` (Note [Signatures of stored graphs]) stands for, in
  // words another process can compare: an interned constant's type and repr, an identity-keyed
  // object's type; empty for an id this Flattener never gave.
  std::string describe_local(int64_t tag, int64_t id) const;

 private:
  void visit(py::handle obj, FlatCall& out, TreeSpec* spec);
  void visit_tensor(py::handle obj, FlatCall& out, TreeSpec* spec);
  // None, bools, ints and floats, keyed by value; false (nothing pushed) for anything else.
  bool visit_number(py::handle obj, FlatCall& out, TreeSpec* spec);
  // Containers: their tag and size, then each child (get_child(i), named path_of(i) in paths).
  template <typename GetChild, typename PathOf>
  void visit_children(GetChild get_child, Py_ssize_t n, PathOf path_of, FlatCall& out,
                      TreeSpec* spec);
  void visit_sequence(py::handle obj, FlatCall& out, TreeSpec* spec);
  void visit_dict(py::handle obj, FlatCall& out, TreeSpec* spec);
  void visit_namedtuple(py::handle obj, FlatCall& out, TreeSpec* spec);
  void visit_dataclass(py::handle obj, FlatCall& out, TreeSpec* spec);
  // Anything else: a module, a record, or a constant keyed by value or identity.
  void visit_object(py::handle obj, FlatCall& out, TreeSpec* spec);
  // An object with a __dict__: flattened as a record if it holds tensors at any depth, or if an
  // object of its type did in an earlier call (an HF cache before its first update); returns
  // false (nothing pushed) otherwise.
  bool visit_record(py::handle obj, FlatCall& out, TreeSpec* spec);
  void push_interned(py::handle obj, FlatCall& out);
  // The id of an object keyed by identity (held alive, so the id stays unique).
  int64_t identity_id(py::handle obj);
  void mark_unsupported(FlatCall& out, std::string reason);
  const std::vector<std::pair<std::string, bool>>& dataclass_fields(py::handle type);

  py::dict interned_ids_;                     // constant -> id
  std::vector<py::object> identity_objects_;  // kept alive so their ids stay unique
  std::unordered_map<PyObject*, int64_t> identity_ids_;
  std::unordered_map<PyObject*, std::vector<std::pair<std::string, bool>>> dataclass_fields_;
  std::vector<std::string> path_;  // current path, only while flattening with paths
  bool with_paths_ = false;
  std::unordered_set<PyObject*> record_types_;  // types whose objects held tensors
  const std::vector<py::object>* call_records_ = nullptr;  // while flattening a return value
  bool in_value_ = false;
};

// What unflatten() did beyond building the tree: records whose attributes it set, and the
// containers it built inside arguments (so that in-place changes to them can be found).
struct UnflattenLog {
  struct Container {
    py::object container;  // a list or dict built by unflatten
    py::object contents;   // what it held when built: a tuple (list) or a dict copy
    int record = -1;       // the record whose attribute (transitively) holds it, else -1
    py::object attribute;  // that attribute's name
  };
  std::vector<Container> containers;
  int current_record = -1;  // while rebuilding a record's attribute
  py::object current_attribute;
};

// Rebuilds the tree with `leaves[i]` in place of tensor leaf i. Records get their attributes set
// to the rebuilt values and are returned themselves; a kRecordRef is `records[index]`.
py::object unflatten(const TreeSpec& spec, const std::vector<py::object>& leaves,
                     const std::vector<py::object>* records = nullptr, UnflattenLog* log = nullptr);

// A one-line description of a tensor's signature fields ("f16[1, 12, 64] cuda:0").
std::string describe_tensor(const at::Tensor& t);

// Appends the global state that changes which kernels a capture records.
void push_global_state(core::Signature& signature);

}  // namespace grape
