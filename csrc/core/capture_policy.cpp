#include "core/capture_policy.h"

namespace grape::core {

NextTry next_try(TryResult result, ReasonKind failure, CaptureTries& tries) {
  switch (result) {
    case TryResult::kGraph:
      return NextTry::kNone;
    case TryResult::kRetake:
      // A capture along a plan never asks for another (GraphArena::end_capture).
      if (tries.along_plan) return NextTry::kNone;
      tries.along_plan = true;
      return NextTry::kAlongPlan;
    case TryResult::kRaised:
      return NextTry::kNone;
    case TryResult::kFailed:
      break;
  }
  if (failure == ReasonKind::kPageableCopy && !tries.pinned) {
    tries.pinned = true;
    tries.along_plan = false;
    return NextTry::kPinned;
  }
  if (failure == ReasonKind::kOutOfMemory && !tries.memory_freed) {
    tries.memory_freed = true;
    tries.along_plan = false;
    return NextTry::kAfterFreeingMemory;
  }
  return NextTry::kNone;
}

bool prepares_backward(bool reachable, bool training, bool grad_enabled, bool warmed_up) {
  return reachable && (training || grad_enabled || !warmed_up);
}

AfterFailure after_failed_capture(const WarmupPolicy& policy, int signature_warmups,
                                  ReasonKind failure) {
  // Captured without a warm-up of its own (at first sight, or again after its static state
  // changed): lazy initialization for this signature (a new shape's workspace, a Python-side
  // cache) may be what failed.
  if (failure == ReasonKind::kOutOfMemory) return AfterFailure::kRetryLater;
  const bool without_warmup = !policy.each_signature && policy.warmup > 0 && signature_warmups == 0;
  const bool warmup_may_help = failure != ReasonKind::kUnsupportedArgument;
  return without_warmup && warmup_may_help ? AfterFailure::kWarmUpAndRetry
                                           : AfterFailure::kFallBack;
}

ExceptionVerdict judge_capture_exception(const CaptureException& e) {
  if (!e.is_exception || e.propagated) return {ExceptionAction::kPropagate, ReasonKind::kNone};
  if (e.out_of_memory) return {ExceptionAction::kFallBack, ReasonKind::kOutOfMemory};
  const bool capture_caused = !e.raised_by_function || e.capture_invalidated ||
                              e.in_predicated_body || e.from_compiler ||
                              (e.runtime_error && speaks_of_capture(e.text));
  if (capture_caused) return {ExceptionAction::kFallBack, kind_of_capture_error(e.text)};
  return {ExceptionAction::kRaiseAsEager, ReasonKind::kNone};
}

}  // namespace grape::core
