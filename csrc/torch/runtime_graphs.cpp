// The Runtime's side that needs CUDA (built where GRAPE_WITH_CUDA is; runtime_without_cuda.cpp
// stands in for it elsewhere): a call's way through its signature's warm-up, capture and replay,
// and the graph state those share.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include "core/clock.h"
#include "core/forked.h"
#include "cuda/shared_executables.h"
#include "torch/call_lock.h"
#include "torch/graphs/capture.h"
#include "torch/graphs/captured_graph.h"
#include "torch/graphs/replay.h"
#include "torch/memory/budget.h"
#include "torch/memory/capture_state.h"
#include "torch/memory/graph_pool.h"
#include "torch/memory/site_predictor.h"
#include "torch/python/python_scopes.h"
#include "torch/runtime.h"

namespace grape {

namespace allocator = c10::cuda::CUDACachingAllocator;

void Runtime::make_graph_state(bool alias_prediction, const std::string& sharing) {
  using Sharing = cuda::SharedExecutables::Sharing;
  if (alias_prediction) sites_ = std::make_unique<InputSites>();
  executables_ = std::make_shared<cuda::SharedExecutables>(
      sharing == "none" ? Sharing::kNone
                        : (sharing == "near" ? Sharing::kNearTopologies : Sharing::kTopology),
      executable_cache_.value_or(core::kNoLimit),
      cuda::SharedExecutables::SlotGrowth::kWhenGpuWaits);
}

core::Reason Runtime::graphs_unavailable() {
  if (c10::cuda::device_count() == 0) return {core::ReasonKind::kNoCuda, "CUDA is not available"};
  return {};
}

void Runtime::release_executable(CapturedGraph& graph) {
  // Its executable slot is freed now: a retired graph never replays again.
  if (graph.executables) graph.executables->remove(graph.member);
  graph.member = {};
}

int64_t Runtime::node_count(const Entry& entry) { return entry.graph ? entry.graph->nodes : 0; }

void Runtime::restart_site_learning() {
  if (sites_) sites_->restart_learning();
}

Runtime::GraphFigures Runtime::graph_figures() {
  GraphFigures f;
  f.executables = executables_->stats();
  f.unshareable_reason = executables_->unshareable_reason();
  if (sites_) f.sites = sites_->stats();
  if (!pool_) return f;
  pool_->refresh_segments();
  pool_->prune_live();
  const GraphArena& arena = pool_->arena();
  f.pool_bytes = static_cast<int64_t>(pool_->device_bytes());
  f.arena_bytes = static_cast<int64_t>(arena.mapped_bytes());
  static_assert(GraphFigures::kLanes == GraphArena::kLanes, "a figure for every lane");
  for (int lane = 0; lane < GraphArena::kLanes; ++lane) {
    f.lane_bytes[lane] = arena.mapped_bytes(static_cast<ArenaLane>(lane));
    f.lane_peak_bytes[lane] = arena.peak_allocated_bytes(static_cast<ArenaLane>(lane));
  }
  f.live_outputs = static_cast<int64_t>(pool_->live().size());
  return f;
}

py::object Runtime::call_with_graphs(const py::args& args, const py::kwargs& kwargs) {
  if (core::forked_child()) {
    global_fallback_ = {core::ReasonKind::kForked,
                        "this process was forked from one that captured CUDA graphs, whose "
                        "graphs, streams and memory are the parent's (start child processes that "
                        "use CUDA with the 'spawn' method)"};
    hooks_.report_fallback("", global_fallback_, py::none());
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }
  // Inside another capture (a compiled function calling this one, or a user's torch.cuda.graph),
  // the calls are recorded into that capture.
  if (current_stream_is_capturing()) return run_eager(args, kwargs);
  // Note [One compiled call at a time]. From a backward pass, the holder may be waiting for it.
  const CallLock lock(/*unless_busy=*/&in_backward_pass);
  if (!lock.held()) {
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }

  CallScope call_scope;  // the caller's allocations from here on are not predicted
  FlatCall& flat = scratch();
  struct DepthGuard {
    size_t& depth;
    explicit DepthGuard(size_t& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
  } depth_guard{depth_};
  flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/false, /*with_paths=*/false);

  auto it = cache_.find(flat.signature);
  if (it == cache_.end()) {
    auto entry = std::make_unique<Entry>();
    entry->description = describe(flat);
    open_graph_cache();  // at the first new signature: a replay never comes here
    find_in_graph_cache(*entry, flat);
    it = cache_.emplace(flat.signature, std::move(entry)).first;
  }
  Entry& entry = *it->second;
  const bool repeated = previous_entry_ == &entry;
  previous_entry_ = &entry;
  if (sites_) {
    sites_->begin_call();
    if (entry.fallback.empty()) learn_sites(flat, /*warm_up=*/warming_up(entry));
  }
  if (!entry.fallback.empty() || entry.out_of_memory.waits()) {
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }
  if (entry.graph && !drop_if_state_changed(entry)) {
    return replay_or_run_eagerly(entry, select_graph(entry, repeated, flat, args, kwargs), flat,
                                 args, kwargs);
  }

  // Arguments no graph can take: the signature runs eagerly.
  const core::Reason refusal = refusal_of_arguments(args, kwargs, flat);
  if (!refusal.empty()) {
    set_fallback(entry, refusal, py::none());
    ++stats_.eager_calls;
    return run_eager(args, kwargs);
  }
  // A shape of a validated group of the graph cache replays without a capture.
  if (restore_from_graph_cache(entry)) {
    return replay_or_run_eagerly(entry, *entry.graph, flat, args, kwargs);
  }
  if (warming_up(entry) || training_.defers_capture()) return warm_up(entry, args, kwargs);
  // Capture with the spec of the arguments, so placeholders can stand in for the tensors.
  flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/true, /*with_paths=*/false);
  if (auto eager = capture_entry(entry, flat, args, kwargs)) return *eager;
  validate_graph_cache(entry);
  const int64_t replays = stats_.replays;
  py::object result;
  try {
    result = replay_or_run_eagerly(entry, *entry.graph, flat, args, kwargs);
  } catch (...) {
    settle_graph_cache(entry, /*replayed=*/false);  // a pending group is dropped, untested
    throw;
  }
  settle_graph_cache(entry, stats_.replays > replays);
  return result;
}

