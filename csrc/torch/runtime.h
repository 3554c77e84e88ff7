#pragma once
// The core of a compiled function: signature -> cache entry -> (eager warm-up | capture | replay).
// A call is one C++ call; Python runs only when a call misses (the function itself, and the
// warning of a fallback). runtime.cpp and runtime_graphs.cpp decide which (runtime_without_cuda.cpp
// in a build without CUDA); capture.cpp captures, replay.cpp replays, and core/capture_policy.h
// holds the decisions that need no torch. See docs/design.md.

#include <pybind11/pybind11.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/capture_policy.h"
#include "core/memory_budget.h"
#include "core/reasons.h"
#include "core/alias_sites.h"
#include "core/signature.h"
#include "cuda/executable_stats.h"
#include "torch/python/python_hooks.h"
#include "torch/python/pytree.h"
#include "torch/graphs/runtime_counters.h"
#include "torch/graphs/training.h"

namespace grape {

class GraphCache;
class GraphPool;
class InputSites;
namespace cuda {
class SharedExecutables;
}
struct CapturedGraph;
struct CaptureContext;
struct CaptureOutcome;
struct InputBuffer;

// One call signature of a compiled function.
struct Entry {
  std::string description;
  int warmup_runs = 0;
  // What this signature cost on its way to replays (grape.stats entries' "seconds"): its warm-up
  // calls, its captures (failed tries and chain variants included), and of those, reading the
  // graphs, joining executables and instantiating them, and the chain variants.
  struct Costs {
    int64_t warmup_ns = 0;
    int64_t capture_ns = 0;
    int64_t read_ns = 0;
    int64_t join_ns = 0;
    int64_t instantiate_ns = 0;
    int64_t variant_ns = 0;
  } costs;
  std::unique_ptr<CapturedGraph> graph;
  // Graphs of the same signature whose placeholders are other graphs' outputs (Note [Chain
  // variants]).
  std::vector<std::unique_ptr<CapturedGraph>> chain_variants;
  core::VariantRent variant_rent;  // toward its next chain variant
  core::Reason fallback;  // set: this signature always runs eagerly
  // Its last capture ran out of memory: it runs eagerly for a while, then captures again.
  core::CaptureBackoff out_of_memory;
  core::Reason out_of_memory_reason;
  // Whether its captures build device tensors of Python values in pinned memory (Note [Host
  // constants]): set once one of its captures failed for want of it.
  bool pin_host_constants = false;
  int64_t replays = 0;
  bool reported_refusal = false;
  // The graph cache's stored shape for this signature (Note [The graph cache in the runtime]),
  // its group and index; -1: none.
  int32_t stored_group = -1;
  int32_t stored_shape = -1;
  // Where its live capture is to validate a group: the module tensors' versions when it was
  // found. A function that writes them in place is not run a second time (GraphCache::settle).
  std::vector<int64_t> module_versions;
  Entry();
  ~Entry();
};

class Runtime {
 public:
  // `static_module`: an nn.Module (or None) whose parameters and buffers the function reads.
  // `alias_prediction`: feed an earlier replay's output to the next graph in place (chaining), and
  // hand the caller's allocations at predicted code positions the graphs' input buffers.
  // `sharing`: which graphs share executables: "none", "topology" (Note [Shared executables]) or
  // "near" (near topologies too, Note [Near topologies]).
  // `executable_cache`: bytes of device memory for the executables beyond one per topology, which
  // let shapes replay without patching (Note [Executable slots]); empty: no limit.
  // `memory_budget`: bytes of device memory for the arena and resident executables; empty: none.
  // `warmup_each_signature`: every signature runs `warmup` eager calls before its capture; false:
  // only the function's first `warmup` calls do (Note [Capture policy]).
  // `hooks`: the runtime's way into Python (grape/_hooks.py RuntimeHooks).
  Runtime(py::object fn, int warmup, bool warmup_each_signature, py::object static_module,
          bool alias_prediction, const std::string& sharing,
          std::optional<size_t> executable_cache, std::optional<size_t> memory_budget,
          py::object hooks);
  virtual ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  py::object call(py::args args, py::kwargs kwargs);
  py::dict stats();  // runtime_stats.cpp
  // Writes the function's graphs to its graph cache file (Note [The graph cache in the runtime]);
  // returns what it did ("" where the function has no cache directory).
  std::string save_graph_cache();
  py::list entries() const;
  void reset();

