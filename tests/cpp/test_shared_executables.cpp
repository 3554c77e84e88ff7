// GPU tests of shared executables (Note [Shared executables]); they skip without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/batched_copy.h"
#include "cuda/shared_executables.h"
#include "test_kernels.h"

using grape::cuda::CopySegment;
using grape::cuda::SharedExecutables;
using Sharing = SharedExecutables::Sharing;

namespace {

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

uint8_t* device_alloc(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  return static_cast<uint8_t*>(p);
}

#define CUDA_OK(expr)                                            \
  do {                                                           \
    const cudaError_t status_ = (expr);                          \
    ASSERT_EQ(status_, cudaSuccess) << cudaGetErrorString(status_); \
  } while (0)

constexpr size_t kBytes = 1 << 16;

// Device buffers of one test: sources filled with distinct bytes, destinations cleared per run.
// All their work goes to the test's stream, which (non-blocking) does not wait for the legacy one.
struct Buffers {
  cudaStream_t stream;
  std::vector<uint8_t*> sources;
  uint8_t* copy_dst = nullptr;
  uint8_t* memcpy_dst = nullptr;
  uint8_t* memset_dst = nullptr;
  uint8_t* extra_dst = nullptr;  // the extra memsets' bytes (capture_shape)
  Buffers(cudaStream_t stream, int count) : stream(stream) {
    for (int i = 0; i < count; ++i) {
      uint8_t* p = device_alloc(kBytes);
      std::vector<uint8_t> host(kBytes);
      for (size_t j = 0; j < kBytes; ++j) host[j] = static_cast<uint8_t>(j * 7 + i * 31 + 1);
      EXPECT_EQ(cudaMemcpyAsync(p, host.data(), kBytes, cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // before `host` goes
      sources.push_back(p);
    }
    copy_dst = device_alloc(kBytes);
    memcpy_dst = device_alloc(kBytes);
    memset_dst = device_alloc(kBytes);
    extra_dst = device_alloc(kBytes);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (auto* p : sources) cudaFree(p);
    cudaFree(copy_dst);
    cudaFree(memcpy_dst);
    cudaFree(memset_dst);
    cudaFree(extra_dst);
  }
  void clear() {
    for (uint8_t* p : {copy_dst, memcpy_dst, memset_dst, extra_dst}) {
      EXPECT_EQ(cudaMemsetAsync(p, 0, kBytes, stream), cudaSuccess);
    }
    // A launch that follows on the stream is ordered after the clearing anyway; waiting here
    // reports a failed clear as such rather than as a wrong result.
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  // A buffer's bytes, read on the test's stream once its work is done.
  std::vector<uint8_t> read(const uint8_t* p) const {
    std::vector<uint8_t> host(kBytes);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), p, kBytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return host;
  }
};

// A "shape" of one program: a memset, a kernel and a memcpy whose parameters depend on `i`.
// `extra_memsets` more nodes (another topology, as a library's per-shape algorithm would add)
// set byte k of extra_dst to 100 + k.
cudaGraph_t capture_shape(Buffers& b, int i, size_t bytes, cudaStream_t stream,
                          int extra_memsets = 0) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(b.memset_dst, 10 + i, bytes, stream), cudaSuccess);
  for (int k = 0; k < extra_memsets; ++k) {
    EXPECT_EQ(cudaMemsetAsync(b.extra_dst + k, 100 + k, 1, stream), cudaSuccess);
  }
  std::vector<CopySegment> segments = {{b.sources[i], b.copy_dst, bytes}};
  EXPECT_EQ(grape::cuda::launch_batched_copy(segments, stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(b.memcpy_dst, b.sources[i], bytes, cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  return graph;
}

// Clears the destinations, then launches the executable that holds `member` and waits for it.
void replay(SharedExecutables& ex, SharedExecutables::Member member, Buffers& b,
            cudaStream_t stream) {
  b.clear();
  CUDA_OK(cudaGraphLaunch(ex.prepare(member, stream), stream));
  CUDA_OK(cudaStreamSynchronize(stream));
}

// Byte k of extra_dst is 100 + k for the first `extra_memsets` bytes, else 0.
void expect_extra_memsets(const Buffers& b, int extra_memsets, const char* shape) {
  const std::vector<uint8_t> extra = b.read(b.extra_dst);
  for (size_t k = 0; k < kBytes; ++k) {
    ASSERT_EQ(extra[k], static_cast<int>(k) < extra_memsets ? 100 + k : 0)
        << shape << " extra memset byte " << k;
  }
}

// What the shape's graph must leave in the destinations.
void expect_shape(const Buffers& b, int i, size_t bytes, int extra_memsets = 0) {
  const std::string shape = "shape " + std::to_string(i);
  ASSERT_NO_FATAL_FAILURE(expect_extra_memsets(b, extra_memsets, shape.c_str()));
  const std::vector<uint8_t> src = b.read(b.sources[i]);
  const std::vector<uint8_t> copied = b.read(b.copy_dst);
  const std::vector<uint8_t> memcpyd = b.read(b.memcpy_dst);
  const std::vector<uint8_t> memset = b.read(b.memset_dst);
  for (size_t j = 0; j < kBytes; ++j) {
    const uint8_t written = j < bytes ? src[j] : 0;
    ASSERT_EQ(copied[j], written) << shape << " kernel byte " << j;
    ASSERT_EQ(memcpyd[j], written) << shape << " memcpy byte " << j;
    ASSERT_EQ(memset[j], j < bytes ? 10 + i : 0) << shape << " memset byte " << j;
  }
}

// Graphs that differ only in the kernel they run at one node (test_kernels.h).
enum class Kernel { kAddOne, kTimesTwo };
constexpr int kKernelInput = 7;
constexpr size_t kKernelBytes = 3000;

const char* name(Kernel kernel) { return kernel == Kernel::kAddOne ? "add_one" : "times_two"; }

uint8_t kernel_result(Kernel kernel) {
  return static_cast<uint8_t>(kernel == Kernel::kAddOne ? kKernelInput + 1 : kKernelInput * 2);
}

// memset, `extra_memsets` one-byte memsets (as capture_shape), `kernel` writing copy_dst, and a
// memcpy of its result into memcpy_dst; every parameter but the kernel the same for both kernels.
cudaGraph_t capture_kernel(Buffers& b, Kernel kernel, cudaStream_t stream, int extra_memsets = 0) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(b.memset_dst, 10, kKernelBytes, stream), cudaSuccess);
  for (int k = 0; k < extra_memsets; ++k) {
    EXPECT_EQ(cudaMemsetAsync(b.extra_dst + k, 100 + k, 1, stream), cudaSuccess);
  }
  EXPECT_EQ(kernel == Kernel::kAddOne
                ? grape::test_kernels::launch_add_one(b.copy_dst, kKernelInput, kKernelBytes,
                                                      stream)
                : grape::test_kernels::launch_times_two(b.copy_dst, kKernelInput, kKernelBytes,
                                                        stream),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(b.memcpy_dst, b.copy_dst, kKernelBytes, cudaMemcpyDeviceToDevice,
                            stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  return graph;
}

// What capture_kernel's graph must leave in the destinations.
void expect_kernel(const Buffers& b, Kernel kernel, int extra_memsets) {
  ASSERT_NO_FATAL_FAILURE(expect_extra_memsets(b, extra_memsets, name(kernel)));
  const std::vector<uint8_t> computed = b.read(b.copy_dst);
  const std::vector<uint8_t> memcpyd = b.read(b.memcpy_dst);
  const std::vector<uint8_t> memset = b.read(b.memset_dst);
  for (size_t j = 0; j < kBytes; ++j) {
    const uint8_t result = j < kKernelBytes ? kernel_result(kernel) : 0;
    ASSERT_EQ(computed[j], result) << name(kernel) << " kernel byte " << j;
    ASSERT_EQ(memcpyd[j], result) << name(kernel) << " memcpy byte " << j;
    ASSERT_EQ(memset[j], j < kKernelBytes ? 10 : 0) << name(kernel) << " memset byte " << j;
  }
}

// Skips without a GPU; gives each test a non-blocking stream (as torch's are) to capture and
// replay on. A test's buffers and executables are gone before TearDown destroys the stream.
class SharedExecutablesOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }
  // Shape i's graph (capture_shape with sizes[i] bytes and extras[i] extra memsets, none where
  // `extras` is empty) added to `ex`, for each i.
  std::vector<SharedExecutables::Member> add_shapes(SharedExecutables& ex, Buffers& b,
                                                    const std::vector<size_t>& sizes,
                                                    const std::vector<int>& extras = {}) {
    std::vector<SharedExecutables::Member> members;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int extra = extras.empty() ? 0 : extras[i];
      members.push_back(
          ex.add(capture_shape(b, static_cast<int>(i), sizes[i], stream_, extra), stream_));
    }
    return members;
  }
  // Four shapes of one topology, most tests' set.
  const std::vector<size_t> kFourSizes = {kBytes, 1000, 4096 + 3, 77};
  cudaStream_t stream_ = nullptr;
};

}  // namespace

