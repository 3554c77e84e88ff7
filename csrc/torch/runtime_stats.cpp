// Runtime::stats(): the counters of a compiled function as grape.stats() reports them. Every key
// is defined, with its meaning, in grape/_stats.py's table; a test fails on a key missing there.
#include "torch/runtime.h"

#include "core/clock.h"

#include <iterator>

namespace grape {

namespace {

// `figure(lane)` of each arena lane (ArenaLane's values, in order), by its name in grape.stats.
constexpr const char* kLaneNames[] = {"large", "small", "placeholder", "input", "output"};
py::dict per_lane(const std::array<size_t, std::size(kLaneNames)>& figure) {
  py::dict d;
  for (size_t lane = 0; lane < std::size(kLaneNames); ++lane) d[kLaneNames[lane]] = figure[lane];
  return d;
}

py::object none_if_empty(std::optional<size_t> v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}

py::object none_if_empty(const std::string& s) {
  return s.empty() ? py::object(py::none()) : py::object(py::str(s));
}

}  // namespace

py::dict Runtime::stats() {
  // No call lock (a backward pass may ask while the holder waits for it): what is read here
  // changes only while the GIL is held, as this does (Note [One compiled call at a time]).
  py::dict d;
  d["calls"] = stats_.calls;
  d["replays"] = stats_.replays;
  d["captures"] = stats_.captures;
  d["warmup_calls"] = stats_.warmup_calls;
  d["eager_calls"] = stats_.eager_calls;
  d["recaptures"] = stats_.recaptures;
  d["capture_failures"] = stats_.capture_failures;
  d["raised_under_capture"] = stats_.raised_under_capture;
  d["capture_seconds"] = core::seconds(stats_.capture_ns);
  d["warmup_seconds"] = core::seconds(stats_.warmup_ns);
  d["chain_variant_seconds"] = core::seconds(stats_.chain_variant_ns);
  d["capture_function_seconds"] = core::seconds(stats_.capture_function_ns);
  d["replay_seconds"] = core::seconds(stats_.replay_ns);
  d["launch_seconds"] = core::seconds(stats_.launch_ns);
  d["bytes_copied_in"] = stats_.bytes_copied_in;
  d["bytes_copied_back"] = stats_.bytes_copied_back;
  d["bytes_evacuated"] = stats_.bytes_evacuated;
  d["inputs_moved"] = stats_.inputs_moved;
  d["inputs_in_place"] = stats_.inputs_in_place;
  d["evacuations"] = stats_.evacuations;
  d["eager_for_other_threads"] = stats_.eager_for_other_threads;
  d["outputs_copied_out"] = stats_.outputs_copied_out;
  d["bytes_copied_out"] = stats_.bytes_copied_out;
  d["alias_prediction"] = chain_.alias_prediction;
  d["alias_predictions"] = stats_.alias_predictions;
  d["alias_hits"] = stats_.alias_hits;
  d["alias_misses"] = stats_.alias_misses;
  d["bytes_avoided"] = stats_.bytes_avoided;
  d["chain_variants"] = stats_.chain_variants;
  d["chain_variants_deferred"] = stats_.chain_variants_deferred;
  d["capture_oom_retries"] = stats_.capture_oom_retries;
  d["replanned_captures"] = stats_.replanned_captures;
  d["replans_diverged"] = stats_.replans_diverged;
  int64_t pinning = 0;
  for (const auto& [signature, entry] : cache_) pinning += entry->pin_host_constants ? 1 : 0;
  d["pinned_host_constants"] = pinning;
  d["last_recapture_reason"] = none_if_empty(last_recapture_reason_);
  d["warmup_each_signature"] = warmup_.each_signature;
  d["first_sight_failures"] = warmup_.first_sight_failures;
  d["memory_budget"] = none_if_empty(budget_.bytes());
  d["graph_cache"] = graph_cache_stats();
  const GraphFigures figures = graph_figures();
  const cuda::ExecutableStats& ex = figures.executables;
  const std::string& unshareable_reason = figures.unshareable_reason;
  const core::SiteStats& sites = figures.sites;
  d["shapes"] = ex.members;
  d["topology_groups"] = ex.groups;
  d["unshareable_groups"] = ex.unshareable;
  d["unshareable_reason"] = unshareable_reason.empty()
                                ? py::object(py::none())
                                : py::str("graphs cannot share executables: " + unshareable_reason);
  d["resident_executables"] = ex.resident;
  d["executable_bytes"] = static_cast<int64_t>(ex.device_bytes);
  d["cached_executable_bytes"] = static_cast<int64_t>(ex.cached_bytes);
  d["executable_cache"] = none_if_empty(executable_cache_);
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
  d["patch_seconds"] = core::seconds(ex.patch_ns);
  d["graph_read_seconds"] = core::seconds(ex.read_ns);
  d["join_seconds"] = core::seconds(ex.join_ns);
  d["settle_seconds"] = core::seconds(ex.settle_ns);
  d["instantiate_seconds"] = core::seconds(ex.instantiate_ns);
  d["params_bytes"] = static_cast<int64_t>(ex.params_bytes);
  d["params_raw_bytes"] = static_cast<int64_t>(ex.params_raw_bytes);
  d["input_sites"] = sites.sites;
  d["site_allocations"] = sites.site_allocations;
  d["site_buffers_busy"] = sites.site_buffers_busy;
  d["input_buffer_bytes"] = sites.buffer_bytes;
  int64_t graphs = 0;
  for (const auto& kv : cache_) graphs += kv.second->graph ? 1 : 0;
  d["graphs"] = graphs;
  d["signatures"] = static_cast<int64_t>(cache_.size());
  // Graph memory; zeros before the first capture.
  d["pool_bytes"] = figures.pool_bytes;
  d["arena_bytes"] = figures.arena_bytes;
  d["arena_lane_bytes"] = per_lane(figures.lane_bytes);
  d["arena_lane_peak_bytes"] = per_lane(figures.lane_peak_bytes);
  d["live_outputs"] = figures.live_outputs;
  d["fallback"] = none_if_empty(global_fallback_.text);
  return d;
}

}  // namespace grape
