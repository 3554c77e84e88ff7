#include "torch/memory/graph_arena.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <c10/util/Exception.h>

#include "core/forked.h"
#include "cuda/driver.h"
#include "torch/memory/capture_state.h"

#include <algorithm>
#include <string>
#include <type_traits>

namespace grape {

namespace {

// The virtual memory calls this arena needs, with a clear error where the driver lacks one.
const cuda::DriverApi& driver() {
  const cuda::DriverApi& d = cuda::driver();
  TORCH_CHECK(d.cuMemCreate != nullptr && d.cuMemMap != nullptr && d.cuMemSetAccess != nullptr &&
                  d.cuMemAddressReserve != nullptr && d.cuMemGetAllocationGranularity != nullptr,
              "grape: the CUDA driver lacks the virtual memory management calls (cuMemMap)");
  return d;
}

void check_driver(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  TORCH_CHECK(false, "grape: ", what, " failed: ", cuda::driver_error_string(status));
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Every live arena, for the deleter of its blocks. Arenas leave it with their last block after
// their owner released them.
struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<GraphArena>> arenas;
  std::vector<std::shared_ptr<GraphArena>> released;  // to destroy once no capture runs
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: blocks may be freed during exit
  return *r;
}

}  // namespace

std::shared_ptr<GraphArena> GraphArena::create(c10::DeviceIndex device) {
  std::shared_ptr<GraphArena> arena(new GraphArena(device));
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().arenas.push_back(arena);
  return arena;
}

GraphArena::GraphArena(c10::DeviceIndex device) : device_(device) {
  c10::cuda::CUDAGuard guard(device_);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  check_driver(driver().cuMemGetAllocationGranularity(
      &granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  size_t free_bytes = 0, total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Address space is cheap; a lane never needs more than the device holds.
  const size_t reserve = round_up(total_bytes, granularity_);
  for (int i = 0; i < kLanes; ++i) {
    CUdeviceptr base = 0;
    check_driver(driver().cuMemAddressReserve(&base, reserve, granularity_, 0, 0), "cuMemAddressReserve");
    lanes_[i].base = static_cast<uintptr_t>(base);
    lanes_[i].reserved = reserve;
    lanes_[i].layout = std::make_unique<core::ArenaLayout>(reserve);
  }
}

GraphArena::~GraphArena() {
  if (core::forked_child()) return;  // the parent's mappings, left to the process's end
  try {
    c10::cuda::CUDAGuard guard(device_);
    // Replays that use this memory may still be queued.
    C10_CUDA_CHECK_WARN(cudaDeviceSynchronize());
    for (auto& lane : lanes_) {
      if (lane.base == 0) continue;
      if (lane.mapped > 0) {
        (void)driver().cuMemUnmap(static_cast<CUdeviceptr>(lane.base), lane.mapped);
      }
      for (auto handle : lane.handles) {
        (void)driver().cuMemRelease(static_cast<CUmemGenericAllocationHandle>(handle));
      }
      (void)driver().cuMemAddressFree(static_cast<CUdeviceptr>(lane.base), lane.reserved);
    }
  } catch (const std::exception& e) {
    TORCH_WARN("grape: releasing a graph arena failed: ", e.what());
  }
}

void GraphArena::map_up_to(int index, size_t extent) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  if (extent <= lane.mapped) return;
  const size_t bytes = round_up(extent - lane.mapped, granularity_);
  size_t mapped = 0;
  for (const auto& l : lanes_) mapped += l.mapped;
  // Messages are built with std::to_string: streaming a size_t crashed in the extension on the
  // GPU machine's toolchain.
  TORCH_CHECK_WITH(OutOfMemoryError, mapped + bytes <= limit_,
                   "grape: growing a graph arena to " + std::to_string(mapped + bytes) +
                       " bytes would exceed the function's memory budget (" +
                       std::to_string(limit_) + " bytes for the arena)");
  // Mapping is not a stream operation; allow it while the thread captures, as the caching
  // allocator does for cudaMalloc.
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  CUmemGenericAllocationHandle handle = 0;
  CUresult status = driver().cuMemCreate(&handle, bytes, &prop, 0);
  if (status == CUDA_ERROR_OUT_OF_MEMORY) {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "grape: out of memory growing a graph arena by " + std::to_string(bytes) +
                         " bytes on cuda:" + std::to_string(device_) + " (" +
                         std::to_string(free_bytes) + " bytes free of " +
                         std::to_string(total_bytes) + ")");
  }
  check_driver(status, "cuMemCreate");
  const auto at = static_cast<CUdeviceptr>(lane.base + lane.mapped);
  status = driver().cuMemMap(at, bytes, 0, handle, 0);
  if (status != CUDA_SUCCESS) {
    (void)driver().cuMemRelease(handle);
    check_driver(status, "cuMemMap");
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  status = driver().cuMemSetAccess(at, bytes, &access, 1);
  if (status != CUDA_SUCCESS) {
    (void)driver().cuMemUnmap(at, bytes);
    (void)driver().cuMemRelease(handle);
    check_driver(status, "cuMemSetAccess");
  }
  lane.handles.push_back(static_cast<unsigned long long>(handle));
  lane.handle_bytes.push_back(bytes);
  lane.mapped += bytes;
}

void GraphArena::begin_capture(const CapturePlan& plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  survivors_.begin();
  small_allocations_.clear();
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    lane.mapped_before = lane.mapped;
    lane.extent_before = lane.layout->extent();
    core::LayoutPlan lane_plan = i < plan.size() ? plan[i] : core::LayoutPlan{};
    lane.planned = lane_plan.placements.size();
    lane.layout->begin_trace(std::move(lane_plan));
  }
}

GraphArena::CapturePlan GraphArena::end_capture(std::vector<core::AddressRange>* survivors,
                                                bool completed) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lanes_.front().layout->tracing()) return {};  // ended already
  CapturePlan plan(lanes_.size());
  std::vector<core::LayoutTrace> traces;
  for (auto& lane : lanes_) traces.push_back(lane.layout->end_trace());
  std::vector<core::SurvivorPrediction::Allocation> small;
  small.reserve(small_allocations_.size());
  for (const SmallAllocation& a : small_allocations_) {
    const auto& traced = traces[static_cast<size_t>(a.lane)].allocations;
    small.push_back({a.bytes, a.index < traced.size() &&
                                  traced[a.index].freed == core::LayoutTrace::kLive});
  }
  if (completed) survivors_.end(std::move(small));
  bool followed = false;
  size_t grown = 0, saved = 0, mapped = 0;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    const core::LayoutTrace& trace = traces[i];
    if (survivors != nullptr) {
      for (const auto& a : trace.allocations) {
        if (a.freed == core::LayoutTrace::kLive) {
          survivors->push_back({lane.base + a.offset, lane.base + a.offset + a.bytes});
        }
      }
    }
    followed |= lane.planned > 0;
    mapped += lane.mapped;
    if (lane.mapped <= lane.mapped_before) continue;
    grown += lane.mapped - lane.mapped_before;
    plan[i] = core::plan_layout(trace);
    if (plan[i].empty()) continue;
    const size_t needed = std::max(lane.mapped_before, round_up(plan[i].extent, granularity_));
    if (needed < lane.mapped) saved += lane.mapped - needed;
  }
  // Worth a capture: a sixteenth of the arena, or most of what the capture grew it by (what a
  // shape a little larger than any before would otherwise add, shape after shape).
  if (followed || saved < granularity_ || (16 * saved < mapped && 2 * saved < grown)) return {};
  return plan;
}