  // For garbage collection: the Python objects this runtime references.
  int traverse(visitproc visit, void* arg);
  void clear_references();

 private:
  py::object run_eager(const py::args& args, const py::kwargs& kwargs);
  // An eager call that warms `entry` up.
  py::object warm_up(Entry& entry, const py::args& args, const py::kwargs& kwargs);
  bool warming_up(const Entry& entry) const;
  void set_fallback(Entry& entry, core::Reason reason, const py::object& error);
  // Why no graph can take these arguments (unsupported types, several devices), or none.
  core::Reason refusal_of_arguments(const py::args& args, const py::kwargs& kwargs,
                                    const FlatCall& flat);
  // A signature's capture point: captures `entry` (its arguments `flat`, flattened with their
  // spec); on failure warms up or falls back (Note [Capture policy]). Returns the result when
  // this call ran eagerly instead of capturing.
  std::optional<py::object> capture_entry(Entry& entry, FlatCall& flat, const py::args& args,
                                          const py::kwargs& kwargs);
  // Captures `flat` for `entry` with the tries the capture policy allows; the outcome is a graph
  // or the last failure. A refused pageable copy sets the entry's pin_host_constants; the time
  // goes to its costs (`variant`: a chain variant's capture). Where f raised an exception of its
  // own, the work before it has run and the exception is thrown (Note [Exceptions under capture]).
  CaptureOutcome capture_with_retry(Entry& entry, FlatCall& flat, bool variant);
  // After a capture that ran out of memory: this call runs eagerly, and the signature is captured
  // again later (core::CaptureBackoff); the first time, the reason is reported.
  py::object defer_after_out_of_memory(Entry& entry, core::Reason reason, const py::args& args,
                                       const py::kwargs& kwargs);
  CaptureContext capture_context(FlatCall& flat);
  // Replays `graph` for `entry`'s call, or runs it eagerly where the replay is refused.
  py::object replay_or_run_eagerly(Entry& entry, CapturedGraph& graph, FlatCall& flat,
                                   const py::args& args, const py::kwargs& kwargs);
  // The graph of `entry` that serves this call (Note [Chain variants]), capturing a chain variant
  // when none fits and one could. `repeated`: the function's previous call was `entry`'s too.
  CapturedGraph& select_graph(Entry& entry, bool repeated, FlatCall& flat, const py::args& args,
                              const py::kwargs& kwargs);
  // Whether every input `graph` chained is in place and it copies no input a capture could chain.
  bool fits(const CapturedGraph& graph, const FlatCall& flat) const;
  // Whether `graph` would copy an input into a site buffer that another tensor holds (its replay
  // is refused then).
  bool site_buffer_held(const CapturedGraph& graph, const FlatCall& flat) const;
  // Whether another graph reads the outputs of one of `entry`'s graphs in place, so that a chain
  // variant laying them out anew would break that chain (Note [Chain variants]).
  static bool outputs_read_in_place(const Entry& entry);
  // What the copies cost (core::CopyCost) that `graph` makes of inputs a chain variant would read
  // in place.
  int64_t copies_a_variant_saves_ns(const CapturedGraph& graph, const FlatCall& flat) const;
  // Whether input i can be its graph's placeholder in place: a live output of an earlier replay,
  // or a buffer of a predicted allocation site (`buffer`, when not null, receives it).
  bool can_alias(const FlatCall& flat, size_t i, std::shared_ptr<InputBuffer>* buffer) const;
  // Learns where the inputs of unknown origin were allocated (Note [Allocation-site prediction]).
  void learn_sites(const FlatCall& flat, bool warm_up);
  GraphPool& pool_for(int device);
  std::string describe(const FlatCall& flat) const;
  // In a forked child: the parent's graphs and memory left alone until the process ends.
  void leave_to_process_end();
  // Keeps a graph that will not replay again until the runtime ends (see retired_).
  void retire(std::unique_ptr<CapturedGraph> graph);
  // Drops `entry`'s graphs, whose static state changed, if it did; returns whether.
  bool drop_if_state_changed(Entry& entry);
  FlatCall& scratch();

