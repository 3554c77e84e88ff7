#pragma once
// Note [Capture policy]
// ~~~~~~~~~~~~~~~~~~~~~
// The decisions around a capture that need no torch, kept here so that they are tested without a
// GPU (tests/cpp/test_capture_policy.cpp); csrc/torch/runtime.cpp carries them out.
//   - When a signature warms up: only the function's first `warmup` calls run eagerly, and a later
//     signature is captured at first sight; or (warmup_each_signature on, or once two captures at
//     first sight failed and were mended by a warm-up) `warmup` eager calls of each signature.
//   - Tries of one capture: a capture that grew the arena well beyond its planned layout is taken
//     again along the plan (Note [Planned capture layouts]); one refused for a pageable copy is
//     taken again with host constants pinned (Note [Host constants]); one that ran out of memory
//     is taken again once, after the executables and cached blocks were freed.
//   - After a failed capture: a signature captured without a warm-up of its own runs eagerly once,
//     as its warm-up, and is captured again at its next call, unless memory ran out (a warm-up
//     does not help) or no graph can take its arguments; otherwise it falls back to eager. One
//     that ran out of memory runs eagerly and is captured again later (CaptureBackoff), since
//     memory may be freed meanwhile.
//   - An exception raised while f was captured: f's own reaches the caller, as in eager; one the
//     capture caused falls back; an interrupt propagates (Note [Exceptions under capture]).
//   - Which graph serves a call: a signature's graph, or one of its chain variants (graphs of the
//     same signature whose placeholders are other graphs' outputs or site buffers), and when a
//     variant is worth its capture (Note [Chain variants]).

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/reasons.h"

