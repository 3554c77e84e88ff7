#pragma once
// The core of a compiled function: signature -> cache entry -> (eager warm-up | capture | replay).
// A call is one C++ call; Python runs only when a call misses (the function itself, and the
// warning of a fallback). See docs/design.md for the whole picture.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/address_ranges.h"
#include "core/arena_layout.h"
#include "core/signature.h"
#include "torch/pytree.h"
#include "torch/training.h"
#ifdef GRAPE_WITH_CUDA
#include "cuda/shared_executables.h"
#endif

namespace grape {

class GraphPool;
class InputSites;
namespace cuda {
class SharedExecutables;
}
struct CapturedGraph;
struct Effect;
struct InputBuffer;

struct RuntimeStats {
  int64_t calls = 0;
  int64_t replays = 0;
  int64_t captures = 0;
  int64_t warmup_calls = 0;
  int64_t eager_calls = 0;  // calls of keys that fell back to eager, and refused replays
  int64_t recaptures = 0;   // graphs dropped because static state moved
  int64_t capture_failures = 0;
  int64_t capture_ns = 0;
  int64_t bytes_copied_in = 0;
  int64_t bytes_copied_back = 0;
  int64_t bytes_evacuated = 0;
  int64_t inputs_moved = 0;
  int64_t inputs_in_place = 0;
  int64_t evacuations = 0;
  int64_t alias_predictions = 0;  // placeholders used in place: an earlier replay's output
                                  // (chained) or a buffer of a predicted allocation site
  int64_t alias_hits = 0;         // predicted inputs found in place at replay
  int64_t alias_misses = 0;       // predicted placeholders that had to be copied into
  int64_t bytes_avoided = 0;      // input bytes the hits did not copy
  int64_t chain_variants = 0;     // extra graphs captured to chain a signature's inputs
  int64_t capture_oom_retries = 0;  // captures retried after an out-of-memory freed executables
  int64_t replanned_captures = 0;   // captures taken again along a planned layout (Note
                                    // [Planned capture layouts]) ...
  int64_t replans_diverged = 0;     // ... of which some allocation did not come as planned
  int64_t replay_ns = 0;  // host time of replays: preparing the executable, copies, launch
  int64_t launch_ns = 0;  // ... of it, in graph launches (the driver's share)
};

struct Entry {
  std::string description;
  int warmup_runs = 0;
  std::unique_ptr<CapturedGraph> graph;
  // Graphs of the same signature whose placeholders are other graphs' outputs (chain prediction
  // for a signature first captured with a caller's tensors).
  std::vector<std::unique_ptr<CapturedGraph>> chain_variants;
  std::string fallback_reason;  // non-empty: this signature always runs eagerly
  // Whether its captures build device tensors of Python values in pinned memory (Note [Host
  // constants]): set once one of its captures failed for want of it.
  bool pin_host_constants = false;
  int64_t replays = 0;
  bool reported_refusal = false;
  Entry();
  ~Entry();
};

// Exception types that a capture lets through to the caller instead of falling back to eager.
void set_propagated_errors(py::tuple types);

class Runtime {
 public:
  // `static_module`: an nn.Module (or None) whose parameters and buffers the function reads.
  // `alias_prediction`: feed an earlier replay's output to the next graph in place (chaining), and
  // hand the caller's allocations at predicted code positions the graphs' input buffers.
  // `sharing`: which graphs share executables: "none", "topology" (Note [Shared executables]) or
  // "near" (near topologies too, Note [Near topologies]).
  // `executable_cache`: bytes of device memory for the executables beyond one per topology, which
  // let shapes replay without patching (Note [Executable slots]); < 0: no limit.
  // `memory_budget`: bytes of device memory for the arena and resident executables; < 0: none.
  // `warmup_each_signature`: every signature runs `warmup` eager calls before its capture; false:
  // only the function's first `warmup` calls do, and a signature whose capture fails without a
  // warm-up of its own runs eagerly once and is captured again at its next call.
  Runtime(py::object fn, int warmup, bool warmup_each_signature, py::object static_module,
          bool alias_prediction, const std::string& sharing, int64_t executable_cache,
          int64_t memory_budget);
  virtual ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  py::object call(py::args args, py::kwargs kwargs);
  py::dict stats();
  py::list entries() const;
  void reset();

