#include "torch/runtime.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/alias_sites.h"
#include "core/replay_plan.h"
#include "cuda/executable_stats.h"
#include "torch/torch_version.h"

#ifdef GRAPE_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/batched_copy.h"
#include "cuda/shared_executables.h"
#include "torch/allocator_hook.h"
#include "torch/graph_pool.h"
#include "torch/python_scopes.h"
#include "torch/side_effects.h"
#include "torch/site_predictor.h"
#else
namespace grape {
class InputSites {};
}  // namespace grape
#endif

namespace grape {

namespace {

int64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              since)
      .count();
}

// Bytes from a tensor's first element to one past its last (its placeholder's storage size).
size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.sizes()[d] - 1) * t.strides()[d];
  return static_cast<size_t>(last + 1) * t.element_size();
}

// Whether `t` is its whole storage of `bytes` bytes, laid out from the storage's start: what a
// placeholder of `t`'s sizes and strides would be.
bool is_whole_storage(const at::Tensor& t, size_t bytes) {
  return t.storage_offset() == 0 && t.storage().nbytes() == bytes;
}

// Errors the user must see rather than a fallback (grape.RewriteError): registered by Python.
py::object& propagated_error_types() {
  static auto* types = new py::object(py::tuple());  // never destroyed: a Python object
  return *types;
}

bool propagates(const py::error_already_set& e) {
  return py::len(propagated_error_types()) > 0 && e.matches(propagated_error_types());
}

py::object call_python(const py::object& fn, const py::args& args, const py::kwargs& kwargs) {
  PyObject* result = PyObject_Call(fn.ptr(), args.ptr(), kwargs.ptr());
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

}  // namespace

// What one capture recorded: the graph, where its inputs go, and how to rebuild its outputs.
struct CapturedGraph {
  struct Placeholder {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool mutated = false;
    bool chained = false;  // predicted: an earlier replay's output, used in place
#ifdef GRAPE_WITH_CUDA
    std::shared_ptr<InputBuffer> buffer;  // predicted: a site's input buffer, used in place
#endif
  };
  struct OutputStorage {
    enum class Source { kPool, kInput, kStatic };
    Source source = Source::kPool;
    void* ptr = nullptr;  // kPool
    size_t bytes = 0;     // kPool
    int input = -1;       // kInput: the input whose placeholder this is
  };
  struct OutputTensor {
    int storage = -1;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t offset = 0;  // elements from the storage's start (the placeholder's, for kInput)
    at::ScalarType dtype = at::kFloat;
    at::Tensor static_tensor;  // returned as is when its storage is static state
  };

#ifdef GRAPE_WITH_CUDA
  std::shared_ptr<GraphPool> pool;  // outlives the graph
  std::unique_ptr<ReplayGraph> graph;
  // The executable that replays it, shared with the graphs of its topology.
  std::shared_ptr<cuda::SharedExecutables> executables;
  cuda::SharedExecutables::Member member;
  ~CapturedGraph() {
    try {
      if (executables) executables->remove(member);
      if (pool) pool->destroy_graph(graph);
    } catch (const std::exception& e) {
      TORCH_WARN("grape: destroying a graph failed: ", e.what());
    }
  }
#endif
  std::vector<Placeholder> placeholders;
  TreeSpec output_spec;
  std::vector<OutputStorage> output_storages;
  std::vector<OutputTensor> output_tensors;
  std::vector<std::pair<at::Tensor, const void*>> static_tensors;
  // Attributes of argument objects that f rebinds (Note [Argument objects]) and gradients that
  // its backward pass replaces (Note [Gradients of a captured step]); when there are any, the
  // outputs are (f's result, the effects' values).
  std::vector<Effect> effects;
  // Gradients the graph reads or accumulates into where they are.
  std::vector<GradGuard> grad_guards;
  // (param group, key, value): the optimizers' settings the graph baked in.
  py::list hyperparameters;
  // Pinned host tensors the graph copies to the device (grape._host_constants).
  py::list host_constants;
};

void set_propagated_errors(py::tuple types) { propagated_error_types() = std::move(types); }

Entry::Entry() = default;
Entry::~Entry() = default;

Runtime::Runtime(py::object fn, int warmup, bool warmup_each_signature, py::object static_module,
                 bool alias_prediction, const std::string& sharing, int64_t executable_cache,
                 int64_t memory_budget)
    : fn_(std::move(fn)),
      static_module_(std::move(static_module)),
      warmup_(warmup),
      warmup_each_signature_(warmup_each_signature),
      alias_prediction_(alias_prediction),
      executable_cache_(executable_cache),
      memory_budget_(memory_budget) {
  TORCH_CHECK(PyCallable_Check(fn_.ptr()), "grape.compile expects a callable, got ",
              Py_TYPE(fn_.ptr())->tp_name);
  TORCH_CHECK(warmup_ >= 0, "grape.compile: warmup must be >= 0, got ", warmup_);
  TORCH_CHECK(sharing == "none" || sharing == "topology" || sharing == "near",
              "grape.compile: executable sharing must be 'none', 'topology' or 'near', got '",
              sharing, "'");
#ifdef GRAPE_WITH_CUDA
  using Sharing = cuda::SharedExecutables::Sharing;
  if (alias_prediction_) sites_ = std::make_unique<InputSites>();
  executables_ = std::make_shared<cuda::SharedExecutables>(
      sharing == "none" ? Sharing::kNone
                        : (sharing == "near" ? Sharing::kNearTopologies : Sharing::kTopology),
      executable_cache < 0 ? SIZE_MAX : static_cast<size_t>(executable_cache),
      cuda::SharedExecutables::SlotGrowth::kWhenGpuWaits);
#endif
}

Runtime::~Runtime() {
  // Graphs before the pool they allocate from.
  cache_.clear();
  retired_.clear();
}

FlatCall& Runtime::scratch() {
  if (scratch_.size() <= depth_) scratch_.push_back(std::make_unique<FlatCall>());
  return *scratch_[depth_];
}

py::object Runtime::run_eager(const py::args& args, const py::kwargs& kwargs) {
  last_was_replay_ = false;
  return call_python(fn_, args, kwargs);
}

void Runtime::report(const std::string& description, const std::string& reason,
                     const py::object& error) {
  py::object self = py::cast(this, py::return_value_policy::reference);
  if (py::hasattr(self, "_report_fallback")) {
    self.attr("_report_fallback")(description, reason, error);
  }
}

void Runtime::set_fallback(Entry& entry, std::string reason, const py::object& error) {
  entry.fallback_reason = std::move(reason);
  entry.graph.reset();
  entry.chain_variants.clear();
  report(entry.description, entry.fallback_reason, error);
}

