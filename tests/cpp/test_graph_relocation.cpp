// Relocating stored graphs (Note [Relocating stored graphs]), with synthetic blobs standing for
// kernel nodes: a kernel handle, three words that may hold addresses, and literal bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/graph_relocation.h"
#include "core/kernel_images.h"

using grape::core::AddressRange;
using grape::core::Blob;
using grape::core::match_live_shape;
using grape::core::NodeLayout;
using grape::core::relocate_shape;
using grape::core::RestoreContext;
using grape::core::store_shape;
using grape::core::StoreContext;
using grape::core::StoredNames;
using grape::core::StoredNode;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A process's view: where its lanes, its module tensor "w" and a library workspace are, and its
// kernels' handles.
struct Process {
  uint64_t lane0, lane1, weight, workspace;
  uint64_t gemm, softmax;  // kernel handles
  uint64_t context;        // the driver context kernels are launched in

  std::vector<AddressRange> lanes() const {
    return {{lane0, lane0 + kGiB}, {lane1, lane1 + kGiB}};
  }
  // Any address of this process's device memory (the lanes and tensors included).
  bool is_device_address(uint64_t v) const { return v >= 0x1000'0000 && v < 0x8000'0000'0000; }
  std::optional<std::string> kernel_name(uint64_t handle) const {
    if (handle == gemm) return "libcublasLt:gemm_128x64";
    if (handle == softmax) return "libtorch_cuda:softmax_warp";
    return std::nullopt;
  }
  StoreContext store_context() const {
    return {lanes(), {{"w", {weight, weight + 4096}}},
            [this](uint64_t v) { return is_device_address(v); },
            [this](uint64_t h, uint32_t) { return kernel_name(h); }};
  }
  RestoreContext restore_context() const {
    RestoreContext c;
    c.lanes = lanes();
    c.tensors = {{"w", {weight, weight + 4096}}};
    c.is_device_address = [this](uint64_t v) { return is_device_address(v); };
    c.kernel_name = [this](uint64_t h, uint32_t) { return kernel_name(h); };
    return c;
  }
};

const Process kStoring{0x7000'0000'0000, 0x7100'0000'0000, 0x5000'0000, 0x6000'0000, 0xA0, 0xB0,
                       0x5500};
const Process kLater{0x7a00'0000'0000, 0x7b00'0000'0000, 0x5400'0000, 0x6600'0000, 0xC0, 0xD0,
                     0x7700};

// Kernel node blob: handle @0, its arguments from 8 on: three address words @8 @16 @24, 8 literal
// bytes, the context handle @40, then 4 literal bytes.
const NodeLayout kLayout{{8, 16, 24}, {40}, 0, 8};

void put(Blob& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, sizeof(v)); }
uint64_t word_at(const Blob& b, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, sizeof(v));
  return v;
}

Blob kernel_blob(uint64_t kernel, uint64_t a, uint64_t b, uint64_t c, uint32_t grid,
                 uint64_t context = 0) {
  Blob blob(52, 0);
  put(blob, 0, kernel);
  put(blob, 8, a);
  put(blob, 16, b);
  put(blob, 24, c);
  std::memcpy(blob.data() + 32, &grid, sizeof(grid));
  put(blob, 40, context);
  blob[48] = 0x5a;  // bytes no layout word covers
  return blob;
}

// A shape of a two-node graph as process `p` captures it for sequence length `n`: a GEMM reading
// the weight at an offset and writing an arena buffer whose place depends on n, then a softmax
// over it in place with n as a literal argument and the library's workspace.
std::vector<Blob> shape_blobs(const Process& p, uint64_t n) {
  return {kernel_blob(p.gemm, p.weight + 256, p.lane0 + 4096 * n, p.lane1 + 64, 8, p.context),
          kernel_blob(p.softmax, p.lane0 + 4096 * n, n, p.workspace, static_cast<uint32_t>(n),
                      p.context)};
}

const std::vector<NodeLayout> kLayouts{kLayout, kLayout};

std::vector<StoredNode> store(const std::vector<Blob>& blobs, StoredNames& names) {
  const auto result = store_shape(blobs, kLayouts, kStoring.store_context(), names);
  EXPECT_EQ(result.why_not, "");
  return result.nodes;
}

}  // namespace

