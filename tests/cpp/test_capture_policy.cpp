// The capture policy (Note [Capture policy]), typed reasons (Note [Typed reasons]) and the memory
// budget, without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "core/capture_policy.h"
#include "core/memory_budget.h"
#include "core/reasons.h"

using namespace grape::core;

TEST(WarmupPolicy, EachSignatureWarmsUpOnItsOwn) {
  const WarmupPolicy policy{2, true};
  EXPECT_TRUE(policy.warming_up(0, 5));
  EXPECT_TRUE(policy.warming_up(1, 5));
  EXPECT_FALSE(policy.warming_up(2, 5));
}

TEST(WarmupPolicy, OnlyTheFunctionsFirstCallsWarmUp) {
  const WarmupPolicy policy{1, false};
  EXPECT_TRUE(policy.warming_up(0, 0));
  EXPECT_FALSE(policy.warming_up(0, 1));  // a new signature after the first warm-up captures
  EXPECT_FALSE(WarmupPolicy({0, false}).warming_up(0, 0));
}

TEST(WarmupPolicy, FailuresAtFirstSightMakeEachSignatureWarmUp) {
  WarmupPolicy policy;  // the default: the function's first call warms up
  EXPECT_FALSE(policy.warming_up(0, 1));
  policy.failed_at_first_sight();
  EXPECT_FALSE(policy.warming_up(0, 1));  // one failure may be the signature's own
  policy.failed_at_first_sight();
  EXPECT_TRUE(policy.each_signature);
  EXPECT_TRUE(policy.warming_up(0, 1));
}

TEST(CapturePolicy, AGraphEndsTheTries) {
  CaptureTries tries;
  EXPECT_EQ(next_try(TryResult::kGraph, ReasonKind::kNone, tries), NextTry::kNone);
}

TEST(CapturePolicy, ARetakeFollowsThePlanOnce) {
  CaptureTries tries;
  EXPECT_EQ(next_try(TryResult::kRetake, ReasonKind::kNone, tries), NextTry::kAlongPlan);
  EXPECT_TRUE(tries.along_plan);
  EXPECT_EQ(next_try(TryResult::kRetake, ReasonKind::kNone, tries), NextTry::kNone);
}

TEST(CapturePolicy, APageableCopyIsTakenAgainPinnedOnce) {
  CaptureTries tries;
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kPageableCopy, tries), NextTry::kPinned);
  EXPECT_TRUE(tries.pinned);
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kPageableCopy, tries), NextTry::kNone);
  CaptureTries already_pinned{false, true, false};
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kPageableCopy, already_pinned),
            NextTry::kNone);
}

TEST(CapturePolicy, OutOfMemoryIsTakenAgainOnceAfterFreeing) {
  CaptureTries tries;
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kOutOfMemory, tries),
            NextTry::kAfterFreeingMemory);
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kOutOfMemory, tries), NextTry::kNone);
}

TEST(CapturePolicy, EachTryMayFollowItsOwnPlan) {
  CaptureTries tries;
  EXPECT_EQ(next_try(TryResult::kRetake, ReasonKind::kNone, tries), NextTry::kAlongPlan);
  EXPECT_EQ(next_try(TryResult::kFailed, ReasonKind::kPageableCopy, tries), NextTry::kPinned);
  EXPECT_FALSE(tries.along_plan);
  EXPECT_EQ(next_try(TryResult::kRetake, ReasonKind::kNone, tries), NextTry::kAlongPlan);
}

TEST(CapturePolicy, OtherFailuresAreFinal) {
  for (ReasonKind kind : {ReasonKind::kHostSync, ReasonKind::kCaptureError, ReasonKind::kResults,
                          ReasonKind::kCpuTensor, ReasonKind::kInstantiation}) {
    CaptureTries tries;
    EXPECT_EQ(next_try(TryResult::kFailed, kind, tries), NextTry::kNone) << reason_kind_name(kind);
  }
}