#ifdef GRAPE_WITH_CUDA
std::string Runtime::refusal_of_arguments(const py::args& args, const py::kwargs& kwargs,
                                          const FlatCall& flat) {
  if (!flat.unsupported.empty()) {
    FlatCall with_paths;
    flattener_.flatten_call(args, kwargs, with_paths, false, /*with_paths=*/true);
    return "argument " + with_paths.unsupported_path + " is a " + flat.unsupported;
  }
  if (flat.tensors.empty()) return {};
  const c10::DeviceIndex device = pool_ ? pool_->device() : flat.tensors.front().device().index();
  for (const auto& t : flat.tensors) {
    if (t.device().index() != device) {
      return "inputs on several devices (cuda:" + std::to_string(device) + " and " +
             t.device().str() + "); a compiled function runs on one device";
    }
  }
  return {};
}

bool Runtime::in_process_group() {
  return py::module_::import("grape._distributed").attr("active")().cast<bool>();
}

bool Runtime::agree_across_ranks(Entry& entry, bool captured, std::string& reason,
                                 py::object& error, bool& out_of_memory) {
  // Note [Capture points agree across ranks]
  // Under torch.distributed, a rank that replays a graph holding a collective while another runs
  // the call eagerly (or captures) can leave the collective waiting forever: NCCL registers a
  // captured collective's buffers with its peers. So at a capture point every rank tells the
  // others what it did (grape/_distributed.py), and they all replay, or all run the signature
  // eagerly with one reason. Ranks are expected to reach capture points alike, as they call
  // collectives alike: same functions, same signatures, same order. Chain variants, captured
  // where one rank's allocations happen to allow them, are not made (select_graph).
  py::object self = py::cast(this, py::return_value_policy::reference);
  if (!py::hasattr(self, "_agree")) return captured;
  py::object common = self.attr("_agree")(entry.description, captured ? "" : reason,
                                          out_of_memory);
  if (common.is_none()) return captured;
  ranks_agree_ = true;
  auto [common_reason, any_out_of_memory] = common.cast<std::pair<std::string, bool>>();
  out_of_memory = any_out_of_memory;
  if (common_reason.empty()) return true;
  entry.graph.reset();  // never launched
  error = py::none();    // every rank reports the same reason, whose ever it is
  reason = std::move(common_reason);
  return false;
}
#endif  // GRAPE_WITH_CUDA

std::string Runtime::describe(const FlatCall& flat) const {
  std::string s = "(";
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    if (i) s += ", ";
    s += describe_tensor(flat.tensors[i]);
  }
  return s + ")";
}

py::object Runtime::call(py::args args, py::kwargs kwargs) {
  ++stats_.calls;
  if (!checked_cuda_) {
    checked_cuda_ = true;
#ifdef GRAPE_WITH_CUDA
    if (c10::cuda::device_count() == 0) global_fallback_ = "CUDA is not available";
#else
    global_fallback_ = "grape was built without CUDA";
#endif
    if (!global_fallback_.empty()) report("", global_fallback_, py::none());
  }
  if (!global_fallback_.empty()) {
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }

#ifdef GRAPE_WITH_CUDA
  // Inside another capture (a compiled function calling this one, or a user's torch.cuda.graph),
  // the calls are recorded into that capture.
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    return run_eager(args, kwargs);
  }

  CallScope call_scope;  // the caller's allocations from here on are not predicted
  struct DepthGuard {
    size_t& depth;
    explicit DepthGuard(size_t& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
  };
  FlatCall& flat = scratch();
  DepthGuard depth_guard(depth_);
  flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/false, /*with_paths=*/false);

  auto it = cache_.find(flat.signature);
  if (it == cache_.end()) {
    auto entry = std::make_unique<Entry>();
    entry->description = describe(flat);
    it = cache_.emplace(flat.signature, std::move(entry)).first;
  }
  Entry& entry = *it->second;
  if (sites_) {
    sites_->begin_call();
    if (entry.fallback_reason.empty()) {
      learn_sites(flat, /*warm_up=*/warming_up(entry));
    }
  }
  if (!entry.fallback_reason.empty()) {
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }

  if (entry.graph) {
    std::string changed;
    const StateChange change = static_state_change(*entry.graph, changed);
    if (change != StateChange::kNone) {
      ++stats_.recaptures;
      if (change == StateChange::kOptimizerSetting && !warned_settings_) {
        warned_settings_ = true;
        const std::string message =
            "grape: " + changed + " since the step was captured: capturing it again. A setting "
            "that changes every step (a float lr under a scheduler) makes every step a capture; "
            "give it as a CUDA tensor, e.g. lr=torch.tensor(1e-3, device='cuda')";
        if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0) throw py::error_already_set();
      }
      last_recapture_reason_ = std::move(changed);
      retire(std::move(entry.graph));
      for (auto& variant : entry.chain_variants) retire(std::move(variant));
      entry.chain_variants.clear();
    } else {
      CapturedGraph& graph = select_graph(entry, flat, args, kwargs);
      py::object result;
      std::string refusal;
      if (replay(entry, graph, flat, result, refusal)) return result;
      ++stats_.eager_calls;
      if (!entry.reported_refusal) {
        entry.reported_refusal = true;
        report(entry.description, "replay refused, this call ran eagerly: " + refusal, py::none());
      }
      return run_eager(args, kwargs);
    }
  }

  // Arguments no graph can take: the signature runs eagerly. Under torch.distributed that is
  // decided at its capture point, with the other ranks (Note [Capture points agree across ranks]).
  std::string refusal = refusal_of_arguments(args, kwargs, flat);
  if (!refusal.empty() && !in_process_group()) {
    set_fallback(entry, refusal, py::none());
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }

  if (warming_up(entry)) return warm_up(entry, args, kwargs);

  std::string reason = refusal;
  py::object error = py::none();
  bool out_of_memory = false;
  bool captured = false;
  if (refusal.empty()) {
    // Capture with the spec of the arguments, so placeholders can stand in for the tensors.
    flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/true, /*with_paths=*/false);
    captured = capture_with_retry(flat, entry.graph, reason, error, out_of_memory,
                                  entry.pin_host_constants);
    if (!captured) ++stats_.capture_failures;
  }
  if (!agree_across_ranks(entry, captured, reason, error, out_of_memory)) {
    if (!warmup_each_signature_ && entry.warmup_runs == 0 && warmup_ > 0 && !out_of_memory &&
        refusal.empty()) {
      // Captured without a warm-up of its own (at first sight, or again after its static state
      // changed): lazy initialization for this signature (a new shape's workspace, a Python-side
      // cache) may be what failed. This call is its warm-up; the next one captures again, and
      // falls back if that fails too. Running out of memory is not helped by a warm-up.
      error = py::none();
      return warm_up(entry, args, kwargs);
    }
    set_fallback(entry, reason, error);
    // The error's traceback holds f's frames: what they reference (an autograd graph whose
    // nodes run on the capture stream) must not outlive the capture into the eager run.
    error = py::none();
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }
  py::object result;
  std::string replay_refusal;
  if (replay(entry, *entry.graph, flat, result, replay_refusal)) return result;
  ++stats_.eager_calls;
  entry.reported_refusal = true;
  report(entry.description, "replay refused, this call ran eagerly: " + replay_refusal, py::none());
  return run_eager(args, kwargs);
