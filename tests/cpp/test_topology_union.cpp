// Union plans of near topologies (Note [Near topologies]).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/topology_union.h"

using grape::core::Edge;
using grape::core::NodeGraph;
using grape::core::plan_as_mapped;
using grape::core::plan_union;
using grape::core::UnionPlan;

namespace {

// A captured single-stream graph: nodes in creation order, each depending on the one before.
NodeGraph chain(const std::vector<uint64_t>& keys) {
  NodeGraph g;
  g.keys = keys;
  for (uint32_t i = 0; i < keys.size(); ++i) g.order.push_back(i);
  for (uint32_t i = 1; i < keys.size(); ++i) g.edges.emplace_back(i - 1, i);
  return g;
}

// The union `plan` makes of `group` and the graph it planned: what a group keeps afterwards.
NodeGraph apply(const NodeGraph& group, const NodeGraph& graph, const UnionPlan& plan) {
  NodeGraph u = group;
  for (uint32_t h : plan.added) {
    u.keys.push_back(graph.keys[h]);
    if (!u.variants.empty()) u.variants.push_back(graph.variants[h]);
  }
  u.order = plan.order;
  u.edges.insert(u.edges.end(), plan.added_edges.begin(), plan.added_edges.end());
  std::sort(u.edges.begin(), u.edges.end());
  return u;
}

// What running `graph` inside union `u` relies on: every node maps to a distinct union node of the
// same key, the union's order is topological, every edge of `graph` is an edge of the union (not a
// path: nodes on it may be disabled), and its first and last nodes are reported for the anchors.
void expect_sound(const NodeGraph& u, const NodeGraph& graph, const UnionPlan& plan) {
  ASSERT_EQ(plan.node_of.size(), graph.keys.size());
  std::set<uint32_t> used(plan.node_of.begin(), plan.node_of.end());
  EXPECT_EQ(used.size(), graph.keys.size());
  for (uint32_t i = 0; i < graph.keys.size(); ++i) {
    ASSERT_LT(plan.node_of[i], u.keys.size());
    EXPECT_EQ(u.keys[plan.node_of[i]], graph.keys[i]);
  }
  ASSERT_EQ(u.order.size(), u.keys.size());
  std::vector<uint32_t> position(u.keys.size());
  for (uint32_t p = 0; p < u.order.size(); ++p) position[u.order[p]] = p;
  for (const auto& [a, b] : u.edges) EXPECT_LT(position[a], position[b]);
  std::set<uint32_t> sources, sinks;
  for (uint32_t i = 0; i < graph.keys.size(); ++i) {
    sources.insert(plan.node_of[i]);
    sinks.insert(plan.node_of[i]);
  }
  for (const auto& [a, b] : graph.edges) {
    const Edge edge{plan.node_of[a], plan.node_of[b]};
    EXPECT_TRUE(std::binary_search(u.edges.begin(), u.edges.end(), edge)) << a << "->" << b;
    sinks.erase(edge.first);
    sources.erase(edge.second);
  }
  EXPECT_EQ(std::set<uint32_t>(plan.sources.begin(), plan.sources.end()), sources);
  EXPECT_EQ(std::set<uint32_t>(plan.sinks.begin(), plan.sinks.end()), sinks);
  EXPECT_EQ(plan.absent, u.keys.size() - graph.keys.size());
}

constexpr uint64_t K = 1, M = 2, C = 3;  // kernel, memset, memcpy

TEST(TopologyUnion, IdenticalGraphsMapOneToOne) {
  const NodeGraph g = chain({K, K, M, K, C});
  auto plan = plan_union(g, g, 4);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->added.empty());
  EXPECT_TRUE(plan->added_edges.empty());
  EXPECT_EQ(plan->absent, 0u);
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(plan->node_of[i], i);
}

TEST(TopologyUnion, AnExtraNodeIsAddedAndLinkedWhereItRuns) {
  // The graph has a memset before its second kernel (a library's workspace clear).
  const NodeGraph group = chain({K, K, K});
  const NodeGraph graph = chain({K, M, K, K});
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->added, (std::vector<uint32_t>{1}));
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 3, 1, 2}));
  EXPECT_EQ(plan->order, (std::vector<uint32_t>{0, 3, 1, 2}));
  EXPECT_EQ(plan->added_edges, (std::vector<Edge>{{0, 3}, {3, 1}}));
  expect_sound(apply(group, graph, *plan), graph, *plan);
}