TEST(GraphRelocation, AStoredShapeIsRebuiltWithTheLaterProcesssAddressesAndKernels) {
  StoredNames names;
  const auto a = store(shape_blobs(kStoring, 3), names);
  const auto b = store(shape_blobs(kStoring, 7), names);
  EXPECT_EQ(names.kernels.size(), 2u);
  EXPECT_EQ(names.tensors, std::vector<std::string>{"w"});
  RestoreContext later = kLater.restore_context();
  // Before a live capture, nothing resolves the kernels or the workspace.
  EXPECT_NE(relocate_shape(b, names, later).why_not, "");
  ASSERT_EQ(match_live_shape(a, names, shape_blobs(kLater, 3), later), "");
  EXPECT_EQ(later.kernels.at("libcublasLt:gemm_128x64"), kLater.gemm);
  EXPECT_EQ(later.foreign.at(kStoring.workspace), kLater.workspace);
  EXPECT_EQ(later.foreign.at(kStoring.context), kLater.context) << "the context handle is mapped";
  const auto relocated = relocate_shape(b, names, later);
  ASSERT_EQ(relocated.why_not, "");
  EXPECT_EQ(relocated.blobs, shape_blobs(kLater, 7));
}

TEST(GraphRelocation, TheStoredFormDependsOnWhereTheProcessPutThingsOnlyInForeignWords) {
  // The same shape stored by two processes is the same stored shape but for the foreign words
  // and handles, which keep the storing process's value until a live capture maps it.
  StoredNames first, second;
  auto a = store(shape_blobs(kStoring, 5), first);
  auto result = store_shape(shape_blobs(kLater, 5), kLayouts, kLater.store_context(), second);
  ASSERT_EQ(result.why_not, "");
  EXPECT_EQ(first.kernels, second.kernels);
  ASSERT_EQ(a[1].kinds[2], grape::core::WordKind::kForeign);
  EXPECT_NE(result.nodes, a);
  for (size_t node : {0, 1}) {  // the contexts, and node 1's workspace
    put(a[node].words, 40, 0);
    put(result.nodes[node].words, 40, 0);
  }
  put(a[1].words, 24, 0);
  put(result.nodes[1].words, 24, 0);
  EXPECT_EQ(result.nodes, a);
}

TEST(GraphRelocation, ALiveCaptureThatDiffersDropsTheGroupAndTeachesNothing) {
  StoredNames names;
  const auto a = store(shape_blobs(kStoring, 3), names);
  auto expect_mismatch = [&](std::vector<Blob> live, const char* what) {
    RestoreContext later = kLater.restore_context();
    EXPECT_NE(match_live_shape(a, names, live, later), "") << what;
    EXPECT_TRUE(later.kernels.empty() && later.foreign.empty()) << what;
  };
  auto live = shape_blobs(kLater, 3);
  put(live[0], 16, kLater.lane0 + 8192);  // the arena laid out otherwise
  expect_mismatch(live, "another arena offset");
  live = shape_blobs(kLater, 3);
  put(live[1], 16, 4);  // the literal n
  expect_mismatch(live, "another literal");
  live = shape_blobs(kLater, 3);
  put(live[0], 0, kLater.softmax);
  expect_mismatch(live, "another kernel");
  live = shape_blobs(kLater, 3);
  put(live[0], 8, kLater.weight + 512);
  expect_mismatch(live, "another offset into the weight");
  live = shape_blobs(kLater, 3);
  live[1][48] = 0;
  expect_mismatch(live, "other bytes outside the layout");
  live = shape_blobs(kLater, 3);
  put(live[0], 40, 0);
  expect_mismatch(live, "no context where the stored graph had one");
  live = shape_blobs(kLater, 3);
  live.pop_back();
  expect_mismatch(live, "another node count");
  live = shape_blobs(kLater, 3);
  put(live[1], 24, kLater.lane1 + 128);  // the workspace's word now points into the arena
  expect_mismatch(live, "another kind of address");
}

TEST(GraphRelocation, AForeignAddressMapsToOneLiveAddressOnly) {
  StoredNames names;
  auto blobs = shape_blobs(kStoring, 3);
  put(blobs[0], 24, kStoring.workspace);  // both nodes read the workspace
  const auto a = store(blobs, names);
  auto live = shape_blobs(kLater, 3);
  put(live[0], 24, kLater.workspace + 64);  // ... but the live graph reads two places
  RestoreContext later = kLater.restore_context();
  EXPECT_NE(match_live_shape(a, names, live, later), "");
}