TEST(CapturePolicy, ACaptureWithoutWarmUpWarmsUpAndTriesAgain) {
  const WarmupPolicy lazy{1, false};
  EXPECT_EQ(after_failed_capture(lazy, 0, ReasonKind::kCaptureError),
            AfterFailure::kWarmUpAndRetry);
  EXPECT_EQ(after_failed_capture(lazy, 0, ReasonKind::kHostSync), AfterFailure::kWarmUpAndRetry);
  // A second failure, and arguments no graph takes, fall back.
  EXPECT_EQ(after_failed_capture(lazy, 1, ReasonKind::kCaptureError), AfterFailure::kFallBack);
  EXPECT_EQ(after_failed_capture(lazy, 0, ReasonKind::kUnsupportedArgument),
            AfterFailure::kFallBack);
  // Warmed up already, or no warm-up at all: nothing a warm-up could mend.
  EXPECT_EQ(after_failed_capture({1, true}, 0, ReasonKind::kCaptureError), AfterFailure::kFallBack);
  EXPECT_EQ(after_failed_capture({0, false}, 0, ReasonKind::kCaptureError),
            AfterFailure::kFallBack);
}

TEST(CapturePolicy, OutOfMemoryRunsEagerlyAndCapturesAgainLater) {
  // Whatever the warm-ups: memory may be freed meanwhile, and a warm-up frees none.
  for (const WarmupPolicy& policy : {WarmupPolicy{1, false}, WarmupPolicy{1, true}}) {
    for (int warmups : {0, 1, 5}) {
      EXPECT_EQ(after_failed_capture(policy, warmups, ReasonKind::kOutOfMemory),
                AfterFailure::kRetryLater);
    }
  }
}

// Which calls of a signature run eagerly while it waits (true) after `failures` failures in a row.
std::vector<bool> waits_after(int failures, int calls) {
  CaptureBackoff backoff;
  std::vector<bool> waited;
  for (int i = 0; i < failures; ++i) {
    backoff.failed();
    while (i + 1 < failures && backoff.waits()) {
    }
  }
  for (int i = 0; i < calls; ++i) waited.push_back(backoff.waits());
  return waited;
}