TEST(TopologyUnion, OnlyEqualKeysPair) {
  // Keys name what a node does: the group's memset clears buffer 10; the graph clears 10, then 11
  // and 12. Its first memset pairs with the group's, and the others are added.
  const uint64_t clear10 = 10, clear11 = 11, clear12 = 12, kernel7 = 7, kernel8 = 8, copy5 = 5;
  const NodeGraph group = chain({clear10, kernel7, copy5});
  NodeGraph graph = chain({clear10, clear11, clear12, kernel7, copy5});
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 3, 4, 1, 2}));
  EXPECT_EQ(plan->order, (std::vector<uint32_t>{0, 3, 4, 1, 2}));
  expect_sound(apply(group, graph, *plan), graph, *plan);
  // Another kernel in the same place is not the group's kernel: it is added, the group's absent.
  graph = chain({clear10, kernel8, copy5});
  plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->added, (std::vector<uint32_t>{1}));
  EXPECT_EQ(plan->absent, 1u);
  expect_sound(apply(group, graph, *plan), graph, *plan);
}

TEST(TopologyUnion, KernelsOfOtherFunctionsPairAsSwapsAndTheSameFunctionIsPreferred) {
  // Kernel nodes share a key and differ in their function (the variant), as a library's
  // per-shape algorithms do: another kernel in the same place pairs, no node added.
  NodeGraph group = chain({K, K, M, K});
  group.variants = {70, 71, 0, 72};
  NodeGraph graph = chain({K, K, M, K});
  graph.variants = {70, 81, 0, 72};
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->added.empty());
  EXPECT_EQ(plan->absent, 0u);
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan->swaps, 1u);
  EXPECT_EQ(plan_as_mapped(group, graph, plan->node_of)->swaps, 1u);
  // One kernel fewer: of the alignments deleting one group kernel, the one pairing kernels of the
  // same functions wins (deleting the second, not the first, kernel).
  group = chain({K, K, K, M, K});
  group.variants = {70, 71, 73, 0, 72};
  graph = chain({K, K, M, K});
  graph.variants = {70, 73, 0, 99};
  plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->added.empty());
  EXPECT_EQ(plan->absent, 1u);
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 2, 3, 4}));
  EXPECT_EQ(plan->swaps, 1u);  // the last kernel's
  expect_sound(apply(group, graph, *plan), graph, *plan);
  // Without variants the first kernel is as good a pairing: the edits alone decide.
  group.variants.clear();
  plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->absent, 1u);
}

TEST(TopologyUnion, AMembersOrderDoesNotGoThroughANodeItLacks) {
  // The graph lacks the group's memset, which it would run disabled: its edge K0 -> K2 is added
  // rather than left to the path through the memset.
  const NodeGraph group = chain({K, M, K});
  const NodeGraph graph = chain({K, K});
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->added.empty());
  EXPECT_EQ(plan->added_edges, (std::vector<Edge>{{0, 2}}));
  EXPECT_EQ(plan->absent, 1u);
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 2}));
  expect_sound(apply(group, graph, *plan), graph, *plan);
}

TEST(TopologyUnion, AGraphsFirstAndLastNodesAreReportedInUnionIndices) {
  // Two streams: 0 and 1 start, 2 and 3 end; the graph's node 1 is the union's node 3 (added).
  NodeGraph group = chain({K, K, K});
  NodeGraph graph;
  graph.keys = {K, M, K, K};
  graph.order = {0, 1, 2, 3};
  graph.edges = {{0, 2}, {1, 3}};
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->node_of, (std::vector<uint32_t>{0, 3, 1, 2}));
  EXPECT_EQ(plan->sources, (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(plan->sinks, (std::vector<uint32_t>{1, 2}));
  expect_sound(apply(group, graph, *plan), graph, *plan);
}

TEST(TopologyUnion, AnEdgeTheGroupDoesNotImplyIsAdded) {
  // The group forks after node 0 (two streams: 1 and 2 run concurrently); the graph orders 1
  // before 2.
  NodeGraph group;
  group.keys = {K, K, K, K};
  group.order = {0, 1, 2, 3};
  group.edges = {{0, 1}, {0, 2}, {1, 3}, {2, 3}};
  const NodeGraph graph = chain({K, K, K, K});
  auto plan = plan_union(group, graph, 4);
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->added.empty());
  EXPECT_EQ(plan->added_edges, (std::vector<Edge>{{1, 2}}));
  expect_sound(apply(group, graph, *plan), graph, *plan);
}

TEST(TopologyUnion, GraphsTooFarApartAreRefused) {
  EXPECT_FALSE(plan_union(chain({K, K, K, K}), chain({K}), 2));  // node counts alone
  EXPECT_FALSE(plan_union(chain({K, K, M, M}), chain({M, M, K, K}), 3));  // 4 edits
  EXPECT_TRUE(plan_union(chain({K, K, M, M}), chain({M, M, K, K}), 4));
}