TEST(GraphRelocation, AShapeWithWhatNoLiveCaptureShowedIsNotRestored) {
  StoredNames names;
  const auto a = store(shape_blobs(kStoring, 3), names);
  auto other = shape_blobs(kStoring, 9);
  put(other[1], 24, kStoring.workspace + 1024);  // another workspace
  const auto b = store(other, names);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(a, names, shape_blobs(kLater, 3), later), "");
  EXPECT_NE(relocate_shape(b, names, later).why_not.find("no live capture showed"),
            std::string::npos);
  // A kernel no live capture ran.
  const auto c =
      store({shape_blobs(kStoring, 4)[0], kernel_blob(kStoring.gemm, 0, 0, 0, 1)}, names);
  RestoreContext only_softmax = kLater.restore_context();
  only_softmax.foreign = later.foreign;
  only_softmax.kernels = {{"libtorch_cuda:softmax_warp", kLater.softmax}};
  EXPECT_NE(relocate_shape(c, names, only_softmax).why_not.find("no live capture ran"),
            std::string::npos);
}

TEST(GraphRelocation, MissingOrShorterMemoryIsAReasonNotAWrongAddress) {
  StoredNames names;
  const auto a = store(shape_blobs(kStoring, 3), names);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(a, names, shape_blobs(kLater, 3), later), "");
  RestoreContext no_weight = later;
  no_weight.tensors.clear();
  EXPECT_NE(relocate_shape(a, names, no_weight).why_not, "");
  RestoreContext short_weight = later;
  short_weight.tensors["w"] = {kLater.weight, kLater.weight + 128};  // offset 256 lies past it
  EXPECT_NE(relocate_shape(a, names, short_weight).why_not, "");
  RestoreContext short_lane = later;
  short_lane.lanes[0].end = short_lane.lanes[0].begin + 4096;  // offset 12288 lies past it
  EXPECT_NE(relocate_shape(a, names, short_lane).why_not, "");
  RestoreContext one_lane = later;
  one_lane.lanes.pop_back();
  EXPECT_NE(relocate_shape(a, names, one_lane).why_not, "");
}

TEST(GraphRelocation, AKernelTheDriverDoesNotNameMakesTheShapeUnstorable) {
  StoredNames names;
  auto blobs = shape_blobs(kStoring, 3);
  put(blobs[1], 0, 0xEE);
  const auto result = store_shape(blobs, kLayouts, kStoring.store_context(), names);
  EXPECT_NE(result.why_not.find("does not name"), std::string::npos);
  EXPECT_NE(store_shape(blobs, {kLayout}, kStoring.store_context(), names).why_not, "");
}

TEST(GraphRelocation, ANodeTheShapeLacksStaysEmpty) {
  // Note [Near topologies]: a shape lacking a node has an empty blob there.
  StoredNames names;
  const std::vector<Blob> blobs = {shape_blobs(kStoring, 3)[0], Blob{}};
  const auto a = store(blobs, names);
  RestoreContext later = kLater.restore_context();
  const std::vector<Blob> live = {shape_blobs(kLater, 3)[0], Blob{}};
  ASSERT_EQ(match_live_shape(a, names, live, later), "");
  const auto relocated = relocate_shape(a, names, later);
  ASSERT_EQ(relocated.why_not, "");
  EXPECT_EQ(relocated.blobs, live);
}

