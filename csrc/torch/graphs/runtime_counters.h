#pragma once
// The counters of one compiled function. grape/_stats.py's table defines every key that
// grape.stats() reports, these among them, with its meaning.

#include <cstdint>

namespace grape {

struct RuntimeCounters {
  int64_t calls = 0;
  int64_t replays = 0;
  int64_t captures = 0;
  int64_t warmup_calls = 0;
  int64_t eager_calls = 0;  // calls of keys that fell back to eager, and refused replays
  int64_t recaptures = 0;   // graphs dropped because static state moved
  int64_t capture_failures = 0;
  int64_t raised_under_capture = 0;  // captures that f's own exception ended (it reached the caller)
  int64_t capture_ns = 0;
  int64_t warmup_ns = 0;         // wall time of warm-up calls
  int64_t chain_variant_ns = 0;  // of capture_ns, in chain-variant captures
  int64_t capture_function_ns = 0;  // of capture_ns, in the function itself
  int64_t bytes_copied_in = 0;
  int64_t bytes_copied_back = 0;
  int64_t bytes_evacuated = 0;
  int64_t inputs_moved = 0;
  int64_t inputs_in_place = 0;
  int64_t evacuations = 0;
  // Note [Outputs of several threads]
  int64_t eager_for_other_threads = 0;  // calls whose replay would have moved such an output
  int64_t outputs_copied_out = 0;       // outputs copied out of the pool before their call returned
  int64_t bytes_copied_out = 0;
  int64_t alias_predictions = 0;  // placeholders used in place: an earlier replay's output
                                  // (chained) or a buffer of a predicted allocation site
  int64_t alias_hits = 0;         // predicted inputs found in place at replay
  int64_t alias_misses = 0;       // predicted placeholders that had to be copied into
  int64_t bytes_avoided = 0;      // input bytes the hits did not copy
  int64_t chain_variants = 0;     // extra graphs captured to chain a signature's inputs
  int64_t chain_variants_deferred = 0;  // calls that copied what a variant not yet worth its
                                        // capture would read in place (Note [Chain variants])
  int64_t capture_oom_retries = 0;  // captures retried after an out-of-memory freed executables
  int64_t replanned_captures = 0;   // captures taken again along a planned layout (Note
                                    // [Planned capture layouts]) ...
  int64_t replans_diverged = 0;     // ... of which some allocation did not come as planned
  int64_t replay_ns = 0;  // host time of replays: preparing the executable, copies, launch
  int64_t launch_ns = 0;  // ... of it, in graph launches (the driver's share)
};

}  // namespace grape