TEST(TopologyUnion, TheBandIsCappedWhateverTheAllowance) {
  // Alignment memory and time grow with the band: it stops at kMaxEdits.
  const std::vector<uint64_t> many(600, K);
  const NodeGraph group = chain(many);
  EXPECT_FALSE(plan_union(group, chain(std::vector<uint64_t>(300, K)), 1000));  // 300 apart
  EXPECT_TRUE(plan_union(group, chain(std::vector<uint64_t>(400, K)), 1000));   // 200 apart
}

TEST(TopologyUnion, AGraphWhoseEdgesGoBackwardIsRefused) {
  NodeGraph graph = chain({K, K});
  graph.edges = {{1, 0}};
  EXPECT_FALSE(plan_union(chain({K, K}), graph, 4));
}

TEST(TopologyUnion, RepeatedUnionsOfMutatedChainsStaySound) {
  // A group grows by union with random variants of one chain (nodes inserted, deleted or of
  // another kind), as captures of a function at many shapes would; every variant must run
  // soundly in the union of its time, and earlier members in the final union.
  std::mt19937 rng(7);
  std::vector<uint64_t> base(60);
  for (auto& k : base) k = 1 + rng() % 3;
  NodeGraph group = chain(base);
  std::vector<NodeGraph> members{group};
  std::vector<std::vector<uint32_t>> mappings{group.order};  // each member's node_of at its join
  for (int round = 0; round < 40; ++round) {
    std::vector<uint64_t> keys = base;
    for (int e = 0; e < 3; ++e) {
      const size_t at = rng() % keys.size();
      switch (rng() % 3) {
        case 0: keys.insert(keys.begin() + static_cast<long>(at), 1 + rng() % 3); break;
        case 1: keys.erase(keys.begin() + static_cast<long>(at)); break;
        default: keys[at] = 1 + rng() % 3; break;
      }
    }
    const NodeGraph graph = chain(keys);
    auto plan = plan_union(group, graph, 128);
    ASSERT_TRUE(plan) << "round " << round;
    NodeGraph grown = apply(group, graph, *plan);
    expect_sound(grown, graph, *plan);
    group = std::move(grown);
    members.push_back(graph);
    mappings.push_back(plan->node_of);
  }
  for (size_t k = 0; k < members.size(); ++k) {
    const NodeGraph& member = members[k];
    // A member again (as a recapture would be) needs no new node. Aligned afresh, it may need
    // edges: where alignments tie, it may pair with other nodes of its keys than when it joined.
    auto plan = plan_union(group, member, 256);
    ASSERT_TRUE(plan);
    EXPECT_TRUE(plan->added.empty());
    expect_sound(apply(group, member, *plan), member, *plan);
    // Mapped as when it joined, it needs nothing.
    plan = plan_as_mapped(group, member, mappings[k]);
    ASSERT_TRUE(plan) << "member " << k;
    EXPECT_TRUE(plan->added.empty());
    EXPECT_TRUE(plan->added_edges.empty()) << "member " << k;
    EXPECT_EQ(plan->order, group.order);
    expect_sound(apply(group, member, *plan), member, *plan);
  }
  EXPECT_LT(group.keys.size(), base.size() + 40 * 3);
}

TEST(TopologyUnion, AMappingThatDoesNotFitTheGraphIsRefused) {
  // The union K M K K; a graph K K K mapped to its nodes 0, 2, 3 fits (the memset absent).
  const NodeGraph group = chain({K, M, K, K});
  const NodeGraph graph = chain({K, K, K});
  auto plan = plan_as_mapped(group, graph, {0, 2, 3});
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->absent, 1u);
  EXPECT_EQ(plan->added_edges, (std::vector<Edge>{{0, 2}}));  // not through the memset
  EXPECT_EQ(plan->sources, (std::vector<uint32_t>{0}));
  EXPECT_EQ(plan->sinks, (std::vector<uint32_t>{3}));
  EXPECT_FALSE(plan_as_mapped(group, graph, {0, 1, 3}));     // a kernel mapped to the memset
  EXPECT_FALSE(plan_as_mapped(group, graph, {0, 2, 2}));     // two nodes mapped to one
  EXPECT_FALSE(plan_as_mapped(group, graph, {0, 2}));        // a node not mapped
  EXPECT_FALSE(plan_as_mapped(group, graph, {0, 2, 4}));     // past the union
  EXPECT_FALSE(plan_as_mapped(group, graph, {3, 2, 0}));     // edges going backward
}

}  // namespace
