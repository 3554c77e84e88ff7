#include "torch/graphs/stored_graph.h"

#include <pybind11/pybind11.h>

#include <cstring>

namespace grape {

namespace py = pybind11;

namespace {

using core::StoredTreeNode;
using core::StoredValue;

std::optional<core::ArenaSpan> arena_span(const GraphArena& arena, const void* ptr, size_t bytes) {
  const core::AddressRange range = core::make_range(ptr, bytes);
  for (int lane = 0; lane < GraphArena::kLanes; ++lane) {
    const core::AddressRange lane_range = arena.lane_range(static_cast<ArenaLane>(lane));
    if (lane_range.contains(range)) {
      return core::ArenaSpan{static_cast<uint32_t>(lane), range.begin - lane_range.begin, bytes};
    }
  }
  return std::nullopt;
}

std::optional<StoredValue> stored_value(py::handle value) {
  StoredValue v;
  if (value.is_none()) return v;
  if (PyBool_Check(value.ptr())) {
    v.kind = StoredValue::Kind::kBool;
    v.integer = value.ptr() == Py_True ? 1 : 0;
  } else if (PyLong_CheckExact(value.ptr())) {
    int overflow = 0;
    v.kind = StoredValue::Kind::kInt;
    v.integer = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) return std::nullopt;
  } else if (PyFloat_CheckExact(value.ptr())) {
    v.kind = StoredValue::Kind::kFloat;
    v.real = PyFloat_AS_DOUBLE(value.ptr());
  } else if (PyUnicode_CheckExact(value.ptr())) {
    v.kind = StoredValue::Kind::kString;
    v.text = py::cast<std::string>(value);
  } else if (const py::module_ torch = py::module_::import("torch");
             py::isinstance(value, torch.attr("dtype"))) {
    // str(torch.float16) is "torch.float16", the attribute of torch that a later process reads.
    const std::string name = py::str(value);
    const std::string prefix = "torch.";
    if (name.rfind(prefix, 0) != 0) return std::nullopt;
    v.kind = StoredValue::Kind::kDtype;
    v.text = name.substr(prefix.size());
  } else if (py::isinstance(value, torch.attr("device"))) {
    v.kind = StoredValue::Kind::kDevice;
    v.text = py::str(value);
  } else {
    return std::nullopt;
  }
  return v;
}

py::object python_value(const StoredValue& v) {
  switch (v.kind) {
    case StoredValue::Kind::kNone: return py::none();
    case StoredValue::Kind::kBool: return py::bool_(v.integer != 0);
    case StoredValue::Kind::kInt: return py::int_(v.integer);
    case StoredValue::Kind::kFloat: return py::float_(v.real);
    case StoredValue::Kind::kString: return py::str(v.text);
    case StoredValue::Kind::kDtype:
    case StoredValue::Kind::kDevice:
      // Null where this torch makes none of that name: the shape is then captured, never given
      // another value.
      try {
        const py::module_ torch = py::module_::import("torch");
        if (v.kind == StoredValue::Kind::kDevice) return torch.attr("device")(v.text);
        py::object dtype = torch.attr(v.text.c_str());
        return py::isinstance(dtype, torch.attr("dtype")) ? dtype : py::object();
      } catch (const py::error_already_set&) {
        return py::object();
      }
  }
  return py::none();
}

std::string qualified_type_name(py::handle type) {
  return py::cast<std::string>(type.attr("__module__")) + ":" +
         py::cast<std::string>(type.attr("__qualname__"));
}

// The type a qualified name names in this process, or None.
py::object type_named(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return py::none();
  try {
    py::object found = py::module_::import(name.substr(0, colon).c_str());
    size_t start = colon + 1;
    while (start <= name.size()) {
      const size_t dot = std::min(name.find('.', start), name.size());
      found = found.attr(name.substr(start, dot - start).c_str());
      start = dot + 1;
    }
    if (PyType_Check(found.ptr())) return found;
  } catch (const py::error_already_set&) {
  }
  return py::none();
}

// Appends `spec`'s tree in preorder; false (with `why`) for a node it cannot name.
bool store_tree(const TreeSpec& spec, std::vector<StoredTreeNode>& out, std::string& why) {
  StoredTreeNode node;
  node.children = static_cast<uint32_t>(spec.children.size());
  using Kind = TreeSpec::Kind;
  switch (spec.kind) {
    case Kind::kTuple: node.kind = StoredTreeNode::Kind::kTuple; break;
    case Kind::kList: node.kind = StoredTreeNode::Kind::kList; break;
    case Kind::kTensor:
      node.kind = StoredTreeNode::Kind::kTensor;
      node.tensor = spec.tensor_index;
      break;
    case Kind::kRecordRef:
      node.kind = StoredTreeNode::Kind::kRecordRef;
      node.record = spec.index;
      break;
    case Kind::kConstant: {
      node.kind = StoredTreeNode::Kind::kConstant;
      std::optional<StoredValue> value = stored_value(spec.constant);
      if (!value) {
        why = std::string("a constant of type ") + Py_TYPE(spec.constant.ptr())->tp_name +
              " in its result";
        return false;
      }
      node.constant = std::move(*value);
      break;
    }
    case Kind::kDict:
    case Kind::kDataclass:
    case Kind::kNamedTuple: {
      node.kind = spec.kind == Kind::kDict
                      ? StoredTreeNode::Kind::kDict
                      : (spec.kind == Kind::kDataclass ? StoredTreeNode::Kind::kDataclass
                                                       : StoredTreeNode::Kind::kNamedTuple);
      if (spec.kind != Kind::kDict) node.type = qualified_type_name(spec.type);
      // A named tuple's keys are its fields: only their count is checked when it is read.
      const py::object keys = spec.kind == Kind::kNamedTuple
                                  ? py::object(spec.type.attr("_fields"))
                                  : spec.keys;
      for (py::handle key : py::reinterpret_borrow<py::tuple>(keys)) {
        std::optional<StoredValue> value = stored_value(key);
        if (!value) {
          why = "a dict key of another type than None, bool, int, float, str, torch.dtype or "
                "torch.device in its result";
          return false;
        }
        node.keys.push_back(std::move(*value));
      }
      node.field_init = spec.field_init;
      break;
    }
    case Kind::kRecord:
      why = "an argument object built anew in its result";
      return false;
  }
  out.push_back(std::move(node));
  for (const TreeSpec& child : spec.children) {
    if (!store_tree(child, out, why)) return false;
  }
  return true;
}

// The TreeSpec of the stored tree from node `at` on (advanced past it); false (with `why`) for a
// type this process lacks.
bool restore_tree(const std::vector<StoredTreeNode>& tree, size_t& at, TreeSpec& spec,
                  std::string& why) {
  const StoredTreeNode& node = tree.at(at++);
  using Kind = StoredTreeNode::Kind;
  switch (node.kind) {
    case Kind::kTuple: spec.kind = TreeSpec::Kind::kTuple; break;
    case Kind::kList: spec.kind = TreeSpec::Kind::kList; break;
    case Kind::kTensor:
      spec.kind = TreeSpec::Kind::kTensor;
      spec.tensor_index = node.tensor;
      break;
    case Kind::kRecordRef:
      spec.kind = TreeSpec::Kind::kRecordRef;
      spec.index = node.record;
      break;
    case Kind::kConstant:
      spec.kind = TreeSpec::Kind::kConstant;
      spec.constant = python_value(node.constant);
      if (!spec.constant) {
        why = "its result's constant " + node.constant.text + " is not in this torch";
        return false;
      }
      break;
    case Kind::kDict:
    case Kind::kDataclass:
    case Kind::kNamedTuple: {
      spec.kind = node.kind == Kind::kDict
                      ? TreeSpec::Kind::kDict
                      : (node.kind == Kind::kDataclass ? TreeSpec::Kind::kDataclass
                                                       : TreeSpec::Kind::kNamedTuple);
      if (node.kind != Kind::kDict) {
        spec.type = type_named(node.type);
        if (spec.type.is_none()) {
          why = "its result's type " + node.type + " is not in this process";
          return false;
        }
      }
      py::tuple keys(node.keys.size());
      for (size_t i = 0; i < node.keys.size(); ++i) {
        py::object key = python_value(node.keys[i]);
        if (!key) {
          why = "its result's key " + node.keys[i].text + " is not in this torch";
          return false;
        }
        keys[i] = std::move(key);
      }
      spec.keys = keys;
      spec.field_init = node.field_init;
      break;
    }
  }
  spec.children.resize(node.children);
  for (TreeSpec& child : spec.children) {
    if (!restore_tree(tree, at, child, why)) return false;
  }
  return true;
}

// Why `graph`'s capture recorded something a stored entry cannot hold, or "".
std::string unstorable_state(const CapturedGraph& graph) {
  for (const Effect& effect : graph.effects) {
    if (effect.leaf.defined()) return "a training step's state";
  }
  if (!graph.grad_guards.empty() || !graph.hyperparameters.empty() ||
      !graph.device_settings.empty()) {
    return "a training step's state";
  }
  if (!graph.host_constants.empty()) return "pinned host constants";
  if (graph.graph && graph.graph->draws_random_numbers()) return "it draws random numbers";
  return "";
}

}  // namespace