TEST_F(SharedExecutablesOnGpu, ShapesOfOneTopologyShareOneExecutableAndReplayTheirOwnParameters) {
  Buffers b(stream_, 4);
  SharedExecutables ex(Sharing::kTopology, /*cache_bytes=*/0);
  const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, kFourSizes);
  auto s = ex.stats();
  EXPECT_EQ(s.groups, 1);
  EXPECT_EQ(s.members, 4);
  EXPECT_EQ(s.joins, 3);
  EXPECT_EQ(s.instantiations, 1);
  EXPECT_EQ(s.switches, 3);  // each join patched the one executable, which asked the driver
  EXPECT_LT(s.params_bytes, s.params_raw_bytes);
  // Any order, repeats included, replays each shape's own parameters.
  for (int i : {2, 0, 0, 3, 1, 2, 3, 0}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, kFourSizes[i]);
  }
  s = ex.stats();
  EXPECT_GT(s.nodes_patched, 0);
  EXPECT_EQ(s.switches, 3 + 7);  // 8 launches; the repeated 0 needs no patching

  // Evicted, it is instantiated again from the base graph and patched.
  EXPECT_EQ(ex.evict_to(0, {}), 1);
  EXPECT_EQ(ex.stats().resident, 0);
  ASSERT_NO_FATAL_FAILURE(replay(ex, members[3], b, stream_));
  expect_shape(b, 3, kFourSizes[3]);
  EXPECT_EQ(ex.stats().instantiations, 2);

  // The graph cache reads a member's parameters out, its own in node order.
  const auto params = ex.params_of(members[1]);
  ASSERT_TRUE(params.has_value());
  EXPECT_EQ(params->blobs.size(), params->kinds.size());

  for (auto m : members) ex.remove(m);
  EXPECT_EQ(ex.stats().groups, 0);
  std::string why;
  EXPECT_FALSE(ex.params_of(members[1], &why).has_value());
  EXPECT_EQ(why, "its executable group has ended");
}