namespace grape::core {

struct WarmupPolicy {
  // First-sight captures that failed and were mended by a warm-up, after which the function warms
  // up each new signature: its shapes need lazy initialization of their own (cuDNN's autotuning
  // under torch.backends.cudnn.benchmark), and a failed capture costs about an eager call more
  // than a warm-up.
  static constexpr int kFirstSightFailuresToWarmEach = 2;
  int warmup = 1;
  bool each_signature = false;
  int first_sight_failures = 0;
  // Whether a call of a signature without a graph, warmed up `signature_runs` times, is a warm-up
  // call; `function_runs`: warm-up calls of the whole function so far.
  bool warming_up(int signature_runs, int function_runs) const {
    return each_signature ? signature_runs < warmup
                          : function_runs < warmup && signature_runs < warmup;
  }
  // A capture at first sight failed and its signature warms up (after_failed_capture).
  void failed_at_first_sight() {
    if (++first_sight_failures >= kFirstSightFailuresToWarmEach) each_signature = true;
  }
};

// How one try at capturing ended.
enum class TryResult {
  kGraph,    // a graph, ready to replay
  kRetake,   // dropped before instantiation: take it again along its planned layout
  kFailed,   // failed, for the reason's kind
  kRaised,   // f raised an exception of its own: it reaches the caller (Note [Exceptions under
             // capture])
};

// Note [Exceptions under capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// f runs once per call, under capture as in eager, and an exception it raises reaches the caller
// on the call that raised it. Under capture f's kernels were recorded, not run, so the graph
// recorded up to the raise (the capture ended there) is launched once before the exception goes
// on: the GPU work that came before it is done, as eager would have done it. The signature is not
// marked as failed; its next call captures again.
// Some exceptions are the capture's doing, not f's, and eager would not raise them: a host
// synchronization, a CUDA error that ends the capture (an operation not permitted while
// capturing, another stream's work joined in), torch.compile compiling inside the capture, a
// collective or branch a predicated body cannot hold. Those fall back to eager as before (the
// eager run raises what eager raises). A predicated body is captured whatever its condition, so
// an exception leaving one may come from a branch eager would not take: it falls back too.
// KeyboardInterrupt, SystemExit (any BaseException that is no Exception) and the errors the
// hooks name (grape.RewriteError, grape.PredicateError) end the capture and propagate at once.
// What grape knows of the exception, gathered where it was caught:
struct CaptureException {
  std::string text;                  // "Type: message", the message's first line
  bool is_exception = true;          // false: KeyboardInterrupt, SystemExit, GeneratorExit
  bool propagated = false;           // one of the errors the hooks let through
  bool out_of_memory = false;        // torch.OutOfMemoryError or the arena's limit
  bool runtime_error = false;        // a RuntimeError, as PyTorch and CUDA raise
  bool from_compiler = false;        // raised by torch.compile (Dynamo, Inductor)
  bool in_predicated_body = false;   // it left a grape.Predicate or while_loop body
  bool capture_invalidated = false;  // CUDA had ended the capture when it reached grape
  bool raised_by_function = true;    // false: grape's own work around f raised it
};

enum class ExceptionAction {
  kPropagate,     // the capture is dropped and the exception goes on at once
  kRaiseAsEager,  // f's own: the GPU work before it runs once, then it goes on
  kFallBack,      // the capture's doing: the call runs eagerly, for `kind`
};

struct ExceptionVerdict {
  ExceptionAction action = ExceptionAction::kFallBack;
  ReasonKind kind = ReasonKind::kCaptureError;  // kFallBack
};

ExceptionVerdict judge_capture_exception(const CaptureException& e);

// What a capture tried so far (one per capture, across its tries).
struct CaptureTries {
  bool along_plan = false;     // the current try follows a planned layout
  bool pinned = false;         // host constants are pinned (the signature's flag)
  bool memory_freed = false;   // executables and cached blocks were freed for it
};

enum class NextTry { kNone, kAlongPlan, kPinned, kAfterFreeingMemory };

// The next try after one that ended with `result` (`failure`: its reason's kind); updates `tries`.
// kNone: the capture is done (a graph) or has failed for good.
NextTry next_try(TryResult result, ReasonKind failure, CaptureTries& tries);

enum class AfterFailure { kWarmUpAndRetry, kFallBack, kRetryLater };

// Whether a capture first runs a small backward pass on its stream, outside the capture (once per
// function): the autograd engine's lazy start (its device thread, that thread's cuBLAS handle and
// workspace) cannot happen inside a capture. `reachable`: the capture watches leaves, or modules'
// parameters require grad. Needed where a backward pass may run: the function was seen training,
// grad mode is on, or no warm-up has shown what it does. Not for inference under no_grad after a
// warm-up that ran no backward pass: the engine's start is most of a process's first capture
// (docs/results.md). A backward pass such a function runs all the same (under enable_grad) fails
// that capture at most once: the warm-up after it sees the pass, and the next capture prepares.
bool prepares_backward(bool reachable, bool training, bool grad_enabled, bool warmed_up);

// What a signature does after its capture failed for `failure`. `signature_warmups`: its warm-up
// calls so far. Out of memory: this call runs eagerly (raising what eager raises where eager runs
// out too) and the signature is captured again later (CaptureBackoff).
AfterFailure after_failed_capture(const WarmupPolicy& policy, int signature_warmups,
                                  ReasonKind failure);

// When a signature whose capture ran out of memory is captured again: memory may be freed at any
// time (outputs dropped, another function's pool gone, empty_cache), and nothing tells. So it runs
// eagerly for 0, 1, 3, 7, ... calls after each failure in a row, at most kMaxWait: a signature that
// never fits costs a failed capture once in kMaxWait + 1 calls, and one that fits again captures
// within twice the calls it waited last.
class CaptureBackoff {
 public:
  static constexpr int64_t kMaxWait = 63;
  // Its capture ran out of memory (again).
  void failed() {
    remaining_ = wait_;
    wait_ = wait_ * 2 + 1 > kMaxWait ? kMaxWait : wait_ * 2 + 1;
  }
  // A call of the signature: whether it runs eagerly, still waiting.
  bool waits() {
    if (remaining_ == 0) return false;
    --remaining_;
    return true;
  }
  // A capture succeeded: the next failure starts the waits anew.
  void succeeded() {
    wait_ = 0;
    remaining_ = 0;
  }
  // Whether the signature's last capture ran out of memory.
  bool deferred() const { return wait_ > 0; }