TEST(GraphRelocation, TwoKernelsOfOneNameAreNeverOneForTheOther) {
  // Generated kernels (a compiler's, a library's runtime fusion) may share a name.
  Process twin = kStoring;
  twin.softmax = 0xA8;  // another handle the driver names as gemm
  const auto name_both_gemm = [&](uint64_t h, uint32_t) -> std::optional<std::string> {
    if (h == kStoring.gemm || h == twin.softmax) return "libcublasLt:gemm_128x64";
    return kStoring.kernel_name(h);
  };
  StoreContext context = kStoring.store_context();
  context.kernel_name = name_both_gemm;
  StoredNames names;
  const auto stored = store_shape({kernel_blob(kStoring.gemm, 0, 0, 0, 1),
                                   kernel_blob(twin.softmax, 0, 0, 0, 1)},
                                  kLayouts, context, names);
  EXPECT_NE(stored.why_not.find("two kernels are named"), std::string::npos) << stored.why_not;
  // In the later process: a stored shape of one kernel, a live capture showing two of its name.
  StoredNames one;
  const auto a = store({kernel_blob(kStoring.gemm, 0, 0, 0, 1),
                        kernel_blob(kStoring.gemm, 0, 0, 0, 2)}, one);
  RestoreContext later = kLater.restore_context();
  later.kernel_name = [&](uint64_t h, uint32_t) -> std::optional<std::string> {
    if (h == kLater.gemm || h == 0xE0) return "libcublasLt:gemm_128x64";
    return std::nullopt;
  };
  const std::vector<Blob> live = {kernel_blob(kLater.gemm, 0, 0, 0, 1),
                                  kernel_blob(0xE0, 0, 0, 0, 2)};
  EXPECT_NE(match_live_shape(a, one, live, later).find("two live kernels"), std::string::npos);
}

TEST(GraphRelocation, KernelsOfOneImageStandForEachOther) {
  // Two modules loaded from one image (a library's plans for two lengths): one code, one name.
  const std::string name = grape::core::with_image("cudnn_generated_sdpa(8,8,)", 0x5718fe55);
  const auto both = [&](uint64_t a, uint64_t b) {
    return [&name, a, b](uint64_t h, uint32_t) -> std::optional<std::string> {
      if (h == a || h == b) return name;
      return std::nullopt;
    };
  };
  StoreContext context = kStoring.store_context();
  context.kernel_name = both(kStoring.gemm, 0xA8);
  StoredNames names;
  const auto stored = store_shape({kernel_blob(kStoring.gemm, 0, 0, 0, 1),
                                   kernel_blob(0xA8, 0, 0, 0, 2)},
                                  kLayouts, context, names);
  ASSERT_EQ(stored.why_not, "");
  EXPECT_EQ(names.kernels, std::vector<std::string>{name});
  RestoreContext later = kLater.restore_context();
  later.kernel_name = both(kLater.gemm, 0xE0);
  const std::vector<Blob> live = {kernel_blob(kLater.gemm, 0, 0, 0, 1),
                                  kernel_blob(0xE0, 0, 0, 0, 2)};
  ASSERT_EQ(match_live_shape(stored.nodes, names, live, later), "");
  const auto rebuilt = relocate_shape(stored.nodes, names, later);
  ASSERT_EQ(rebuilt.why_not, "");
  // Either live handle runs the code: the first one learned stands for both.
  EXPECT_EQ(word_at(rebuilt.blobs[0], 0), kLater.gemm);
  EXPECT_EQ(word_at(rebuilt.blobs[1], 0), kLater.gemm);
}

TEST(GraphRelocation, TwoForeignAddressesTheStoringProcessKeptApartStayApart) {
  StoredNames names;
  auto blobs = shape_blobs(kStoring, 3);
  put(blobs[0], 24, kStoring.workspace + 4096);  // a second workspace
  const auto a = store(blobs, names);
  auto live = shape_blobs(kLater, 3);
  put(live[0], 24, kLater.workspace);  // ... which here is the first one
  RestoreContext later = kLater.restore_context();
  EXPECT_NE(match_live_shape(a, names, live, later).find("map to one"), std::string::npos);
  EXPECT_TRUE(later.foreign.empty());
}