TEST_F(SharedExecutablesOnGpu, AJoinIsSettledOnceALaunchIsQueuedAndItsShapeReplaysAfter) {
  Buffers b(stream_, 3);
  SharedExecutables ex(Sharing::kTopology, 0);
  const std::vector<size_t> sizes = {512, 2048};
  const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, sizes);
  // The joined shape's blobs are held whole and its graph kept until a launch is queued.
  const size_t held_whole = ex.stats().params_bytes;
  EXPECT_EQ(ex.stats().settle_ns, 0);
  b.clear();
  CUDA_OK(cudaGraphLaunch(ex.prepare(members[1], stream_), stream_));
  ex.launched(members[1]);
  CUDA_OK(cudaStreamSynchronize(stream_));
  expect_shape(b, 1, sizes[1]);
  EXPECT_GT(ex.stats().settle_ns, 0);
  EXPECT_LT(ex.stats().params_bytes, held_whole);
  // Compressed, both shapes still replay their own parameters.
  for (int i : {0, 1, 0}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, sizes[static_cast<size_t>(i)]);
  }
  // A join before any launch settles the one before it.
  const auto third = ex.add(capture_shape(b, 2, 300, stream_), stream_);
  const int64_t settled = ex.stats().settle_ns;
  ex.add(capture_shape(b, 0, 4096, stream_), stream_);
  EXPECT_GT(ex.stats().settle_ns, settled);
  ASSERT_NO_FATAL_FAILURE(replay(ex, third, b, stream_));
  expect_shape(b, 2, 300);
}

TEST_F(SharedExecutablesOnGpu, PatchesBackToTheBaseAfterARemovedShape) {
  Buffers b(stream_, 3);
  SharedExecutables ex(Sharing::kTopology, 0);
  auto base = ex.add(capture_shape(b, 0, 512, stream_), stream_);
  auto gone = ex.add(capture_shape(b, 1, 2048, stream_), stream_);
  auto kept = ex.add(capture_shape(b, 2, 300, stream_), stream_);
  ex.prepare(gone, stream_);
  ex.remove(gone);  // the executable holds a shape that no longer exists
  for (auto [m, i, n] : {std::tuple{kept, 2, size_t{300}}, std::tuple{base, 0, size_t{512}}}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, m, b, stream_));
    expect_shape(b, i, n);
  }
}

TEST_F(SharedExecutablesOnGpu, OtherTopologiesAndSharingOffGetExecutablesOfTheirOwn) {
  Buffers b(stream_, 2);
  SharedExecutables ex(Sharing::kNearTopologies, 0);
  auto plain = ex.add(capture_shape(b, 0, 1000, stream_), stream_);
  // 20 nodes more than 3: beyond the 8 a near topology may differ by.
  auto far = ex.add(capture_shape(b, 1, 1000, stream_, /*extra_memsets=*/20), stream_);
  EXPECT_EQ(ex.stats().groups, 2);
  EXPECT_EQ(ex.stats().joins, 0);
  ASSERT_NO_FATAL_FAILURE(replay(ex, plain, b, stream_));
  expect_shape(b, 0, 1000);
  ASSERT_NO_FATAL_FAILURE(replay(ex, far, b, stream_));
  expect_shape(b, 1, 1000, 20);
  // Least recently used first; the one kept is spared.
  EXPECT_EQ(ex.evict_to(0, far), 1);
  EXPECT_EQ(ex.stats().resident, 1);

  // Sharing by topology alone: a near topology (a memset more) is a group of its own.
  SharedExecutables exact(Sharing::kTopology, 0);
  exact.add(capture_shape(b, 0, 1000, stream_), stream_);
  auto near = exact.add(capture_shape(b, 1, 500, stream_, /*extra_memsets=*/1), stream_);
  EXPECT_EQ(exact.stats().groups, 2);
  EXPECT_EQ(exact.stats().joins, 0);
  EXPECT_EQ(exact.stats().near_joins, 0);
  ASSERT_NO_FATAL_FAILURE(replay(exact, near, b, stream_));
  expect_shape(b, 1, 500, 1);

  SharedExecutables separate(Sharing::kNone, SIZE_MAX);
  separate.add(capture_shape(b, 0, 1000, stream_), stream_);
  auto second = separate.add(capture_shape(b, 1, 500, stream_), stream_);
  EXPECT_EQ(separate.stats().groups, 2);
  EXPECT_EQ(separate.stats().params_bytes, 0u);
  ASSERT_NO_FATAL_FAILURE(replay(separate, second, b, stream_));
  expect_shape(b, 1, 500);
}

