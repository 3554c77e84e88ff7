#include "torch/memory/graph_pool.h"
#include <torch/csrc/utils/device_lazy_init.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/forked.h"
#include "cuda/batched_copy.h"
#include "torch/memory/torch_version.h"

namespace grape {

namespace allocator = c10::cuda::CUDACachingAllocator;

namespace {
// The context of a handed-out DataPtr: it keeps the pool alive, and owns no memory.
struct PoolReference {
  std::shared_ptr<GraphPool> pool;
};
void release_pool_reference(void* ctx) { delete static_cast<PoolReference*>(ctx); }

// Capture streams outlive their pools: PyTorch keeps using a stream it has seen (cuBLAS keeps a
// workspace per (handle, stream), a block records the streams that used it, an autograd node
// runs on its forward's stream), so a pool's stream goes back to this list for the next pool.
struct StreamList {
  std::mutex mutex;
  std::vector<std::pair<c10::DeviceIndex, cudaStream_t>> free;
};
StreamList& capture_streams() {
  static auto* list = new StreamList();  // never destroyed: streams live as long as the process
  return *list;
}

cudaStream_t take_capture_stream(c10::DeviceIndex device) {
  {
    StreamList& list = capture_streams();
    std::lock_guard<std::mutex> lock(list.mutex);
    for (auto it = list.free.begin(); it != list.free.end(); ++it) {
      if (it->first == device) {
        cudaStream_t stream = it->second;
        list.free.erase(it);
        return stream;
      }
    }
  }
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void give_back_capture_stream(c10::DeviceIndex device, cudaStream_t stream) {
  StreamList& list = capture_streams();
  std::lock_guard<std::mutex> lock(list.mutex);
  list.free.emplace_back(device, stream);
}
// PyTorch's pinned-host allocator keeps a pool per graph pool id (torch >= 2.11), counted by the
// captures that use it; an id whose count fell to zero cannot be used again (an internal assert).
// A failed capture releases its count, so the GraphPool holds one of its own for its lifetime.
void hold_host_pool(c10::MempoolId_t id) {
#if GRAPE_TORCH_AT_LEAST(2, 11)
  at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
  host->begin_allocate_to_pool(id, [](c10::Stream) { return false; });
  host->end_allocate_to_pool(id);
#else
  (void)id;
#endif
}

void release_host_pool(c10::MempoolId_t id) {
#if GRAPE_TORCH_AT_LEAST(2, 11)
  at::getHostAllocator(at::kCUDA)->release_pool(id);
#else
  (void)id;
#endif
}
}  // namespace

std::shared_ptr<GraphPool> GraphPool::create(c10::DeviceIndex device) {
  core::making_cuda_state();  // a fork from here on runs eagerly (core/forked.h)
  // PyTorch makes its CUDA state (the caching allocator's devices among it) at first use, which
  // a call holding no CUDA tensor, in a process that used none yet, has not made: the pool's
  // allocator calls would find no device. Made as torch.cuda makes it (seeds queued before it
  // run now, not inside the capture, and a fork after it is refused CUDA), not in C++ alone.
  torch::utils::device_lazy_init(at::kCUDA);
  return std::shared_ptr<GraphPool>(new GraphPool(device));
}

GraphPool::GraphPool(c10::DeviceIndex device)
    : device_(device),
      id_(at::cuda::graph_pool_handle()),
      capture_stream_(at::cuda::getCurrentCUDAStream(device)) {
  c10::cuda::CUDAGuard guard(device_);
  arena_ = GraphArena::create(device_);
  allocator::createOrIncrefPool(device_, id_);
  hold_host_pool(id_);
  raw_stream_ = take_capture_stream(device_);
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ready_event_, cudaEventDisableTiming));
  capture_stream_ = at::cuda::getStreamFromExternal(raw_stream_, device_);
  // cuBLAS keeps one workspace per (handle, stream) for the process's life. Create the capture
  // stream's now, from PyTorch's allocator, rather than from the arena during the first capture.
  at::cuda::CUDAStreamGuard on_capture_stream(capture_stream_);
  (void)at::cuda::getCurrentCUDABlasHandle();
  (void)at::cuda::getCUDABlasLtWorkspace();
}

GraphPool::~GraphPool() {
  if (core::forked_child()) return;  // the parent's CUDA state, left to the process's end
  // Destructors must not throw: report CUDA failures as warnings.
  try {
    c10::cuda::CUDAGuard guard(device_);
    allocator::releasePool(device_, id_);
    release_host_pool(id_);
    arena_->release_owner();
    if (ready_event_ != nullptr) C10_CUDA_CHECK_WARN(cudaEventDestroy(ready_event_));
    if (raw_stream_ != nullptr) give_back_capture_stream(device_, raw_stream_);
  } catch (const std::exception& e) {
    TORCH_WARN("grape: releasing a graph pool failed: ", e.what());
  }
}