#else
  return run_eager(args, kwargs);
#endif
}


void Runtime::retire(std::unique_ptr<CapturedGraph> graph) {
#ifdef GRAPE_WITH_CUDA
  // Its executable slot is freed now: a retired graph never replays again.
  if (graph->executables) graph->executables->remove(graph->member);
  graph->member = {};
#endif
  retired_.push_back(std::move(graph));
}

bool Runtime::warming_up(const Entry& entry) const {
  if (entry.graph) return false;
  return warmup_each_signature_ ? entry.warmup_runs < warmup_
                                : function_warmup_runs_ < warmup_ && entry.warmup_runs < warmup_;
}

std::vector<std::pair<at::Tensor, const void*>> Runtime::gather_static_tensors(
    const FlatCall& flat) {
  std::vector<std::pair<at::Tensor, const void*>> statics;
  auto add_module = [&](const py::object& module) {
    for (const char* kind : {"parameters", "buffers"}) {
      for (py::handle t : module.attr(kind)()) {
        const at::Tensor& tensor = THPVariable_Unpack(t.ptr());
        statics.emplace_back(tensor, tensor.data_ptr());
      }
    }
  };
  if (!static_module_.is_none()) add_module(static_module_);
  for (const auto& m : flat.modules) add_module(m);
  return statics;
}

#ifdef GRAPE_WITH_CUDA

namespace allocator = c10::cuda::CUDACachingAllocator;

py::object Runtime::warm_up(Entry& entry, const py::args& args, const py::kwargs& kwargs) {
  ++entry.warmup_runs;
  ++function_warmup_runs_;
  ++stats_.warmup_calls;
  EnteredContext watch(training_.step_watch());  // optimizers it steps become capturable
  return run_eager(args, kwargs);
}

Runtime::StateChange Runtime::static_state_change(const CapturedGraph& g,
                                                  std::string& changed) const {
  for (const auto& [tensor, ptr] : g.static_tensors) {
    if (tensor.data_ptr() != ptr) {
      changed = "a parameter, buffer or optimizer state tensor moved";
      return StateChange::kTensorMoved;
    }
  }
  for (const auto& guard : g.grad_guards) {
    const at::Tensor& grad = guard.leaf.grad();
    if ((grad.defined() ? grad.data_ptr() : nullptr) != guard.grad) {
      changed = "a gradient is not where the capture found it";
      return StateChange::kGradientMoved;
    }
  }
  return optimizer_settings_hold(g.hyperparameters, changed) ? StateChange::kNone
                                                             : StateChange::kOptimizerSetting;
}

namespace {

// The index of the placeholder whose storage is `impl`, or -1.
int placeholder_of(const std::vector<at::Tensor>& placeholders, const c10::StorageImpl* impl) {
  int found = -1;
  for (size_t i = 0; i < placeholders.size(); ++i) {
    if (placeholders[i].storage().unsafeGetStorageImpl() == impl) found = static_cast<int>(i);
  }
  return found;
}

void check_copy(cudaError_t err) { C10_CUDA_CHECK(err); }

class SyncDebugModeGuard {
 public:
  SyncDebugModeGuard() : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncDebugModeGuard() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }
  SyncDebugModeGuard(const SyncDebugModeGuard&) = delete;
  SyncDebugModeGuard& operator=(const SyncDebugModeGuard&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};

// Ends a capture that failed part-way and puts the allocator's pool bookkeeping back where it was.
// Torch versions differ in how much of this CUDAGraph::reset() does itself, so we compare the
// pool's use count with its value before the capture rather than assume either.
void abort_capture(std::unique_ptr<ReplayGraph>& graph, GraphPool& pool,
                   int use_count_before) {
  cudaStream_t stream = pool.capture_stream().stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  (void)cudaStreamIsCapturing(stream, &status);
  if (status != cudaStreamCaptureStatusNone) {
    try {
      graph->capture_end();
    } catch (const std::exception&) {
    }
    (void)cudaStreamIsCapturing(stream, &status);
    if (status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream, &partial);
      if (partial != nullptr) (void)cudaGraphDestroy(partial);
    }
  }
  (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
  graph.reset();
  if (pool.allocator_use_count() > use_count_before) {
    try {
      allocator::endAllocateToPool(pool.device(), pool.id());
    } catch (const std::exception&) {
    }
    pool.release_to(use_count_before);
  }
}

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

// Note [Host constants]
// `torch.tensor(0.0, device="cuda")` builds the value on the host and copies it from pageable
// memory, which a capture refuses (Hugging Face builds attention-mask fill values so).
// grape._host_constants.PinnedHostConstants, a TorchFunctionMode, builds such tensors in pinned
// memory the graph keeps. It is entered only for signatures that need it: a signature's first
// capture runs without it, and a capture refused for a pageable copy is tried again with it, as
// are the signature's later captures. Entering it for every capture, or for every signature of a
// function once one needed it, would change what torch.compile'd code sees: Dynamo guards on the
// torch function mode stack, so a capture under the mode compiles the function again, inside
// the capture, where compiling fails (a Hugging Face generate whose prompt runs eagerly and whose
// decode steps run compiled code is such a function).
bool copied_from_pageable_memory(const std::string& reason) {
  return reason.find("unless the CPU tensor is pinned") != std::string::npos;
}

std::string python_error_text(const py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string text = py::str(e.value());
  auto nl = text.find('\n');
  if (nl != std::string::npos) text = text.substr(0, nl);
  return type + ": " + text;
}

}  // namespace

GraphPool& Runtime::pool_for(c10::DeviceIndex device) {
  if (!pool_) {
    pool_ = GraphPool::create(device);
    if (sites_) sites_->attach(pool_);
  }
  return *pool_;
}

