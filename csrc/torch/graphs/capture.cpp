#include "torch/graphs/capture.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>

#include "core/clock.h"
#include "torch/memory/allocator_hook.h"
#include "torch/memory/budget.h"
#include "torch/python/module_tensors.h"
#include "torch/python/python_scopes.h"
#include "torch/graphs/replay.h"
#include "torch/python/side_effects.h"

namespace grape {

namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;

// Note [Host constants]
// `torch.tensor(0.0, device="cuda")` builds the value on the host and copies it from pageable
// memory, which a capture refuses (Hugging Face builds attention-mask fill values so).
// grape._host_constants.PinnedHostConstants, a TorchFunctionMode, builds such tensors in pinned
// memory the graph keeps. It is entered only for signatures that need it: a signature's first
// capture runs without it, and a capture refused for a pageable copy is tried again with it, as
// are the signature's later captures (Note [Capture policy]). Entering it for every capture, or
// for every signature of a function once one needed it, would change what torch.compile'd code
// sees: Dynamo guards on the torch function mode stack, so a capture under the mode compiles the
// function again, inside the capture, where compiling fails (a Hugging Face generate whose prompt
// runs eagerly and whose decode steps run compiled code is such a function).

// The arena's trace of a capture's allocations (Note [Planned capture layouts]), from the start of
// the captured region until the blocks held to its end are freed; ended on every way out.
class LayoutTrace {
 public:
  explicit LayoutTrace(GraphArena& arena) : arena_(arena) {}
  ~LayoutTrace() { abandon(); }
  LayoutTrace(const LayoutTrace&) = delete;
  LayoutTrace& operator=(const LayoutTrace&) = delete;
  void begin(const std::vector<core::LayoutPlan>& follow) {
    arena_.begin_capture(follow);
    begun_ = true;
  }
  // The plan to capture along again, if any (GraphArena::end_capture).
  std::vector<core::LayoutPlan> end(std::vector<core::AddressRange>* survivors = nullptr) {
    if (!begun_) return {};
    begun_ = false;
    return arena_.end_capture(survivors);
  }
  // A capture that did not reach end() failed part-way: what it allocated predicts nothing.
  void abandon() {
    if (!begun_) return;
    begun_ = false;
    (void)arena_.end_capture(nullptr, /*completed=*/false);
  }

 private:
  GraphArena& arena_;
  bool begun_ = false;
};

// What a capture holds around f, released on every way out in reverse order: arenas whose last
// block died during the capture are destroyed last, once nothing captures.
class CaptureScope {
 public:
  explicit CaptureScope(GraphPool& pool) : arena_(pool.arena()) {
    // The capture stream follows the caller's stream, as torch.cuda.graph does.
    pool.wait_for(at::cuda::getCurrentCUDAStream(pool.device()));
    on_capture_stream_.emplace(pool.capture_stream());
    // Memory that callers still hold is laid out around, never over (Note [Capture arena layout]).
    pool.prune_live();
    for (const auto& live : pool.live()) arena_.pin(live.range);
  }
  ~CaptureScope() { arena_.unpin_all(); }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  struct DestroyReleasedArenas {
    ~DestroyReleasedArenas() { GraphArena::destroy_released(); }
  } destroy_released_arenas_;
  const GarbageCollectionPaused no_collection_while_capturing_;
  GraphArena& arena_;
  std::optional<at::cuda::CUDAStreamGuard> on_capture_stream_;
};

cudaStreamCaptureStatus capture_status(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) (void)cudaGetLastError();
  return status;
}