  // For garbage collection: the Python objects this runtime references.
  int traverse(visitproc visit, void* arg);
  void clear_references();

 private:
  py::object run_eager(const py::args& args, const py::kwargs& kwargs);
  // Returns false (with the reason) when this call must run eagerly instead.
  bool replay(Entry& entry, CapturedGraph& graph, FlatCall& flat, py::object& result,
              std::string& refusal);
  // Where a capture's allocations go (Note [Planned capture layouts]): the plan it follows (empty:
  // first fit), and the plan it asks to be captured again along (`retake`, set by a capture that
  // dropped its graph for growing the arena well beyond that plan).
  struct CaptureLayout {
    std::vector<core::LayoutPlan> follow;
    std::vector<core::LayoutPlan> retake;
  };
  // `out_of_memory` tells whether the capture failed for want of memory.
  // `pin_host_constants`: run f under grape._host_constants.PinnedHostConstants.
  bool capture(FlatCall& flat, std::unique_ptr<CapturedGraph>& into, std::string& reason,
               py::object& error, bool& out_of_memory, bool pin_host_constants,
               CaptureLayout& layout);
  // Whether every block in `survivors` (allocated by a capture, still allocated after it) holds
  // one of `results` (the outputs and effects' values): then the capture may be dropped and taken
  // again.
  static bool only_results_survive(const std::vector<core::AddressRange>& survivors,
                                   const FlatCall& results);
  // Why a capture's results cannot be replayed faithfully, or empty; flattens them into `out`.
  std::string refusal_of_results(const py::object& result, const std::vector<Effect>& effects,
                                 const py::list& effect_values, bool effects_ok,
                                 const std::string& effects_reason, bool backward_ran,
                                 const std::vector<at::Tensor>& placeholders, FlatCall& flat,
                                 FlatCall& out);
  // capture(), and again along the planned layout that it asks for.
  bool capture_planned(FlatCall& flat, std::unique_ptr<CapturedGraph>& into, std::string& reason,
                       py::object& error, bool& out_of_memory, bool pin_host_constants);
  // capture_planned(), once more with host constants pinned if it copied from pageable memory
  // (Note [Host constants]), and once more after freeing every executable and cached block if
  // memory ran out; `out_of_memory` tells whether the last try failed for want of memory.
  // `pin_host_constants`: the signature's flag, which a refused pageable copy sets.
  bool capture_with_retry(FlatCall& flat, std::unique_ptr<CapturedGraph>& into,
                          std::string& reason, py::object& error, bool& out_of_memory,
                          bool& pin_host_constants);
  // Evicts least recently used executables until the budget holds, sparing `keep`'s.
  void enforce_budget(const CapturedGraph* keep);
  // The graph of `entry` that serves this call: the one whose chained inputs are in place,
  // capturing a chained variant when none is and one could be.
  CapturedGraph& select_graph(Entry& entry, FlatCall& flat, const py::args& args,
                              const py::kwargs& kwargs);
  bool fits(const CapturedGraph& graph, const FlatCall& flat) const;
#ifdef GRAPE_WITH_CUDA
  // After a launch: patches the shared executable for the graph predicted to come next.
  void patch_ahead(const cuda::SharedExecutables::Member& launched);
#endif
  // Whether input i can be its graph's placeholder in place: a live output of an earlier replay,
  // or a buffer of a predicted allocation site (`buffer`, when not null, receives it).
  bool can_alias(const FlatCall& flat, size_t i, std::shared_ptr<InputBuffer>* buffer) const;
  // Learns where the inputs of unknown origin were allocated (Note [Allocation-site prediction]).
  void learn_sites(const FlatCall& flat, bool warm_up);
  GraphPool& pool_for(c10::DeviceIndex device);
  static constexpr size_t kMaxChainVariants = 3;
  void set_fallback(Entry& entry, std::string reason, const py::object& error);
  // Why no graph can take these arguments (unsupported types, several devices), or empty.
  std::string refusal_of_arguments(const py::args& args, const py::kwargs& kwargs,
                                   const FlatCall& flat);
  // Whether this process is a rank of an initialized torch.distributed process group.
  static bool in_process_group();
  // At a capture point: this rank's outcome (`captured`, else `reason`) made common to every rank
  // (Note [Capture points agree across ranks]); returns whether to replay. Where another rank
  // failed, drops this rank's graph and sets the common reason and out_of_memory.
  bool agree_across_ranks(Entry& entry, bool captured, std::string& reason, py::object& error,
                          bool& out_of_memory);
  void report(const std::string& description, const std::string& reason, const py::object& error);
  std::string describe(const FlatCall& flat) const;
  // Keeps a graph that will not replay again until the runtime ends (see retired_).
  void retire(std::unique_ptr<CapturedGraph> graph);
  // Whether a call of `entry`'s signature is a warm-up call (eager, before its capture).
  bool warming_up(const Entry& entry) const;
  // An eager call that warms `entry` up.
  py::object warm_up(Entry& entry, const py::args& args, const py::kwargs& kwargs);
  std::vector<std::pair<at::Tensor, const void*>> gather_static_tensors(const FlatCall& flat);
  // What of a graph's static state (parameters, buffers, gradients, optimizer state and
  // settings) is not as it was captured, if anything; `changed` says it in words.
  enum class StateChange { kNone, kTensorMoved, kGradientMoved, kOptimizerSetting };
  StateChange static_state_change(const CapturedGraph& graph, std::string& changed) const;
  FlatCall& scratch();