TEST(GraphRelocation, LayoutsWhoseWordsOverlapOrOverrunAreRefused) {
  StoredNames names;
  const NodeLayout overlapping{{8, 12}, {}, 0}, overrunning{{8, 48}, {}, 0},
      on_the_kernel{{0, 8}, {}, 0}, handle_on_an_address{{8, 16}, {16}, 0};
  for (const NodeLayout& bad : {overlapping, overrunning, on_the_kernel, handle_on_an_address}) {
    EXPECT_NE(store_shape({kernel_blob(kStoring.gemm, 0, 0, 0, 1)}, {bad},
                          kStoring.store_context(), names).why_not, "");
  }
  EXPECT_TRUE(grape::core::valid_layout(kLayout, 52));
  EXPECT_TRUE(grape::core::valid_layout(overrunning, 0)) << "an absent node has no words";
  const NodeLayout descending{{16, 8}, {}, 0}, handle_on_the_kernel{{8}, {4}, 0},
      two_handles_in_one{{8}, {24, 28}, 0}, handle_past_the_end{{8}, {48}, 0},
      arguments_past_the_end{{8}, {}, 0, 53};
  for (const NodeLayout& bad :
       {overlapping, overrunning, on_the_kernel, handle_on_an_address, descending,
        handle_on_the_kernel, two_handles_in_one, handle_past_the_end, arguments_past_the_end}) {
    EXPECT_FALSE(grape::core::valid_layout(bad, 52));
  }
  EXPECT_TRUE(grape::core::valid_layout(NodeLayout{{8, 16}, {32, 40}, 0}, 52));
  // A stored node whose layout was damaged after storing is refused, not half relocated.
  auto a = store(shape_blobs(kStoring, 3), names);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(a, names, shape_blobs(kLater, 3), later), "");
  a[1].layout.address_words = {8, 12, 24};
  EXPECT_NE(relocate_shape(a, names, later).why_not, "");
}

TEST(GraphRelocation, ALeftoverIsKeptAndNeverCompared) {
  // Bytes no code set: a word of a kernel's arguments holding a heap address of the launching
  // code, another at every capture, which the caller calls a leftover.
  const uint64_t heap = 0x2831'f170, other_heap = 0x2a7c'7350;
  StoreContext context = kStoring.store_context();
  // Host memory, which no driver call knows (a pinned buffer would be foreign, not a leftover).
  context.is_device_address = [](uint64_t v) { return v >= 0x5000'0000 && v < 0x8000'0000'0000; };
  context.is_leftover = [](uint64_t v) { return v >= 0x2000'0000 && v < 0x3000'0000; };
  auto blobs = shape_blobs(kStoring, 3);
  put(blobs[1], 16, heap);  // the softmax's literal n, as a leftover instead
  StoredNames names;
  const auto result = store_shape(blobs, kLayouts, context, names);
  ASSERT_EQ(result.why_not, "");
  ASSERT_EQ(result.nodes[1].kinds[1], grape::core::WordKind::kLeftover);
  ASSERT_EQ(result.nodes[1].kinds[0], grape::core::WordKind::kArena) << "the others as ever";
  auto live = shape_blobs(kLater, 3);
  put(live[1], 16, other_heap);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(result.nodes, names, live, later), "");
  const auto relocated = relocate_shape(result.nodes, names, later);
  ASSERT_EQ(relocated.why_not, "");
  EXPECT_EQ(word_at(relocated.blobs[1], 16), heap) << "the stored value stays: no kernel reads it";
  // A word the lanes, tensors or driver name is never a leftover, whatever the caller says.
  StoreContext everything = context;
  everything.is_leftover = [](uint64_t) { return true; };
  StoredNames other_names;
  const auto named = store_shape(shape_blobs(kStoring, 3), kLayouts, everything, other_names);
  ASSERT_EQ(named.why_not, "");
  EXPECT_EQ(named.nodes[0].kinds[0], grape::core::WordKind::kTensor);
  EXPECT_EQ(named.nodes[1].kinds[2], grape::core::WordKind::kForeign);
  // Where the live capture holds a leftover at a word stored as another kind, it differs.
  auto stale = shape_blobs(kLater, 3);
  put(stale[0], 16, other_heap);
  RestoreContext again = kLater.restore_context();
  EXPECT_NE(match_live_shape(result.nodes, names, stale, again), "");
}

TEST(GraphRelocation, ALeftoverInALaneIsOneAndTheRestOfTheLaneIsArena) {
  // The caller's leftovers come first: a lane's tail beyond what it maps is in the lane's range,
  // yet no kernel reads through a word there (graph_cache.cpp's is_leftover).
  constexpr uint64_t mapped = uint64_t{256} << 20;
  StoreContext context = kStoring.store_context();
  context.is_leftover = [](uint64_t v) {
    return v >= kStoring.lane1 + mapped && v < kStoring.lane1 + kGiB;
  };
  auto blobs = shape_blobs(kStoring, 3);
  put(blobs[0], 24, kStoring.lane1 + mapped + 0x40);
  StoredNames names;
  const auto result = store_shape(blobs, kLayouts, context, names);
  ASSERT_EQ(result.why_not, "");
  EXPECT_EQ(result.nodes[0].kinds[2], grape::core::WordKind::kLeftover);
  EXPECT_EQ(result.nodes[0].kinds[1], grape::core::WordKind::kArena) << "the mapped part";
  auto live = shape_blobs(kLater, 3);
  put(live[0], 24, kLater.lane1 + mapped + 0x9c0);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(result.nodes, names, live, later), "");
  const auto relocated = relocate_shape(result.nodes, names, later);
  ASSERT_EQ(relocated.why_not, "");
  EXPECT_EQ(word_at(relocated.blobs[0], 24), kStoring.lane1 + mapped + 0x40) << "kept, not moved with the lane";
}