TEST_F(SharedExecutablesOnGpu, AUnionHoldsVariantsFartherApartThanOneGraphMayBring) {
  // Note [Near topologies]: a graph may bring at most 8 nodes a union lacks, but the union's
  // own extra nodes are bounded only by its growth over its smallest member (16 here). A graph
  // with 12 memsets more, then the plain one, share one executable; each runs its own nodes.
  Buffers b(stream_, 3);
  SharedExecutables ex(Sharing::kNearTopologies, 0);
  const std::vector<size_t> sizes = {1000, 2048};
  const std::vector<int> extras = {12, 0};
  const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, sizes, extras);
  const auto s = ex.stats();
  EXPECT_EQ(s.groups, 1);
  EXPECT_EQ(s.near_joins, 1);
  // The plain graph's nodes are all in the wider one; the union gains its anchors and the plain
  // graph's memset-to-kernel edge, which must not go through the memsets it lacks.
  EXPECT_EQ(s.unions, 1);
  for (int i : {1, 0, 1, 1, 0}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, sizes[i], extras[i]);
  }
  // The graph cache reads each member out in its own graph's node order; a shape restored from
  // those parameters into the union replays as that member does (after the other member ran).
  const auto wide = ex.params_of(members[0]), plain = ex.params_of(members[1]);
  ASSERT_TRUE(wide.has_value() && plain.has_value());
  EXPECT_NE(wide->topology, plain->topology);
  EXPECT_EQ(wide->blobs.size(), plain->blobs.size() + 12) << "each in its own graph's nodes";
  for (size_t i : {0, 1}) {
    const auto& params = i == 0 ? *wide : *plain;
    const SharedExecutables::Member restored =
        ex.add_shape(members[i], params.topology, params.blobs, stream_);
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[1 - i], b, stream_));
    ASSERT_NO_FATAL_FAILURE(replay(ex, restored, b, stream_));
    expect_shape(b, static_cast<int>(i), sizes[i], extras[i]);
  }
  // As a later process restores it: into a group of that topology alone (another shape of it
  // captured live), then after that live shape is gone.
  SharedExecutables later(Sharing::kNearTopologies, 0);
  const SharedExecutables::Member live =
      later.add(capture_shape(b, 2, 1500, stream_, extras[1]), stream_);
  const SharedExecutables::Member restored =
      later.add_shape(live, plain->topology, plain->blobs, stream_);
  ASSERT_NO_FATAL_FAILURE(replay(later, live, b, stream_));
  ASSERT_NO_FATAL_FAILURE(replay(later, restored, b, stream_));
  expect_shape(b, 1, sizes[1], extras[1]);
  later.remove(live);
  const SharedExecutables::Member again =
      later.add_shape(restored, plain->topology, plain->blobs, stream_);
  ASSERT_NO_FATAL_FAILURE(replay(later, again, b, stream_));
  expect_shape(b, 1, sizes[1], extras[1]);
  later.remove(restored);
  later.remove(again);
}

TEST_F(SharedExecutablesOnGpu, NearTopologiesShareOneUnionAndRunOnlyTheirOwnNodes) {
  // Note [Near topologies]: shapes with 0, 2, 1, 0 and 1 extra memsets share one group; each
  // runs its own nodes only (an absent memset leaves its byte zero), in any order, patched or in
  // slots.
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(stream_, 5);
    SharedExecutables ex(Sharing::kNearTopologies, cache);
    const std::vector<size_t> sizes = {1000, 2048, 77, 4096, 3000};
    const std::vector<int> extras = {0, 2, 1, 0, 1};
    const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, sizes, extras);
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.members, 5);
    EXPECT_EQ(s.joins, 4);
    EXPECT_EQ(s.near_joins, 4);  // the union is built by the second; the rest are no longer exact
    // The third grows it by an edge from its one extra memset to the kernel. The fourth's edges
    // and first and last nodes are the base's, already in the union, and the fifth maps as the
    // third did: both join as is.
    EXPECT_EQ(s.unions, 2);
    for (int i : {1, 2, 0, 1, 3, 4, 2, 2, 0, 3, 4, 1}) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
      expect_shape(b, i, sizes[i], extras[i]);
    }
    if (cache == 0) {
      EXPECT_EQ(ex.stats().resident, 1);
      EXPECT_GT(ex.stats().switches, 0);
    } else {
      EXPECT_EQ(ex.stats().resident, 5);
    }
    // Evicted, the union is instantiated again with the base's absent nodes as no-ops.
    ex.evict_to(0, {});
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[0], b, stream_));
    expect_shape(b, 0, sizes[0], 0);
    for (auto m : members) ex.remove(m);
    EXPECT_EQ(ex.stats().groups, 0);
  }
}

TEST_F(SharedExecutablesOnGpu, AGraphOfTheGroupsOwnTopologyRunsWhatASmallerShapeLacks) {
  // The larger graph first: the smaller one joins it, its extra memset a no-op in the slot it is
  // patched into (the union only gains the smaller one's memset-to-kernel edge, and anchors); a
  // later graph of the larger topology joins as is and must run that memset again (an executable
  // update would leave it a no-op).
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(stream_, 3);
    SharedExecutables ex(Sharing::kNearTopologies, cache);
    const std::vector<size_t> sizes = {1000, 300, 2048};
    const std::vector<int> extras = {1, 0, 1};
    const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, sizes, extras);
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.joins, 2);
    EXPECT_EQ(s.near_joins, 2);
    EXPECT_EQ(s.unions, 1);
    for (int i : {2, 1, 2, 0, 1, 0, 2}) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
      expect_shape(b, i, sizes[i], extras[i]);
    }
  }
}

