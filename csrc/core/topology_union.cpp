#include "core/topology_union.h"

#include <algorithm>
#include <limits>

namespace grape::core {

namespace {

// Whether `to` is reachable from `from` along `adjacency`, where every edge goes forward in
// `position` (so the search stops at nodes past `to`). `seen` holds a stamp per node.
bool reachable(const std::vector<std::vector<uint32_t>>& adjacency,
               const std::vector<uint32_t>& position, uint32_t from, uint32_t to,
               std::vector<uint32_t>& seen, uint32_t stamp) {
  std::vector<uint32_t> stack{from};
  seen[from] = stamp;
  while (!stack.empty()) {
    const uint32_t node = stack.back();
    stack.pop_back();
    if (node == to) return true;
    for (uint32_t next : adjacency[node]) {
      if (seen[next] == stamp || position[next] > position[to]) continue;
      seen[next] = stamp;
      stack.push_back(next);
    }
  }
  return false;
}

}  // namespace

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
  // order) with the graph's first j. Kept for |i - j| <= band (a path with at most `band` edits
  // stays there), at column j - i + band.
  const size_t width = 2 * band + 1;
  constexpr uint32_t kFar = std::numeric_limits<uint32_t>::max() / 2;
  std::vector<uint32_t> cost((n + 1) * width, kFar);
  auto get = [&](size_t i, size_t j) -> uint32_t {
    if (j + band < i || j > i + band) return kFar;
    return cost[i * width + (j + band - i)];
  };
  auto same = [&](size_t i, size_t j) {  // the group's i-th node (in order) and the graph's j-th
    return group.keys[group.order[i]] == graph.keys[j];
  };
  for (size_t i = 0; i <= n; ++i) {
    const size_t lo = i > band ? i - band : 0;
    const size_t hi = std::min(m, i + band);
    for (size_t j = lo; j <= hi; ++j) {
      uint32_t best = (i == 0 && j == 0) ? 0 : kFar;
      if (i > 0) best = std::min(best, get(i - 1, j) + 1);
      if (j > 0) best = std::min(best, get(i, j - 1) + 1);
      if (i > 0 && j > 0 && same(i - 1, j - 1)) best = std::min(best, get(i - 1, j - 1));
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
    const uint32_t here = get(i, j);
    if (i > 0 && j > 0 && same(i - 1, j - 1) && get(i - 1, j - 1) == here) {
      steps.emplace_back(group.order[i - 1], static_cast<uint32_t>(j - 1));
      --i;
      --j;
    } else if (i > 0 && get(i - 1, j) + 1 == here) {
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
    }
    plan.order.push_back(plan.node_of[h]);
  }

  // The graph's edges that the union does not already imply.
  std::vector<uint32_t> position(union_size + plan.added.size());
  for (uint32_t p = 0; p < plan.order.size(); ++p) position[plan.order[p]] = p;
  std::vector<std::vector<uint32_t>> adjacency(union_size);
  for (const auto& [from, to] : group.edges) adjacency[from].push_back(to);
  std::vector<uint32_t> seen(union_size, 0);
  uint32_t stamp = 0;
  for (const auto& [from, to] : graph.edges) {
    const Edge edge{plan.node_of[from], plan.node_of[to]};
    const bool existing = edge.first < union_size && edge.second < union_size;
    if (existing && (std::binary_search(group.edges.begin(), group.edges.end(), edge) ||
                     reachable(adjacency, position, edge.first, edge.second, seen, ++stamp))) {
      continue;
    }
    plan.added_edges.push_back(edge);
  }
  std::sort(plan.added_edges.begin(), plan.added_edges.end());
  return plan;
}

}  // namespace grape::core
