// GPU tests of shared executables (Note [Shared executables]); they skip without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "cuda/batched_copy.h"
#include "cuda/shared_executables.h"

using grape::cuda::CopySegment;
using grape::cuda::SharedExecutables;

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

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

constexpr size_t kBytes = 1 << 16;

// Device buffers of one test: sources filled with distinct bytes, destinations cleared per run.
struct Buffers {
  std::vector<uint8_t*> sources;
  uint8_t* copy_dst = nullptr;
  uint8_t* memcpy_dst = nullptr;
  uint8_t* memset_dst = nullptr;
  uint8_t* extra_dst = nullptr;  // the extra memsets' bytes (capture_shape)
  explicit Buffers(int count) {
    for (int i = 0; i < count; ++i) {
      uint8_t* p = device_alloc(kBytes);
      std::vector<uint8_t> host(kBytes);
      for (size_t j = 0; j < kBytes; ++j) host[j] = static_cast<uint8_t>(j * 7 + i * 31 + 1);
      EXPECT_EQ(cudaMemcpy(p, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
      sources.push_back(p);
    }
    copy_dst = device_alloc(kBytes);
    memcpy_dst = device_alloc(kBytes);
    memset_dst = device_alloc(kBytes);
    extra_dst = device_alloc(kBytes);
  }
  ~Buffers() {
    for (auto* p : sources) cudaFree(p);
    cudaFree(copy_dst);
    cudaFree(memcpy_dst);
    cudaFree(memset_dst);
    cudaFree(extra_dst);
  }
  void clear() {
    cudaMemset(copy_dst, 0, kBytes);
    cudaMemset(memcpy_dst, 0, kBytes);
    cudaMemset(memset_dst, 0, kBytes);
    cudaMemset(extra_dst, 0, kBytes);
    // The tests launch on a non-blocking stream, which does not wait for the legacy stream.
    cudaDeviceSynchronize();
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

// What the shape's graph must leave in the destinations.
void expect_shape(Buffers& b, int i, size_t bytes, int extra_memsets = 0) {
  std::vector<uint8_t> src(kBytes), copied(kBytes), memcpyd(kBytes), memset(kBytes), extra(kBytes);
  ASSERT_EQ(cudaMemcpy(extra.data(), b.extra_dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t k = 0; k < kBytes; ++k) {
    ASSERT_EQ(extra[k], static_cast<int>(k) < extra_memsets ? 100 + k : 0)
        << "shape " << i << " extra memset byte " << k;
  }
  ASSERT_EQ(cudaMemcpy(src.data(), b.sources[i], kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(copied.data(), b.copy_dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(memcpyd.data(), b.memcpy_dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(memset.data(), b.memset_dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t j = 0; j < kBytes; ++j) {
    const uint8_t written = j < bytes ? src[j] : 0;
    ASSERT_EQ(copied[j], written) << "shape " << i << " kernel byte " << j;
    ASSERT_EQ(memcpyd[j], written) << "shape " << i << " memcpy byte " << j;
    ASSERT_EQ(memset[j], j < bytes ? 10 + i : 0) << "shape " << i << " memset byte " << j;
  }
}

}  // namespace

TEST(SharedExecutables, ShapesOfOneTopologyShareOneExecutableAndReplayTheirOwnParameters) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Buffers b(4);
    SharedExecutables ex(/*share=*/true, /*cache_bytes=*/0);
    const size_t sizes[] = {kBytes, 1000, 4096 + 3, 77};
    std::vector<SharedExecutables::Member> members;
    for (int i = 0; i < 4; ++i) members.push_back(ex.add(capture_shape(b, i, sizes[i], stream), stream));
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1);
    EXPECT_EQ(s.members, 4);
    EXPECT_EQ(s.joins, 3);
    EXPECT_EQ(s.instantiations, 1);
    EXPECT_LT(s.params_bytes, s.params_raw_bytes);
    // Any order, repeats included, replays each shape's own parameters.
    for (int i : {2, 0, 0, 3, 1, 2, 3, 0}) {
      replay(ex, members[static_cast<size_t>(i)], b, stream);
      expect_shape(b, i, sizes[i]);
    }
    s = ex.stats();
    EXPECT_GT(s.nodes_patched, 0);
    EXPECT_EQ(s.switches, 7);  // 8 launches; the repeated 0 needs no patching

    // Evicted, it is instantiated again from the base graph and patched.
    EXPECT_EQ(ex.evict_to(0, {}), 1);
    EXPECT_EQ(ex.stats().resident, 0);
    replay(ex, members[3], b, stream);
    expect_shape(b, 3, sizes[3]);
    EXPECT_EQ(ex.stats().instantiations, 2);

    for (auto m : members) ex.remove(m);
    EXPECT_EQ(ex.stats().groups, 0);
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(SharedExecutables, PatchesBackToTheBaseAfterARemovedShape) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Buffers b(3);
    SharedExecutables ex(true, 0);
    auto base = ex.add(capture_shape(b, 0, 512, stream), stream);
    auto gone = ex.add(capture_shape(b, 1, 2048, stream), stream);
    auto kept = ex.add(capture_shape(b, 2, 300, stream), stream);
    ex.prepare(gone, stream);
    ex.remove(gone);  // the executable holds a shape that no longer exists
    for (auto [m, i, n] : {std::tuple{kept, 2, size_t{300}}, std::tuple{base, 0, size_t{512}}}) {
      replay(ex, m, b, stream);
      expect_shape(b, i, n);
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(SharedExecutables, FarTopologiesAndSharingOffGetExecutablesOfTheirOwn) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Buffers b(2);
    SharedExecutables ex(true, 0);
    auto plain = ex.add(capture_shape(b, 0, 1000, stream), stream);
    // 20 nodes more than 3: beyond the 8 a near topology may differ by.
    auto far = ex.add(capture_shape(b, 1, 1000, stream, /*extra_memsets=*/20), stream);
    EXPECT_EQ(ex.stats().groups, 2);
    EXPECT_EQ(ex.stats().joins, 0);
    replay(ex, plain, b, stream);
    expect_shape(b, 0, 1000);
    replay(ex, far, b, stream);
    expect_shape(b, 1, 1000, 20);
    // Least recently used first; the one kept is spared.
    EXPECT_EQ(ex.evict_to(0, far), 1);
    EXPECT_EQ(ex.stats().resident, 1);

    SharedExecutables separate(false, SIZE_MAX);
    separate.add(capture_shape(b, 0, 1000, stream), stream);
    auto second = separate.add(capture_shape(b, 1, 500, stream), stream);
    EXPECT_EQ(separate.stats().groups, 2);
    EXPECT_EQ(separate.stats().params_bytes, 0u);
    replay(separate, second, b, stream);
    expect_shape(b, 1, 500);
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(SharedExecutables, NearTopologiesShareOneUnionAndRunOnlyTheirOwnNodes) {
  // Note [Near topologies]: shapes with 0, 2 and 1 extra memsets share one group; each runs its
  // own nodes only (a disabled memset leaves its byte zero), in any order, patched or in slots.
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(4);
    SharedExecutables ex(true, cache);
    const size_t sizes[] = {1000, 2048, 77, 4096};
    const int extras[] = {0, 2, 1, 0};
    std::vector<SharedExecutables::Member> members;
    for (int i = 0; i < 4; ++i) {
      members.push_back(ex.add(capture_shape(b, i, sizes[i], stream, extras[i]), stream));
    }
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.members, 4);
    EXPECT_EQ(s.joins, 3);
    EXPECT_EQ(s.near_joins, 3);  // the union is built by the second; the fourth is no longer exact
    EXPECT_EQ(s.unions, 1);
    for (int i : {1, 2, 0, 1, 3, 2, 2, 0, 3, 1}) {
      replay(ex, members[static_cast<size_t>(i)], b, stream);
      expect_shape(b, i, sizes[i], extras[i]);
    }
    if (cache == 0) {
      EXPECT_EQ(ex.stats().resident, 1);
      EXPECT_GT(ex.stats().switches, 0);
    } else {
      EXPECT_EQ(ex.stats().resident, 4);
    }
    // Evicted, the union is instantiated again with the base's absent nodes disabled.
    ex.evict_to(0, {});
    replay(ex, members[0], b, stream);
    expect_shape(b, 0, sizes[0], 0);
    for (auto m : members) ex.remove(m);
    EXPECT_EQ(ex.stats().groups, 0);
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(SharedExecutables, AGraphOfTheGroupsOwnTopologyEnablesWhatASmallerShapeDisabled) {
  // The larger graph first: the smaller one joins it as is, disabling its extra memset in the
  // slot it is patched into; a later graph of the larger topology must run that memset again
  // (an executable update would leave it disabled).
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (size_t cache : {size_t{0}, SIZE_MAX}) {
    Buffers b(3);
    SharedExecutables ex(true, cache);
    const size_t sizes[] = {1000, 300, 2048};
    const int extras[] = {1, 0, 1};
    std::vector<SharedExecutables::Member> members;
    for (int i = 0; i < 3; ++i) {
      members.push_back(ex.add(capture_shape(b, i, sizes[i], stream, extras[i]), stream));
    }
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1) << "cache " << cache;
    EXPECT_EQ(s.joins, 2);
    EXPECT_EQ(s.near_joins, 2);
    EXPECT_EQ(s.unions, 0);
    for (int i : {2, 1, 2, 0, 1, 0, 2}) {
      replay(ex, members[static_cast<size_t>(i)], b, stream);
      expect_shape(b, i, sizes[i], extras[i]);
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(SharedExecutables, ShapesWithSlotsOfTheirOwnReplayWithoutPatching) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Buffers b(4);
    const size_t sizes[] = {kBytes, 1000, 4096 + 3, 77};
    SharedExecutables ex(true, SIZE_MAX);
    std::vector<SharedExecutables::Member> members;
    for (int i = 0; i < 4; ++i) members.push_back(ex.add(capture_shape(b, i, sizes[i], stream), stream));
    auto s = ex.stats();
    EXPECT_EQ(s.groups, 1);
    EXPECT_EQ(s.resident, 4);
    EXPECT_EQ(s.joins, 3);
    EXPECT_GT(s.cached_bytes, 0u);
    EXPECT_LT(s.cached_bytes, s.device_bytes);
    for (int i : {2, 0, 0, 3, 1, 2, 3, 0}) {
      replay(ex, members[static_cast<size_t>(i)], b, stream);
      expect_shape(b, i, sizes[i]);
    }
    EXPECT_EQ(ex.stats().switches, 0);

    // Evicting all but the slot `keep` uses; the others are instantiated again on demand.
    ex.remove(members[1]);
    EXPECT_EQ(ex.evict_to(0, members[3]), 3);
    EXPECT_EQ(ex.stats().resident, 1);
    for (int i : {0, 2, 3}) {
      replay(ex, members[static_cast<size_t>(i)], b, stream);
      expect_shape(b, i, sizes[i]);
    }
    EXPECT_EQ(ex.stats().resident, 3);
    EXPECT_EQ(ex.stats().switches, 1);  // shape 2's new slot, patched from the base
  }
  {
    // With room for one more executable, two slots alternate: the shape predicted next is
    // patched into the slot not launched last, and prepare() then has nothing to write.
    Buffers b(3);
    const size_t sizes[] = {512, 2000, 3000};
    SharedExecutables ex(true, 0);
    std::vector<SharedExecutables::Member> members;
    members.push_back(ex.add(capture_shape(b, 0, sizes[0], stream), stream));
    // A group's executables are all charged as its first: room for exactly one more.
    const size_t one = ex.stats().device_bytes;
    ex.set_cache_bytes(one + one / 2);
    for (int i = 1; i < 3; ++i) members.push_back(ex.add(capture_shape(b, i, sizes[i], stream), stream));
    EXPECT_EQ(ex.stats().resident, 2);
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 3; ++i) {
        b.clear();
        cudaGraphExec_t launched = ex.prepare(members[static_cast<size_t>(i)], stream);
        CUDA_OK(cudaGraphLaunch(launched, stream));
        const int next = (i + 1) % 3;
        const auto before = ex.stats().switches;
        ex.prepare_ahead(members[static_cast<size_t>(next)]);
        // Three shapes in two slots: every next shape is patched ahead, into the other slot.
        EXPECT_EQ(ex.stats().switches - before, 1);
        const auto at_prepare = ex.stats().switches;
        EXPECT_NE(ex.prepare(members[static_cast<size_t>(next)], stream), launched)
            << "the next shape was patched into the executable just launched";
        EXPECT_EQ(ex.stats().switches, at_prepare) << "prepare() patched after prepare_ahead()";
        CUDA_OK(cudaStreamSynchronize(stream));
        expect_shape(b, i, sizes[i]);
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}