TEST(GraphRelocation, AKernelNoLiveCaptureRanIsLookedUpByName) {
  StoredNames names;
  const auto a = store(shape_blobs(kStoring, 3), names);
  RestoreContext later = kLater.restore_context();
  ASSERT_EQ(match_live_shape(a, names, shape_blobs(kLater, 3), later), "");
  later.kernels.erase("libcublasLt:gemm_128x64");
  RestoreContext without_gemm = later;
  std::string asked;
  uint32_t asked_at = 99;
  int asks = 0;
  later.find_kernel = [&](const std::string& name, uint32_t at) -> std::optional<uint64_t> {
    asked = name;
    asked_at = at;
    ++asks;
    return kLater.gemm;
  };
  const auto b = store(shape_blobs(kStoring, 7), names);
  const auto found = relocate_shape(b, names, later);
  ASSERT_EQ(found.why_not, "");
  EXPECT_EQ(found.blobs, shape_blobs(kLater, 7));
  EXPECT_EQ(asked, "libcublasLt:gemm_128x64");
  EXPECT_EQ(asked_at, 0u);
  // Asked once per group: another shape takes the answer.
  const auto c = store(shape_blobs(kStoring, 9), names);
  const auto found_again = relocate_shape(c, names, later);
  ASSERT_EQ(found_again.why_not, "");
  EXPECT_EQ(found_again.blobs, shape_blobs(kLater, 9));
  EXPECT_EQ(asks, 1);
  int misses = 0;
  without_gemm.find_kernel = [&misses](const std::string&, uint32_t) {
    ++misses;
    return std::optional<uint64_t>();
  };
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(relocate_shape(b, names, without_gemm).why_not.find(
                  "nor is found: libcublasLt:gemm_128x64"),
              std::string::npos);
  }
  EXPECT_EQ(misses, 1) << "a miss is remembered too";
}

