// Alias prediction, the runtime's side (Note [Allocation-site prediction] in core/alias_sites.h,
// chain prediction in docs/design.md, "Capture"): which inputs a graph may read in place, whether
// a graph fits a call's inputs as they are, and learning where the caller allocates inputs.
#include <ATen/core/Tensor.h>

#include "torch/memory/allocator_hook.h"
#include "torch/graphs/captured_graph.h"
#include "torch/memory/graph_pool.h"
#include "torch/runtime.h"
#include "torch/memory/site_predictor.h"

namespace grape {

namespace {

// Whether input `i` is its whole storage, laid out as a placeholder would be, and the only input
// that uses that storage: what an input must be to serve as its own placeholder.
bool is_sole_whole_input(const FlatCall& flat, size_t i) {
  const at::Tensor& t = flat.tensors[i];
  const size_t bytes = span_bytes(t);
  if (bytes == 0 || !is_whole_storage(t, bytes)) return false;
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (size_t j = 0; j < flat.tensors.size(); ++j) {
    if (j != i && flat.tensors[j].storage().unsafeGetStorageImpl() == impl) return false;
  }
  return true;
}

// Whether input `i` can be its own placeholder by chain prediction: a live output of this pool's
// arena that is a sole whole input.
bool is_chainable(const GraphPool& pool, const FlatCall& flat, size_t i) {
  const c10::StorageImpl* impl = flat.tensors[i].storage().unsafeGetStorageImpl();
  if (pool.find_live(impl) == nullptr || !pool.arena().contains(impl->data())) return false;
  return is_sole_whole_input(flat, i);
}

// Whether input `t` is where `ph` reads it, whole: nothing to copy.
bool in_place(const at::Tensor& t, const CapturedGraph::Placeholder& ph) {
  return t.data_ptr() == ph.ptr && is_whole_storage(t, ph.bytes);
}

}  // namespace

bool Runtime::can_alias(const FlatCall& flat, size_t i,
                        std::shared_ptr<InputBuffer>* buffer) const {
  if (!chain_.alias_prediction || !pool_) return false;
  if (is_chainable(*pool_, flat, i)) return true;
  auto found = sites_->buffer_of(flat.tensors[i]);
  if (!found || !is_sole_whole_input(flat, i)) return false;
  if (buffer != nullptr) *buffer = std::move(found);
  return true;
}

bool Runtime::site_buffer_held(const CapturedGraph& g, const FlatCall& flat) const {
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const auto& ph = g.placeholders[i];
    if (!in_place(flat.tensors[i], ph) && ph.site_buffer_held(sites_.get())) return true;
  }
  return false;
}

bool Runtime::outputs_read_in_place(const Entry& entry) {
  if (*entry.graph->outputs_read_in_place) return true;
  for (const auto& variant : entry.chain_variants) {
    if (*variant->outputs_read_in_place) return true;
  }
  return false;
}

int64_t Runtime::copies_a_variant_saves_ns(const CapturedGraph& g, const FlatCall& flat) const {
  size_t saved_bytes = 0;
  bool copies_others = false;  // its batched copy is launched anyway
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const auto& ph = g.placeholders[i];
    if (in_place(flat.tensors[i], ph)) continue;
    if (!can_alias(flat, i, nullptr)) {
      copies_others = true;
      continue;
    }
    saved_bytes += ph.mutated ? 2 * ph.bytes : ph.bytes;  // a mutated input is copied back too
  }
  return core::CopyCost::of(saved_bytes, copies_others);
}

void Runtime::learn_sites(const FlatCall& flat, bool warm_up) {
  if (!sites_->learning() || flat.tensors.empty()) return;
  install_allocator_hook();  // it records the allocations (already there once a capture ran)
  std::vector<bool> explained(flat.tensors.size());
  for (size_t i = 0; i < flat.tensors.size(); ++i) explained[i] = can_alias(flat, i, nullptr);
  if (sites_->learn(flat.tensors, explained, warm_up) && !sites_->attached()) {
    for (const auto& t : flat.tensors) {
      if (t.is_cuda()) {
        pool_for(t.device().index());  // the buffers live in its arena
        break;
      }
    }
  }
}

bool Runtime::fits(const CapturedGraph& g, const FlatCall& flat) const {
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const auto& ph = g.placeholders[i];
    if (in_place(flat.tensors[i], ph)) continue;
    if (ph.chained || ph.site_buffer || can_alias(flat, i, nullptr)) return false;
  }
  return true;
}

}  // namespace grape
