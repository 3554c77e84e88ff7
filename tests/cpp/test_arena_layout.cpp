#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/arena_layout.h"

using grape::core::ArenaLayout;

TEST(ArenaLayout, FirstFitReusesFreedGapsAndAligns) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(100);
  auto b = lane.allocate(1000);
  auto c = lane.allocate(512);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 512u);   // 100 rounds up to one 512-byte unit
  EXPECT_EQ(*c, 1536u);  // 1000 rounds up to 1024
  EXPECT_EQ(lane.extent(), 2048u);
  EXPECT_TRUE(lane.free(*b));
  EXPECT_FALSE(lane.free(*b));  // double free is refused, not corrupting
  auto d = lane.allocate(600);  // fits the freed gap
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 512u);
  EXPECT_EQ(lane.extent(), 2048u);
}

TEST(ArenaLayout, FreedNeighboursCoalesce) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(512), b = lane.allocate(512), c = lane.allocate(512);
  lane.allocate(512);
  lane.free(*a);
  lane.free(*c);
  EXPECT_EQ(lane.allocate(1536), std::optional<size_t>(2048));  // no gap holds it yet
  lane.free(*b);
  EXPECT_EQ(lane.allocate(1536), std::optional<size_t>(0));  // a, b, c merged
}

TEST(ArenaLayout, PinsAreAvoidedUntilUnpinned) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(4096);
  lane.free(*a);
  lane.pin(1024, 1024);  // live memory inside the free gap
  auto b = lane.allocate(1024);
  auto c = lane.allocate(2048);
  EXPECT_EQ(*b, 0u);
  EXPECT_EQ(*c, 2048u);
  lane.free(*b);
  lane.free(*c);
  lane.unpin_all();
  EXPECT_EQ(lane.allocate(4096), std::optional<size_t>(0));
}

TEST(ArenaLayout, FirstFitMatchesAReferenceOverRandomBlocksAndPins) {
  // The lowest aligned offset that no block and no pin overlaps, against a plain reference:
  // blocks and pins gathered and sorted, then scanned.
  const size_t align = 512, capacity = size_t{1} << 24;
  std::mt19937 rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    ArenaLayout lane(capacity, align);
    std::vector<std::pair<size_t, size_t>> blocks, pins;  // (begin, end)
    for (int op = 0; op < 400; ++op) {
      const unsigned kind = rng() % 10;
      if (kind < 2 && !blocks.empty()) {
        const size_t i = rng() % blocks.size();
        ASSERT_TRUE(lane.free(blocks[i].first));
        blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind == 2) {
        const size_t begin = rng() % (1 << 20), length = 1 + rng() % 9000;
        lane.pin(begin, length);
        pins.emplace_back(begin, begin + length);
      } else if (kind == 3 && rng() % 8 == 0) {
        lane.unpin_all();
        pins.clear();
      } else {
        const size_t bytes = 1 + rng() % 20000;
        const size_t size = (bytes + align - 1) / align * align;
        std::vector<std::pair<size_t, size_t>> busy = blocks;
        busy.insert(busy.end(), pins.begin(), pins.end());
        std::sort(busy.begin(), busy.end());
        size_t cursor = 0;
        for (const auto& [begin, end] : busy) {
          if (begin >= cursor && begin - cursor >= size) break;
          cursor = std::max(cursor, (end + align - 1) / align * align);
        }
        const auto offset = lane.allocate(bytes);
        ASSERT_TRUE(offset.has_value());
        ASSERT_EQ(*offset, cursor) << "trial " << trial << " op " << op;
        blocks.emplace_back(*offset, *offset + size);
      }
    }
  }
}

TEST(ArenaLayout, RefusesWhenAddressSpaceIsFull) {
  ArenaLayout lane(4096, 512);
  EXPECT_TRUE(lane.allocate(4096));
  EXPECT_FALSE(lane.allocate(1));
  EXPECT_FALSE(lane.allocate(0));
}

TEST(ArenaLayout, BlockContaining) {
  ArenaLayout lane(1 << 20, 512);
  lane.allocate(512);
  auto b = lane.allocate(2000);
  EXPECT_EQ(lane.block_containing(*b + 100), std::make_optional(std::make_pair(*b, size_t{2048})));
  EXPECT_FALSE(lane.block_containing(*b + 2048));
}

// A decode loop: each step reads the live cache of the previous step (pinned, as a handed-out
// output is) and writes a cache one position longer, plus small temporaries. The lane must stay
// within three times the largest cache, however many shapes go by.
TEST(ArenaLayout, GrowingPingPongStaysNearTheLargestBuffer) {
  ArenaLayout lane(size_t{1} << 40, 512);
  const size_t per_position = 294912;  // GPT-2 small, batch 8, fp16 K and V
  size_t live_offset = 0, live_bytes = 0;
  size_t largest = 0;
  for (size_t t = 1; t <= 1024; ++t) {
    lane.pin(live_offset, live_bytes);
    const size_t bytes = per_position * t;
    auto out = lane.allocate(bytes);
    ASSERT_TRUE(out);
    auto temp = lane.allocate(64 * 1024);  // freed when the capture ends
    lane.free(*temp);
    lane.unpin_all();
    lane.free(*out);  // the capture's tensors die; the graph keeps the address
    live_offset = *out;
    live_bytes = bytes;
    largest = std::max(largest, bytes);
  }
  EXPECT_LE(lane.extent(), 3 * largest + (1 << 20));
  EXPECT_EQ(lane.allocated_bytes(), 0u);
}

