#pragma once
// Note [The graph cache in the runtime]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A function compiled with a cache directory (grape.compile(cache_dir=...)) keeps what it
// captured in one file (Note [Graph cache files]) and a later process restores from it
// (docs/design.md, "The graph cache"):
//   - Reading: at the function's first call that may capture, under the key Python computes
//     (grape/_graph_cache.py). A miss or an unreadable file is reported once; nothing is restored.
//   - A new call signature is looked up among the stored shapes (Note [Signatures of stored
//     graphs]; never a shape whose signature names an object by identity, which no call can
//     tell from another of its type). Where its group has had no live capture yet, the call
//     captures as ever, and the capture is matched against the stored shape, its nodes (Note
//     [Relocating stored graphs]) and its entry (Note [Stored entries]): equal, and
//     the group is validated, this process's kernels and foreign addresses learned from it;
//     different, and the group is dropped with the reason, its shapes captured as they come.
//     Where they differ in literal bytes only (arguments a launching function left uninitialized
//     hold whatever its stack held), the call replays first; then the live capture runs once
//     more with the stored bytes there (settle): the same outputs validate the group, those
//     bytes being ones no kernel reads; other outputs drop it, and are put back as they were.
//     Where its group is validated, the stored shape is relocated, joins the live capture's
//     executable group as a new shape, and replays from this call on, never captured.
//   - Storing (save: grape.save_graph_cache(), and at exit): every storable shape the function
//     holds, grouped as its executables are, with what replays need besides the nodes (Note
//     [Stored entries]). A shape that cannot be stored is counted by its reason. The file's groups
//     that were not dropped are written again as they were read (their unused shapes too), beside
//     the groups of what this process captured; a process that captured nothing the file lacks
//     does not write it.
// Restoring is lazy, at the call that needs the shape: a stored signature names this process's
// interned constants and objects only once a call has shown them.

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/clock.h"
#include "core/graph_relocation.h"
#include "core/graph_store_file.h"
#include "core/signature.h"
#include "core/stored_signatures.h"
#include "cuda/shared_executables.h"
#include "torch/graphs/stored_graph.h"
#include "torch/python/pytree.h"

namespace grape {

class GraphCache {
 public:
  // Reads `path` under `key`: a file of another key is a miss, a damaged one unreadable
  // (status() says which, and why).
  GraphCache(std::string path, std::string key);

  struct Found {
    uint32_t group = 0;
    uint32_t shape = 0;
  };
  // The stored shape that serves calls of `signature` (this process's, described by
  // `flattener`), if any; learns what its local words stand for here.
  std::optional<Found> find(const core::Signature& signature, const Flattener& flattener);
  // Whether `found`'s group was validated by a live capture, and can restore its shapes.
  bool validated(const Found& found) const;
  // Whether `found`'s group has had no live capture yet: a capture of it will validate or drop it.
  bool awaits_validation(const Found& found) const;
  // After a live capture of `found` (`graph`, in `executables`): validates its group, or drops
  // it with the reason, or (`may_run`: the function wrote no module tensor in place) leaves it
  // pending a run (settle).
  void validate(const Found& found, const CapturedGraph& graph,
                cuda::SharedExecutables& executables, const NamedTensors& named,
                bool may_run);
  // After the call that validate() left pending (a match that failed on literal bytes only;
  // `replayed`: whether it replayed the live capture, which must still be its signature's graph,
  // `current`): runs the live capture with the stored bytes, and validates the group where the
  // outputs are the same, else drops it.
  void settle(const CapturedGraph* current, bool replayed, cuda::SharedExecutables& executables,
              const NamedTensors& named);
  bool pending() const { return pending_.has_value(); }
  // `found`'s shape, relocated into this process (its group validated): a graph that replays
  // without a capture, or null where it cannot be restored (counted by the reason).
  std::unique_ptr<CapturedGraph> restore(
      const Found& found, const std::shared_ptr<GraphPool>& pool,
      const std::shared_ptr<cuda::SharedExecutables>& executables, const NamedTensors& named);