TEST_F(SharedExecutablesOnGpu, ShapesGetSlotsOfTheirOwnOnlyWhereTheGpuWaitsForTheHost) {
  // Note [Executable slots], SlotGrowth::kWhenGpuWaits: with no limit on the cache, captures
  // join the one executable, shapes prepared while work is queued (a slow kernel, ~10 ms) are
  // patched into it, and shapes prepared on an idle stream, as most recent ones were, get
  // executables of their own.
  constexpr long long kBusyCycles = 20000000;
  Buffers b(stream_, 4);
  uint8_t* busy = device_alloc(1);  // what the slow kernel writes: no buffer a shape writes
  SharedExecutables ex(Sharing::kTopology, SIZE_MAX,
                       SharedExecutables::SlotGrowth::kWhenGpuWaits);
  auto keep_busy = [&] {
    CUDA_OK(grape::test_kernels::launch_fill_slowly(busy, 1, 1, kBusyCycles, stream_));
  };
  std::vector<SharedExecutables::Member> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(
        ex.add(capture_shape(b, i, kFourSizes[static_cast<size_t>(i)], stream_), stream_));
  }
  EXPECT_EQ(ex.stats().groups, 1);
  EXPECT_EQ(ex.stats().resident, 1);
  for (int i : {2, 0, 3, 1}) {
    b.clear();  // waits for the stream
    keep_busy();
    CUDA_OK(cudaGraphLaunch(ex.prepare(members[static_cast<size_t>(i)], stream_), stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ex.stats().resident, 1) << "a slot made while work was queued";
  // Busy and idle in turn (a GPU-bound function that the host outpaces now and then): shapes 3
  // and 1 find the GPU waiting and get slots, 1 right after 3's costly patch, 3 at its next
  // launch; shapes 2 and 0 always find work queued, their patches cost nothing, and they get none
  // (each follows a launch that made a slot or hit one, never a costly patch).
  auto busy_and_idle = [&] {
    for (int i : {2, 0, 3, 1}) {
      b.clear();
      if (i % 2 == 0) keep_busy();
      CUDA_OK(cudaGraphLaunch(ex.prepare(members[static_cast<size_t>(i)], stream_), stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
    }
  };
  int paying = 0;
  for (; paying < 3 && ex.stats().resident < 3; ++paying) busy_and_idle();
  EXPECT_EQ(ex.stats().resident, 3) << "after " << paying << " rounds";
  for (int round = 0; round < 20; ++round) busy_and_idle();
  EXPECT_EQ(ex.stats().resident, 3) << "a slot made for shapes launched while work was queued";
  // Idle before each prepare (replay() waits for each launch): shape 2, patched while the GPU
  // waits, makes shape 0 a slot right after; 2 keeps the first executable.
  int rounds = 0;
  for (; rounds < 3 && ex.stats().resident < 4; ++rounds) {
    for (int i : {2, 0, 3, 1}) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
      expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
    }
  }
  EXPECT_EQ(ex.stats().resident, 4) << "after " << rounds << " rounds";
  const auto switches = ex.stats().switches;
  for (int i : {3, 2, 1, 0}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
  }
  EXPECT_EQ(ex.stats().switches, switches) << "a shape with a slot of its own was patched";
  CUDA_OK(cudaFree(busy));
}

TEST_F(SharedExecutablesOnGpu, AShapeGetsASlotOfItsOwnAfterACostlyPatchOfItOrOfTheShapeBefore) {
  // Note [Executable slots], SlotAdmission: the GPU waits at every launch (replay() waits for
  // each). A shape's first launch patches it into the one executable, unless the launch before
  // was such a patch: then it gets a slot of its own at once. A patched shape gets its slot at
  // its next launch, and every shape keeps its slot.
  Buffers b(stream_, 4);
  SharedExecutables ex(Sharing::kTopology, SIZE_MAX,
                       SharedExecutables::SlotGrowth::kWhenGpuWaits);
  std::vector<SharedExecutables::Member> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(
        ex.add(capture_shape(b, i, kFourSizes[static_cast<size_t>(i)], stream_), stream_));
  }
  const int64_t switches = ex.stats().switches;
  const int64_t instantiations = ex.stats().instantiations;
  for (int i : {2, 0, 3, 1}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ex.stats().resident, 3) << "shapes 0 and 1 get slots right after 2 and 3 are patched";
  EXPECT_EQ(ex.stats().instantiations - instantiations, 2);
  EXPECT_EQ(ex.stats().switches - switches, 3)
      << "shapes 2 and 3 patch the first executable, and 1's new slot is patched from the base";
  for (int i : {2, 0, 3, 1}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
  }
  // Shape 2 got its slot; shape 3, which the first executable held, replayed in it.
  EXPECT_EQ(ex.stats().resident, 4);
  const int64_t before = ex.stats().switches;
  for (int i : {3, 2, 1, 0, 1, 3}) {
    ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
    expect_shape(b, i, kFourSizes[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ex.stats().switches, before) << "a shape with a slot of its own was patched";
}

TEST_F(SharedExecutablesOnGpu, ShapesWithSlotsOfTheirOwnReplayWithoutPatching) {
  {
    Buffers b(stream_, 4);
    SharedExecutables ex(Sharing::kTopology, SIZE_MAX);
    const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, kFourSizes);
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1);
    EXPECT_EQ(s.resident, 4);
    EXPECT_EQ(s.joins, 3);
    EXPECT_GT(s.cached_bytes, 0u);
    EXPECT_LT(s.cached_bytes, s.device_bytes);
    EXPECT_EQ(s.switches, 3);  // each join's new slot, patched from the base
    for (int i : {2, 0, 0, 3, 1, 2, 3, 0}) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
      expect_shape(b, i, kFourSizes[i]);
    }
    EXPECT_EQ(ex.stats().switches, 3);

    // Evicting all but the slot `keep` uses; the others are instantiated again on demand.
    ex.remove(members[1]);
    EXPECT_EQ(ex.evict_to(0, members[3]), 3);
    EXPECT_EQ(ex.stats().resident, 1);
    for (int i : {0, 2, 3}) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(i)], b, stream_));
      expect_shape(b, i, kFourSizes[i]);
    }
    EXPECT_EQ(ex.stats().resident, 3);
    EXPECT_EQ(ex.stats().switches, 3 + 1);  // and shape 2's new slot
  }
  {
    // With room for one more executable, shape 1's join takes it and keeps it (Note [Executable
    // slots]); shapes 0 and 2 take turns in the first. A patch ahead goes into an executable other
    // than the one just launched; where that is the one they may take, prepare() patches it, and
    // the launch still running keeps its parameters.
    Buffers b(stream_, 3);
    const size_t sizes[] = {512, 2000, 3000};
    SharedExecutables ex(Sharing::kTopology, 0);
    std::vector<SharedExecutables::Member> members;
    members.push_back(ex.add(capture_shape(b, 0, sizes[0], stream_), stream_));
    // A group's executables are all charged as its first: room for exactly one more.
    const size_t one = ex.stats().device_bytes;
    ex.set_cache_bytes(one + one / 2);
    for (int i = 1; i < 3; ++i) {
      members.push_back(ex.add(capture_shape(b, i, sizes[i], stream_), stream_));
    }
    EXPECT_EQ(ex.stats().resident, 2);
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 3; ++i) {
        b.clear();
        cudaGraphExec_t launched = ex.prepare(members[static_cast<size_t>(i)], stream_);
        CUDA_OK(cudaGraphLaunch(launched, stream_));
        const int next = (i + 1) % 3;
        const auto before = ex.stats().switches;
        ex.prepare_ahead(members[static_cast<size_t>(next)]);
        const auto ahead = ex.stats().switches - before;
        cudaGraphExec_t next_exec = ex.prepare(members[static_cast<size_t>(next)], stream_);
        const auto at_prepare = ex.stats().switches - before - ahead;
        if (next == 1) {  // its own executable
          EXPECT_EQ(ahead + at_prepare, 0);
          EXPECT_NE(next_exec, launched);
        } else if (i == 1) {  // the first executable is not running: patched ahead
          EXPECT_EQ(ahead, 1);
          EXPECT_EQ(at_prepare, 0) << "prepare() patched after prepare_ahead()";
          EXPECT_NE(next_exec, launched);
        } else {  // shape 2 runs in the first executable: shape 0 is patched in by prepare()
          EXPECT_EQ(ahead, 0) << "patched ahead into the executable just launched";
          EXPECT_EQ(at_prepare, 1);
          EXPECT_EQ(next_exec, launched);
        }
        CUDA_OK(cudaStreamSynchronize(stream_));
        expect_shape(b, i, sizes[i]);
      }
    }
  }
}