// ---- Note [Planned capture layouts]

namespace {

using grape::core::LayoutPlan;
using grape::core::LayoutTrace;
using grape::core::plan_layout;

// One step of an allocation sequence: allocate `bytes` (> 0) or free the block allocated by step
// `-bytes - 1`.
struct Step {
  long long bytes;
};

// Runs `steps` on `lane`; returns each allocation's offset (by step index).
std::vector<size_t> run(ArenaLayout& lane, const std::vector<Step>& steps) {
  std::vector<size_t> offsets(steps.size(), SIZE_MAX);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].bytes > 0) {
      auto offset = lane.allocate(static_cast<size_t>(steps[i].bytes));
      EXPECT_TRUE(offset);
      offsets[i] = *offset;
    } else {
      EXPECT_TRUE(lane.free(offsets[static_cast<size_t>(-steps[i].bytes - 1)]));
    }
  }
  return offsets;
}

// Whether two blocks of a trace that are allocated at once overlap.
bool overlapping_live_blocks(const LayoutTrace& trace) {
  const auto& a = trace.allocations;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = i + 1; j < a.size(); ++j) {
      const bool together = a[i].allocated < a[j].freed && a[j].allocated < a[i].freed;
      const bool overlap = a[i].offset < a[j].offset + a[j].bytes &&
                           a[j].offset < a[i].offset + a[i].bytes;
      if (together && overlap) return true;
    }
  }
  return false;
}

size_t live_peak(const LayoutTrace& trace) {
  std::vector<std::pair<uint64_t, long long>> events;
  for (const auto& a : trace.allocations) {
    events.emplace_back(a.allocated, static_cast<long long>(a.bytes));
    if (a.freed != LayoutTrace::kLive) events.emplace_back(a.freed, -static_cast<long long>(a.bytes));
  }
  std::sort(events.begin(), events.end());
  long long live = 0, peak = 0;
  for (const auto& [time, delta] : events) peak = std::max(peak, live += delta);
  return static_cast<size_t>(peak);
}

}  // namespace

// First fit: a (1 KB) at 0, b (1 KB) at 1 KB; a freed; c (2 KB) fits no gap and goes to 2 KB,
// for an extent of 4 KB where 3 KB are ever live. The plan places c first (the largest) at 0, b
// past it, and a, dead before c is made, at 0 too: 3 KB.
TEST(LayoutPlan, PlacesTheLargestFirstAndReusesWhatIsDeadByThen) {
  const std::vector<Step> steps = {{1024}, {1024}, {-1}, {2048}};
  ArenaLayout first_fit(1 << 20, 512);
  first_fit.begin_trace();
  run(first_fit, steps);
  const LayoutTrace trace = first_fit.end_trace();
  EXPECT_EQ(first_fit.extent(), 4096u);
  EXPECT_EQ(trace.extent, 4096u);
  ASSERT_EQ(trace.allocations.size(), 3u);
  EXPECT_EQ(trace.allocations[0].freed, 2u);  // allocated at 0, b at 1, freed at 2, c at 3
  EXPECT_EQ(trace.allocations[2].freed, LayoutTrace::kLive);

  const LayoutPlan plan = plan_layout(trace);
  EXPECT_EQ(plan.extent, 3072u);
  ASSERT_EQ(plan.placements.size(), 3u);
  EXPECT_EQ(plan.placements[2], std::make_pair(size_t{2048}, size_t{0}));

  ArenaLayout planned(1 << 20, 512);
  planned.begin_trace(plan);
  const auto offsets = run(planned, steps);
  const LayoutTrace followed = planned.end_trace();
  EXPECT_EQ(planned.placed_by_plan(), 3u);
  EXPECT_EQ(planned.extent(), 3072u);
  for (size_t i = 0; i < plan.placements.size(); ++i) {
    EXPECT_EQ(followed.allocations[i].offset, plan.placements[i].second);
  }
  EXPECT_EQ(offsets[3], 0u);
  EXPECT_FALSE(overlapping_live_blocks(followed));
}