void GraphPool::wait_for(const at::cuda::CUDAStream& stream) {
  C10_CUDA_CHECK(cudaEventRecord(ready_event_, stream.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(raw_stream_, ready_event_, 0));
}

int GraphPool::allocator_use_count() const { return allocator::getPoolUseCount(device_, id_); }

void GraphPool::release_to(int count) {
  while (allocator_use_count() > count) allocator::releasePool(device_, id_);
}

void GraphPool::hold_for_graph(int before) {
  for (int count = allocator_use_count(); count < before + 1; ++count) {
    allocator::createOrIncrefPool(device_, id_);
    hold_host_pool(id_);
  }
}

void GraphPool::end_host_recording() {
#if GRAPE_TORCH_AT_LEAST(2, 11)
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(id_);
  } catch (const std::exception&) {
    // Not recording: the capture ended it, or never began it.
  }
#endif
}

void GraphPool::destroy_graph(std::unique_ptr<ReplayGraph>& graph) {
  if (!graph) return;
  const int before = allocator_use_count();
  graph.reset();
  if (allocator_use_count() == before) allocator::releasePool(device_, id_);
}

namespace {

// Note [Generators of a failed capture]
// Where PyTorch's CUDA generator state keeps a registry of graphs and one capture flag
// (CUDAGeneratorState::registered_graphs_ and capturing_, torch 2.11), CUDAGraph::capture_begin
// registers the device's default generator with the graph and sets the flag, capture_end clears
// it, and ~CUDAGraph unregisters, throwing where the graph is not registered. A capture that fails
// part-way can leave the flag set (every later random op outside a capture then raises "Offset
// increment outside graph capture encountered unexpectedly") or the graph half-registered (its
// destructor throws, and the process ends): the first registration allocates the generator's
// graph-safe seed and offset, and inside a capture's allocation route that allocation comes from
// the arena, which a memory budget may refuse. So ReplayGraph registers the generator itself
// before the route begins, clears the flag where a capture did not end, and unregisters without
// throwing. Where the state keeps its capture state per capture (torch 2.13 and later), reset()
// removes it and nothing here applies.
template <typename State, typename = void>
struct KeepsGraphRegistry : std::false_type {};
template <typename State>
struct KeepsGraphRegistry<State, std::void_t<decltype(std::declval<State&>().registered_graphs_),
                                             decltype(std::declval<State&>().capturing_)>>
    : std::true_type {};

template <typename Impl>
void register_with(const at::Generator& generator, at::cuda::CUDAGraph* graph) {
  if constexpr (KeepsGraphRegistry<at::CUDAGeneratorState>::value) {
    at::check_generator<Impl>(generator)->register_graph(graph);
  }
}

// CUDAGeneratorState's methods are not exported from libtorch, only its fields are public: what
// capture_epilogue and unregister_graph do to them is done here.
template <typename State>
void end_capture_mode(State& state) {
  if constexpr (KeepsGraphRegistry<State>::value) state.capturing_ = false;
}

// Unregisters `graph` from every state it holds and forgets them, so that ~CUDAGraph finds none;
// returns whether it did (not where states are kept per capture: reset() removes those).
template <typename States>
bool unregister_quietly(States& states, at::cuda::CUDAGraph* graph) {
  using State = typename States::key_type::element_type;
  if constexpr (KeepsGraphRegistry<State>::value) {
    for (auto& entry : states) {
      State& state = *entry.first;
      if (state.registered_graphs_.erase(graph) == 0 || !state.registered_graphs_.empty()) {
        continue;
      }
      state.seed_extragraph_.reset();  // the last graph gone: the graph-safe seed and offset too
      state.offset_extragraph_.reset();
    }
    states.clear();
    return true;
  }
  return false;
}

}  // namespace

ReplayGraph::~ReplayGraph() {
  detach();
  (void)unregister_quietly(captured_generator_states_, this);
  // A forked child has no CUDA context of its parent's: the graph is left to the process's end.
  if (core::forked_child()) has_graph_ = false;
}

void ReplayGraph::register_generators(c10::DeviceIndex device) {
  register_with<at::CUDAGeneratorImpl>(at::cuda::detail::getDefaultCUDAGenerator(device), this);
}

void ReplayGraph::abandon_capture() {
  for (auto& entry : captured_generator_states_) end_capture_mode(*entry.first);
}

