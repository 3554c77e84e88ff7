#include "torch/graphs/replay.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <vector>

#include "core/replay_plan.h"
#include "cuda/batched_copy.h"
#include "core/clock.h"
#include "torch/memory/budget.h"
#include "torch/memory/site_predictor.h"

namespace grape {

namespace {

using core::elapsed_ns;

ReplayOutcome refused(std::string why) {
  ReplayOutcome outcome;
  outcome.refusal = std::move(why);
  return outcome;
}

// A gradient the step replaces and nothing else holds is dropped now, as eager drops it, so this
// replay need not move it out of its way; not one the graph reads before replacing it (a guarded
// one).
void drop_replaced_gradients(const CapturedGraph& g) {
  for (const auto& e : g.effects) {
    if (!e.leaf.defined() || e.reads_replaced) continue;
    at::Tensor& grad = e.leaf.mutable_grad();
    if (grad.defined() && held_by_leaf_only(grad)) grad.reset();
  }
}

// This call's memory as the plan sees it (Note [Liveness of graph outputs]): the storages of its
// tensors, each once, then the pool's other live storages, and each input against its placeholder.
struct CallMemory {
  std::vector<c10::StorageImpl*> impls;
  std::vector<core::PlanStorage> storages;
  std::vector<core::PlanInput> inputs;
  std::vector<core::PlanPlaceholder> placeholders;
};

CallMemory describe_call(const CapturedGraph& g, const FlatCall& flat, const GraphPool& pool) {
  const size_t n = flat.tensors.size();
  CallMemory m;
  m.inputs.resize(n);
  m.placeholders.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = flat.tensors[i];
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    int s = -1;
    for (size_t j = 0; j < m.impls.size(); ++j) {
      if (m.impls[j] == impl) s = static_cast<int>(j);
    }
    if (s < 0) {
      s = static_cast<int>(m.impls.size());
      m.impls.push_back(impl);
      m.storages.push_back({core::make_range(impl->data(), impl->nbytes())});  // pool's: below
    }
    const size_t bytes = g.placeholders[i].bytes;
    m.inputs[i] = {s, core::make_range(t.data_ptr(), bytes), is_whole_storage(t, bytes)};
    m.placeholders[i] = {core::make_range(g.placeholders[i].ptr, bytes),
                         g.placeholders[i].mutated, g.placeholders[i].site_buffer};
  }
  // One pass over the pool's live storages: the call's are marked, the others follow.
  const size_t of_call = m.impls.size();
  for (const auto& live : pool.live()) {
    c10::StorageImpl* impl = live.storage._unsafe_get_target();
    const bool other_thread = !live.taken_by_this_thread();
    const auto found = std::find(m.impls.begin(), m.impls.begin() + of_call, impl);
    if (found != m.impls.begin() + of_call) {
      core::PlanStorage& storage = m.storages[static_cast<size_t>(found - m.impls.begin())];
      storage.pool_resident = true;
      storage.other_thread = other_thread;
      continue;
    }
    m.impls.push_back(impl);
    m.storages.push_back({live.range, true, other_thread});
  }
  return m;
}

// Live outputs the replay may overwrite move out of its way: all of them but the inputs that stay
// put or move into their placeholders.
void evacuate_live_outputs(GraphPool& pool, const CallMemory& m, const core::ReplayPlan& plan,
                           cudaStream_t stream, RuntimeCounters& stats) {
  std::vector<c10::StorageImpl*> evacuated;
  for (int s : plan.evacuate) evacuated.push_back(m.impls[static_cast<size_t>(s)]);
  stats.bytes_evacuated += static_cast<int64_t>(pool.evacuate(evacuated, stream));
  stats.evacuations += static_cast<int64_t>(evacuated.size());
}

// What this thread holds in the pool (this call's outputs, and inputs it moved in) leaves it
// before the call returns (Note [Outputs of several threads]): copies on the stream, after the
// launch. Out of memory for the copies, they stay in the pool, as a single thread's outputs do:
// the graph has run, so the call must not run again eagerly, and evacuate() repoints nothing
// before every copy is allocated.
void copy_outputs_out(GraphPool& pool, cudaStream_t stream, RuntimeCounters& stats) {
  std::vector<c10::StorageImpl*> taken;
  for (const auto& live : pool.live()) {
    if (live.taken_by_this_thread()) taken.push_back(live.storage._unsafe_get_target());
  }
  try {
    stats.bytes_copied_out += static_cast<int64_t>(pool.evacuate(taken, stream));
  } catch (const c10::OutOfMemoryError&) {
    return;
  }
  stats.outputs_copied_out += static_cast<int64_t>(taken.size());
}

// Inputs copied or moved into their placeholders, as the plan says; the alias predictions' hits
// and misses counted.
void feed_placeholders(const CapturedGraph& g, const FlatCall& flat, const CallMemory& m,
                       const core::ReplayPlan& plan, ReplayContext& context,
                       cudaStream_t stream) {
  RuntimeCounters& stats = context.stats;
  std::vector<cuda::CopySegment> segments;
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const auto action = plan.actions[i];
    const auto& ph = g.placeholders[i];
    if (ph.chained || ph.site_buffer) {
      if (action == core::InputAction::kNone) {
        ++stats.alias_hits;
        stats.bytes_avoided += static_cast<int64_t>(ph.bytes);
        // A shape restored from the graph cache reads the output in place from its first
        // replay, as a capture does from then on (Note [Chain variants]).
        const GraphPool::LiveStorage* live =
            ph.chained && !g.graph
                ? context.pool.find_live(m.impls[static_cast<size_t>(m.inputs[i].storage)])
                : nullptr;
        if (live != nullptr && live->read_in_place) *live->read_in_place = true;
      } else {
        ++stats.alias_misses;
      }
    }
    if (action == core::InputAction::kNone) {
      ++stats.inputs_in_place;
      continue;
    }
    if (ph.bytes == 0) continue;
    if (context.sites != nullptr && action == core::InputAction::kCopyIn) {
      context.sites->resume_learning();
    }
    segments.push_back({flat.tensors[i].data_ptr(), ph.ptr, ph.bytes});
    stats.bytes_copied_in += static_cast<int64_t>(ph.bytes);
  }
  if (!segments.empty()) C10_CUDA_CHECK(cuda::launch_batched_copy(segments, stream));
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    if (plan.actions[i] == core::InputAction::kMoveIn) {
      context.pool.move_into(m.impls[static_cast<size_t>(m.inputs[i].storage)],
                             g.placeholders[i].ptr);
      ++stats.inputs_moved;
    }
  }
}