TEST(LayoutPlan, AvoidsTheBlocksAndPinsBusyWhenTheTraceBegan) {
  ArenaLayout lane(1 << 20, 512);
  auto kept = lane.allocate(1024);  // an earlier capture's workspace, still allocated
  lane.pin(4096, 1000);             // a caller's output
  lane.begin_trace();
  auto a = lane.allocate(2048);
  auto b = lane.allocate(2048);
  const LayoutTrace trace = lane.end_trace();
  ASSERT_TRUE(kept && a && b);
  ASSERT_EQ(trace.fixed.size(), 2u);
  const LayoutPlan plan = plan_layout(trace);
  for (const auto& [bytes, offset] : plan.placements) {
    for (const auto& [begin, end] : trace.fixed) {
      EXPECT_TRUE(offset + bytes <= begin || offset >= end) << offset;
    }
  }
  EXPECT_EQ(plan.placements[0].second, 1024u);  // between the block and the pin
  EXPECT_EQ(plan.placements[1].second, 5120u);  // past the pin, aligned
}

// A sequence that does not come as planned is placed by first fit from the first allocation that
// differs, and a planned offset that is busy is not taken: a plan never makes blocks overlap.
TEST(LayoutPlan, ASequenceThatDivergesFallsBackToFirstFit) {
  const std::vector<Step> steps = {{1024}, {1024}, {-1}, {2048}};
  ArenaLayout traced(1 << 20, 512);
  traced.begin_trace();
  run(traced, steps);
  const LayoutPlan plan = plan_layout(traced.end_trace());

  ArenaLayout other(1 << 20, 512);
  other.begin_trace(plan);
  run(other, {{1024}, {1536}, {-1}, {2048}});  // the second allocation is larger
  const LayoutTrace diverged = other.end_trace();
  EXPECT_EQ(other.placed_by_plan(), 1u);
  EXPECT_FALSE(overlapping_live_blocks(diverged));

  ArenaLayout busy(1 << 20, 512);
  auto squatter = busy.allocate(512);  // where the plan puts c's first bytes... and a's
  ASSERT_EQ(*squatter, 0u);
  busy.begin_trace(plan);
  run(busy, steps);
  const LayoutTrace around = busy.end_trace();
  EXPECT_EQ(busy.placed_by_plan(), 0u);  // a's planned offset is taken
  EXPECT_FALSE(overlapping_live_blocks(around));
  for (const auto& a : around.allocations) EXPECT_GE(a.offset, 512u);
}

// Random sequences shaped like a training step (a forward that saves, a backward that frees in
// reverse among gradients, temporaries throughout): the plan never overlaps blocks live at once,
// stays within 10% of the live peak and below first fit, and following it reproduces it exactly.
TEST(LayoutPlan, TrainingLikeSequencesPackNearTheLivePeak) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<Step> steps;
    std::vector<long long> saved;  // step indices of saved activations
    auto size = [&](int lo, int hi) {
      return static_cast<long long>(std::uniform_int_distribution<int>(lo, hi)(rng)) * 512;
    };
    const int layers = 8 + round;
    for (int l = 0; l < layers; ++l) {
      const long long temp = static_cast<long long>(steps.size());
      steps.push_back({size(1, 64)});
      saved.push_back(static_cast<long long>(steps.size()));
      steps.push_back({size(8, 256)});
      steps.push_back({-temp - 1});
    }
    std::vector<long long> grads;
    for (int l = layers - 1; l >= 0; --l) {
      grads.push_back(static_cast<long long>(steps.size()));
      steps.push_back({size(4, 512)});
      const long long temp = static_cast<long long>(steps.size());
      steps.push_back({size(8, 256)});
      steps.push_back({-saved[static_cast<size_t>(l)] - 1});
      steps.push_back({-temp - 1});
    }
    for (long long g : grads) steps.push_back({-g - 1});

    ArenaLayout first_fit(size_t{1} << 40, 512);
    first_fit.begin_trace();
    run(first_fit, steps);
    const LayoutTrace trace = first_fit.end_trace();
    const LayoutPlan plan = plan_layout(trace);
    const size_t peak = live_peak(trace);
    EXPECT_GE(plan.extent, peak);
    EXPECT_LE(plan.extent, peak + peak / 10) << "round " << round;
    EXPECT_LT(plan.extent, trace.extent) << "round " << round;  // first fit: 7 to 24% above

    ArenaLayout planned(size_t{1} << 40, 512);
    planned.begin_trace(plan);
    run(planned, steps);
    const LayoutTrace followed = planned.end_trace();
    EXPECT_EQ(planned.placed_by_plan(), trace.allocations.size());
    EXPECT_EQ(followed.extent, plan.extent);
    EXPECT_FALSE(overlapping_live_blocks(followed));
  }
}

TEST(ArenaLayout, RetractExtentKeepsLiveBlocks) {
  ArenaLayout lane(1 << 20, 512);
  auto a = lane.allocate(1024);
  auto b = lane.allocate(4096);
  auto c = lane.allocate(1024);
  lane.free(*b);
  lane.free(*c);
  EXPECT_EQ(lane.extent(), 6144u);
  lane.retract_extent(512);
  EXPECT_EQ(lane.extent(), 1024u);  // a still ends there
  lane.free(*a);
  lane.retract_extent(0);
  EXPECT_EQ(lane.extent(), 0u);
}