 private:
  int64_t wait_ = 0;  // calls to wait after the next failure; 0 until a first one
  int64_t remaining_ = 0;
};

// Note [Chain variants]
// A signature first captured with the caller's tensors copies its inputs at every replay, even
// where a later call brings outputs of earlier replays, or buffers of predicted allocation sites
// (Note [Allocation-site prediction]), that a graph could read in place. Such a call gets a chain
// variant: a capture of the same signature whose placeholders are those tensors.
// A variant lays out its own outputs anew, so where another graph reads the signature's outputs in
// place, that graph would no longer fit, would need a variant in turn, and so on down the chain.
// Where signatures follow one another (a generation's growing shapes) a signature's upstream graph
// can change once (the prompt's, captured a call after its warm-up): the inputs it now produces
// elsewhere are copied into the placeholders instead, rather than every signature being captured
// twice. So a variant is made only where no other graph reads this signature's outputs in place,
// where its graph could not take the call otherwise (a site buffer it would copy into is held by
// another tensor, and its replay would be refused), or where the signature's call follows its
// own previous call: a loop over one shape whose outputs feed its next call (a decode step over a
// static cache), which settles on two variants that feed each other (each lays out its output
// around the other's input). At most kMaxChainVariants per signature.
// Those last two are captured at once: the graph could not take the call, or the loop would copy
// its whole state at every call. Elsewhere a variant only saves copies, often of a few bytes (a
// generation's position, its prompt's mask, which the next call brings in another site buffer),
// so it is bought like a rental (VariantRent): each call the graph serves while copying inputs a
// variant would read in place is charged what those copies cost (CopyCost), and the variant is
// captured once the charges reach what capturing the signature cost. The copies then never cost
// more than twice what the better choice in hindsight would have, and a signature that misfits
// now and then is not captured twice.
struct GraphChoice {
  enum class Kind { kUse, kCaptureVariant };
  Kind kind = Kind::kUse;
  size_t graph = 0;  // kUse: 0 the signature's graph, i > 0 its variant i - 1
};

struct ChainPolicy {
  static constexpr size_t kMaxChainVariants = 3;
  bool alias_prediction = true;
};

// What copying inputs into a graph's placeholders costs a replay, as VariantRent charges it: the
// launch of a batched copy, unless the replay copies other inputs anyway, and the bytes at a
// device's copy bandwidth. A rough estimate on purpose: the rent only has to tell a copy of a few
// bytes from one of the whole state (figures in docs/results.md, "Figures behind design rules").
struct CopyCost {
  static constexpr int64_t kLaunchNs = 4000;
  static constexpr int64_t kBytesPerNs = 1000;
  static int64_t of(size_t bytes, bool launched_anyway) {
    return (launched_anyway ? 0 : kLaunchNs) + static_cast<int64_t>(bytes) / kBytesPerNs;
  }
};

// What a capture of `nodes` graph nodes costs, as VariantRent charges it: an estimate from the
// graph's size, not a measurement, so that when a variant is bought does not depend on the card or
// its load (a measured cost made a test's outcome depend on both). Near what captures cost on an
// H100 or H200, the function's launches included (docs/results.md, "Figures behind design rules").
struct CaptureCost {
  static constexpr int64_t kFixedNs = 200000;
  static constexpr int64_t kPerNodeNs = 20000;
  static int64_t of(size_t nodes) { return kFixedNs + static_cast<int64_t>(nodes) * kPerNodeNs; }
};

// A signature's next chain variant, bought like a rental (Note [Chain variants]).
class VariantRent {
 public:
  // Charges one call's copies, `copy_ns`; whether the charges reached `capture_ns`, what a capture
  // of the signature cost, and so the variant is worth capturing now.
  bool charge(int64_t copy_ns, int64_t capture_ns) {
    charged_ns_ += copy_ns;
    return charged_ns_ >= capture_ns;
  }
  // A variant was captured: the next one starts a rent of its own.
  void bought() { charged_ns_ = 0; }
  int64_t charged_ns() const { return charged_ns_; }

 private:
  int64_t charged_ns_ = 0;
};

// Which graph serves a call, of a signature with `variants` chain variants. `fits(i)`: graph i
// (0: the signature's, i > 0: variant i - 1) finds every input it reads in place where it is and
// copies none that a capture could chain; `chainable()`: some input could be read in place by a
// new capture; `needed()`: a variant is needed at once (the signature's graph would copy into a
// site buffer another tensor holds, or the function's previous call had this signature too);
// `may_move_outputs()`: no other graph reads this signature's outputs in place; `rent_due()`:
// charges this call's copies to the signature's VariantRent and says whether the variant is worth
// capturing now. Each is asked lazily, in the order a replay needs it.
template <class Fits, class Chainable, class Needed, class MayMoveOutputs, class RentDue>
GraphChoice choose_graph(const ChainPolicy& policy, size_t variants, Fits fits,
                         Chainable chainable, Needed needed, MayMoveOutputs may_move_outputs,
                         RentDue rent_due) {
  if (!policy.alias_prediction || fits(size_t{0})) return {};
  for (size_t i = 1; i <= variants; ++i) {
    if (fits(i)) return {GraphChoice::Kind::kUse, i};
  }
  if (variants >= ChainPolicy::kMaxChainVariants || !chainable()) return {};
  if (needed() || (may_move_outputs() && rent_due())) {
    return {GraphChoice::Kind::kCaptureVariant, 0};
  }
  return {};
}

}  // namespace grape::core