TEST_F(SharedExecutablesOnGpu, PatchesAheadOnlyTheShapeThatFollowedTheLaunchedOneTheLastTwoTimes) {
  Buffers b(stream_, 3);
  const std::vector<size_t> sizes = {512, 2000, 3000};
  // Launches `order` (shape indices) from a group of one slot, each reported to launched(), and
  // returns how many patches were made ahead. A patch ahead goes into the slot still running the
  // launched shape, which must not change that launch; in these orders every patch ahead is of
  // the shape launched next, whose prepare() then has nothing to write.
  auto patches_ahead = [&](const std::vector<int>& order) -> int64_t {
    SharedExecutables ex(Sharing::kTopology, /*cache_bytes=*/0);
    const std::vector<SharedExecutables::Member> members = add_shapes(ex, b, sizes);
    int64_t ahead = 0;
    for (int i : order) {
      const SharedExecutables::Member m = members[static_cast<size_t>(i)];
      b.clear();
      const auto switches = ex.stats().switches;
      EXPECT_EQ(cudaGraphLaunch(ex.prepare(m, stream_), stream_), cudaSuccess);
      if (ex.stats().patches_ahead > ahead) {
        EXPECT_EQ(ex.stats().switches, switches) << "prepare() patched after a patch ahead";
      }
      ahead = ex.stats().patches_ahead;
      ex.launched(m);
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      expect_shape(b, i, sizes[static_cast<size_t>(i)]);
    }
    return ex.stats().patches_ahead;
  };
  // 1 followed 0 at launches 2 and 4: launches 5 and 6 patch in 1 and 0 ahead.
  EXPECT_EQ(patches_ahead({0, 1, 0, 1, 0, 1}), 2);
  // 0 is followed by 1, 2, 1, 2: never by the same twice running; 1 is followed by 0 twice, but
  // not launched again.
  EXPECT_EQ(patches_ahead({0, 1, 0, 2, 0, 1, 0, 2}), 0);
}