namespace allocator = c10::cuda::CUDACachingAllocator;

bool Runtime::drop_if_state_changed(Entry& entry) {
  std::string changed;
  auto change = entry.graph->static_state_change(changed);
  if (change == CapturedGraph::StateChange::kNone &&
      !write_device_settings(entry.graph->device_settings, changed)) {
    change = CapturedGraph::StateChange::kOptimizerSetting;
  }
  if (change == CapturedGraph::StateChange::kNone) return false;
  ++stats_.recaptures;
  if (change == CapturedGraph::StateChange::kOptimizerSetting && !warned_settings_) {
    warned_settings_ = true;
    const std::string message =
        "grape: " + changed + ": capturing the step again. A setting that changes every step "
        "makes every step a capture. Graphs read a float lr from device memory for Adam and AdamW "
        "(capturable or fused) and fused SGD; a setting the optimizer reads on the host, such as "
        "the betas or momentum that OneCycleLR and CyclicLR cycle, needs a capture per value "
        "(OneCycleLR(cycle_momentum=False) keeps them constant)";
    if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0) throw py::error_already_set();
  }
  last_recapture_reason_ = std::move(changed);
  retire(std::move(entry.graph));
  for (auto& variant : entry.chain_variants) retire(std::move(variant));
  entry.chain_variants.clear();
  return true;
}

py::object Runtime::warm_up(Entry& entry, const py::args& args, const py::kwargs& kwargs) {
  ++entry.warmup_runs;
  ++function_warmup_runs_;
  ++stats_.warmup_calls;
  const auto start = core::Clock::now();
  py::object result;
  {
    EnteredContext watch(training_.step_watch());  // optimizers it steps become capturable
    result = run_eager(args, kwargs);
    training_.remember_refusal(watch.get());
  }
  const int64_t ns = core::elapsed_ns(start);
  entry.costs.warmup_ns += ns;
  stats_.warmup_ns += ns;
  return result;
}

core::Reason Runtime::refusal_of_arguments(const py::args& args, const py::kwargs& kwargs,
                                           const FlatCall& flat) {
  if (!flat.unsupported.empty()) {
    FlatCall with_paths;
    flattener_.flatten_call(args, kwargs, with_paths, false, /*with_paths=*/true);
    return {core::ReasonKind::kUnsupportedArgument,
            "argument " + with_paths.unsupported_path + " is a " + flat.unsupported};
  }
  if (flat.tensors.empty()) return {};
  const c10::DeviceIndex device = pool_ ? pool_->device() : flat.tensors.front().device().index();
  for (const auto& t : flat.tensors) {
    if (t.device().index() != device) {
      return {core::ReasonKind::kUnsupportedArgument,
              "inputs on several devices (cuda:" + std::to_string(device) + " and " +
                  t.device().str() + "); a compiled function runs on one device"};
    }
  }
  return {};
}