  // The graph cache (runtime_graph_cache.cpp; runtime_without_cuda.cpp has none). Opens it once,
  // at the first new signature of a call that may capture.
  void open_graph_cache();
  // Looks `entry` (new, of the call `flat`) up among the stored shapes.
  void find_in_graph_cache(Entry& entry, const FlatCall& flat);
  // Gives `entry` a graph restored from the cache, where its group was validated; returns whether.
  bool restore_from_graph_cache(Entry& entry);
  // After `entry`'s live capture: validates its stored group, or drops it.
  void validate_graph_cache(Entry& entry);
  // After the call that validated `entry` (`replayed`: by its graph; false too where the call
  // raised): a group left pending runs once more, or is dropped (GraphCache::settle).
  void settle_graph_cache(const Entry& entry, bool replayed);
  // What grape.stats reports of the graph cache (None where the function has none).
  py::object graph_cache_stats() const;

  // Where a build with CUDA and one without differ: runtime_graphs.cpp defines these, or
  // runtime_without_cuda.cpp.
  // The executables and the site predictor, made at construction.
  void make_graph_state(bool alias_prediction, const std::string& sharing);
  // Why no call can have graphs in this process (no CUDA device, or none in this build), or none.
  static core::Reason graphs_unavailable();
  // A call where graphs are possible: its signature's warm-up, capture, replay or fallback.
  py::object call_with_graphs(const py::args& args, const py::kwargs& kwargs);
  // Frees a retired graph's executable slot.
  void release_executable(CapturedGraph& graph);
  static int64_t node_count(const Entry& entry);
  void restart_site_learning();
  // What grape.stats reports of the executables, the site predictor and the graph pool (zeros
  // where there are none).
  struct GraphFigures {
    cuda::ExecutableStats executables;
    std::string unshareable_reason;
    core::SiteStats sites;
    int64_t pool_bytes = 0;
    int64_t arena_bytes = 0;
    static constexpr size_t kLanes = 5;  // the arena's lanes (ArenaLane), in order
    std::array<size_t, kLanes> lane_bytes{};
    std::array<size_t, kLanes> lane_peak_bytes{};
    int64_t live_outputs = 0;
  };
  GraphFigures graph_figures();

  py::object fn_;
  py::object static_module_;
  PythonHooks hooks_;
  TrainingState training_;  // Note [Gradients of a captured step]
  std::string last_recapture_reason_;
  bool warned_settings_ = false;  // recaptures for changed optimizer settings: warned once
  core::WarmupPolicy warmup_;
  int function_warmup_runs_ = 0;
  core::ChainPolicy chain_;
  std::optional<size_t> executable_cache_;  // empty: no limit
  core::MemoryBudget budget_;
  Flattener flattener_;
  std::unordered_map<core::Signature, std::unique_ptr<Entry>, core::SignatureHash> cache_;
  const Entry* previous_entry_ = nullptr;  // of the function's previous call (Note [Chain variants])
  // Graphs replaced while the function lives (static state moved, reset()). They are destroyed
  // with the runtime: destroying a graph of a pool that is still capturing tripped the caching
  // allocator's pool bookkeeping on torch 2.11.
  std::vector<std::unique_ptr<CapturedGraph>> retired_;
  std::shared_ptr<GraphPool> pool_;
  std::shared_ptr<cuda::SharedExecutables> executables_;  // outlives the graphs it serves
  // shared_ptr: a deleter of its own, so builds without CUDA never see the type.
  std::shared_ptr<GraphCache> graph_cache_;  // null: no cache directory, or not opened yet
  bool graph_cache_opened_ = false;
  std::unique_ptr<InputSites> sites_;  // null when alias prediction is off
  // Whether the last thing this function did was a replay (not a capture, warm-up or eager run):
  // only then does an idle stream at a launch mean that the GPU waits for launches (Note
  // [Executable slots]).
  bool last_was_replay_ = false;
  // A replay found an output another thread holds in the pool: outputs leave the pool before
  // their call returns from then on (Note [Outputs of several threads]).
  bool copy_outputs_out_ = false;
  RuntimeCounters stats_;
  core::Reason global_fallback_;  // set when graphs are impossible for every call (no CUDA)
  bool checked_cuda_ = false;
  std::vector<std::unique_ptr<FlatCall>> scratch_;  // one per nesting depth of calls
  size_t depth_ = 0;
};

}  // namespace grape