TEST(CaptureBackoff, WaitsTwiceAsLongAfterEachFailureInARow) {
  EXPECT_EQ(waits_after(1, 2), (std::vector<bool>{false, false}));  // the next call captures
  EXPECT_EQ(waits_after(2, 3), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(waits_after(3, 5), (std::vector<bool>{true, true, true, false, false}));
  EXPECT_EQ(waits_after(4, 8),
            (std::vector<bool>{true, true, true, true, true, true, true, false}));
}

TEST(CaptureBackoff, WaitsAtMostKMaxWaitCalls) {
  CaptureBackoff backoff;
  for (int i = 0; i < 20; ++i) {
    backoff.failed();
    int waited = 0;
    while (backoff.waits()) ++waited;
    EXPECT_LE(waited, CaptureBackoff::kMaxWait);
    if (i >= 6) EXPECT_EQ(waited, CaptureBackoff::kMaxWait);
  }
}

TEST(CaptureBackoff, ASuccessStartsTheWaitsAnew) {
  CaptureBackoff backoff;
  EXPECT_FALSE(backoff.deferred());
  backoff.failed();
  backoff.failed();
  EXPECT_TRUE(backoff.deferred());
  backoff.succeeded();
  EXPECT_FALSE(backoff.deferred());
  EXPECT_FALSE(backoff.waits());
  backoff.failed();
  EXPECT_FALSE(backoff.waits());  // the first failure of a new run waits no call
}

CaptureException raised(const std::string& text) {
  CaptureException e;
  e.text = text;
  return e;
}

TEST(ExceptionsUnderCapture, TheFunctionsOwnReachTheCaller) {
  EXPECT_EQ(judge_capture_exception(raised("ValueError: no threes")).action,
            ExceptionAction::kRaiseAsEager);
  // A RuntimeError of f's own, and one that speaks of a capture but is no RuntimeError.
  CaptureException shape = raised("RuntimeError: The size of tensor a (3) must match (4)");
  shape.runtime_error = true;
  EXPECT_EQ(judge_capture_exception(shape).action, ExceptionAction::kRaiseAsEager);
  EXPECT_EQ(judge_capture_exception(raised("KeyError: 'capture group'")).action,
            ExceptionAction::kRaiseAsEager);
}

TEST(ExceptionsUnderCapture, WhatTheCaptureCausedFallsBack) {
  for (const char* text :
       {"RuntimeError: CUDA error: operation not permitted when stream is capturing",
        "RuntimeError: called a synchronizing CUDA operation",
        "RuntimeError: CUDA error: dependency created on uncaptured work in another stream",
        "RuntimeError: Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture",
        "RuntimeError: grape: otherwise() must directly follow its Predicate block"}) {
    CaptureException e = raised(text);
    e.runtime_error = true;
    EXPECT_EQ(judge_capture_exception(e).action, ExceptionAction::kFallBack) << text;
  }
  CaptureException sync = raised("RuntimeError: called a synchronizing CUDA operation");
  sync.runtime_error = true;
  EXPECT_EQ(judge_capture_exception(sync).kind, ReasonKind::kHostSync);
  // CUDA ended the capture, whatever the text; torch.compile compiled inside the capture; a
  // predicated body raised (captured whatever its condition); grape's own work raised.
  CaptureException invalidated = raised("ValueError: after a CUDA error");
  invalidated.capture_invalidated = true;
  CaptureException compiler = raised("BackendCompilerFailed: inductor raised");
  compiler.from_compiler = true;
  CaptureException body = raised("ValueError: only where the condition holds");
  body.in_predicated_body = true;
  CaptureException grapes = raised("TypeError: a record's attribute");
  grapes.raised_by_function = false;
  for (const CaptureException& e : {invalidated, compiler, body, grapes}) {
    const ExceptionVerdict verdict = judge_capture_exception(e);
    EXPECT_EQ(verdict.action, ExceptionAction::kFallBack) << e.text;
    EXPECT_EQ(verdict.kind, ReasonKind::kCaptureError) << e.text;
  }
}

TEST(ExceptionsUnderCapture, OutOfMemoryFallsBackForMemory) {
  CaptureException e = raised("OutOfMemoryError: CUDA out of memory");
  e.out_of_memory = true;
  e.runtime_error = true;
  EXPECT_EQ(judge_capture_exception(e).action, ExceptionAction::kFallBack);
  EXPECT_EQ(judge_capture_exception(e).kind, ReasonKind::kOutOfMemory);
}

TEST(ExceptionsUnderCapture, InterruptsAndPropagatedErrorsGoOnAtOnce) {
  CaptureException interrupt = raised("KeyboardInterrupt: ");
  interrupt.is_exception = false;
  EXPECT_EQ(judge_capture_exception(interrupt).action, ExceptionAction::kPropagate);
  CaptureException rewrite = raised("RewriteError: a return inside a tensor branch");
  rewrite.propagated = true;
  rewrite.runtime_error = true;
  EXPECT_EQ(judge_capture_exception(rewrite).action, ExceptionAction::kPropagate);
  // Even where it ended a capture CUDA had invalidated.
  interrupt.capture_invalidated = true;
  EXPECT_EQ(judge_capture_exception(interrupt).action, ExceptionAction::kPropagate);
}

TEST(CaptureCost, GrowsWithTheGraphAndNeedsNoClock) {
  EXPECT_EQ(CaptureCost::of(0), CaptureCost::kFixedNs);
  EXPECT_EQ(CaptureCost::of(10) - CaptureCost::of(0), 10 * CaptureCost::kPerNodeNs);
  // A small graph's copies of a few bytes buy its variant within a few hundred calls.
  const int64_t copy = CopyCost::of(2 * 73 * 8, false);
  EXPECT_LT(CaptureCost::of(12) / copy, 200);
}

namespace {

struct Graphs {
  std::vector<bool> fit;
  bool chainable = false;
  bool may_move_outputs = true;
  bool needed = false;   // a held site buffer, or the signature repeats the previous call
  bool rent_due = true;  // the copies saved so far paid for a capture
  mutable int fits_asked = 0;
  mutable int rent_asked = 0;
  GraphChoice choose(const ChainPolicy& policy) const {
    return choose_graph(
        policy, fit.size() - 1,
        [&](size_t i) {
          ++fits_asked;
          return static_cast<bool>(fit[i]);
        },
        [&] { return chainable; }, [&] { return needed; }, [&] { return may_move_outputs; },
        [&] {
          ++rent_asked;
          return rent_due;
        });
  }
};

}  // namespace

TEST(CapturePolicy, ABackwardPassIsPreparedWhereOneMayRun) {
  // Nothing a backward pass could reach: never.
  EXPECT_FALSE(prepares_backward(false, true, true, false));
  // Training, or grad mode on, or no warm-up seen yet: prepared.
  EXPECT_TRUE(prepares_backward(true, true, false, true));
  EXPECT_TRUE(prepares_backward(true, false, true, true));
  EXPECT_TRUE(prepares_backward(true, false, false, false));
  // Inference under no_grad after a warm-up that ran no backward pass: not.
  EXPECT_FALSE(prepares_backward(true, false, false, true));
}

TEST(ChainVariants, TheSignaturesGraphServesWhereItFits) {
  Graphs g{{true, true}, true};
  const GraphChoice c = g.choose({});
  EXPECT_EQ(c.kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(c.graph, 0u);
  EXPECT_EQ(g.fits_asked, 1);  // the replay path asks once
}

TEST(ChainVariants, AFittingVariantServes) {
  Graphs g{{false, false, true}, true};
  const GraphChoice c = g.choose({});
  EXPECT_EQ(c.kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(c.graph, 2u);
}

TEST(ChainVariants, ANewVariantWhereInputsChain) {
  Graphs g{{false, false}, true};
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kCaptureVariant);
  g.chainable = false;
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kUse);
}

TEST(ChainVariants, NoneWhereAnotherGraphReadsTheOutputsInPlace) {
  // A generation's growing shapes: the next signature's graph reads this one's outputs in place.
  // The input its upstream graph now produces elsewhere is copied, not chained by a variant.
  Graphs g{{false}, true};
  g.may_move_outputs = false;
  const GraphChoice c = g.choose({});
  EXPECT_EQ(c.kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(c.graph, 0u);
  // A fitting variant still serves.
  Graphs h{{false, true}, true};
  h.may_move_outputs = false;
  EXPECT_EQ(h.choose({}).graph, 1u);
}

TEST(ChainVariants, NeededAtOnceEvenWhereOutputsAreReadInPlaceOrTheRentIsNotDue) {
  // The graph would copy into a site buffer another tensor holds (its replay would be refused),
  // or a loop over one shape feeds its outputs back: no rent, and no say for readers downstream.
  Graphs g{{false}, true};
  g.needed = true;
  g.may_move_outputs = false;
  g.rent_due = false;
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kCaptureVariant);
  EXPECT_EQ(g.rent_asked, 0);
  // Still none beyond the limit, across ranks, or where nothing could be chained.
  g.chainable = false;
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kUse);
}