bool Runtime::can_alias(const FlatCall& flat, size_t i,
                        std::shared_ptr<InputBuffer>* buffer) const {
  if (!alias_prediction_ || !pool_) return false;
  if (is_chainable(*pool_, flat, i)) return true;
  auto found = sites_->buffer_of(flat.tensors[i]);
  if (!found || !is_sole_whole_input(flat, i)) return false;
  if (buffer != nullptr) *buffer = std::move(found);
  return true;
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

bool Runtime::capture_with_retry(FlatCall& flat, std::unique_ptr<CapturedGraph>& into,
                                 std::string& reason, py::object& error, bool& out_of_memory,
                                 bool& pin_host_constants) {
  out_of_memory = false;
  if (capture_planned(flat, into, reason, error, out_of_memory, pin_host_constants)) return true;
  if (!pin_host_constants && copied_from_pageable_memory(reason)) {
    pin_host_constants = true;
    reason.clear();
    error = py::none();
    if (capture_planned(flat, into, reason, error, out_of_memory, pin_host_constants)) return true;
  }
  if (!out_of_memory) return false;
  // Free what other shapes hold but can rebuild (executables, from their base graphs) and the
  // allocator's cached blocks, then try once more.
  ++stats_.capture_oom_retries;
  executables_->evict_to(0, {});
  allocator::emptyCache();
  reason.clear();
  error = py::none();
  if (capture_planned(flat, into, reason, error, out_of_memory, pin_host_constants)) return true;
  if (out_of_memory) reason = "out of memory while capturing, after freeing executables: " + reason;
  return false;
}

bool Runtime::only_results_survive(const std::vector<core::AddressRange>& survivors,
                                   const FlatCall& results) {
  // A block the capture allocated that outlives it and is no output or effect is state f kept (a
  // cache made at first sight of a shape): only this graph's kernels fill it, so a graph captured
  // again, which finds it made, would read what nothing wrote.
  for (const auto& block : survivors) {
    bool held = false;
    for (const auto& t : results.tensors) {
      held |= core::make_range(t.storage().data(), t.storage().nbytes()).overlaps(block);
    }
    if (!held) return false;
  }
  return true;
}

std::string Runtime::refusal_of_results(const py::object& result,
                                        const std::vector<Effect>& effects,
                                        const py::list& effect_values, bool effects_ok,
                                        const std::string& effects_reason, bool backward_ran,
                                        const std::vector<at::Tensor>& placeholders,
                                        FlatCall& flat, FlatCall& out) {
  if (!effects_ok) return effects_reason;
  flattener_.flatten_value(
      effects.empty() ? result : py::object(py::make_tuple(result, py::tuple(effect_values))), out,
      &flat.records);
  if (!out.unsupported.empty()) return "returns " + out.unsupported_path + ", a " + out.unsupported;
  for (const auto& t : out.tensors) {
    if (!t.is_cuda()) {
      return "returns a tensor on " + t.device().str() +
             " (computed once while capturing; a replay would not update it)";
    }
    if (t.requires_grad() && !t.is_leaf() && !backward_ran) {
      return "an output requires grad and the function ran no backward pass (a graph cannot "
             "join the caller's autograd graph: call backward inside the function, or run it "
             "under torch.no_grad() or torch.inference_mode())";
    }
    const int input = placeholder_of(placeholders, t.storage().unsafeGetStorageImpl());
    if (input >= 0 && t.scalar_type() != flat.tensors[static_cast<size_t>(input)].scalar_type()) {
      return "returns a view of an input with another dtype";
    }
  }
  return {};
}

bool Runtime::capture_planned(FlatCall& flat, std::unique_ptr<CapturedGraph>& into,
                              std::string& reason, py::object& error, bool& out_of_memory,
                              bool pin_host_constants) {
  CaptureLayout layout;
  if (capture(flat, into, reason, error, out_of_memory, pin_host_constants, layout)) return true;
  if (layout.retake.empty()) return false;
  // The graph was dropped and its blocks are free: the arena maps no more than before it, and
  // the capture runs again, its allocations placed as planned.
  GraphArena& arena = pool_->arena();
  arena.forget_capture();
  layout.follow = std::move(layout.retake);
  layout.retake.clear();
  if (!capture(flat, into, reason, error, out_of_memory, pin_host_constants, layout)) return false;
  ++stats_.replanned_captures;
  if (arena.plan_diverged()) ++stats_.replans_diverged;
  return true;
}

void Runtime::enforce_budget(const CapturedGraph* keep) {
  if (memory_budget_ < 0 || !pool_) return;
  const auto budget = static_cast<size_t>(memory_budget_);
  const size_t arena = pool_->arena().mapped_bytes();
  const size_t for_executables = budget > arena ? budget - arena : 0;
  executables_->set_device_limit(for_executables);
  executables_->evict_to(for_executables,
                         keep != nullptr ? keep->member : cuda::SharedExecutables::Member{});
}

bool Runtime::capture(FlatCall& flat, std::unique_ptr<CapturedGraph>& into, std::string& reason,
                      py::object& error, bool& out_of_memory, bool pin_host_constants,
                      CaptureLayout& layout) {
  out_of_memory = false;
  last_was_replay_ = false;
  const auto start = std::chrono::steady_clock::now();
  const c10::DeviceIndex device = flat.tensors.empty() ? c10::cuda::current_device()
                                                       : flat.tensors.front().device().index();
  GraphPool& pool = pool_for(device);
  c10::cuda::CUDAGuard device_guard(pool.device());

  auto graph = std::make_unique<ReplayGraph>();
  const int use_count_before = pool.allocator_use_count();
  GraphArena& arena = pool.arena();
  if (memory_budget_ >= 0) {
    // The arena may grow into what the resident executables leave of the budget.
    const auto budget = static_cast<size_t>(memory_budget_);
    const size_t executables = executables_->device_bytes();
    arena.set_limit(budget > executables ? budget - executables : 0);
  }
  install_allocator_hook();  // again, in case it was removed since the pool was made

  // Gradients before f (Note [Gradients of a captured step]); put back when the capture ends.
  std::vector<at::Tensor> grad_leaves = training_.tracked_leaves(static_module_, flat);
  if (!grad_leaves.empty()) training_.prepare_backward(pool);
  const CaptureGradients gradients(std::move(grad_leaves), pool,
                                   at::cuda::getCurrentCUDAStream(pool.device()).stream());
  EnteredContext stepped_optimizers(training_.step_watch());
  // Tensors f makes from Python values on the device come from pinned memory the graph keeps,
  // where the signature needs it (Note [Host constants]).
  const py::object host_constants =
      pin_host_constants
          ? py::module_::import("grape._host_constants").attr("PinnedHostConstants")()
          : py::object(py::none());

  std::vector<at::Tensor> placeholders;
  std::vector<int64_t> versions;
  std::vector<bool> chained(flat.tensors.size(), false);
  std::vector<std::shared_ptr<InputBuffer>> buffers(flat.tensors.size());
  py::object result;
  std::vector<Effect> effects;
  py::list effect_values;
  std::vector<GradGuard> grad_guards;
  bool backward_ran = false;
  bool effects_ok = true;
  std::string effects_reason;
  // Traces the capture's allocations from the start of the captured region until the blocks held
  // to its end are freed, on every way out (Note [Planned capture layouts]).
  struct LayoutTrace {
    GraphArena& arena;
    bool begun = false;
    ~LayoutTrace() {
      if (begun) arena.end_capture();
    }
  } layout_trace{arena};
  {
    // On every way out of the capture, arenas whose last block died during it are destroyed.
    struct DestroyReleasedArenas {
      ~DestroyReleasedArenas() { GraphArena::destroy_released(); }
    } destroy_released_arenas;
    const GarbageCollectionPaused no_collection_while_capturing;
    // The capture stream follows the caller's stream, as torch.cuda.graph does.
    pool.wait_for(at::cuda::getCurrentCUDAStream(pool.device()));
    at::cuda::CUDAStreamGuard stream_guard(pool.capture_stream());
    cudaStream_t stream = pool.capture_stream().stream();
    // Memory that callers still hold is laid out around, never over (Note [Capture arena layout]).
    pool.prune_live();
    for (const auto& live : pool.live()) arena.pin(live.range);
    struct Unpin {
      GraphArena& arena;
      ~Unpin() { arena.unpin_all(); }
    } unpin{arena};

    std::vector<py::object> leaves;
    {
      AllocationRoute to_placeholder_lane(arena, stream, /*placeholders=*/true);
      for (size_t i = 0; i < flat.tensors.size(); ++i) {
        const at::Tensor& t = flat.tensors[i];
        if (can_alias(flat, i, &buffers[i])) {
          // The input is an output of an earlier replay that nothing else references (chain
          // prediction), or a buffer a predicted allocation site handed out (site prediction):
          // it is this graph's placeholder, so calls that bring it again copy nothing.
          chained[i] = buffers[i] == nullptr;
          placeholders.push_back(
              at::empty({0}, t.options()).set_(t.storage(), 0, t.sizes(), t.strides()));
        } else {
          try {
            placeholders.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
          } catch (const c10::OutOfMemoryError& e) {
            reason = std::string("capture failed: ") + e.what_without_backtrace();
            out_of_memory = true;
            return false;
          }
        }
        versions.push_back(placeholders.back()._version());
        leaves.push_back(py::reinterpret_steal<py::object>(THPVariable_Wrap(placeholders.back())));
      }
    }
    // A host synchronization inside the function raises before it reaches CUDA (which would
    // invalidate the capture and leave the RNG in capture mode on older torch).
    SyncDebugModeGuard raise_on_sync;
    // The backward pass of a training step allocates from the autograd engine's device thread.
    AllocationRoute to_arena(arena, stream, /*placeholders=*/false, /*for_all_threads=*/true);
    // f runs on the caller's argument objects, placeholders set in them; they are put back as
    // they were when this scope ends, and the replay sets what f rebound.
    CaptureEffects record_state(flat.records);
    UnflattenLog log;
    try {
      graph->capture_begin(pool.id(), cudaStreamCaptureModeGlobal);
      // From here on, what f allocates: the placeholders and what capture_begin makes (the RNG's
      // seed and offset, which replays write from the host) are laid out already.
      arena.begin_capture(layout.follow);
      layout_trace.begun = true;
      py::tuple call = rebuild_arguments(flat, leaves, record_state, log);
      {
        std::optional<EnteredContext> pinned;
        if (!host_constants.is_none()) pinned.emplace(host_constants);
        result = call_python(fn_, py::reinterpret_borrow<py::args>(call[0]),
                             py::reinterpret_borrow<py::kwargs>(call[1]));
      }
      graph->capture_end();
      effects_ok = record_state.collect(log, effects, effect_values, effects_reason);
      backward_ran = gradients.collect(effects, effect_values, grad_guards);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_Exception) || propagates(e)) {  // not a reason to run eagerly
        result = py::none();
        abort_capture(graph, pool, use_count_before);
        throw;
      }
      // The capture ends before any more Python runs (a failing __str__ must not leave it open).
      result = py::none();
      abort_capture(graph, pool, use_count_before);
      reason = "capture failed: " + python_error_text(e);
      out_of_memory = e.matches(py::module_::import("torch").attr("OutOfMemoryError"));
      error = e.value();
      return false;
    } catch (const c10::OutOfMemoryError& e) {
      reason = std::string("capture failed: ") + e.what_without_backtrace();
      out_of_memory = true;
      result = py::none();
      abort_capture(graph, pool, use_count_before);
      return false;
    } catch (const std::exception& e) {
      reason = std::string("capture failed: ") + e.what();
      result = py::none();
      abort_capture(graph, pool, use_count_before);
      return false;
    }
  }

  pool.hold_for_graph(use_count_before);
  auto captured = std::make_unique<CapturedGraph>();
  captured->pool = pool_;
  captured->graph = std::move(graph);  // destroyed with `captured` wherever the graph is refused
  layout_trace.begun = false;
  std::vector<core::AddressRange> survivors;
  layout.retake = arena.end_capture(&survivors);
  // What f returned and changed is checked before anything is built from the graph: a refused
  // capture is neither taken again nor instantiated.
  FlatCall out;
  reason = refusal_of_results(result, effects, effect_values, effects_ok, effects_reason,
                              backward_ran, placeholders, flat, out);
  if (!reason.empty()) {
    layout.retake.clear();
    return false;
  }
  if (!layout.retake.empty() && only_results_survive(survivors, out)) {
    // Dropped before it is instantiated: the caller captures again along the plan.
    stats_.capture_ns += elapsed_ns(start);
    return false;
  }
  layout.retake.clear();
  try {
    // One executable per topology: the graph joins its group (or starts one) and is read and
    // destroyed; only the ReplayGraph stays, for PyTorch's replay prologue.
    captured->member = executables_->add(captured->graph->release_graph(),
                                         at::cuda::getCurrentCUDAStream(pool.device()).stream());
    captured->executables = executables_;
  } catch (const std::exception& e) {
    reason = std::string("instantiating the captured graph failed: ") + e.what();
    return false;
  }
  enforce_budget(captured.get());
  for (size_t i = 0; i < placeholders.size(); ++i) {
    captured->placeholders.push_back({placeholders[i].data_ptr(), span_bytes(placeholders[i]),
                                      placeholders[i]._version() != versions[i], chained[i],
                                      buffers[i]});
    stats_.alias_predictions += chained[i] || buffers[i] ? 1 : 0;
  }
  captured->effects = std::move(effects);
  pool.refresh_segments();
  std::unordered_map<const c10::StorageImpl*, int> storage_slots;
  for (const auto& t : out.tensors) {
    CapturedGraph::OutputTensor slot;
    slot.sizes = t.sizes().vec();
    slot.strides = t.strides().vec();
    slot.offset = t.storage_offset();
    slot.dtype = t.scalar_type();
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    auto found = storage_slots.find(impl);
    if (found == storage_slots.end()) {
      CapturedGraph::OutputStorage storage;
      const int input = placeholder_of(placeholders, impl);
      if (input >= 0) {
        storage.source = CapturedGraph::OutputStorage::Source::kInput;
        storage.input = input;
      } else {
        const auto range = core::make_range(t.storage().data(), t.storage().nbytes());
        if (pool.segments().contains(range)) {
          storage.source = CapturedGraph::OutputStorage::Source::kPool;
          storage.ptr = const_cast<void*>(t.storage().data());
          storage.bytes = t.storage().nbytes();
        } else {
          storage.source = CapturedGraph::OutputStorage::Source::kStatic;
        }
      }
      found = storage_slots.emplace(impl, static_cast<int>(captured->output_storages.size())).first;
      captured->output_storages.push_back(storage);
    }
    slot.storage = found->second;
    if (captured->output_storages[static_cast<size_t>(slot.storage)].source ==
        CapturedGraph::OutputStorage::Source::kStatic) {
      slot.static_tensor = t;
    }
    captured->output_tensors.push_back(std::move(slot));
  }
  captured->output_spec = std::move(out.spec);
  captured->static_tensors = gather_static_tensors(flat);
  {
    // Leaves that are not parameters of the modules (parameter arguments, optimizers' params).
    std::unordered_set<const c10::TensorImpl*> known;
    for (const auto& [tensor, ptr] : captured->static_tensors) {
      known.insert(tensor.unsafeGetTensorImpl());
    }
    for (const auto& leaf : gradients.leaves()) {
      if (known.insert(leaf.unsafeGetTensorImpl()).second) {
        captured->static_tensors.emplace_back(leaf, leaf.data_ptr());
      }
    }
  }
  captured->grad_guards = std::move(grad_guards);
  captured->hyperparameters =
      TrainingState::bake_optimizers(stepped_optimizers.get(), captured->static_tensors);
  if (!host_constants.is_none()) captured->host_constants = host_constants.attr("kept");
  into = std::move(captured);
  ++stats_.captures;
  stats_.capture_ns += elapsed_ns(start);
  // Dropping `placeholders`, `out` and `result` frees their blocks back to the pool: later
  // captures reuse them, and the registry protects what callers still hold.
  return true;
}