TEST_F(SharedExecutablesOnGpu, GraphsOfOneTopologyRunningDifferentKernelsEachReplayTheirOwnKernel) {
  // A topology leaves the kernel to node updates, so these graphs (memset, kernel, memcpy; only
  // the kernel differs) have one topology and the second joins the first's group by a node
  // update, which the driver lets change a node's function. Replays alternate the kernels: with
  // one executable (cache 0) each one swaps the function back by a node update; with a slot
  // each, the join's update swapped it once.
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(stream_, 0);
    SharedExecutables ex(Sharing::kNearTopologies, cache);
    const Kernel kernels[] = {Kernel::kAddOne, Kernel::kTimesTwo};
    std::vector<SharedExecutables::Member> members;
    for (Kernel k : kernels) members.push_back(ex.add(capture_kernel(b, k, stream_), stream_));
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.unshareable, 0);
    EXPECT_EQ(s.members, 2);
    EXPECT_EQ(s.joins, 1);
    EXPECT_EQ(s.near_joins, 0);  // the update path, not alignment
    const auto switches_before = s.switches;
    constexpr int kReplays = 6;
    for (int r = 0; r < kReplays; ++r) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(r % 2)], b, stream_));
      expect_kernel(b, kernels[r % 2], 0);
    }
    s = ex.stats();
    if (cache == 0) {
      EXPECT_EQ(s.resident, 1);
      EXPECT_EQ(s.switches - switches_before, kReplays);  // every replay swapped the kernel
    } else {
      EXPECT_EQ(s.resident, 2);
      EXPECT_EQ(s.switches - switches_before, 0);
    }
  }
}

TEST_F(SharedExecutablesOnGpu, NearTopologiesPairKernelNodesOfOtherKernelsEachRunningItsOwn) {
  // Note [Near topologies]: alignment pairs a kernel node with one of another kernel (a swap:
  // the function changes by a parameter update). Graph A is memset, extra memset, add_one,
  // memcpy; graph B is memset, times_two, memcpy. Their node counts differ, so B joins A's group
  // by alignment: times_two pairs with add_one, and B runs A's extra memset as a no-op. The
  // union gains B's memset-to-kernel edge and anchors, no node.
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(stream_, 0);
    SharedExecutables ex(Sharing::kNearTopologies, cache);
    const Kernel kernels[] = {Kernel::kAddOne, Kernel::kTimesTwo};
    const int extras[] = {1, 0};
    std::vector<SharedExecutables::Member> members;
    for (int i = 0; i < 2; ++i) {
      members.push_back(ex.add(capture_kernel(b, kernels[i], stream_, extras[i]), stream_));
    }
    const auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.unshareable, 0);
    EXPECT_EQ(s.members, 2);
    EXPECT_EQ(s.joins, 1);
    EXPECT_EQ(s.near_joins, 1);
    EXPECT_EQ(s.near_swaps, 1);
    EXPECT_EQ(s.unions, 1);
    // Each runs its own kernel (the memcpy after it copies that kernel's result) and its own
    // memsets, in alternating order.
    for (int r = 0; r < 6; ++r) {
      ASSERT_NO_FATAL_FAILURE(replay(ex, members[static_cast<size_t>(r % 2)], b, stream_));
      expect_kernel(b, kernels[r % 2], extras[r % 2]);
    }
    EXPECT_EQ(ex.stats().resident, cache == 0 ? 1 : 2);
  }
}

TEST_F(SharedExecutablesOnGpu, GraphsACopyApartKeepGroupsOfTheirOwnAndAMemsetApartShareOne) {
  // A shape runs the nodes it lacks as no-ops; a copy has none (its memory kinds are the node's),
  // so graphs a copy apart do not join, in either order, while graphs a memset apart do. Each
  // replays its own nodes.
  for (bool copy : {true, false}) {
    for (bool extra_first : {true, false}) {
      Buffers b(stream_, 1);
      SharedExecutables ex(Sharing::kNearTopologies, 0);
      std::vector<SharedExecutables::Member> members;
      for (bool with_extra : {extra_first, !extra_first}) {
        cudaGraph_t graph = nullptr;
        CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        CUDA_OK(cudaMemsetAsync(b.memset_dst, 10, kKernelBytes, stream_));
        if (with_extra && copy) {
          CUDA_OK(cudaMemcpyAsync(b.memcpy_dst, b.sources[0], kKernelBytes,
                                  cudaMemcpyDeviceToDevice, stream_));
        } else if (with_extra) {
          CUDA_OK(cudaMemsetAsync(b.memcpy_dst, 20, kKernelBytes, stream_));
        }
        CUDA_OK(cudaStreamEndCapture(stream_, &graph));
        members.push_back(ex.add(graph, stream_));
      }
      const auto s = ex.stats();
      const std::string what = std::string(copy ? "copy" : "memset") +
                               (extra_first ? " first" : " second");
      EXPECT_EQ(s.groups, copy ? 2 : 1) << what;
      EXPECT_EQ(s.near_joins, copy ? 0 : 1) << what;
      EXPECT_EQ(s.near_refused_no_noop, copy ? 1 : 0) << what;
      const std::vector<uint8_t> src = b.read(b.sources[0]);
      for (size_t m : {0, 1, 0}) {
        ASSERT_NO_FATAL_FAILURE(replay(ex, members[m], b, stream_));
        const bool with_extra = (m == 0) == extra_first;
        const std::vector<uint8_t> extra = b.read(b.memcpy_dst);
        const std::vector<uint8_t> memset = b.read(b.memset_dst);
        for (size_t j = 0; j < kKernelBytes; ++j) {
          ASSERT_EQ(memset[j], 10) << what << ", member " << m << ", byte " << j;
          const int expected = !with_extra ? 0 : (copy ? src[j] : 20);
          ASSERT_EQ(extra[j], expected) << what << ", member " << m << ", byte " << j;
        }
      }
    }
  }
}