void GraphArena::forget_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  survivors_.forget();
  for (auto& lane : lanes_) {
    lane.layout->retract_extent(lane.extent_before);
    const size_t keep = std::max(lane.mapped_before, round_up(lane.layout->extent(), granularity_));
    // Only the dropped capture's blocks lay above `keep`, and no launch ever used them.
    while (!lane.handles.empty() && lane.mapped - lane.handle_bytes.back() >= keep) {
      const size_t bytes = lane.handle_bytes.back();
      const auto at = static_cast<CUdeviceptr>(lane.base + lane.mapped - bytes);
      check_driver(driver().cuMemUnmap(at, bytes), "cuMemUnmap");
      check_driver(driver().cuMemRelease(
                       static_cast<CUmemGenericAllocationHandle>(lane.handles.back())),
                   "cuMemRelease");
      lane.handles.pop_back();
      lane.handle_bytes.pop_back();
      lane.mapped -= bytes;
    }
  }
}

bool GraphArena::plan_diverged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& lane : lanes_) {
    if (lane.layout->placed_by_plan() < lane.planned) return true;
  }
  return false;
}

c10::DataPtr GraphArena::allocate(ArenaLane which, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocate_locked(static_cast<int>(which), bytes);
}

c10::DataPtr GraphArena::allocate_for_capture(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > kSmallLimit) return allocate_locked(static_cast<int>(ArenaLane::kLarge), bytes);
  int lane = static_cast<int>(ArenaLane::kSmall);
  if (bytes > 0 && lanes_[static_cast<size_t>(lane)].layout->tracing()) {
    if (survivors_.next_apart(bytes)) lane = static_cast<int>(ArenaLane::kOutput);
    small_allocations_.push_back(
        {lane, lanes_[static_cast<size_t>(lane)].layout->traced_allocations(), bytes});
  }
  return allocate_locked(lane, bytes);
}

