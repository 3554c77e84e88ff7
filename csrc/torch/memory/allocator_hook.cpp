#include "torch/memory/allocator_hook.h"

#include "torch/memory/capture_state.h"
#include "torch/memory/site_predictor.h"
#include "torch/memory/torch_version.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <mutex>

namespace grape {

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

thread_local AllocationRoute* current_route = nullptr;
std::atomic<AllocationRoute*> all_threads_route{nullptr};

void delete_any(void* ptr);

// Delegates everything to `inner`; see Note [Allocator hook].
class HookedAllocator final : public cca::CUDAAllocator {
 public:
  explicit HookedAllocator(cca::CUDAAllocator* inner) : inner_(inner) {}
  cca::CUDAAllocator* inner() const { return inner_; }

  c10::DataPtr allocate(size_t n) override {
    AllocationRoute* mine = current_route;
    AllocationRoute* shared = all_threads_route.load(std::memory_order_acquire);
    if ((mine != nullptr || shared != nullptr) && n > 0) {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
      AllocationRoute* route = mine != nullptr && mine->stream() == stream ? mine
                               : shared != nullptr && shared->stream() == stream ? shared
                                                                                 : nullptr;
      if (route != nullptr) {
        return route->placeholders() ? route->arena().allocate(ArenaLane::kPlaceholder, n)
                                     : route->arena().allocate_for_capture(n);
      }
    }
    if (site_prediction_wanted()) return allocate_at_site(*inner_, n);
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_any; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return data_ptr.get() == data_ptr.get_context();
  }

  // c10::DeviceAllocator
  bool initialized() override { return inner_->initialized(); }
  void emptyCache(c10::MempoolId_t id) override { inner_->emptyCache(id); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return inner_->getDeviceStats(device);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    inner_->resetAccumulatedStats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override { inner_->resetPeakStats(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return inner_->getMemoryInfo(device);
  }

  // CUDAAllocator
  void* raw_alloc(size_t nbytes) override { return inner_->raw_alloc(nbytes); }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return inner_->raw_alloc_with_stream(nbytes, stream);
  }
  void raw_delete(void* ptr) override { delete_any(ptr); }
  void init(int device_count) override { inner_->init(device_count); }
  double getMemoryFraction(c10::DeviceIndex device) override {
    return inner_->getMemoryFraction(device);
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    inner_->setMemoryFraction(fraction, device);
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    return inner_->getExpandableSegmentSizes(device);
  }
  void enable(bool value) override { inner_->enable(value); }
  bool isEnabled() const override { return inner_->isEnabled(); }
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    inner_->cacheInfo(device, largest_block);
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    return inner_->getBaseAllocation(ptr, size);
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get_deleter() == &GraphArena::free_block) {
      // Used on another stream during a capture: not reused before the capture ends.
      if (auto arena = GraphArena::find(ptr.get())) arena->hold_until_unpin(ptr.get());
      return;
    }
    if (ptr.get_deleter() == &release_hand_out) {
      retire_hand_out(ptr);  // its buffer could be reused while the other stream reads it
      return;
    }
    inner_->recordStream(ptr, stream);
  }
  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override {
    return inner_->snapshot(id, include_traces);
  }
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    inner_->beginAllocateToPool(device, id, std::move(filter));
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    inner_->endAllocateToPool(device, id);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    inner_->releasePool(device, id);
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    return inner_->getPoolUseCount(device, id);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    inner_->createOrIncrefPool(device, id, std::move(allocator));
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    inner_->setUseOnOOM(device, id, use_on_oom);
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override {
    inner_->setNoSplit(device, id);
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    return inner_->checkPoolLiveAllocations(device, id, expected);
  }
  cca::ShareableHandle shareIpcHandle(void* ptr) override { return inner_->shareIpcHandle(ptr); }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    return inner_->getIpcDevPtr(std::move(handle));
  }
  bool isHistoryEnabled() override { return inner_->isHistoryEnabled(); }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override {
    inner_->recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clear_history,
                          skip_actions);
  }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    inner_->recordAnnotation(md);
  }
  void pushCompileContext(std::string& md) override { inner_->pushCompileContext(md); }
  void popCompileContext() override { inner_->popCompileContext(); }
  void setUserMetadata(const std::string& metadata) override { inner_->setUserMetadata(metadata); }
  std::string getUserMetadata() override { return inner_->getUserMetadata(); }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    inner_->attachOutOfMemoryObserver(std::move(observer));
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    inner_->attachAllocatorTraceTracker(std::move(tracker));
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    inner_->enablePeerAccess(dev, dev_to_access);
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override {
    return inner_->memcpyAsync(dst, dst_device, src, src_device, count, stream, p2p_enabled);
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    return inner_->getCheckpointState(device, id);
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    return inner_->setCheckpointPoolState(device, std::move(pps));
  }
  std::string name() override { return inner_->name(); }