// For tests of a union's launch order: a kernel still running (~100 us) when the host queues
// the next work, and launches of two members, mostly the second.
constexpr long long kSpinCycles = 200000;
constexpr int kLaunches = 24;

std::vector<int> mostly_second(int launches) {
  std::vector<int> order;
  for (int r = 0; r < launches; ++r) order.push_back(r % 3 == 0 ? 0 : 1);
  return order;
}

// Launches members[order[r]] for each r, back to back: `before(r)` queued before launch r, and a
// copy of `output` (kKernelBytes) after it, none waited for. Returns the copies, launch by launch.
std::vector<uint8_t> launch_back_to_back(SharedExecutables& ex,
                                         const std::vector<SharedExecutables::Member>& members,
                                         const std::vector<int>& order, const uint8_t* output,
                                         const std::function<void(int)>& before,
                                         cudaStream_t stream) {
  uint8_t* copies = device_alloc(order.size() * kKernelBytes);
  for (size_t r = 0; r < order.size(); ++r) {
    before(static_cast<int>(r));
    EXPECT_EQ(cudaGraphLaunch(ex.prepare(members[static_cast<size_t>(order[r])], stream), stream),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(copies + r * kKernelBytes, output, kKernelBytes,
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
  }
  std::vector<uint8_t> host(order.size() * kKernelBytes);
  EXPECT_EQ(cudaMemcpyAsync(host.data(), copies, host.size(), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(copies), cudaSuccess);
  return host;
}

TEST_F(SharedExecutablesOnGpu, AMembersLaunchStartsAfterWorkQueuedBeforeWhateverItLacks) {
  // The start's counterpart of the test below: graph A is a memset, then a kernel that reads an
  // input; graph B that kernel alone. In their union B lacks the memset, A's first node. B's
  // kernel must still wait for work queued before B's launch: a slow kernel writes the input,
  // a new value each launch, right before it. (With the memset disabled for B and an empty start
  // node, B's kernel read the input before the slow kernel wrote it on an H100.)
  Buffers b(stream_, 0);
  uint8_t* input = b.memcpy_dst;
  SharedExecutables ex(Sharing::kNearTopologies, 0);
  std::vector<SharedExecutables::Member> members;
  for (int g = 0; g < 2; ++g) {
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    if (g == 0) CUDA_OK(cudaMemsetAsync(b.extra_dst, 100, 1, stream_));
    CUDA_OK(grape::test_kernels::launch_copy(b.copy_dst, input, kKernelBytes, stream_));
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    members.push_back(ex.add(graph, stream_));
  }
  EXPECT_EQ(ex.stats().groups, 1);
  EXPECT_EQ(ex.stats().near_joins, 1);
  const std::vector<int> order = mostly_second(kLaunches);
  const std::vector<uint8_t> host = launch_back_to_back(ex, members, order, b.copy_dst, [&](int r) {
    CUDA_OK(grape::test_kernels::launch_fill_slowly(input, r + 1, kKernelBytes, kSpinCycles,
                                                    stream_));
  }, stream_);
  for (int r = 0; r < kLaunches; ++r) {
    for (size_t j = 0; j < kKernelBytes; ++j) {
      ASSERT_EQ(host[static_cast<size_t>(r) * kKernelBytes + j], r + 1)
          << "launch " << r << " of graph " << (order[r] == 0 ? "A" : "B") << ", byte " << j;
    }
  }
}

TEST_F(SharedExecutablesOnGpu, AMembersLaunchEndsAfterItsOwnNodesWhateverItLacks) {
  // Note [Near topologies]: graph A is a slow kernel, then a memset; graph B the slow kernel
  // alone. In their union B lacks the memset, A's last node. Work queued after B's launch must
  // still wait for B's kernel: each launch is followed, without waiting, by a copy of the kernel's
  // output, and the output is cleared before the next launch. (With the memset disabled for B and
  // an empty node ending the union, every copy after B's launches read the cleared output on an
  // H100.)
  const int values[] = {5, 9};
  Buffers b(stream_, 0);
  SharedExecutables ex(Sharing::kNearTopologies, 0);
  std::vector<SharedExecutables::Member> members;
  for (int g = 0; g < 2; ++g) {
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(grape::test_kernels::launch_fill_slowly(b.copy_dst, values[g], kKernelBytes,
                                                    kSpinCycles, stream_));
    if (g == 0) CUDA_OK(cudaMemsetAsync(b.extra_dst, 100, 1, stream_));
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    members.push_back(ex.add(graph, stream_));
  }
  EXPECT_EQ(ex.stats().groups, 1);
  EXPECT_EQ(ex.stats().near_joins, 1);
  const std::vector<int> order = mostly_second(kLaunches);
  const std::vector<uint8_t> host = launch_back_to_back(ex, members, order, b.copy_dst, [&](int) {
    CUDA_OK(cudaMemsetAsync(b.copy_dst, 0, kKernelBytes, stream_));
  }, stream_);
  for (int r = 0; r < kLaunches; ++r) {
    for (size_t j = 0; j < kKernelBytes; ++j) {
      ASSERT_EQ(host[static_cast<size_t>(r) * kKernelBytes + j], values[order[r]])
          << "launch " << r << " of graph " << (order[r] == 0 ? "A" : "B") << ", byte " << j;
    }
  }
}
