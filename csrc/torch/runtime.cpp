// The Runtime's side that every build shares: its life, its entry to a call, and what it reports.
// A call's way through warm-up, capture and replay is runtime_graphs.cpp's.
#include "torch/runtime.h"

#include <utility>

#include "core/clock.h"
#include "core/forked.h"
#include "torch/call_lock.h"
#include "torch/graph_types.h"
#include "torch/python/python_scopes.h"

namespace grape {

Entry::Entry() = default;
Entry::~Entry() = default;

Runtime::Runtime(py::object fn, int warmup, bool warmup_each_signature, py::object static_module,
                 bool alias_prediction, const std::string& sharing,
                 std::optional<size_t> executable_cache, std::optional<size_t> memory_budget,
                 py::object hooks)
    : fn_(std::move(fn)),
      static_module_(std::move(static_module)),
      hooks_(std::move(hooks)),
      training_(hooks_),
      warmup_{warmup, warmup_each_signature},
      chain_{alias_prediction},
      executable_cache_(executable_cache),
      budget_(memory_budget) {
  TORCH_CHECK(PyCallable_Check(fn_.ptr()), "grape.compile expects a callable, got ",
              Py_TYPE(fn_.ptr())->tp_name);
  TORCH_CHECK(warmup >= 0, "grape.compile: warmup must be >= 0, got ", warmup);
  TORCH_CHECK(sharing == "none" || sharing == "topology" || sharing == "near",
              "grape.compile: executable sharing must be 'none', 'topology' or 'near', got '",
              sharing, "'");
  make_graph_state(alias_prediction, sharing);
}

Runtime::~Runtime() {
  if (core::forked_child()) {
    leave_to_process_end();
    return;
  }
  // Graphs before the pool they allocate from.
  cache_.clear();
  retired_.clear();
}

void Runtime::leave_to_process_end() {
  // A forked child holds its parent's graphs, executables and memory, which no CUDA call of its
  // own may touch: they stay as they are until the process ends.
  new auto(std::move(cache_));
  new auto(std::move(retired_));
  new auto(std::move(executables_));
  new auto(std::move(pool_));
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

void Runtime::set_fallback(Entry& entry, core::Reason reason, const py::object& error) {
  entry.fallback = std::move(reason);
  entry.graph.reset();
  entry.chain_variants.clear();
  hooks_.report_fallback(entry.description, entry.fallback, error);
}

bool Runtime::warming_up(const Entry& entry) const {
  return !entry.graph && warmup_.warming_up(entry.warmup_runs, function_warmup_runs_);
}

std::string Runtime::describe(const FlatCall& flat) const {
  std::string s = "(";
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    if (i) s += ", ";
    s += describe_tensor(flat.tensors[i]);
  }
  return s + ")";
}

void Runtime::retire(std::unique_ptr<CapturedGraph> graph) {
  release_executable(*graph);
  retired_.push_back(std::move(graph));
}

py::object Runtime::call(py::args args, py::kwargs kwargs) {
  ++stats_.calls;
  if (!checked_cuda_) {
    checked_cuda_ = true;
    global_fallback_ = graphs_unavailable();
    if (!global_fallback_.empty()) hooks_.report_fallback("", global_fallback_, py::none());
  }
  if (!global_fallback_.empty()) {
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }

  return call_with_graphs(args, kwargs);
}


py::list Runtime::entries() const {
  py::list list;  // no call lock, as stats() (runtime_stats.cpp)
  for (const auto& kv : cache_) {
    const Entry& e = *kv.second;
    py::dict d;
    d["signature"] = e.description;
    const bool deferred = e.fallback.empty() && !e.graph && e.out_of_memory.deferred();
    const core::Reason& reason = deferred ? e.out_of_memory_reason : e.fallback;
    d["state"] = !e.fallback.empty() ? "eager" : (e.graph ? "graph" : (deferred ? "deferred" : "warmup"));
    d["reason"] = reason.text;
    d["kind"] = core::reason_kind_name(reason.kind);
    d["replays"] = e.replays;
    d["chain_variants"] = e.chain_variants.size();
    d["nodes"] = node_count(e);
    const Entry::Costs& c = e.costs;
    d["seconds"] = py::dict(
        py::arg("warmup") = core::seconds(c.warmup_ns),
        py::arg("capture") = core::seconds(c.capture_ns),
        py::arg("read") = core::seconds(c.read_ns), py::arg("join") = core::seconds(c.join_ns),
        py::arg("instantiate") = core::seconds(c.instantiate_ns),
        py::arg("variants") = core::seconds(c.variant_ns));
    list.append(d);
  }
  return list;
}

void Runtime::reset() {
  const CallLock lock(/*unless_busy=*/&in_backward_pass);
  TORCH_CHECK(lock.held(), "grape: reset() from a backward pass while another thread's compiled "
              "call runs, which may be waiting for this backward pass: reset it outside");
  for (auto& kv : cache_) {
    if (kv.second->graph) retire(std::move(kv.second->graph));
    for (auto& variant : kv.second->chain_variants) retire(std::move(variant));
  }
  cache_.clear();
  // The graph cache is read again at the next call: its groups' live captures are gone.
  graph_cache_.reset();
  graph_cache_opened_ = false;
  previous_entry_ = nullptr;
  function_warmup_runs_ = 0;
  checked_cuda_ = false;
  global_fallback_ = {};
  restart_site_learning();
}

int Runtime::traverse(visitproc visit, void* arg) {
  Py_VISIT(fn_.ptr());
  Py_VISIT(static_module_.ptr());
  if (int r = hooks_.traverse(visit, arg)) return r;
  return training_.traverse(visit, arg);
}

void Runtime::clear_references() {
  previous_entry_ = nullptr;
  if (core::forked_child()) leave_to_process_end();
  cache_.clear();
  retired_.clear();
  graph_cache_.reset();
  fn_ = py::none();
  static_module_ = py::none();
  training_.clear();
  hooks_.clear();
}

}  // namespace grape