std::string NamedTensors::name_of(const at::Tensor& t) const {
  for (const auto& [name, tensor] : tensors) {
    if (tensor.storage().data() == t.storage().data() && tensor.sizes() == t.sizes() &&
        tensor.strides() == t.strides() && tensor.storage_offset() == t.storage_offset() &&
        tensor.scalar_type() == t.scalar_type()) {
      return name;
    }
  }
  return "";
}

const at::Tensor* NamedTensors::find(const std::string& name) const {
  for (const auto& [n, tensor] : tensors) {
    if (n == name) return &tensor;
  }
  return nullptr;
}

std::optional<core::StoredEntry> store_entry(const CapturedGraph& graph, const GraphArena& arena,
                                             const NamedTensors& named, std::string& why) {
  why = unstorable_state(graph);
  if (!why.empty()) return std::nullopt;
  core::StoredEntry entry;
  for (const auto& p : graph.placeholders) {
    std::optional<core::ArenaSpan> span = arena_span(arena, p.ptr, p.bytes);
    if (!span) {
      why = "a placeholder outside the arena";
      return std::nullopt;
    }
    entry.placeholders.push_back({*span, p.mutated, p.chained, p.site_buffer});
  }
  using Source = CapturedGraph::OutputStorage::Source;
  for (size_t s = 0; s < graph.output_storages.size(); ++s) {
    const auto& storage = graph.output_storages[s];
    core::StoredEntry::OutputStorage stored;
    stored.source = static_cast<core::StoredEntry::OutputStorage::Source>(storage.source);
    if (storage.source == Source::kPool) {
      std::optional<core::ArenaSpan> span = arena_span(arena, storage.ptr, storage.bytes);
      if (!span) {
        why = "an output outside the arena (in the private pool)";
        return std::nullopt;
      }
      stored.span = *span;
    } else if (storage.source == Source::kInput) {
      stored.input = storage.input;
    } else {
      // Each output over it must be one named tensor itself, and all the same one: a restored
      // shape returns that tensor (a view or another dtype of it would need more than a name).
      for (const auto& tensor : graph.output_tensors) {
        if (tensor.storage != static_cast<int>(s)) continue;
        const std::string name = named.name_of(tensor.static_tensor);
        if (name.empty() || (!stored.tensor.empty() && name != stored.tensor)) {
          why = "a tensor in its result that is no module's parameter or buffer as it is";
          return std::nullopt;
        }
        stored.tensor = name;
      }
    }
    entry.output_storages.push_back(std::move(stored));
  }
  for (const auto& tensor : graph.output_tensors) {
    entry.output_tensors.push_back({tensor.storage, tensor.sizes, tensor.strides, tensor.offset,
                                    static_cast<int32_t>(tensor.dtype)});
  }
  if (!store_tree(graph.output_spec, entry.output_tree, why)) return std::nullopt;
  for (const Effect& effect : graph.effects) {
    if (!PyUnicode_CheckExact(effect.attribute.ptr())) {
      why = "an effect on an attribute whose name is no str";
      return std::nullopt;
    }
    entry.effects.push_back({effect.record, py::cast<std::string>(effect.attribute)});
  }
  for (const auto& [tensor, ptr] : graph.static_tensors) {
    std::string name = named.name_of(tensor);
    if (name.empty()) {
      why = "static state that is no module's parameter or buffer";
      return std::nullopt;
    }
    entry.static_tensors.push_back(std::move(name));
  }
  for (int lane = 0; lane < GraphArena::kLanes; ++lane) {
    entry.lane_extents.push_back(arena.mapped_bytes(static_cast<ArenaLane>(lane)));
  }
  return entry;
}

