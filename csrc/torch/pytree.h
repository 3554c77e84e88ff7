#pragma once
// Flattening of call arguments into (signature, tensors) and rebuilding of Python trees.
// See Note [Call signatures] in core/signature.h for what the signature holds.

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "core/signature.h"

namespace grape {

namespace py = pybind11;

// The shape of a Python tree whose tensor leaves were taken out; rebuilt by unflatten().
struct TreeSpec {
  enum class Kind { kTuple, kList, kDict, kNamedTuple, kDataclass, kTensor, kConstant };
  Kind kind = Kind::kConstant;
  py::object type;      // namedtuple / dataclass type
  py::object keys;      // dict keys, or dataclass field names (a tuple)
  py::object constant;  // the leaf itself, for kConstant
  int tensor_index = -1;
  std::vector<TreeSpec> children;
};

// What flattening found. `unsupported` names the first leaf that prevents capture (then the call
// runs eagerly); its path is filled in only when flattening was asked for paths.
struct FlatCall {
  core::Signature signature;
  std::vector<at::Tensor> tensors;
  std::vector<py::object> modules;  // nn.Module arguments: their parameters are static state
  std::string unsupported;
  std::string unsupported_path;
  TreeSpec spec;  // only when asked for
};

// Flattens arguments for one compiled function. Interned constants and identity-keyed objects
// live as long as the Flattener, so interned ids are never reused for another value.
class Flattener {
 public:
  Flattener();
  void flatten_call(py::handle args, py::handle kwargs, FlatCall& out, bool with_spec,
                    bool with_paths);
  // Flattens a function's return value (signature words are produced but not used).
  void flatten_value(py::handle value, FlatCall& out);
  size_t interned_count() const { return interned_ids_.size(); }

 private:
  void visit(py::handle obj, FlatCall& out, TreeSpec* spec);
  void visit_tensor(py::handle obj, FlatCall& out, TreeSpec* spec);
  void push_interned(py::handle obj, FlatCall& out);
  void mark_unsupported(FlatCall& out, std::string reason);
  const std::vector<std::pair<std::string, bool>>& dataclass_fields(py::handle type);

  py::dict interned_ids_;                     // constant -> id
  std::vector<py::object> identity_objects_;  // kept alive so their ids stay unique
  std::unordered_map<PyObject*, int64_t> identity_ids_;
  std::unordered_map<PyObject*, std::vector<std::pair<std::string, bool>>> dataclass_fields_;
  std::vector<std::string> path_;  // current path, only while flattening with paths
  bool with_paths_ = false;
};

// Rebuilds the tree with `leaves[i]` in place of tensor leaf i.
py::object unflatten(const TreeSpec& spec, const std::vector<py::object>& leaves);

// A one-line description of a tensor's signature fields ("f16[1, 12, 64] cuda:0").
std::string describe_tensor(const at::Tensor& t);

// Appends the global state that changes which kernels a capture records.
void push_global_state(core::Signature& signature);

}  // namespace grape