TEST(ChainVariants, ElsewhereAVariantWaitsForItsRent) {
  Graphs g{{false}, true};
  g.rent_due = false;
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(g.rent_asked, 1);
  g.rent_due = true;
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kCaptureVariant);
  // A call whose outputs another graph reads in place is not charged: no variant could serve it.
  Graphs h{{false}, true};
  h.may_move_outputs = false;
  EXPECT_EQ(h.choose({}).kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(h.rent_asked, 0);
}

TEST(VariantRent, ACaptureIsBoughtOnceTheCopiesItSavesAddUpToItsCost) {
  VariantRent rent;
  const int64_t capture_ns = 8'000'000;  // a small model's capture, about 8 ms
  const int64_t copy_ns = CopyCost::of(8, /*launched_anyway=*/false);  // a position, alone
  EXPECT_EQ(copy_ns, CopyCost::kLaunchNs);
  int calls = 1;
  while (!rent.charge(copy_ns, capture_ns)) ++calls;
  EXPECT_EQ(calls, static_cast<int>((capture_ns + copy_ns - 1) / copy_ns));
  EXPECT_GE(rent.charged_ns(), capture_ns);
  EXPECT_LT(rent.charged_ns() - copy_ns, capture_ns);
  rent.bought();
  EXPECT_EQ(rent.charged_ns(), 0);
  // A copy of the whole state (tens of MB) pays for a capture within a few hundred calls; a few
  // bytes riding along a copy that is launched anyway never do.
  EXPECT_GT(CopyCost::of(size_t{64} << 20, false), 60'000);
  EXPECT_EQ(CopyCost::of(64, /*launched_anyway=*/true), 0);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rent.charge(CopyCost::of(64, true), capture_ns));
}