std::optional<py::object> Runtime::capture_entry(Entry& entry, FlatCall& flat,
                                                 const py::args& args, const py::kwargs& kwargs) {
  CaptureOutcome outcome;
  // Known from a warm-up to fail half-way, leaving state the eager run would read: not tried.
  const bool known_to_fail = !training_.refusal().empty();
  if (known_to_fail) {
    outcome.reason = {core::ReasonKind::kHostSync, training_.refusal()};
  } else {
    outcome = capture_with_retry(entry, flat, /*variant=*/false);
    if (outcome.graph) {
      entry.graph = std::move(outcome.graph);
      entry.out_of_memory.succeeded();
    } else {
      ++stats_.capture_failures;
    }
  }
  if (entry.graph) return std::nullopt;
  const core::AfterFailure after = known_to_fail
                                       ? core::AfterFailure::kFallBack
                                       : core::after_failed_capture(warmup_, entry.warmup_runs,
                                                                    outcome.reason.kind);
  if (after == core::AfterFailure::kWarmUpAndRetry) {
    // This call is its warm-up; the next one captures again, and falls back if that fails too.
    warmup_.failed_at_first_sight();
    outcome.error = py::none();
    return warm_up(entry, args, kwargs);
  }
  if (after == core::AfterFailure::kRetryLater) {
    outcome.error = py::none();
    return defer_after_out_of_memory(entry, std::move(outcome.reason), args, kwargs);
  }
  set_fallback(entry, std::move(outcome.reason), outcome.error);
  // The error's traceback holds f's frames: what they reference (an autograd graph whose nodes
  // run on the capture stream) must not outlive the capture into the eager run.
  outcome.error = py::none();
  ++stats_.eager_calls;
  return run_eager(args, kwargs);
}

py::object Runtime::defer_after_out_of_memory(Entry& entry, core::Reason reason,
                                              const py::args& args, const py::kwargs& kwargs) {
  const bool first = !entry.out_of_memory.deferred();
  entry.out_of_memory.failed();
  entry.out_of_memory_reason = reason;
  if (first) {
    reason.text += " (this call runs eagerly, and the signature is captured again later)";
    hooks_.report_fallback(entry.description, reason, py::none());
  }
  ++stats_.eager_calls;
  return run_eager(args, kwargs);
}

CaptureContext Runtime::capture_context(FlatCall& flat) {
  const int device = flat.tensors.empty() ? c10::cuda::current_device()
                                          : flat.tensors.front().device().index();
  pool_for(device);
  return CaptureContext{
      fn_, static_module_, flattener_, pool_, executables_, training_, hooks_, budget_,
      function_warmup_runs_ > 0,
      [this](const FlatCall& f, size_t i, std::shared_ptr<InputBuffer>* buffer) {
        return can_alias(f, i, buffer);
      }};
}

CaptureOutcome Runtime::capture_with_retry(Entry& entry, FlatCall& flat, bool variant) {
  last_was_replay_ = false;
  const CaptureContext context = capture_context(flat);
  core::CaptureTries tries;
  tries.pinned = entry.pin_host_constants;
  std::vector<core::LayoutPlan> plan;
  // Every try's time is the signature's cost, failed ones included.
  struct ChargeEntry {
    Entry& entry;
    const cuda::SharedExecutables& executables;
    bool variant;
    core::Clock::time_point start = core::Clock::now();
    cuda::ExecutableStats before = executables.counters();
    ~ChargeEntry() {
      const int64_t ns = core::elapsed_ns(start);
      const cuda::ExecutableStats& after = executables.counters();
      entry.costs.capture_ns += ns;
      entry.costs.read_ns += after.read_ns - before.read_ns;
      entry.costs.join_ns += after.join_ns - before.join_ns;
      entry.costs.instantiate_ns += after.instantiate_ns - before.instantiate_ns;
      if (variant) entry.costs.variant_ns += ns;
    }
  } charge_entry{entry, *executables_, variant};
  while (true) {
    const auto start = core::Clock::now();
    CaptureOutcome outcome = capture(context, flat, tries.pinned, plan);
    if (outcome.result == core::TryResult::kRaised) {
      // f's own exception, after the work it queued before raising has run.
      ++stats_.raised_under_capture;
      throw *outcome.raised;
    }
    if (outcome.result != core::TryResult::kFailed) {
      const int64_t ns = core::elapsed_ns(start);
      stats_.capture_ns += ns;
      stats_.capture_function_ns += outcome.function_ns;
      if (variant) stats_.chain_variant_ns += ns;
    }
    if (outcome.result == core::TryResult::kGraph) {
      ++stats_.captures;
      stats_.alias_predictions += outcome.alias_predictions;
      if (tries.along_plan) {
        ++stats_.replanned_captures;
        if (pool_->arena().plan_diverged()) ++stats_.replans_diverged;
      }
      enforce_memory_budget(budget_, *pool_, *executables_, outcome.graph->member);
      return outcome;
    }
    switch (core::next_try(outcome.result, outcome.reason.kind, tries)) {
      case core::NextTry::kAlongPlan:
        // The graph was dropped and its blocks are free: the arena maps no more than before it,
        // and the capture runs again, its allocations placed as planned.
        pool_->arena().forget_capture();
        plan = std::move(outcome.plan);
        break;
      case core::NextTry::kPinned:
        entry.pin_host_constants = true;
        plan.clear();
        break;
      case core::NextTry::kAfterFreeingMemory:
        // Free what other shapes hold but can rebuild (executables, from their base graphs) and
        // the allocator's cached blocks.
        ++stats_.capture_oom_retries;
        executables_->evict_to(0, {});
        try {
          allocator::emptyCache();
        } catch (const c10::Error&) {
          // PyTorch's allocator refuses while a graph captures in another thread (a user's own).
        }
        plan.clear();
        break;
      case core::NextTry::kNone:
        if (tries.memory_freed && outcome.reason.kind == core::ReasonKind::kOutOfMemory) {
          outcome.reason.text =
              "out of memory while capturing, after freeing executables: " + outcome.reason.text;
        }
        return outcome;
    }
  }
}