  py::object fn_;
  py::object static_module_;
  TrainingState training_;  // Note [Gradients of a captured step]
  std::string last_recapture_reason_;
  bool warned_settings_ = false;  // recaptures for changed optimizer settings: warned once
  int warmup_;
  bool warmup_each_signature_;
  int function_warmup_runs_ = 0;
  bool alias_prediction_;
  int64_t executable_cache_;  // < 0: no limit
  int64_t memory_budget_;     // < 0: none
  Flattener flattener_;
  std::unordered_map<core::Signature, std::unique_ptr<Entry>, core::SignatureHash> cache_;
  // Graphs replaced while the function lives (static state moved, reset()). They are destroyed
  // with the runtime: destroying a graph of a pool that is still capturing tripped the caching
  // allocator's pool bookkeeping on torch 2.11.
  std::vector<std::unique_ptr<CapturedGraph>> retired_;
  std::shared_ptr<GraphPool> pool_;
  std::shared_ptr<cuda::SharedExecutables> executables_;  // outlives the graphs it serves
  std::unique_ptr<InputSites> sites_;  // null when alias prediction is off
#ifdef GRAPE_WITH_CUDA
  // The graph launched last, and for each launched graph the one launched after it last time,
  // confirmed where the same one followed it the time before too.
  struct Successor {
    cuda::SharedExecutables::Member next;
    bool confirmed = false;
  };
  cuda::SharedExecutables::Member last_launched_;
  std::unordered_map<uint64_t, Successor> successor_;
#endif
  // Whether the last thing this function did was a replay (not a capture, warm-up or eager run):
  // only then does an idle stream at a launch mean that the GPU waits for launches (Note
  // [Executable slots]).
  bool last_was_replay_ = false;
  // Whether capture points were agreed with other ranks (Note [Capture points agree across ranks]).
  bool ranks_agree_ = false;
  RuntimeStats stats_;
  std::string global_fallback_;  // set when graphs are impossible for every call (no CUDA)
  bool checked_cuda_ = false;
  std::vector<std::unique_ptr<FlatCall>> scratch_;  // one per nesting depth of calls
  size_t depth_ = 0;
};

}  // namespace grape
