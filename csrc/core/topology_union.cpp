#include "core/topology_union.h"

#include <algorithm>
#include <limits>

namespace grape::core {

namespace {

// Fills in `plan`'s added_edges, sources and sinks from `graph`'s edges and plan.node_of.
void link(const NodeGraph& group, const NodeGraph& graph, UnionPlan& plan) {
  // The graph's edges that the union lacks. A path through other nodes does not do: they may be
  // absent for this graph, and an absent node is not relied on to order anything.
  for (const auto& [from, to] : graph.edges) {
    const Edge edge{plan.node_of[from], plan.node_of[to]};
    if (!std::binary_search(group.edges.begin(), group.edges.end(), edge)) {
      plan.added_edges.push_back(edge);
    }
  }
  std::sort(plan.added_edges.begin(), plan.added_edges.end());
  first_and_last_nodes(graph, plan.sources, plan.sinks);
  for (uint32_t& node : plan.sources) node = plan.node_of[node];
  for (uint32_t& node : plan.sinks) node = plan.node_of[node];
}

// 1 where union node `node` and the graph's node `h` pair as a swap (their variants differ).
size_t swap_cost_of(const NodeGraph& group, const NodeGraph& graph, uint32_t node, uint32_t h) {
  return !group.variants.empty() && !graph.variants.empty() &&
                 group.variants[node] != graph.variants[h]
             ? 1
             : 0;
}

}  // namespace

void first_and_last_nodes(const NodeGraph& graph, std::vector<uint32_t>& first,
                          std::vector<uint32_t>& last) {
  const size_t count = graph.keys.size();
  std::vector<uint8_t> has_predecessor(count, 0), has_successor(count, 0);
  for (const auto& [from, to] : graph.edges) {
    has_successor[from] = 1;
    has_predecessor[to] = 1;
  }
  first.clear();
  last.clear();
  for (uint32_t node = 0; node < count; ++node) {
    if (!has_predecessor[node]) first.push_back(node);
    if (!has_successor[node]) last.push_back(node);
  }
}

std::optional<UnionPlan> plan_union(const NodeGraph& group, const NodeGraph& graph,
                                    size_t max_edits) {
  const size_t n = group.order.size();
  const size_t m = graph.order.size();
  const size_t band = std::min(max_edits, kMaxEdits);
  if ((n > m ? n - m : m - n) > band) return std::nullopt;
  for (uint32_t i = 0; i < m; ++i) {
    if (graph.order[i] != i) return std::nullopt;  // a captured graph: its creation order
  }
  for (const auto& [from, to] : graph.edges) {
    if (from >= to || to >= m) return std::nullopt;
  }

  // cost(i, j): the fewest nodes inserted plus deleted that align the group's first i nodes (in
  // order) with the graph's first j, then the fewest swaps (pairs of differing variants), as
  // edits * kEdit + swaps. Kept for |i - j| <= band (a path with at most `band` edits stays
  // there), at column j - i + band.
  const size_t width = 2 * band + 1;
  constexpr uint64_t kEdit = uint64_t{1} << 32;  // more than any number of swaps
  constexpr uint64_t kFar = std::numeric_limits<uint64_t>::max() / 2;
  std::vector<uint64_t> cost((n + 1) * width, kFar);
  auto get = [&](size_t i, size_t j) -> uint64_t {
    if (j + band < i || j > i + band) return kFar;
    return cost[i * width + (j + band - i)];
  };
  auto same = [&](size_t i, size_t j) {  // the group's i-th node (in order) and the graph's j-th
    return group.keys[group.order[i]] == graph.keys[j];
  };
  auto swap_cost = [&](size_t i, size_t j) -> uint64_t {
    return swap_cost_of(group, graph, group.order[i], static_cast<uint32_t>(j));
  };
  for (size_t i = 0; i <= n; ++i) {
    const size_t lo = i > band ? i - band : 0;
    const size_t hi = std::min(m, i + band);
    for (size_t j = lo; j <= hi; ++j) {
      uint64_t best = (i == 0 && j == 0) ? 0 : kFar;
      if (i > 0) best = std::min(best, get(i - 1, j) + kEdit);
      if (j > 0) best = std::min(best, get(i, j - 1) + kEdit);
      if (i > 0 && j > 0 && same(i - 1, j - 1)) {
        best = std::min(best, get(i - 1, j - 1) + swap_cost(i - 1, j - 1));
      }
      cost[i * width + (j + band - i)] = std::min(best, kFar);
    }
  }
  if (get(n, m) >= kFar) return std::nullopt;

  // Trace back: (group node or kNone, graph node or kNone), last pair first.
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<std::pair<uint32_t, uint32_t>> steps;
  size_t edits = 0;
  size_t i = n, j = m;
  while (i > 0 || j > 0) {
    const uint64_t here = get(i, j);
    if (i > 0 && j > 0 && same(i - 1, j - 1) &&
        get(i - 1, j - 1) + swap_cost(i - 1, j - 1) == here) {
      steps.emplace_back(group.order[i - 1], static_cast<uint32_t>(j - 1));
      --i;
      --j;
    } else if (i > 0 && get(i - 1, j) + kEdit == here) {
      steps.emplace_back(group.order[i - 1], kNone);
      --i;
      ++edits;
    } else {
      steps.emplace_back(kNone, static_cast<uint32_t>(j - 1));
      --j;
      ++edits;
    }
  }
  if (edits > band) return std::nullopt;
  std::reverse(steps.begin(), steps.end());

  UnionPlan plan;
  plan.node_of.assign(m, kNone);
  const auto union_size = static_cast<uint32_t>(group.keys.size());
  for (const auto& [g, h] : steps) {
    if (h == kNone) {
      ++plan.absent;
      plan.order.push_back(g);
      continue;
    }
    if (g == kNone) {
      plan.node_of[h] = union_size + static_cast<uint32_t>(plan.added.size());
      plan.added.push_back(h);
    } else {
      plan.node_of[h] = g;
      plan.swaps += swap_cost_of(group, graph, g, h);
    }
    plan.order.push_back(plan.node_of[h]);
  }

  link(group, graph, plan);
  return plan;
}

std::optional<UnionPlan> plan_as_mapped(const NodeGraph& group, const NodeGraph& graph,
                                        const std::vector<uint32_t>& node_of) {
  const size_t n = group.keys.size();
  const size_t m = graph.keys.size();
  if (node_of.size() != m || m > n || group.order.size() != n) return std::nullopt;
  std::vector<uint8_t> used(n, 0);
  for (uint32_t h = 0; h < m; ++h) {
    const uint32_t node = node_of[h];
    if (node >= n || used[node] || group.keys[node] != graph.keys[h]) return std::nullopt;
    used[node] = 1;
  }
  size_t swaps = 0;
  for (uint32_t h = 0; h < m; ++h) swaps += swap_cost_of(group, graph, node_of[h], h);
  std::vector<uint32_t> position(n);
  for (uint32_t p = 0; p < n; ++p) position[group.order[p]] = p;
  for (const auto& [from, to] : graph.edges) {
    if (from >= m || to >= m || position[node_of[from]] >= position[node_of[to]]) {
      return std::nullopt;
    }
  }
  UnionPlan plan;
  plan.node_of = node_of;
  plan.order = group.order;
  plan.absent = n - m;
  plan.swaps = swaps;
  link(group, graph, plan);
  return plan;
}

}  // namespace grape::core