  struct ShapeToStore {
    const core::Signature* signature;
    const CapturedGraph* graph;
  };
  // Writes `shapes` (the function's graphs now) to the file under `key`, unless every one came
  // from the file. Returns what failed, or "".
  std::string save(const std::vector<ShapeToStore>& shapes, const std::string& key,
                   cuda::SharedExecutables& executables, const GraphArena& arena,
                   const NamedTensors& named, const Flattener& flattener);

  struct Figures {
    std::string status;  // "read", "no file", "miss: ...", "unreadable: ..."
    int64_t stored_groups = 0;  // in the file read
    int64_t stored_shapes = 0;
    int64_t restored_shapes = 0;
    int64_t validated_groups = 0;
    int64_t leftover_halves = 0;  // 4-byte units validation took for halves of host addresses
    // Group bytes (every stored shape's alike) in which validation found the live capture's
    // differ, taken from it for restored shapes.
    int64_t taken_from_live = 0;
    // Bytes in which the live capture differed and a run with the stored ones gave the same
    // outputs: bytes no kernel reads.
    int64_t unread_bytes = 0;
    std::vector<std::string> dropped_groups;       // why each was dropped
    std::map<std::string, int64_t> unrestored;     // shapes of validated groups not restored
    int64_t load_ns = 0;     // reading the file
    int64_t file_bytes = 0;  // its size
    int64_t restore_ns = 0;  // validating groups and restoring shapes
    int64_t restore_join_ns = 0;  // of restore_ns: restored shapes joining their groups
    int64_t restore_validate_ns = 0;  // of restore_ns: matching live captures, and runs
    int64_t restore_relocate_ns = 0;  // of restore_ns: rewriting stored words for this process
    int64_t saved_shapes = -1;                  // at the last save that wrote; -1: none
    int64_t writes = 0;                         // saves that wrote the file
    std::map<std::string, int64_t> unstored;  // at the last save, by reason
    int64_t store_ns = 0;
  };
  const Figures& figures() const { return figures_; }
  const std::string& path() const { return path_; }

 private:
  enum class GroupState { kUnseen, kPending, kValidated, kDropped };
  struct GroupRestore {
    GroupState state = GroupState::kUnseen;
    core::RestoreContext context;                // kValidated: what the live capture taught
    core::HostAddresses live_host;               // this process's, when its live capture came
    cuda::SharedExecutables::Member live;        // kValidated: the shapes join its group
    std::vector<bool> restored;                  // per stored shape
    // What its signatures' local words stand for here: per group, since a file's groups may come
    // from different storing processes, each numbering its objects its own way.
    core::LocalWordMap local_words;
  };
  void drop(GroupRestore& group, uint32_t index, std::string why);
  // Validation's time since `start`, in restore_ns and restore_validate_ns.
  void charge_validation(core::Clock::time_point start);
  // Why the live capture `graph` of `found` differs from the stored shape, or "" (then `group`'s
  // context has learned this process's kernels and foreign addresses).
  std::string match(const Found& found, const CapturedGraph& graph,
                    cuda::SharedExecutables& executables, const NamedTensors& named,
                    GroupRestore& group);

  // Whether running `graph` (of `topology`) with `variant`'s parameters leaves its outputs as
  // the call's replay left them (they are put back where not), or why it cannot tell (`why`).
  bool same_outputs(const CapturedGraph& graph, uint64_t topology,
                    cuda::SharedExecutables& executables, const std::vector<core::Blob>& variant,
                    std::string& why);

  // A group whose live capture differs in literal bytes only, until settle().
  struct Pending {
    Found found;
    uint64_t graph = 0;  // the live capture's CapturedGraph::id
    std::vector<core::Blob> variant;  // the live capture's blobs with the stored bytes
    std::string why;                  // the match's reason, kept for a drop
  };
  std::optional<Pending> pending_;

  std::string path_;
  std::vector<core::StoredGroup> groups_;  // from the file
  std::vector<GroupRestore> restores_;     // per stored group
  std::string key_;  // the file's, where it was read
  // Graphs of the file's groups (restored, or the live captures that validated one), which a
  // write carries over as they were read, and graphs this process wrote.
  std::unordered_set<uint64_t> from_file_;  // by CapturedGraph::id
  std::unordered_set<uint64_t> written_;
  Figures figures_;
};

}  // namespace grape
