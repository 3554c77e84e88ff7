#include "torch/graphs/captured_graph.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "torch/memory/site_predictor.h"
#include "torch/python/module_tensors.h"

namespace grape {

bool CapturedGraph::Placeholder::site_buffer_held(const InputSites* sites) const {
  if (!site_buffer) return false;
  if (buffer) return buffer->in_use.load();
  return sites != nullptr && sites->holds(ptr, bytes);  // restored from the graph cache
}

uint64_t CapturedGraph::next_id() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

CapturedGraph::~CapturedGraph() {
  try {
    if (executables) executables->remove(member);
    if (pool) pool->destroy_graph(graph);
  } catch (const std::exception& e) {
    TORCH_WARN("grape: destroying a graph failed: ", e.what());
  }
}

size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.sizes()[d] - 1) * t.strides()[d];
  return static_cast<size_t>(last + 1) * t.element_size();
}

bool is_whole_storage(const at::Tensor& t, size_t bytes) {
  return t.storage_offset() == 0 && t.storage().nbytes() == bytes;
}

int placeholder_of(const std::vector<at::Tensor>& placeholders, const c10::StorageImpl* impl) {
  int found = -1;
  for (size_t i = 0; i < placeholders.size(); ++i) {
    if (placeholders[i].storage().unsafeGetStorageImpl() == impl) found = static_cast<int>(i);
  }
  return found;
}

void CapturedGraph::classify_outputs(const FlatCall& results,
                                     const std::vector<at::Tensor>& captured_placeholders) {
  std::unordered_map<const c10::StorageImpl*, int> storage_slots;
  for (const auto& t : results.tensors) {
    OutputTensor slot;
    slot.sizes = t.sizes().vec();
    slot.strides = t.strides().vec();
    slot.offset = t.storage_offset();
    slot.dtype = t.scalar_type();
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    auto found = storage_slots.find(impl);
    if (found == storage_slots.end()) {
      OutputStorage storage;
      const int input = placeholder_of(captured_placeholders, impl);
      if (input >= 0) {
        storage.source = OutputStorage::Source::kInput;
        storage.input = input;
      } else if (pool->segments().contains(
                     core::make_range(t.storage().data(), t.storage().nbytes()))) {
        storage.source = OutputStorage::Source::kPool;
        storage.ptr = const_cast<void*>(t.storage().data());
        storage.bytes = t.storage().nbytes();
      } else {
        storage.source = OutputStorage::Source::kStatic;
      }
      found = storage_slots.emplace(impl, static_cast<int>(output_storages.size())).first;
      output_storages.push_back(storage);
    }
    slot.storage = found->second;
    if (output_storages[static_cast<size_t>(slot.storage)].source ==
        OutputStorage::Source::kStatic) {
      slot.static_tensor = t;
    }
    output_tensors.push_back(std::move(slot));
  }
}

py::object CapturedGraph::rebuild_outputs(FlatCall& flat) const {
  // Fresh tensors over pool memory, views of inputs, or static tensors.
  std::vector<c10::Storage> storages(output_storages.size());
  for (size_t s = 0; s < output_storages.size(); ++s) {
    const auto& slot = output_storages[s];
    if (slot.source == OutputStorage::Source::kPool) {
      storages[s] = pool->hand_out(slot.ptr, slot.bytes, outputs_read_in_place);
    } else if (slot.source == OutputStorage::Source::kInput) {
      storages[s] = flat.tensors[static_cast<size_t>(slot.input)].storage();
    }
  }
  std::vector<py::object> leaves;
  leaves.reserve(output_tensors.size());
  const auto key_set = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  for (const auto& slot : output_tensors) {
    if (slot.static_tensor.defined()) {
      leaves.push_back(py::reinterpret_steal<py::object>(THPVariable_Wrap(slot.static_tensor)));
      continue;
    }
    const auto& storage_slot = output_storages[static_cast<size_t>(slot.storage)];
    int64_t offset = slot.offset;
    if (storage_slot.source == OutputStorage::Source::kInput) {
      offset += flat.tensors[static_cast<size_t>(storage_slot.input)].storage_offset();
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(storages[static_cast<size_t>(slot.storage)]), key_set,
        caffe2::TypeMeta::fromScalarType(slot.dtype));
    impl->set_sizes_and_strides(slot.sizes, slot.strides, offset);
    leaves.push_back(
        py::reinterpret_steal<py::object>(THPVariable_Wrap(at::Tensor(std::move(impl)))));
  }
  if (effects.empty()) return unflatten(output_spec, leaves, &flat.records);
  py::tuple both = unflatten(output_spec, leaves, &flat.records);
  apply_effects(flat.records, effects, both[1]);
  return both[0];
}

void CapturedGraph::gather_static_tensors() {
  if (!pending_statics) return;
  const PendingStatics pending = std::move(*pending_statics);
  pending_statics.reset();
  // Which tensors the modules hold, only where leaves are to be told apart from them.
  std::unordered_set<const c10::TensorImpl*> known;
  auto add_module = [&](const py::object& module) {
    const ModuleTensors tensors = module_tensors(module);
    for (const auto* kind : {&tensors.parameters, &tensors.buffers}) {
      for (const at::Tensor& tensor : *kind) {
        static_tensors.emplace_back(tensor, tensor.data_ptr());
        if (!pending.leaves.empty()) known.insert(tensor.unsafeGetTensorImpl());
      }
    }
  };
  if (!pending.static_module.is_none()) add_module(pending.static_module);
  for (const auto& m : pending.modules) add_module(m);
  // Leaves that are not parameters of the modules (parameter arguments, optimizers' params).
  for (const auto& leaf : pending.leaves) {
    if (known.insert(leaf.unsafeGetTensorImpl()).second) {
      static_tensors.emplace_back(leaf, leaf.data_ptr());
    }
  }
}

CapturedGraph::StateChange CapturedGraph::static_state_change(std::string& changed) {
  gather_static_tensors();  // where no replay has gathered them (a refused first replay)
  for (const auto& [tensor, ptr] : static_tensors) {
    if (tensor.data_ptr() != ptr) {
      changed = "a parameter, buffer or optimizer state tensor moved";
      return StateChange::kTensorMoved;
    }
  }
  for (const auto& guard : grad_guards) {
    const at::Tensor& grad = guard.leaf.grad();
    if ((grad.defined() ? grad.data_ptr() : nullptr) != guard.grad) {
      changed = "a gradient is not where the capture found it";
      return StateChange::kGradientMoved;
    }
  }
  return optimizer_settings_hold(hyperparameters, changed) ? StateChange::kNone
                                                           : StateChange::kOptimizerSetting;
}

}  // namespace grape