bool ReplayGraph::draws_random_numbers() const {
  for (const auto& [state, increment] : captured_generator_states_) {
    if (increment != 0) return true;
  }
  return false;
}

size_t ReplayGraph::node_count() const {
  size_t nodes = 0;
  if (has_graph_) C10_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes));
  return nodes;
}

cudaGraph_t ReplayGraph::release_graph() {
  TORCH_CHECK(has_graph_, "grape: no captured graph to release");
  has_graph_ = false;
  return std::exchange(graph_, nullptr);
}

void ReplayGraph::launch(cudaGraphExec_t exec) {
  graph_exec_ = exec;
  has_graph_exec_ = true;
  struct Detach {
    ReplayGraph& graph;
    ~Detach() { graph.detach(); }
  } detach_after{*this};
  replay();
}

void ReplayGraph::launch_once() {
  instantiate();
  struct DestroyExecutable {
    ReplayGraph& graph;
    // Launches in flight finish first: the driver frees a launched executable once it has run.
    ~DestroyExecutable() {
      C10_CUDA_CHECK_WARN(cudaGraphExecDestroy(graph.graph_exec_));
      graph.detach();
    }
  } destroy_after{*this};
  replay();
}

void GraphPool::refresh_segments() {
  segments_.clear();
  private_pool_bytes_ = 0;
  for (auto lane :
       {ArenaLane::kLarge, ArenaLane::kSmall, ArenaLane::kPlaceholder, ArenaLane::kOutput}) {
    segments_.add(arena_->lane_range(lane));
  }
  auto snapshot = allocator::snapshot(id_, /*include_traces=*/false);
  for (const auto& seg : snapshot.segments) {
    if (seg.device != device_ || seg.owner_private_pool_id != id_) continue;
    segments_.add({seg.address, seg.address + seg.total_size});
    private_pool_bytes_ += seg.total_size;
  }
}

c10::DataPtr GraphPool::pool_data_ptr(void* ptr) {
  return c10::DataPtr(ptr, new PoolReference{shared_from_this()}, &release_pool_reference,
                      c10::Device(c10::DeviceType::CUDA, device_));
}

c10::Storage GraphPool::hand_out(void* ptr, size_t bytes, std::shared_ptr<bool> read_in_place) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, pool_data_ptr(ptr),
                       /*allocator=*/nullptr, /*resizable=*/false);
  live_.push_back(
      {storage.getWeakStorageImpl(), core::make_range(ptr, bytes), std::move(read_in_place)});
  return storage;
}

void GraphPool::move_into(c10::StorageImpl* storage, void* ptr) {
  const size_t bytes = storage->nbytes();
  storage->set_data_ptr_noswap(pool_data_ptr(ptr));
  auto range = core::make_range(ptr, bytes);
  for (auto& entry : live_) {
    if (entry.storage._unsafe_get_target() == storage) {
      entry.range = range;
      return;
    }
  }
  live_.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(
                       c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)),
                   range, nullptr});
}

size_t GraphPool::evacuate(const std::vector<c10::StorageImpl*>& storages, cudaStream_t stream) {
  std::vector<cuda::CopySegment> segments;
  std::vector<c10::DataPtr> copies;
  size_t bytes = 0;
  for (c10::StorageImpl* storage : storages) {
    copies.push_back(allocator::get()->allocate(storage->nbytes()));
    if (storage->nbytes() == 0) continue;
    segments.push_back({storage->data(), copies.back().get(), storage->nbytes()});
    bytes += storage->nbytes();
  }
  if (!segments.empty()) C10_CUDA_CHECK(cuda::launch_batched_copy(segments, stream));
  for (size_t i = 0; i < storages.size(); ++i) {
    storages[i]->set_data_ptr_noswap(std::move(copies[i]));
    live_.erase(std::remove_if(live_.begin(), live_.end(),
                               [&](const LiveStorage& e) {
                                 return e.storage._unsafe_get_target() == storages[i];
                               }),
                live_.end());
  }
  return bytes;
}

uint64_t GraphPool::calling_thread() {
  static std::atomic<uint64_t> next{0};
  thread_local const uint64_t serial = next.fetch_add(1);
  return serial;
}

void GraphPool::prune_live() {
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [](const LiveStorage& e) { return e.storage.expired(); }),
              live_.end());
}

const GraphPool::LiveStorage* GraphPool::find_live(const c10::StorageImpl* storage) const {
  for (const auto& entry : live_) {
    if (entry.storage._unsafe_get_target() == storage) return &entry;
  }
  return nullptr;
}

}  // namespace grape
