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
  const bool without_warmup = !policy.each_signature && policy.warmup > 0 && signature_warmups == 0;
  const bool warmup_may_help =
      failure != ReasonKind::kOutOfMemory && failure != ReasonKind::kUnsupportedArgument;
  return without_warmup && warmup_may_help ? AfterFailure::kWarmUpAndRetry
                                           : AfterFailure::kFallBack;
}

}  // namespace grape::core