// Ends a capture that failed part-way and puts PyTorch's state back where it was before it: no
// stream capturing, the generators out of capture mode (Note [Generators of a failed capture]),
// the caching allocator's and the pinned-host allocator's pool bookkeeping balanced. Torch
// versions differ in how much of this CUDAGraph::capture_end and reset() do themselves, so we
// compare the pool's use count with its value before the capture rather than assume either. The
// capture stream is ours alone while the call lock is held (Note [One compiled call at a time]).
void abort_capture(std::unique_ptr<ReplayGraph>& graph, GraphPool& pool, int use_count_before) {
  cudaStream_t stream = pool.capture_stream().stream();
  if (capture_status(stream) != cudaStreamCaptureStatusNone) {
    try {
      graph->capture_end();
    } catch (const std::exception&) {
    }
    if (capture_status(stream) != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream, &partial);
      if (partial != nullptr) (void)cudaGraphDestroy(partial);
    }
  }
  graph->abandon_capture();
  (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
  graph.reset();
  if (pool.allocator_use_count() > use_count_before) {
    try {
      allocator::endAllocateToPool(pool.device(), pool.id());
    } catch (const std::exception&) {
    }
    pool.release_to(use_count_before);
  }
  pool.end_host_recording();
}

// Ends the capture of a function that raised, keeping what it recorded up to the raise (Note
// [Exceptions under capture]); false where the capture cannot end cleanly.
bool end_partial_capture(ReplayGraph& graph) {
  // An empty graph (f raised before queueing work) is no news worth PyTorch's warning.
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard no_warnings(&quiet);
  try {
    graph.capture_end();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// "Type: message" (the message's first line); the type alone where its __str__ raises, so that
// f's exception is never replaced by one of its message.
std::string python_error_text(const py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string text;
  try {
    text = py::str(e.value());
  } catch (py::error_already_set& str_failed) {
    str_failed.discard_as_unraisable(__func__);
    return type;
  }
  auto nl = text.find('\n');
  if (nl != std::string::npos) text = text.substr(0, nl);
  return type + ": " + text;
}

CaptureOutcome failed(core::ReasonKind kind, std::string text, py::object error = py::none()) {
  CaptureOutcome outcome;
  outcome.result = core::TryResult::kFailed;
  outcome.reason = {kind, std::move(text)};
  outcome.error = std::move(error);
  return outcome;
}

// Whether every block in `survivors` (allocated by a capture, still allocated after it) holds one
// of `results` (the outputs and effects' values): then the capture may be dropped and taken
// again. A block that outlives the capture and is no output or effect is state f kept (a cache
// made at first sight of a shape): only this graph's kernels fill it, so a graph captured again,
// which finds it made, would read what nothing wrote.
bool only_results_survive(const std::vector<core::AddressRange>& survivors,
                          const FlatCall& results) {
  for (const auto& block : survivors) {
    bool held = false;
    for (const auto& t : results.tensors) {
      held |= core::make_range(t.storage().data(), t.storage().nbytes()).overlaps(block);
    }
    if (!held) return false;
  }
  return true;
}

// What f returned and changed, flattened into `out`; the reason a replay could not repeat it, if
// any.
struct CapturedResults {
  py::object result;
  std::vector<Effect> effects;
  py::list effect_values;
  std::vector<GradGuard> grad_guards;
  bool backward_ran = false;
  bool effects_ok = true;
  std::string effects_reason;
};

core::Reason refusal_of_results(Flattener& flattener, const CapturedResults& r,
                                const std::vector<at::Tensor>& placeholders, FlatCall& flat,
                                FlatCall& out) {
  if (!r.effects_ok) return {core::ReasonKind::kResults, r.effects_reason};
  flattener.flatten_value(
      r.effects.empty() ? r.result
                        : py::object(py::make_tuple(r.result, py::tuple(r.effect_values))),
      out, &flat.records);
  if (!out.unsupported.empty()) {
    return {core::ReasonKind::kResults, "returns " + out.unsupported_path + ", a " + out.unsupported};
  }
  for (const auto& t : out.tensors) {
    if (!t.is_cuda()) {
      return {core::ReasonKind::kCpuTensor,
              "returns a tensor on " + t.device().str() +
                  " (computed once while capturing; a replay would not update it)"};
    }
    if (t.requires_grad() && !t.is_leaf() && !r.backward_ran) {
      return {core::ReasonKind::kResults,
              "an output requires grad and the function ran no backward pass (a graph cannot "
              "join the caller's autograd graph: call backward inside the function, or run it "
              "under torch.no_grad() or torch.inference_mode())"};
    }
    const int input = placeholder_of(placeholders, t.storage().unsafeGetStorageImpl());
    if (input >= 0 && t.scalar_type() != flat.tensors[static_cast<size_t>(input)].scalar_type()) {
      return {core::ReasonKind::kResults, "returns a view of an input with another dtype"};
    }
  }
  return {};
}

// Note [Host scalars]: a replay would not change a CPU scalar argument that f changed in place.
// Where f did, the values from before f (`before`, in order) are put back, so that the eager run
// that follows the failed capture starts from them, as eager would.
std::string changed_host_scalar(const FlatCall& flat, const std::vector<at::Tensor>& before) {
  std::string why;
  for (size_t i = 0; i < flat.host_scalars.size(); ++i) {
    const auto& [t, version] = flat.host_scalars[i];
    if (t._version() == version) continue;
    at::Tensor scalar = t;  // a handle: copy_ writes the argument's own storage
    scalar.copy_(before[i]);
    why = "the function changed a CPU scalar tensor argument in place (a graph bakes its value "
          "in; a replay would not change it)";
  }
  return why;
}

// One try at capturing f on a call, in its phases: the watches set up before the CUDA capture,
// the placeholders, f under capture, then either f's own exception or the checked graph joining
// its executable. Members are declared in the order their effects begin (the layout trace, built
// at once, begins with the capture), so they are torn down in reverse (the layout trace first,
// the device guard last), on every way out.
class CaptureTry {
 public:
  CaptureTry(const CaptureContext& context, FlatCall& flat, bool pin_host_constants,
             const std::vector<core::LayoutPlan>& follow)
      : context_(context),
        flat_(flat),
        pin_host_constants_(pin_host_constants),
        follow_(follow),
        pool_(*context.pool),
        device_guard_(pool_.device()),
        use_count_before_(pool_.allocator_use_count()),
        layout_trace_(pool_.arena()) {}

  CaptureOutcome run() {
    limit_arena_to_budget(context_.budget, pool_.arena(), *context_.executables);
    install_allocator_hook();  // again, in case it was removed since the pool was made
    if (std::optional<CaptureOutcome> refused = watch_the_state()) return std::move(*refused);
    if (std::optional<CaptureOutcome> failed_early = record()) return std::move(*failed_early);
    if (raised_) return run_what_raised();
    return build();
  }

 private:
  // Gradients before f (Note [Gradients of a captured step]), put back when the try ends, and the
  // training and host-value watches f runs under.
  std::optional<CaptureOutcome> watch_the_state() {
    modules_ = call_modules(context_.static_module, flat_.modules);
    std::vector<at::Tensor> grad_leaves =
        context_.training.tracked_leaves(modules_, flat_, pool_, context_.warmed_up);
    if (std::string why = unwatchable_state(modules_, grad_leaves); !why.empty()) {
      return failed(core::ReasonKind::kUnsupportedArgument, std::move(why));
    }
    // Note [Host scalars]
    for (const auto& [t, version] : flat_.host_scalars) host_scalars_before_.push_back(t.clone());
    gradients_.emplace(std::move(grad_leaves), pool_,
                       at::cuda::getCurrentCUDAStream(pool_.device()).stream());
    stepped_optimizers_.emplace(context_.training.step_watch());
    // Settings the optimizers can read from device memory are tensors during the capture (Note
    // [Device settings]); the swap allocates, so it is entered before the CUDA capture begins.
    device_settings_.emplace(context_.training.device_settings_swap());
    // Library settings every capture of this function runs in: transformers' mask rules as in
    // eager calls (Note [Masks of unpadded batches under capture], grape/_masks.py). Attention
    // without plans covers every call, not only captures (Note [Attention without plans]).
    if (py::object settings = context_.hooks.capture_settings(); !settings.is_none()) {
      capture_settings_.emplace(std::move(settings));
    }
    // Tensors f makes from Python values on the device come from pinned memory the graph keeps,
    // where the signature needs it (Note [Host constants]).
    if (pin_host_constants_) host_constants_ = context_.hooks.pinned_host_constants();
    return std::nullopt;
  }

  // Placeholders for the call's tensors, wrapped as the leaves f is called on.
  std::optional<CaptureOutcome> make_placeholders(cudaStream_t stream,
                                                  std::vector<py::object>& leaves) {
    const size_t n = flat_.tensors.size();
    chained_.assign(n, false);
    buffers_.resize(n);
    AllocationRoute to_placeholder_lane(pool_.arena(), stream, /*placeholders=*/true);
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& t = flat_.tensors[i];
      if (context_.can_alias(flat_, i, &buffers_[i])) {
        // The input is an output of an earlier replay that nothing else references (chain
        // prediction), or a buffer a predicted allocation site handed out (site prediction): it
        // is this graph's placeholder, so calls that bring it again copy nothing.
        chained_[i] = buffers_[i] == nullptr;
        placeholders_.push_back(
            at::empty({0}, t.options()).set_(t.storage(), 0, t.sizes(), t.strides()));
      } else {
        try {
          placeholders_.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
        } catch (const c10::OutOfMemoryError& e) {
          return failed(core::ReasonKind::kOutOfMemory,
                        std::string("capture failed: ") + e.what_without_backtrace());
        }
      }
      versions_.push_back(placeholders_.back()._version());
      leaves.push_back(py::reinterpret_steal<py::object>(THPVariable_Wrap(placeholders_.back())));
    }
    return std::nullopt;
  }

  // Before any allocation route: the generator's first registration allocates (Note [Generators
  // of a failed capture]).
  std::optional<CaptureOutcome> register_generators() {
    try {
      graph_->register_generators(pool_.device());
    } catch (const c10::OutOfMemoryError& e) {
      return failed(core::ReasonKind::kOutOfMemory,
                    std::string("capture failed: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return failed(core::ReasonKind::kCaptureError, std::string("capture failed: ") + e.what());
    }
    return std::nullopt;
  }

  // f under stream capture, on the capture stream, with the arena's allocation routes; an outcome
  // where the try ends here. f's own exception is kept in raised_: what it recorded before
  // raising runs once this scope is left (Note [Exceptions under capture]).
  std::optional<CaptureOutcome> record() {
    CaptureScope scope(pool_);
    cudaStream_t stream = pool_.capture_stream().stream();
    std::vector<py::object> leaves;
    if (std::optional<CaptureOutcome> failed_early = make_placeholders(stream, leaves)) {
      return failed_early;
    }
    if (std::optional<CaptureOutcome> failed_early = register_generators()) return failed_early;
    // A host synchronization inside f fails in CUDA, which ends the capture, and the call runs
    // eagerly. PyTorch's sync debug mode would say so sooner, but it is one setting for the whole
    // process, and would make other threads' synchronizations raise while this thread captures.
    // The backward pass of a training step allocates from the autograd engine's device thread.
    AllocationRoute to_arena(pool_.arena(), stream, /*placeholders=*/false,
                             /*for_all_threads=*/true);
    // f runs on the caller's argument objects, placeholders set in them; they are put back as
    // they were when this scope ends, and the replay sets what f rebound.
    CaptureEffects record_state(flat_.records);
    UnflattenLog log;
    bool in_function = false;  // an exception now is f's (or the capture's), not grape's
    try {
      // Thread-local: other threads' eager work neither fails nor ends the capture (Note [One
      // compiled call at a time]).
      graph_->capture_begin(pool_.id(), cudaStreamCaptureModeThreadLocal);
      // From here on, what f allocates: the placeholders and what capture_begin makes (the RNG's
      // seed and offset, which replays write from the host) are laid out already.
      layout_trace_.begin(follow_);
      py::tuple call = rebuild_arguments(flat_, leaves, record_state, log);
      {
        std::optional<EnteredContext> pinned;
        if (!host_constants_.is_none()) pinned.emplace(host_constants_);
        const auto function_start = core::Clock::now();
        in_function = true;
        results_.result = call_python(context_.fn, py::reinterpret_borrow<py::args>(call[0]),
                                      py::reinterpret_borrow<py::kwargs>(call[1]));
        in_function = false;
        function_ns_ = core::elapsed_ns(function_start);
      }
      graph_->capture_end();
      check_what_f_changed(record_state, log);
    } catch (py::error_already_set& e) {
      results_.result = py::none();
      return judge_python_error(e, stream, in_function);
    } catch (const c10::OutOfMemoryError& e) {
      results_.result = py::none();
      abort_capture(graph_, pool_, use_count_before_);
      return failed(core::ReasonKind::kOutOfMemory,
                    std::string("capture failed: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      results_.result = py::none();
      abort_capture(graph_, pool_, use_count_before_);
      const std::string text = e.what();
      return failed(core::kind_of_capture_error(text), "capture failed: " + text);
    }
    return std::nullopt;
  }

  // What f changed that a replay could not repeat, each check's values put back whatever the
  // others say: the eager run after a failed capture reads them.
  void check_what_f_changed(CaptureEffects& record_state, UnflattenLog& log) {
    CapturedResults& r = results_;
    r.effects_ok = record_state.collect(log, r.effects, r.effect_values, r.effects_reason);
    std::string scalar_changed = changed_host_scalar(flat_, host_scalars_before_);
    if (r.effects_ok && !scalar_changed.empty()) {
      r.effects_ok = false;
      r.effects_reason = std::move(scalar_changed);
    }
    if (r.effects_ok) {
      const py::object changed = PythonHooks::changed_by_function(device_settings_->get());
      r.effects_ok = changed.is_none();
      if (!r.effects_ok) r.effects_reason = changed.cast<std::string>();
    }
    r.backward_ran = gradients_->collect(r.effects, r.effect_values, r.grad_guards);
    if (r.effects_ok) {
      // A gradient no guard or effect covers would be written by every replay where this capture
      // left it (Note [Gradients of a captured step]).
      const py::object untracked = PythonHooks::untracked_leaves_kept(stepped_optimizers_->get());
      r.effects_ok = untracked.is_none();
      if (!r.effects_ok) r.effects_reason = untracked.cast<std::string>();
    }
  }

  // A Python exception under capture: f's own goes on to the caller (kept in raised_), one the
  // capture caused falls back, and the propagated kinds are rethrown (core::judge_capture_exception).
  // Called from the handler, so that `throw;` rethrows `e`.
  std::optional<CaptureOutcome> judge_python_error(py::error_already_set& e, cudaStream_t stream,
                                                   bool in_function) {
    // The capture ends before any more Python runs (a failing __str__ must not leave it open):
    // where f raised into a capture CUDA still holds, with what f recorded kept.
    const bool invalidated = capture_status(stream) == cudaStreamCaptureStatusInvalidated;
    const bool kept = in_function && !invalidated && end_partial_capture(*graph_);
    if (!kept) abort_capture(graph_, pool_, use_count_before_);
    core::CaptureException facts;
    facts.text = python_error_text(e);
    facts.is_exception = e.matches(PyExc_Exception);
    facts.propagated = context_.hooks.propagates(e);
    facts.out_of_memory = e.matches(py::module_::import("torch").attr("OutOfMemoryError"));
    facts.runtime_error = e.matches(PyExc_RuntimeError);
    facts.capture_invalidated = invalidated;
    facts.raised_by_function = in_function;
    if (facts.is_exception && !facts.propagated) {
      const std::string cause = context_.hooks.capture_cause(e);
      facts.from_compiler = cause == "compiler";
      facts.in_predicated_body = cause == "predicated_body";
    }
    const core::ExceptionVerdict verdict = core::judge_capture_exception(facts);
    if (verdict.action == core::ExceptionAction::kRaiseAsEager) {
      raised_ = std::make_shared<py::error_already_set>(std::move(e));
      return std::nullopt;
    }
    if (kept) pool_.destroy_graph(graph_);
    if (verdict.action == core::ExceptionAction::kPropagate) throw;
    return failed(verdict.kind, "capture failed: " + facts.text, e.value());
  }

  // f raised: the argument objects are as before the call, the capture stream's scope is left,
  // and the work f queued before raising runs on the caller's stream.
  CaptureOutcome run_what_raised() {
    layout_trace_.abandon();
    // Where CUDA could not end the capture at the raise (work f forked to another stream and did
    // not join), there is no graph to run.
    std::string not_run = "the capture could not end where it raised";
    if (graph_) {
      std::vector<PartialInput> inputs;
      for (size_t i = 0; i < placeholders_.size(); ++i) {
        inputs.push_back({placeholders_[i].data_ptr(), span_bytes(placeholders_[i]),
                          placeholders_[i]._version() != versions_[i],
                          chained_[i] || buffers_[i]});
      }
      not_run = replay_partial(*graph_, inputs, flat_, pool_);
      pool_.destroy_graph(graph_);
    }
    if (!not_run.empty()) {
      const std::string message = "grape: the function raised while it was captured, and the GPU "
                                  "work it queued before raising could not be run: " + not_run;
      if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) PyErr_Clear();
    }
    CaptureOutcome outcome;
    outcome.result = core::TryResult::kRaised;
    outcome.raised = std::move(raised_);
    return outcome;
  }

  // The captured graph, once what f returned and changed passed the checks: dropped to be taken
  // again along a better layout, or joined to its executable.
  CaptureOutcome build() {
    pool_.hold_for_graph(use_count_before_);
    auto captured = std::make_unique<CapturedGraph>();
    captured->pool = context_.pool;
    captured->nodes = graph_->node_count();
    captured->graph = std::move(graph_);  // destroyed with `captured` wherever it is refused
    std::vector<core::AddressRange> survivors;
    std::vector<core::LayoutPlan> plan = layout_trace_.end(&survivors);
    // What f returned and changed is checked before anything is built from the graph: a refused
    // capture is neither taken again nor instantiated.
    FlatCall out;
    core::Reason refusal =
        refusal_of_results(context_.flattener, results_, placeholders_, flat_, out);
    if (!refusal.empty()) return failed(refusal.kind, std::move(refusal.text));
    if (!plan.empty() && only_results_survive(survivors, out)) {
      // Dropped before it is instantiated: the caller captures again along the plan.
      CaptureOutcome retake;
      retake.result = core::TryResult::kRetake;
      retake.plan = std::move(plan);
      retake.function_ns = function_ns_;
      return retake;
    }
    if (std::optional<CaptureOutcome> refused = join_executable(*captured)) {
      return std::move(*refused);
    }
    CaptureOutcome outcome;
    outcome.function_ns = function_ns_;
    describe(*captured, out, outcome);
    outcome.result = core::TryResult::kGraph;
    outcome.graph = std::move(captured);
    // Dropping the placeholders, `out` and the results frees their blocks back to the pool: later
    // captures reuse them, and the registry protects what callers still hold.
    return outcome;
  }

  // One executable per topology: the graph joins its group (or starts one) and is read and
  // destroyed; only the ReplayGraph stays, for PyTorch's replay prologue.
  std::optional<CaptureOutcome> join_executable(CapturedGraph& captured) {
    try {
      captured.member = context_.executables->add(
          captured.graph->release_graph(),
          at::cuda::getCurrentCUDAStream(pool_.device()).stream());
      captured.executables = context_.executables;
    } catch (const std::exception& e) {
      // The driver's memory for executables is the device's: out of it, the signature waits for
      // memory as a capture that ran out does (Note [Capture policy]).
      const std::string text = e.what();
      const bool out_of_memory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                                 text.find("out of memory") != std::string::npos;
      return failed(
          out_of_memory ? core::ReasonKind::kOutOfMemory : core::ReasonKind::kInstantiation,
          "instantiating the captured graph failed: " + text);
    }
    return std::nullopt;
  }

  // What a replay needs besides the executable: the placeholders, the outputs' kinds, the
  // effects, the static tensors and the optimizers' baked settings.
  void describe(CapturedGraph& captured, FlatCall& out, CaptureOutcome& outcome) {
    for (size_t i = 0; i < placeholders_.size(); ++i) {
      captured.placeholders.push_back({placeholders_[i].data_ptr(), span_bytes(placeholders_[i]),
                                       placeholders_[i]._version() != versions_[i], chained_[i],
                                       buffers_[i], buffers_[i] != nullptr});
      outcome.alias_predictions += chained_[i] || buffers_[i] ? 1 : 0;
      // The graph that made a chained input now has its outputs read in place (Note [Chain
      // variants]).
      const GraphPool::LiveStorage* live =
          chained_[i] ? pool_.find_live(flat_.tensors[i].storage().unsafeGetStorageImpl())
                      : nullptr;
      if (live != nullptr && live->read_in_place) *live->read_in_place = true;
    }
    captured.effects = std::move(results_.effects);
    pool_.refresh_segments();
    captured.classify_outputs(out, placeholders_);
    captured.output_spec = std::move(out.spec);
    // The modules' parameters and buffers join the static state after the first launch.
    captured.pending_statics =
        CapturedGraph::PendingStatics{context_.static_module, flat_.modules, gradients_->leaves()};
    captured.grad_guards = std::move(results_.grad_guards);
    TrainingState::BakedSettings baked = context_.training.bake_optimizers(
        stepped_optimizers_->get(), device_settings_->get(), captured.static_tensors);
    captured.hyperparameters = std::move(baked.hyperparameters);
    captured.device_settings = std::move(baked.device_settings);
    if (!host_constants_.is_none()) {
      captured.host_constants = PythonHooks::kept_host_constants(host_constants_);
    }
  }

  const CaptureContext& context_;
  FlatCall& flat_;
  const bool pin_host_constants_;
  const std::vector<core::LayoutPlan>& follow_;
  GraphPool& pool_;
  c10::cuda::CUDAGuard device_guard_;
  std::unique_ptr<ReplayGraph> graph_ = std::make_unique<ReplayGraph>();
  const int use_count_before_;
  std::vector<CallModule> modules_;
  std::vector<at::Tensor> host_scalars_before_;  // Note [Host scalars]
  std::optional<CaptureGradients> gradients_;
  std::optional<EnteredContext> stepped_optimizers_;
  std::optional<EnteredContext> device_settings_;
  std::optional<EnteredContext> capture_settings_;
  py::object host_constants_ = py::none();
  std::vector<at::Tensor> placeholders_;
  std::vector<int64_t> versions_;
  std::vector<bool> chained_;
  std::vector<std::shared_ptr<InputBuffer>> buffers_;
  CapturedResults results_;
  int64_t function_ns_ = 0;
  std::shared_ptr<py::error_already_set> raised_;
  LayoutTrace layout_trace_;
};

}  // namespace

CaptureOutcome capture(const CaptureContext& context, FlatCall& flat, bool pin_host_constants,
                       const std::vector<core::LayoutPlan>& follow) {
  return CaptureTry(context, flat, pin_host_constants, follow).run();
}

}  // namespace grape