py::object Runtime::replay_or_run_eagerly(Entry& entry, CapturedGraph& graph, FlatCall& flat,
                                          const py::args& args, const py::kwargs& kwargs) {
  ReplayContext context{*pool_,  budget_,          sites_.get(),
                        stats_, last_was_replay_, copy_outputs_out_};
  ReplayOutcome outcome;
  try {
    outcome = replay(graph, flat, context);
  } catch (const c10::OutOfMemoryError& e) {
    // Nothing was launched or moved (a replay allocates only to evacuate, before it moves any
    // storage): the call runs eagerly, which raises where eager runs out too.
    outcome.refusal = std::string("out of memory before the launch: ") + e.what_without_backtrace();
  }
  // After the launch, while the GPU runs the graph (a no-op after a graph's first replay).
  graph.gather_static_tensors();
  if (outcome.replayed) {
    last_was_replay_ = true;
    ++entry.replays;
    return std::move(outcome.result);
  }
  ++stats_.eager_calls;
  if (outcome.spared_other_thread) {
    // Not a fallback: once the other thread's outputs are gone, calls replay again.
    ++stats_.eager_for_other_threads;
    copy_outputs_out_ = true;
    return run_eager(args, kwargs);
  }
  if (!entry.reported_refusal) {
    entry.reported_refusal = true;
    hooks_.report_fallback(entry.description,
                           {core::ReasonKind::kReplayRefused,
                            "replay refused, this call ran eagerly: " + outcome.refusal},
                           py::none());
  }
  return run_eager(args, kwargs);
}

GraphPool& Runtime::pool_for(int device) {
  if (!pool_) {
    pool_ = GraphPool::create(static_cast<c10::DeviceIndex>(device));
    if (sites_) sites_->attach(pool_);
  }
  return *pool_;
}

CapturedGraph& Runtime::select_graph(Entry& entry, bool repeated, FlatCall& flat,
                                     const py::args& args, const py::kwargs& kwargs) {
  const core::GraphChoice choice = core::choose_graph(
      chain_, entry.chain_variants.size(),
      [&](size_t i) { return fits(i == 0 ? *entry.graph : *entry.chain_variants[i - 1], flat); },
      [&] {
        for (size_t i = 0; i < flat.tensors.size(); ++i) {
          if (can_alias(flat, i, nullptr)) return true;
        }
        return false;
      },
      [&] { return repeated || site_buffer_held(*entry.graph, flat); },
      [&] { return !outputs_read_in_place(entry); },
      [&] {
        const int64_t capture_ns = core::CaptureCost::of(entry.graph->nodes);
        if (entry.variant_rent.charge(copies_a_variant_saves_ns(*entry.graph, flat), capture_ns)) {
          return true;
        }
        ++stats_.chain_variants_deferred;
        return false;
      });
  if (choice.kind == core::GraphChoice::Kind::kUse) {
    return choice.graph == 0 ? *entry.graph : *entry.chain_variants[choice.graph - 1];
  }
  // Capture a variant that reads these inputs in place.
  entry.variant_rent.bought();
  flattener_.flatten_call(args, kwargs, flat, /*with_spec=*/true, /*with_paths=*/false);
  CaptureOutcome outcome = capture_with_retry(entry, flat, /*variant=*/true);
  if (!outcome.graph) {
    ++stats_.capture_failures;
    return *entry.graph;
  }
  ++stats_.chain_variants;
  entry.chain_variants.push_back(std::move(outcome.graph));
  return *entry.chain_variants.back();
}

}  // namespace grape
