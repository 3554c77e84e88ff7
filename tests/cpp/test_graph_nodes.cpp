// GPU tests of storing a captured graph's nodes (csrc/cuda/graph_nodes.h's storable_layout,
// stored_kernel_name, is_driver_address) with core/graph_relocation: a graph stored with one set
// of buffers runs on another after a live capture matched. They skip without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/graph_relocation.h"
#include "cuda/graph_nodes.h"
#include "test_kernels.h"

namespace core = grape::core;
namespace cuda = grape::cuda;

namespace {

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(expr)                                               \
  do {                                                              \
    const cudaError_t status_ = (expr);                             \
    ASSERT_EQ(status_, cudaSuccess) << cudaGetErrorString(status_); \
  } while (0)

constexpr size_t kLane = 1 << 20, kWeight = 1 << 16;

// What stands for one process: an arena lane and a weight tensor, filled with a pattern of its
// own (`seed`), so that a word left pointing at the other process's weight shows.
struct Memory {
  uint8_t* lane = nullptr;
  uint8_t* weight = nullptr;
  int seed;
  Memory(cudaStream_t stream, int seed) : seed(seed) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&lane), kLane), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&weight), kWeight), cudaSuccess);
    std::vector<uint8_t> pattern(kWeight);
    for (size_t i = 0; i < kWeight; ++i) pattern[i] = static_cast<uint8_t>(i * 13 + seed);
    EXPECT_EQ(cudaMemcpyAsync(weight, pattern.data(), kWeight, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(lane, 0, kLane, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  ~Memory() {
    cudaFree(lane);
    cudaFree(weight);
  }
  std::vector<core::AddressRange> lanes() const {
    return {core::make_range(lane, kLane)};
  }
  std::vector<std::pair<std::string, core::AddressRange>> tensors() const {
    return {{"w", core::make_range(weight, kWeight)}};
  }
  std::vector<uint8_t> read(size_t offset, size_t bytes) const {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), lane + offset, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// Shape n: a memset of the lane's first n bytes, a kernel copying n bytes of the weight (from
// offset 16) into the lane at 4096, and a copy of those into the lane at 65536.
cudaGraph_t capture(const Memory& m, size_t n, cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(m.lane, static_cast<int>(n % 200) + 1, n, stream), cudaSuccess);
  EXPECT_EQ(grape::test_kernels::launch_copy(m.lane + 4096, m.weight + 16, n, stream),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(m.lane + 65536, m.lane + 4096, n, cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  return graph;
}

std::vector<core::NodeLayout> layouts_of(const cuda::GraphContents& g) {
  std::vector<core::NodeLayout> layouts;
  for (size_t i = 0; i < g.blobs.size(); ++i) {
    layouts.push_back(cuda::storable_layout(g.kinds[i], g.blobs[i]));
  }
  return layouts;
}

class GraphNodesOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace

TEST_F(GraphNodesOnGpu, AStoredShapeRunsOnAnotherProcesssBuffersAfterALiveCaptureMatched) {
  Memory storing(stream_, 5);
  core::StoreContext store{storing.lanes(), storing.tensors(), cuda::is_driver_address,
                           cuda::stored_kernel_name};
  core::StoredNames names;
  std::vector<std::vector<core::StoredNode>> stored;
  for (size_t n : {1000, 3100}) {
    cudaGraph_t graph = capture(storing, n, stream_);
    const cuda::GraphContents g = cuda::read_graph(graph, true);
    cudaGraphDestroy(graph);
    ASSERT_TRUE(g.readable) << g.why_not;
    const core::StoreResult s = core::store_shape(g.blobs, layouts_of(g), store, names);
    ASSERT_EQ(s.why_not, "");
    // The kernel's words: its output in the lane, its input in the weight, its byte count, and
    // its function by name (the context is cleared where a function is set).
    const std::vector<core::WordKind> kernel_words = {
        core::WordKind::kArena, core::WordKind::kTensor, core::WordKind::kLiteral,
        core::WordKind::kKernel};
    ASSERT_EQ(g.kinds[1], cuda::NodeKind::kKernel);
    EXPECT_EQ(s.nodes[1].kinds, kernel_words);
    EXPECT_EQ(s.nodes[0].kinds, std::vector<core::WordKind>{core::WordKind::kArena});  // memset
    stored.push_back(s.nodes);
  }
  ASSERT_EQ(names.kernels.size(), 1u);
  EXPECT_EQ(names.tensors, std::vector<std::string>{"w"});

  // Another "process": other buffers. Its live capture of shape 1000 matches the stored one.
  Memory later(stream_, 9);
  core::RestoreContext restore;
  restore.lanes = later.lanes();
  restore.tensors = {{"w", core::make_range(later.weight, kWeight)}};
  restore.is_device_address = cuda::is_driver_address;
  restore.kernel_name = cuda::stored_kernel_name;
  cudaGraph_t live = capture(later, 1000, stream_);
  const cuda::GraphContents g = cuda::read_graph(live, true);
  ASSERT_TRUE(g.readable) << g.why_not;
  ASSERT_EQ(core::match_live_shape(stored[0], names, g.blobs, restore), "");

  // Shape 3100, never captured here, rebuilt from its stored words into the live executable.
  const core::RelocateResult shape = core::relocate_shape(stored[1], names, restore);
  ASSERT_EQ(shape.why_not, "");
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, live, 0));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    cuda::write_node(exec, g.nodes[i], g.kinds[i], shape.blobs[i]);
  }
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  const std::vector<uint8_t> filled = later.read(0, 3100), copied = later.read(65536, 3100);
  for (size_t i = 0; i < 3100; ++i) {
    ASSERT_EQ(filled[i], 3100 % 200 + 1) << "byte " << i;
    ASSERT_EQ(copied[i], static_cast<uint8_t>((i + 16) * 13 + later.seed)) << "byte " << i;
  }
  EXPECT_EQ(storing.read(65536, 16), std::vector<uint8_t>(16, 0)) << "the storing buffers moved";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(live);
}

TEST_F(GraphNodesOnGpu, KernelsAreNamedAndOnlyMemoryTheDriverKnowsIsAnAddress) {
  Memory m(stream_, 5);
  cudaGraph_t graph = capture(m, 64, stream_);
  const cuda::GraphContents g = cuda::read_graph(graph, true);
  cudaGraphDestroy(graph);
  ASSERT_TRUE(g.readable) << g.why_not;
  bool named = false;
  for (size_t i = 0; i < g.blobs.size(); ++i) {
    const core::NodeLayout layout = cuda::storable_layout(g.kinds[i], g.blobs[i]);
    EXPECT_TRUE(core::valid_layout(layout, g.blobs[i].size())) << "node " << i;
    if (!layout.kernel_word) continue;
    EXPECT_GT(layout.arguments_begin, *layout.kernel_word) << "the launch comes first";
    uint64_t handle = 0;
    std::memcpy(&handle, g.blobs[i].data() + *layout.kernel_word, sizeof(handle));
    const auto name = cuda::stored_kernel_name(handle, *layout.kernel_word);
    ASSERT_TRUE(name.has_value());
    EXPECT_NE(name->find("copy"), std::string::npos) << *name;
    named = true;
  }
  EXPECT_TRUE(named) << "the graph's kernel node";
  EXPECT_TRUE(cuda::is_driver_address(reinterpret_cast<uint64_t>(m.lane) + 100));
  EXPECT_FALSE(cuda::is_driver_address(3000));
  int on_the_stack = 0;
  EXPECT_FALSE(cuda::is_driver_address(reinterpret_cast<uint64_t>(&on_the_stack)));
}