c10::DataPtr GraphArena::allocate_locked(int index, size_t bytes) {
  const c10::Device device(c10::DeviceType::CUDA, device_);
  if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &GraphArena::free_block, device);
  Lane& lane = lanes_[static_cast<size_t>(index)];
  const size_t extent_before = lane.layout->extent();
  auto offset = lane.layout->allocate(bytes);
  TORCH_CHECK_WITH(OutOfMemoryError, offset.has_value(),
                   "grape: a graph arena lane is full (" + std::to_string(lane.reserved) +
                       " bytes of address space)");
  try {
    map_up_to(index, lane.layout->extent());
  } catch (...) {
    // Unmapped: the extent goes back, or later allocations would try to map up to it again.
    lane.layout->free(*offset);
    lane.layout->retract_extent(extent_before);
    throw;
  }
  void* ptr = reinterpret_cast<void*>(lane.base + *offset);
  return c10::DataPtr(ptr, ptr, &GraphArena::free_block, device);
}

void GraphArena::pin(core::AddressRange range) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& lane : lanes_) {
    const core::AddressRange r{lane.base, lane.base + lane.reserved};
    if (!r.overlaps(range)) continue;
    const uintptr_t begin = std::max(range.begin, r.begin);
    const uintptr_t end = std::min(range.end, r.end);
    lane.layout->pin(begin - lane.base, end - begin);
  }
}

void GraphArena::unpin_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& lane : lanes_) {
    lane.layout->unpin_all();
    for (size_t offset : lane.held) lane.layout->free(offset);
    lane.held.clear();
  }
  holds_.clear();
}

void GraphArena::hold_until_unpin(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  holds_.push_back(ptr);
}

bool GraphArena::contains(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& lane : lanes_) {
    if (p >= lane.base && p < lane.base + lane.reserved) return true;
  }
  return false;
}

void GraphArena::map_at_least(ArenaLane lane, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(bytes <= lanes_[static_cast<size_t>(lane)].reserved,
              "grape: a restored graph needs more of an arena lane than is reserved");
  map_up_to(static_cast<int>(lane), bytes);
}

core::AddressRange GraphArena::lane_range(ArenaLane which) const {
  const Lane& lane = lanes_[static_cast<size_t>(which)];
  return {lane.base, lane.base + lane.reserved};
}

size_t GraphArena::mapped_bytes(ArenaLane which) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lanes_[static_cast<size_t>(which)].mapped;
}

void GraphArena::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

size_t GraphArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& lane : lanes_) total += lane.mapped;
  return total;
}

size_t GraphArena::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& lane : lanes_) total += lane.layout->allocated_bytes();
  return total;
}

size_t GraphArena::peak_allocated_bytes(ArenaLane which) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lanes_[static_cast<size_t>(which)].layout->peak_allocated_bytes();
}

bool GraphArena::free_local(void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& lane : lanes_) {
    if (p < lane.base || p >= lane.base + lane.reserved) continue;
    const size_t offset = p - lane.base;
    auto held = std::find(holds_.begin(), holds_.end(), ptr);
    if (held != holds_.end()) {
      holds_.erase(held);
      lane.held.push_back(offset);
    } else {
      lane.layout->free(offset);
    }
    break;
  }
  if (!owner_released_) return false;
  for (const auto& lane : lanes_) {
    if (lane.layout->blocks() > 0) return false;
  }
  return true;
}

std::shared_ptr<GraphArena> GraphArena::find(const void* ptr) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (const auto& arena : registry().arenas) {
    if (arena->contains(ptr)) return arena;
  }
  return nullptr;
}

void GraphArena::release_owner() {
  std::shared_ptr<GraphArena> self;  // destroyed outside the registry's lock
  std::lock_guard<std::mutex> lock(registry().mutex);
  {
    std::lock_guard<std::mutex> own(mutex_);
    owner_released_ = true;
    for (const auto& lane : lanes_) {
      if (lane.layout->blocks() > 0) return;
    }
  }
  auto& arenas = registry().arenas;
  auto it = std::find_if(arenas.begin(), arenas.end(),
                         [this](const std::shared_ptr<GraphArena>& a) { return a.get() == this; });
  if (it != arenas.end()) {
    self = std::move(*it);
    arenas.erase(it);
  }
  if (capture_underway()) registry().released.push_back(std::move(self));
}

void GraphArena::destroy_released() {
  std::vector<std::shared_ptr<GraphArena>> released;  // destroyed outside the registry's lock
  std::lock_guard<std::mutex> lock(registry().mutex);
  released.swap(registry().released);
}

bool GraphArena::free_if_owned(void* ptr) {
  auto arena = find(ptr);
  if (!arena) return false;
  if (arena->free_local(ptr)) arena->release_owner();
  return true;
}

void GraphArena::free_block(void* ptr) {
  if (ptr == nullptr) return;
  const bool owned = free_if_owned(ptr);
  TORCH_INTERNAL_ASSERT(owned, "grape: freeing a pointer no graph arena holds");
}

}  // namespace grape