// A graph fits a call perfectly when every input it chained is in place and it copies no input
// that a capture could chain.
bool Runtime::fits(const CapturedGraph& g, const FlatCall& flat) const {
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const at::Tensor& t = flat.tensors[i];
    const auto& ph = g.placeholders[i];
    if (t.data_ptr() == ph.ptr && is_whole_storage(t, ph.bytes)) continue;  // in place
    if (ph.chained || ph.buffer || can_alias(flat, i, nullptr)) return false;
  }
  return true;
}

CapturedGraph& Runtime::select_graph(Entry& entry, FlatCall& flat, const py::args& args,
                                     const py::kwargs& kwargs) {
  CapturedGraph& base = *entry.graph;
  if (!alias_prediction_ || fits(base, flat)) return base;
  for (auto& variant : entry.chain_variants) {
    if (fits(*variant, flat)) return *variant;
  }
  if (ranks_agree_) return base;  // a capture one rank alone would take
  bool chainable = false;
  for (size_t i = 0; i < flat.tensors.size(); ++i) chainable |= can_alias(flat, i, nullptr);
  if (!chainable || entry.chain_variants.size() >= kMaxChainVariants) return base;
  // Capture a variant that reads these outputs in place. A loop over one shape settles on two
  // variants that feed each other (each lays out its output around the other's input).
  flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/true, /*with_paths=*/false);
  std::unique_ptr<CapturedGraph> variant;
  std::string reason;
  py::object error = py::none();
  bool out_of_memory = false;
  if (!capture_with_retry(flat, variant, reason, error, out_of_memory,
                          entry.pin_host_constants)) {
    ++stats_.capture_failures;
    return base;
  }
  ++stats_.chain_variants;
  entry.chain_variants.push_back(std::move(variant));
  return *entry.chain_variants.back();
}