#if GRAPE_TORCH_AT_LEAST(2, 13)
  void markCaptureBegin(c10::DeviceIndex device) override { inner_->markCaptureBegin(device); }
  void markCaptureEnd(c10::DeviceIndex device) override { inner_->markCaptureEnd(device); }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    return inner_->getContextForPointer(ptr);
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    inner_->attachOomRejectionObserver(std::move(observer));
  }
  c10::DataPtr allocateWithAddress(size_t size, void* addr) override {
    return inner_->allocateWithAddress(size, addr);
  }
#endif
#if GRAPE_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override { return inner_->supportsUserMetadata(); }
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    inner_->annotateMemory(ptr, metadata);
  }
#endif

 private:
  cca::CUDAAllocator* inner_;
};

std::mutex install_mutex;
HookedAllocator* hook = nullptr;  // kept for the process's life: DataPtrs may name it

void delete_any(void* ptr) {
  if (ptr == nullptr || GraphArena::free_if_owned(ptr)) return;
  cca::CUDAAllocator* inner = hook != nullptr ? hook->inner() : cca::get();
  inner->raw_delete(ptr);
}

void set_current(cca::CUDAAllocator* allocator) {
  cca::allocator.store(allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, allocator, /*priority=*/UINT8_MAX);
}

}  // namespace

void install_allocator_hook() {
  std::lock_guard<std::mutex> lock(install_mutex);
  cca::CUDAAllocator* current = cca::get();
  if (hook != nullptr && current == hook) return;
  if (hook == nullptr || hook->inner() != current) hook = new HookedAllocator(current);
  set_current(hook);
}

bool uninstall_allocator_hook() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (hook == nullptr || cca::get() != hook) return true;
  if (allocation_routes_active()) return false;
  set_current(hook->inner());
  return true;
}

bool allocator_hook_installed() {
  std::lock_guard<std::mutex> lock(install_mutex);
  return hook != nullptr && cca::get() == hook;
}

AllocationRoute* current_allocation_route() { return current_route; }

AllocationRoute::AllocationRoute(GraphArena& arena, cudaStream_t stream, bool placeholders,
                                 bool for_all_threads)
    : arena_(arena),
      stream_(stream),
      placeholders_(placeholders),
      for_all_threads_(for_all_threads),
      previous_(current_route) {
  TORCH_CHECK(allocator_hook_installed(),
              "grape: the allocator hook was removed; captures need it installed");
  if (for_all_threads_) {
    AllocationRoute* none = nullptr;
    TORCH_CHECK(all_threads_route.compare_exchange_strong(none, this),
                "grape: another capture routes all threads' allocations");
  }
  current_route = this;
  enter_allocation_route();
}

AllocationRoute::~AllocationRoute() {
  if (for_all_threads_) all_threads_route.store(nullptr, std::memory_order_release);
  current_route = previous_;
  leave_allocation_route();
}

}  // namespace grape