TEST(GraphRelocation, HalvesOfHostAddressesInFourByteFieldsAreLeftovers) {
  // A struct of 4-byte fields whose padding holds halves of stack addresses: the low half of one
  // at bytes 36-39 (beside the grid at 32), the high half at bytes 48-51.
  grape::core::HostAddresses storing, later;
  storing.stack = {0x7fff'dd7a'0000, 0x7fff'dd7c'0000};
  storing.high_halves = {0x7fff};
  later.stack = {0x7ffd'2236'0000, 0x7ffd'2238'1000};
  later.high_halves = {0x7ffd};
  auto with_halves = [](std::vector<Blob> blobs, uint32_t low, uint32_t high) {
    std::memcpy(blobs[1].data() + 36, &low, 4);
    std::memcpy(blobs[1].data() + 48, &high, 4);
    return blobs;
  };
  StoredNames names;
  const auto stored = store(with_halves(shape_blobs(kStoring, 3), 0xdd7a'bfe8, 0x7fff), names);
  const auto live = with_halves(shape_blobs(kLater, 3), 0x2237'f5e8, 0x7ffd);
  RestoreContext without = kLater.restore_context();
  const std::string why = match_live_shape(stored, names, live, without);
  EXPECT_NE(why.find("node 1 (libtorch_cuda:softmax_warp) bytes 37-"), std::string::npos) << why;
  RestoreContext with = kLater.restore_context();
  with.stored_host = &storing;
  with.live_host = &later;
  ASSERT_EQ(match_live_shape(stored, names, live, with), "");
  EXPECT_EQ(with.leftover_halves, 2u);
  // A half of one process's kind and not the other's is a difference: a low half that is no
  // stack address here, or a number where the storing process had a high half.
  for (const auto& other : {with_halves(shape_blobs(kLater, 3), 0x1234'5678, 0x7ffd),
                            with_halves(shape_blobs(kLater, 3), 0x2237'f5e8, 0x0001)}) {
    RestoreContext again = kLater.restore_context();
    again.stored_host = &storing;
    again.live_host = &later;
    EXPECT_NE(match_live_shape(stored, names, other, again), "");
  }
}

TEST(GraphRelocation, BytesEveryStoredShapeHoldsAlikeAreTheGroupsAndComeFromTheLiveCapture) {
  // Byte 49 of node 1 is one no code set, the same in every stored shape (the group's); byte 50
  // of node 0 differs from shape to shape (the shape's).
  auto with_bytes = [](std::vector<Blob> blobs, uint8_t group_byte, uint8_t shape_byte) {
    blobs[1][49] = group_byte;
    blobs[0][50] = shape_byte;
    return blobs;
  };
  StoredNames names;
  const auto a = store(with_bytes(shape_blobs(kStoring, 3), 0x11, 0x21), names);
  const auto b = store(with_bytes(shape_blobs(kStoring, 7), 0x11, 0x22), names);
  const std::vector<Blob> group = grape::core::group_bytes({&a, &b});
  ASSERT_EQ(group.size(), 2u);
  EXPECT_EQ(group[1][49], 1);
  EXPECT_EQ(group[0][50], 0);
  EXPECT_EQ(group[0][0], 0) << "a kernel is always matched by name";
  EXPECT_EQ(group[1][24], 1) << "the workspace's word is the same in both";
  EXPECT_EQ(group[0][8], 0) << "a weight's word relocates, read where the weight is";
  EXPECT_EQ(group[0][24], 0) << "so does an arena word, the same in both";
  EXPECT_EQ(group[0][16], 0) << "the arena buffer's place depends on the shape";
  EXPECT_EQ(group[1][32], 0) << "the grid depends on the shape";
  EXPECT_EQ(group[1][33], 0) << "a field is the group's whole or not at all";
  EXPECT_EQ(group[0][48], 0) << "byte 50 varies, and so its 8-byte unit is the shape's";
  EXPECT_EQ(grape::core::group_bytes({&a}), std::vector<Blob>(2)) << "one shape: no group bytes";

  const auto live = with_bytes(shape_blobs(kLater, 3), 0x99, 0x21);
  RestoreContext without = kLater.restore_context();
  EXPECT_NE(match_live_shape(a, names, live, without).find("node 1 (libtorch_cuda:softmax_warp) bytes 49-49"),
            std::string::npos);
  RestoreContext later = kLater.restore_context();
  later.group_bytes = group;
  ASSERT_EQ(match_live_shape(a, names, live, later), "");
  EXPECT_EQ(later.taken_from_live, 1u);
  EXPECT_EQ(later.foreign.at(kStoring.workspace), kLater.workspace) << "learned all the same";
  const auto relocated = relocate_shape(b, names, later);
  ASSERT_EQ(relocated.why_not, "");
  EXPECT_EQ(relocated.blobs, with_bytes(shape_blobs(kLater, 7), 0x99, 0x22));
  // A weight that moved after validation is read where it is now.
  RestoreContext moved = later;
  moved.tensors["w"] = {kLater.weight + 8192, kLater.weight + 8192 + 4096};
  const auto after_move = relocate_shape(b, names, moved);
  ASSERT_EQ(after_move.why_not, "");
  EXPECT_EQ(word_at(after_move.blobs[0], 8), kLater.weight + 8192 + 256);

  // An arena word the same in every shape is still matched: another offset is a drop.
  auto elsewhere = live;
  put(elsewhere[0], 24, kLater.lane1 + 128);
  RestoreContext other_arena = kLater.restore_context();
  other_arena.group_bytes = group;
  EXPECT_NE(match_live_shape(a, names, elsewhere, other_arena), "");

  // A shape's byte that differs is a difference, group bytes or not.
  RestoreContext again = kLater.restore_context();
  again.group_bytes = group;
  EXPECT_NE(match_live_shape(a, names, with_bytes(shape_blobs(kLater, 3), 0x99, 0x77), again)
                .find("node 0 (libcublasLt:gemm_128x64) bytes 50-50"),
            std::string::npos);
}

TEST(GraphRelocation, AMatchThatFailsOnLiteralBytesOnlySaysWhichAndTakesThemOnceShownUnread) {
  // Byte 49 of node 1: a byte no code set, which differs between the processes.
  auto with_byte = [](std::vector<Blob> blobs, uint8_t byte) {
    blobs[1][49] = byte;
    return blobs;
  };
  StoredNames names;
  const auto a = store(with_byte(shape_blobs(kStoring, 3), 0x11), names);
  const auto live = with_byte(shape_blobs(kLater, 3), 0x99);
  RestoreContext later = kLater.restore_context();
  EXPECT_NE(match_live_shape(a, names, live, later), "");
  ASSERT_EQ(later.differing.size(), 2u);
  EXPECT_TRUE(later.differing[0].empty());
  ASSERT_EQ(later.differing[1].size(), live[1].size());
  for (size_t at = 0; at < live[1].size(); ++at) EXPECT_EQ(later.differing[1][at], at == 49);
  // The run: the live capture with the stored byte.
  const auto variant = grape::core::with_stored_bytes(live, a, later.differing);
  EXPECT_EQ(variant, with_byte(shape_blobs(kLater, 3), 0x11));
  later.unread = later.differing;
  ASSERT_EQ(match_live_shape(a, names, live, later), "");
  EXPECT_EQ(later.unread_bytes, 1u);
  EXPECT_TRUE(later.differing.empty());

  // A stored word that is an address in this process is not run: a kernel could read through it.
  StoreContext blind = kStoring.store_context();
  blind.is_device_address = [](uint64_t v) {
    return v != 0x5000'1000 && kStoring.is_device_address(v);
  };
  auto with_address = shape_blobs(kStoring, 3);
  put(with_address[1], 16, 0x5000'1000);
  StoredNames blind_names;
  const auto stored_address = store_shape(with_address, kLayouts, blind, blind_names);
  ASSERT_EQ(stored_address.why_not, "");
  RestoreContext not_run = kLater.restore_context();
  EXPECT_NE(match_live_shape(stored_address.nodes, blind_names, shape_blobs(kLater, 3), not_run)
                .find("node 1 (libtorch_cuda:softmax_warp) bytes 16-"),
            std::string::npos);
  EXPECT_TRUE(not_run.differing.empty());

  // A byte before the kernel's arguments is the launch's own: never run with another value.
  std::vector<NodeLayout> launch_layouts = kLayouts;
  launch_layouts[1].arguments_begin = 50;
  StoredNames launch_names;
  const auto launch = store_shape(with_byte(shape_blobs(kStoring, 3), 0x11), launch_layouts,
                                  kStoring.store_context(), launch_names);
  ASSERT_EQ(launch.why_not, "");
  RestoreContext launch_later = kLater.restore_context();
  EXPECT_NE(match_live_shape(launch.nodes, launch_names, live, launch_later), "");
  EXPECT_TRUE(launch_later.differing.empty());

  // A mangled kernel name is shown as its function's.
  StoreContext mangled = kStoring.store_context();
  mangled.kernel_name = [](uint64_t h, uint32_t) -> std::optional<std::string> {
    const bool gemm = h == kStoring.gemm || h == kLater.gemm;
    return gemm ? "_ZN2at6native4gemmILi4EEEvPf(8,)" : "_ZN2at6native7softmaxEv(8,)";
  };
  StoredNames mangled_names;
  const auto named = store_shape(with_byte(shape_blobs(kStoring, 3), 0x11), kLayouts, mangled,
                                 mangled_names);
  ASSERT_EQ(named.why_not, "");
  RestoreContext named_later = kLater.restore_context();
  named_later.kernel_name = mangled.kernel_name;
  const std::string why = match_live_shape(named.nodes, mangled_names, live, named_later);
  EXPECT_NE(why.find("node 1 (at::native::softmax) bytes 49-49"), std::string::npos) << why;

  // An address of another kind is no literal byte: nothing to run.
  auto moved = shape_blobs(kLater, 3);
  put(moved[0], 16, kLater.lane1 + 4096 * 3);  // the GEMM writes another lane
  RestoreContext other = kLater.restore_context();
  EXPECT_NE(match_live_shape(a, names, moved, other), "");
  EXPECT_TRUE(other.differing.empty());
}