// The replay itself, then in-place updates written back to inputs that do not live in their
// placeholder.
void launch(const CapturedGraph& g, cudaGraphExec_t exec, const FlatCall& flat,
            const core::ReplayPlan& plan, cudaStream_t stream, RuntimeCounters& stats) {
  const auto launch_start = core::Clock::now();
  if (g.graph) {
    g.graph->launch(exec);
  } else {
    // A shape restored from the graph cache: never captured here, and it draws no random
    // numbers, so it has no generator offsets to advance.
    C10_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  }
  stats.launch_ns += elapsed_ns(launch_start);
  std::vector<cuda::CopySegment> segments;
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    if (!plan.copy_back[i] || g.placeholders[i].bytes == 0) continue;
    segments.push_back({g.placeholders[i].ptr, flat.tensors[i].data_ptr(), g.placeholders[i].bytes});
    stats.bytes_copied_back += static_cast<int64_t>(g.placeholders[i].bytes);
  }
  if (!segments.empty()) C10_CUDA_CHECK(cuda::launch_batched_copy(segments, stream));
}

}  // namespace

std::string replay_partial(ReplayGraph& graph, const std::vector<PartialInput>& inputs,
                           const FlatCall& flat, GraphPool& pool) {
  // A changed input written back over another input would not be what eager left.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].mutated || inputs[i].in_place) continue;
    const core::AddressRange written = core::make_range(flat.tensors[i].data_ptr(), inputs[i].bytes);
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (j != i && written.overlaps(core::make_range(flat.tensors[j].data_ptr(), inputs[j].bytes))) {
        return "argument " + std::to_string(i) + ", changed in place, shares memory with argument " +
               std::to_string(j);
      }
    }
  }
  c10::cuda::CUDAGuard device_guard(pool.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(pool.device()).stream();
  std::vector<cuda::CopySegment> copy_in, copy_back;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const PartialInput& input = inputs[i];
    if (input.in_place || input.bytes == 0) continue;
    copy_in.push_back({flat.tensors[i].data_ptr(), input.placeholder, input.bytes});
    if (input.mutated) copy_back.push_back({input.placeholder, flat.tensors[i].data_ptr(), input.bytes});
  }
  try {
    if (graph.node_count() == 0) return "";  // f raised before queueing any work
    if (!copy_in.empty()) C10_CUDA_CHECK(cuda::launch_batched_copy(copy_in, stream));
    graph.launch_once();
    if (!copy_back.empty()) C10_CUDA_CHECK(cuda::launch_batched_copy(copy_back, stream));
    // What the graph reads goes once the caller has the exception (its placeholders, and the
    // generator's graph-safe seed where this was the generator's last graph): a rare path, so it
    // waits for the work rather than keep them.
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

ReplayOutcome replay(const CapturedGraph& g, FlatCall& flat, ReplayContext& context) {
  const auto replay_start = core::Clock::now();
  GraphPool& pool = context.pool;
  RuntimeCounters& stats = context.stats;
  drop_replaced_gradients(g);
  pool.prune_live();

  const CallMemory memory = describe_call(g, flat, pool);
  const core::ReplayPlan plan =
      core::plan_replay(memory.storages, memory.inputs, memory.placeholders);
  if (!plan.safe()) {
    ReplayOutcome outcome = refused(plan.unsafe_reason);
    outcome.spared_other_thread = plan.spares_other_thread;
    return outcome;
  }
  for (size_t i = 0; i < flat.tensors.size(); ++i) {
    const auto& ph = g.placeholders[i];
    if (plan.actions[i] != core::InputAction::kNone && ph.site_buffer_held(context.sites)) {
      return refused("the graph's input buffer for argument " + std::to_string(i) +
                     " is held by another tensor");
    }
  }

  c10::cuda::CUDAGuard device_guard(pool.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(pool.device()).stream();
  // Optimizer settings the graph reads from device memory, written on this stream (Note [Device
  // settings]); the runtime captures again where one is no longer a number, before this.
  std::string changed;
  if (!write_device_settings(g.device_settings, changed)) return refused(changed);

  // The executable, patched to this graph's parameters. Launches already queued keep theirs.
  cudaGraphExec_t exec = nullptr;
  try {
    exec = g.executables->prepare(g.member, stream, context.host_paced);
  } catch (const std::exception& e) {
    return refused(e.what());
  }
  enforce_memory_budget(context.budget, pool, *g.executables, g.member);

  evacuate_live_outputs(pool, memory, plan, stream, stats);
  feed_placeholders(g, flat, memory, plan, context, stream);
  launch(g, exec, flat, plan, stream, stats);
  // The graph predicted to come next is patched in while this one runs.
  g.executables->launched(g.member);

  ReplayOutcome outcome;
  outcome.replayed = true;
  outcome.result = g.rebuild_outputs(flat);
  if (context.copy_outputs_out) copy_outputs_out(pool, stream, stats);
  ++stats.replays;
  stats.replay_ns += elapsed_ns(replay_start);
  return outcome;
}

}  // namespace grape