std::unique_ptr<CapturedGraph> restore_entry(
    const core::StoredEntry& entry, const std::shared_ptr<GraphPool>& pool,
    const std::shared_ptr<cuda::SharedExecutables>& executables,
    cuda::SharedExecutables::Member member, size_t nodes, const NamedTensors& named,
    std::string& why) {
  auto graph = std::make_unique<CapturedGraph>();
  auto address = [&](const core::ArenaSpan& span) {
    const core::AddressRange lane = pool->arena().lane_range(static_cast<ArenaLane>(span.lane));
    return reinterpret_cast<void*>(lane.begin + span.offset);
  };
  for (const auto& p : entry.placeholders) {
    // Only a site's buffers lie in the input lane: a placeholder there that is no site's could
    // be copied into while a tensor holds it.
    if (p.site_buffer != (p.span.lane == static_cast<uint32_t>(ArenaLane::kInput))) {
      why = "a placeholder of another kind than its arena lane";
      return nullptr;
    }
    graph->placeholders.push_back(
        {address(p.span), p.span.bytes, p.mutated, p.chained, nullptr, p.site_buffer});
  }
  using Source = core::StoredEntry::OutputStorage::Source;
  for (const auto& stored : entry.output_storages) {
    CapturedGraph::OutputStorage storage;
    storage.source = static_cast<CapturedGraph::OutputStorage::Source>(stored.source);
    if (stored.source == Source::kPool) {
      storage.ptr = address(stored.span);
      storage.bytes = stored.span.bytes;
    }
    storage.input = stored.input;
    graph->output_storages.push_back(storage);
  }
  for (const auto& stored : entry.output_tensors) {
    CapturedGraph::OutputTensor tensor;
    tensor.storage = stored.storage;
    tensor.sizes = stored.sizes;
    tensor.strides = stored.strides;
    tensor.offset = stored.offset;
    tensor.dtype = static_cast<at::ScalarType>(stored.dtype);
    const auto& storage = entry.output_storages.at(static_cast<size_t>(stored.storage));
    if (storage.source == Source::kStatic) {
      const at::Tensor* found = named.find(storage.tensor);
      if (found == nullptr || named.name_of(*found) != storage.tensor ||
          found->sizes().vec() != stored.sizes || found->strides().vec() != stored.strides ||
          found->storage_offset() != stored.offset ||
          static_cast<int32_t>(found->scalar_type()) != stored.dtype) {
        why = "its result's module tensor " + storage.tensor + " is not here as it was";
        return nullptr;
      }
      tensor.static_tensor = *found;
    }
    graph->output_tensors.push_back(std::move(tensor));
  }
  size_t at = 0;
  if (!entry.output_tree.empty() && !restore_tree(entry.output_tree, at, graph->output_spec, why)) {
    return nullptr;
  }
  for (const auto& effect : entry.effects) {
    graph->effects.push_back({effect.record, py::str(effect.attribute), at::Tensor(), false});
  }
  for (const std::string& name : entry.static_tensors) {
    const at::Tensor* found = named.find(name);
    if (found == nullptr) {
      why = "the module tensor " + name + " is not in this process";
      return nullptr;
    }
    graph->static_tensors.emplace_back(*found, found->data_ptr());
  }
  graph->pool = pool;
  graph->nodes = nodes;
  graph->executables = executables;
  graph->member = member;
  return graph;
}

}  // namespace grape