void Runtime::patch_ahead(const cuda::SharedExecutables::Member& launched) {
  // Graphs tend to follow one another in the same order (a generation's growing shapes): the
  // graph that followed this one the last two times is patched in now, while this one runs. A
  // successor seen once predicts nothing in a shuffled order (an epoch's batches), where a
  // patch ahead would only be undone by the next launch.
  auto key = [](const cuda::SharedExecutables::Member& m) {
    return (static_cast<uint64_t>(m.group) << 32) | m.shape;
  };
  if (last_launched_.valid()) {
    Successor& s = successor_[key(last_launched_)];
    s.confirmed = key(s.next) == key(launched);
    s.next = launched;
  }
  last_launched_ = launched;
  auto next = successor_.find(key(launched));
  if (next != successor_.end() && next->second.confirmed &&
      next->second.next.group == launched.group) {
    executables_->prepare_ahead(next->second.next);
  }
}

bool Runtime::replay(Entry& entry, CapturedGraph& g, FlatCall& flat, py::object& result,
                     std::string& refusal) {
  const auto replay_start = std::chrono::steady_clock::now();
  GraphPool& pool = *pool_;
  const size_t n = flat.tensors.size();
  // A gradient the step replaces and nothing else holds is dropped now, as eager drops it, so
  // this replay need not move it out of its way.
  for (const auto& e : g.effects) {
    if (!e.leaf.defined()) continue;
    at::Tensor& grad = e.leaf.mutable_grad();
    if (grad.defined() && held_by_leaf_only(grad)) grad.reset();
  }
  pool.prune_live();

  // Describe this call's memory for the plan (see Note [Liveness of graph outputs]).
  std::vector<c10::StorageImpl*> impls;
  std::vector<core::PlanStorage> storages;
  std::vector<core::PlanInput> inputs(n);
  std::vector<core::PlanPlaceholder> placeholders(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = flat.tensors[i];
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    int s = -1;
    for (size_t j = 0; j < impls.size(); ++j) {
      if (impls[j] == impl) s = static_cast<int>(j);
    }
    if (s < 0) {
      s = static_cast<int>(impls.size());
      impls.push_back(impl);
      storages.push_back({core::make_range(impl->data(), impl->nbytes()),
                          pool.find_live(impl) != nullptr});
    }
    const size_t bytes = g.placeholders[i].bytes;
    inputs[i] = {s, core::make_range(t.data_ptr(), bytes), is_whole_storage(t, bytes)};
    placeholders[i] = {core::make_range(g.placeholders[i].ptr, bytes), g.placeholders[i].mutated};
  }
  const core::ReplayPlan plan = core::plan_replay(storages, inputs, placeholders);
  if (!plan.safe()) {
    refusal = plan.unsafe_reason;
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& buffer = g.placeholders[i].buffer;
    if (buffer && plan.actions[i] != core::InputAction::kNone && buffer->in_use.load()) {
      refusal = "the graph's input buffer for argument " + std::to_string(i) +
                " is held by another tensor";
      return false;
    }
  }

  c10::cuda::CUDAGuard device_guard(pool.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(pool.device()).stream();

  // The executable, patched to this graph's parameters. Launches already queued keep theirs.
  cudaGraphExec_t exec = nullptr;
  try {
    exec = g.executables->prepare(g.member, stream, last_was_replay_);
  } catch (const std::exception& e) {
    refusal = e.what();
    return false;
  }
  enforce_budget(&g);

  // 1. Evacuate live outputs the replay may overwrite: all of them but the inputs that stay put
  //    or move into their placeholders.
  std::vector<c10::StorageImpl*> evacuated;
  for (const auto& live : pool.live()) {
    c10::StorageImpl* impl = live.storage._unsafe_get_target();
    bool keep = false;
    for (size_t j = 0; j < impls.size(); ++j) {
      if (impls[j] == impl) {
        keep = std::find(plan.evacuate.begin(), plan.evacuate.end(), static_cast<int>(j)) ==
               plan.evacuate.end();
      }
    }
    if (!keep) evacuated.push_back(impl);
  }
  stats_.bytes_evacuated += static_cast<int64_t>(pool.evacuate(evacuated, stream));
  stats_.evacuations += static_cast<int64_t>(evacuated.size());

  // 2. Feed the placeholders.
  std::vector<cuda::CopySegment> segments;
  for (size_t i = 0; i < n; ++i) {
    const auto action = plan.actions[i];
    const auto& ph = g.placeholders[i];
    if (ph.chained || ph.buffer) {
      if (action == core::InputAction::kNone) {
        ++stats_.alias_hits;
        stats_.bytes_avoided += static_cast<int64_t>(ph.bytes);
      } else {
        ++stats_.alias_misses;
      }
    }
    if (action == core::InputAction::kNone) {
      ++stats_.inputs_in_place;
      continue;
    }
    if (ph.bytes == 0) continue;
    if (sites_ && action == core::InputAction::kCopyIn) sites_->resume_learning();
    segments.push_back({flat.tensors[i].data_ptr(), ph.ptr, ph.bytes});
    stats_.bytes_copied_in += static_cast<int64_t>(ph.bytes);
  }
  if (!segments.empty()) {
    check_copy(cuda::launch_batched_copy(segments, stream));
    segments.clear();
  }
  for (size_t i = 0; i < n; ++i) {
    if (plan.actions[i] == core::InputAction::kMoveIn) {
      pool.move_into(impls[static_cast<size_t>(inputs[i].storage)], g.placeholders[i].ptr);
      ++stats_.inputs_moved;
    }
  }

  // 3. Replay, then write in-place updates back to inputs that do not live in their placeholder.
  const auto launch_start = std::chrono::steady_clock::now();
  g.graph->launch(exec);
  last_was_replay_ = true;
  stats_.launch_ns += elapsed_ns(launch_start);
  for (size_t i = 0; i < n; ++i) {
    if (!plan.copy_back[i] || g.placeholders[i].bytes == 0) continue;
    segments.push_back({g.placeholders[i].ptr, flat.tensors[i].data_ptr(), g.placeholders[i].bytes});
    stats_.bytes_copied_back += static_cast<int64_t>(g.placeholders[i].bytes);
  }
  if (!segments.empty()) check_copy(cuda::launch_batched_copy(segments, stream));
  patch_ahead(g.member);

  // 4. Outputs: fresh tensors over pool memory, views of inputs, or static tensors.
  std::vector<c10::Storage> out_storages(g.output_storages.size());
  for (size_t s = 0; s < g.output_storages.size(); ++s) {
    const auto& slot = g.output_storages[s];
    if (slot.source == CapturedGraph::OutputStorage::Source::kPool) {
      out_storages[s] = pool.hand_out(slot.ptr, slot.bytes);
    } else if (slot.source == CapturedGraph::OutputStorage::Source::kInput) {
      out_storages[s] = flat.tensors[static_cast<size_t>(slot.input)].storage();
    }
  }
  std::vector<py::object> leaves;
  leaves.reserve(g.output_tensors.size());
  const auto key_set = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  for (const auto& slot : g.output_tensors) {
    if (slot.static_tensor.defined()) {
      leaves.push_back(py::reinterpret_steal<py::object>(THPVariable_Wrap(slot.static_tensor)));
      continue;
    }
    const auto& storage_slot = g.output_storages[static_cast<size_t>(slot.storage)];
    int64_t offset = slot.offset;
    if (storage_slot.source == CapturedGraph::OutputStorage::Source::kInput) {
      offset += flat.tensors[static_cast<size_t>(storage_slot.input)].storage_offset();
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(out_storages[static_cast<size_t>(slot.storage)]), key_set,
        caffe2::TypeMeta::fromScalarType(slot.dtype));
    impl->set_sizes_and_strides(slot.sizes, slot.strides, offset);
    leaves.push_back(
        py::reinterpret_steal<py::object>(THPVariable_Wrap(at::Tensor(std::move(impl)))));
  }
  if (g.effects.empty()) {
    result = unflatten(g.output_spec, leaves, &flat.records);
  } else {
    py::tuple both = unflatten(g.output_spec, leaves, &flat.records);
    apply_effects(flat.records, g.effects, both[1]);
    result = both[0];
  }
  ++stats_.replays;
  ++entry.replays;
  stats_.replay_ns += elapsed_ns(replay_start);
  return true;
}

#else  // GRAPE_WITH_CUDA

bool Runtime::capture(FlatCall&, std::unique_ptr<CapturedGraph>&, std::string& reason,
                      py::object&, bool& out_of_memory, bool, CaptureLayout&) {
  out_of_memory = false;
  reason = "grape was built without CUDA";
  return false;
}
bool Runtime::replay(Entry&, CapturedGraph&, FlatCall&, py::object&, std::string& refusal) {
  refusal = "grape was built without CUDA";
  return false;
}

#endif  // GRAPE_WITH_CUDA

py::dict Runtime::stats() {
  py::dict d;
  d["calls"] = stats_.calls;
  d["replays"] = stats_.replays;
  d["captures"] = stats_.captures;
  d["warmup_calls"] = stats_.warmup_calls;
  d["eager_calls"] = stats_.eager_calls;
  d["recaptures"] = stats_.recaptures;
  d["capture_failures"] = stats_.capture_failures;
  d["capture_seconds"] = static_cast<double>(stats_.capture_ns) * 1e-9;
  d["replay_seconds"] = static_cast<double>(stats_.replay_ns) * 1e-9;
  d["launch_seconds"] = static_cast<double>(stats_.launch_ns) * 1e-9;
  d["bytes_copied_in"] = stats_.bytes_copied_in;
  d["bytes_copied_back"] = stats_.bytes_copied_back;
  d["bytes_evacuated"] = stats_.bytes_evacuated;
  d["inputs_moved"] = stats_.inputs_moved;
  d["inputs_in_place"] = stats_.inputs_in_place;
  d["evacuations"] = stats_.evacuations;
  d["alias_prediction"] = alias_prediction_;
  d["alias_predictions"] = stats_.alias_predictions;
  d["alias_hits"] = stats_.alias_hits;
  d["alias_misses"] = stats_.alias_misses;
  d["bytes_avoided"] = stats_.bytes_avoided;
  d["chain_variants"] = stats_.chain_variants;
  d["capture_oom_retries"] = stats_.capture_oom_retries;
  d["replanned_captures"] = stats_.replanned_captures;
  d["replans_diverged"] = stats_.replans_diverged;
  int64_t pinning = 0;
  for (const auto& [signature, entry] : cache_) pinning += entry->pin_host_constants ? 1 : 0;
  d["pinned_host_constants"] = pinning;
  d["last_recapture_reason"] =
      last_recapture_reason_.empty() ? py::object(py::none()) : py::str(last_recapture_reason_);
  d["warmup_each_signature"] = warmup_each_signature_;
  d["memory_budget"] = memory_budget_ < 0 ? py::object(py::none()) : py::int_(memory_budget_);
  cuda::ExecutableStats ex;
  std::string unshareable_reason;
#ifdef GRAPE_WITH_CUDA
  ex = executables_->stats();
  unshareable_reason = executables_->unshareable_reason();
#endif
  d["shapes"] = ex.members;
  d["topology_groups"] = ex.groups;
  d["unshareable_groups"] = ex.unshareable;
  d["unshareable_reason"] =
      unshareable_reason.empty()
          ? py::object(py::none())
          : py::str("graphs cannot share executables: " + unshareable_reason);
  d["resident_executables"] = ex.resident;
  d["executable_bytes"] = static_cast<int64_t>(ex.device_bytes);
  d["cached_executable_bytes"] = static_cast<int64_t>(ex.cached_bytes);
  d["executable_cache"] =
      executable_cache_ < 0 ? py::object(py::none()) : py::int_(executable_cache_);
  d["instantiations"] = ex.instantiations;
  d["evictions"] = ex.evictions;
  d["graphs_joined"] = ex.joins;
  d["graphs_joined_near"] = ex.near_joins;
  d["topology_unions"] = ex.unions;
  d["kernels_swapped_near"] = ex.near_swaps;
  d["union_extra_nodes"] = ex.union_extra_nodes;
  py::dict refusals;
  refusals["far"] = ex.near_refused_far;
  refusals["unaligned"] = ex.near_refused_unaligned;
  refusals["edits"] = ex.near_refused_edits;
  refusals["no_noop"] = ex.near_refused_no_noop;
  refusals["driver"] = ex.near_refused_driver;
  d["near_join_refusals"] = refusals;
  d["executable_switches"] = ex.switches;
  d["patches_ahead"] = ex.patches_ahead;
  d["nodes_patched"] = ex.nodes_patched;
  d["kernels_swapped"] = ex.kernels_swapped;
  d["patch_seconds"] = static_cast<double>(ex.patch_ns) * 1e-9;
  d["params_bytes"] = static_cast<int64_t>(ex.params_bytes);
  d["params_raw_bytes"] = static_cast<int64_t>(ex.params_raw_bytes);
  core::SiteStats sites;
#ifdef GRAPE_WITH_CUDA
  if (sites_) sites = sites_->stats();
#endif
  d["input_sites"] = sites.sites;
  d["site_allocations"] = sites.site_allocations;
  d["site_buffers_busy"] = sites.site_buffers_busy;
  d["input_buffer_bytes"] = sites.buffer_bytes;
  int64_t graphs = 0;
  for (const auto& kv : cache_) graphs += kv.second->graph ? 1 : 0;
  d["graphs"] = graphs;
  d["signatures"] = static_cast<int64_t>(cache_.size());
#ifdef GRAPE_WITH_CUDA
  if (pool_) {
    pool_->refresh_segments();
    pool_->prune_live();
    d["pool_bytes"] = static_cast<int64_t>(pool_->device_bytes());
    d["arena_bytes"] = static_cast<int64_t>(pool_->arena().mapped_bytes());
    d["arena_lane_bytes"] = py::dict(
        py::arg("large") = pool_->arena().mapped_bytes(ArenaLane::kLarge),
        py::arg("small") = pool_->arena().mapped_bytes(ArenaLane::kSmall),
        py::arg("placeholder") = pool_->arena().mapped_bytes(ArenaLane::kPlaceholder),
        py::arg("input") = pool_->arena().mapped_bytes(ArenaLane::kInput));
    d["arena_lane_peak_bytes"] = py::dict(
        py::arg("large") = pool_->arena().peak_allocated_bytes(ArenaLane::kLarge),
        py::arg("small") = pool_->arena().peak_allocated_bytes(ArenaLane::kSmall),
        py::arg("placeholder") = pool_->arena().peak_allocated_bytes(ArenaLane::kPlaceholder),
        py::arg("input") = pool_->arena().peak_allocated_bytes(ArenaLane::kInput));
    d["live_outputs"] = static_cast<int64_t>(pool_->live().size());
  } else {
    d["pool_bytes"] = 0;
    d["arena_bytes"] = 0;
    d["live_outputs"] = 0;
  }
#else
  d["pool_bytes"] = 0;
  d["arena_bytes"] = 0;
  d["live_outputs"] = 0;
#endif
  d["fallback"] = global_fallback_.empty() ? py::object(py::none()) : py::str(global_fallback_);
  return d;
}

py::list Runtime::entries() const {
  py::list list;
  for (const auto& kv : cache_) {
    const Entry& e = *kv.second;
    py::dict d;
    d["signature"] = e.description;
    d["state"] = !e.fallback_reason.empty() ? "eager" : (e.graph ? "graph" : "warmup");
    d["reason"] = e.fallback_reason;
    d["replays"] = e.replays;
    list.append(d);
  }
  return list;
}

void Runtime::reset() {
  for (auto& kv : cache_) {
    if (kv.second->graph) retire(std::move(kv.second->graph));
    for (auto& variant : kv.second->chain_variants) retire(std::move(variant));
  }
  cache_.clear();
  function_warmup_runs_ = 0;
  checked_cuda_ = false;
  global_fallback_.clear();
#ifdef GRAPE_WITH_CUDA
  if (sites_) sites_->restart_learning();
#endif
}

int Runtime::traverse(visitproc visit, void* arg) {
  Py_VISIT(fn_.ptr());
  Py_VISIT(static_module_.ptr());
  return training_.traverse(visit, arg);
}

void Runtime::clear_references() {
  cache_.clear();
  retired_.clear();
  fn_ = py::none();
  static_module_ = py::none();
  training_.clear();
}

}  // namespace grape