TEST(ChainVariants, AtMostThreeAndNoneWithoutPrediction) {
  Graphs full{std::vector<bool>(1 + ChainPolicy::kMaxChainVariants, false), true};
  EXPECT_EQ(full.choose({}).kind, GraphChoice::Kind::kUse);
  Graphs g{{false}, true};
  EXPECT_EQ(g.choose({}).kind, GraphChoice::Kind::kCaptureVariant);
  EXPECT_EQ(g.choose({false}).kind, GraphChoice::Kind::kUse);
  EXPECT_EQ(g.choose({false}).graph, 0u);
}

TEST(Reasons, CaptureErrorsAreKindedByWhatPyTorchSays) {
  EXPECT_EQ(kind_of_capture_error(
                "RuntimeError: called a synchronizing CUDA operation"),
            ReasonKind::kHostSync);
  EXPECT_EQ(kind_of_capture_error("operation not permitted when stream is capturing"),
            ReasonKind::kHostSync);
  EXPECT_EQ(kind_of_capture_error("RuntimeError: Cannot copy between CPU and CUDA tensors during "
                                  "CUDA graph capture unless the CPU tensor is pinned."),
            ReasonKind::kPageableCopy);
  EXPECT_EQ(kind_of_capture_error("AcceleratorError: CUDA error: operation would make the legacy "
                                  "stream depend on a capturing blocking stream"),
            ReasonKind::kLegacyStream);
  EXPECT_EQ(kind_of_capture_error("ValueError: bad shape"), ReasonKind::kCaptureError);
}

TEST(Reasons, EveryKindHasItsOwnName) {
  std::vector<std::string> names;
  for (int k = 0; k <= static_cast<int>(ReasonKind::kReplayRefused); ++k) {
    names.emplace_back(reason_kind_name(static_cast<ReasonKind>(k)));
    EXPECT_NE(names.back(), "unknown");
  }
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
  }
}

TEST(MemoryBudget, EachSideTakesWhatTheOtherLeaves) {
  const MemoryBudget none(std::nullopt);
  EXPECT_FALSE(none.limited());
  EXPECT_EQ(none.arena_limit(123), kNoLimit);
  EXPECT_EQ(none.executable_limit(123), kNoLimit);
  const MemoryBudget budget(100);
  EXPECT_TRUE(budget.limited());
  EXPECT_EQ(budget.arena_limit(30), 70u);
  EXPECT_EQ(budget.executable_limit(100), 0u);
  EXPECT_EQ(budget.executable_limit(250), 0u);
}
