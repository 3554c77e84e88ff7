#pragma once
// Allocation-site prediction for inputs that the caller's code allocates (Note [Allocation-site
// prediction] in core/alias_sites.h): the Python side of the key, the buffers, and the entry the
// allocator hook calls.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <map>
#include <optional>
#include <unordered_map>
#include <memory>
#include <vector>

#include "core/alias_sites.h"

namespace grape {

class GraphPool;

// A block of a function's input lane that the allocations of one site and size class take in turn.
struct InputBuffer {
  c10::DataPtr block;
  size_t capacity = 0;
  cudaStream_t stream = nullptr;  // handed out on this stream only, as the caching allocator does
  int64_t owner = 0;              // the InputSites it belongs to
  std::atomic<bool> in_use{false};
  std::atomic<bool> retired{false};  // used on another stream: never handed out again
};

// The input buffers of one compiled function and what it learned about where its inputs come from.
// Every method runs with the GIL held.
class InputSites {
 public:
  static constexpr size_t kBuffersPerClass = 2;

  InputSites();
  ~InputSites();  // forgets the function's sites; buffers live on while tensors use them
  InputSites(const InputSites&) = delete;
  InputSites& operator=(const InputSites&) = delete;

  // Buffers come from this pool's arena (until then, nothing is predicted).
  void attach(std::shared_ptr<GraphPool> pool);
  bool attached() const { return pool_ != nullptr; }

  // At the start of a call: learns the sites of inputs of unknown origin. `explained[i]`: input i
  // needs no site (an earlier replay's output, or already one of this function's buffers).
  // `warm_up`: the call runs eagerly to warm up. Returns whether a site was learned.
  bool learn(const std::vector<at::Tensor>& inputs, const std::vector<bool>& explained,
             bool warm_up);
  // Whether to record allocations until the next call.
  bool learning() const { return budget_.learning(); }
  // At the start of every call.
  void begin_call() { inputs_explained_ = false; }
  // A replay copied an input: unless this call's inputs were all explained by what the function
  // learned, record allocations again (within the learning budget).
  void resume_learning() {
    if (!inputs_explained_ && !budget_.learning()) set_learning(budget_.resume());
  }
  // Learning from scratch (Runtime::reset()).
  void restart_learning();

  // The buffer whose hand-out `t`'s storage is, if it is one of this function's.
  std::shared_ptr<InputBuffer> buffer_of(const at::Tensor& t) const;
  // Whether a buffer over [ptr, ptr + bytes) is handed out now: asked for a graph restored from
  // the graph cache, whose placeholder is memory these sites hand out.
  bool holds(const void* ptr, size_t bytes) const;

  const core::SiteStats& stats() const { return stats_; }

  // The allocator hook's side: a buffer for an allocation at `site` of `bytes`, if one is free.
  std::optional<c10::DataPtr> hand_out(const core::Site& site, size_t bytes);

 private:
  void set_learning(bool on);

  int64_t id_;
  std::shared_ptr<GraphPool> pool_;
  core::LearningBudget budget_;
  std::vector<core::Site> own_sites_;  // each holds a reference to its code object
  bool counted_as_learner_ = false;
  bool inputs_explained_ = false;  // learn() found every input of this call explained
  // Per site, per size class.
  std::unordered_map<core::Site, std::map<int, std::vector<std::shared_ptr<InputBuffer>>>,
                     core::SiteHash>
      buffers_;
  core::SiteStats stats_;
};

// Marks the thread as one that calls compiled functions, and the duration of a call: allocations
// made inside a call (warm-up runs, captures, replays) are never predicted or recorded.
class CallScope {
 public:
  CallScope();
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
};

// For the allocator hook: whether any allocation may need a look at its site (a cheap check), and
// the allocation itself when it may.
bool site_prediction_wanted();
c10::DataPtr allocate_at_site(c10::cuda::CUDACachingAllocator::CUDAAllocator& inner, size_t bytes);
// The deleter of buffer hand-outs, and what the hook does when one is used on another stream.
void release_hand_out(void* context);
void retire_hand_out(const c10::DataPtr& data);

}  // namespace grape
