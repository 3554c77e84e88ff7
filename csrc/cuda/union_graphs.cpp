#include "cuda/union_graphs.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/noop_nodes.h"

namespace grape::cuda {

namespace {

// Gives node `node` of union `group` an edge from its start anchor (kFromStart) or to its end
// anchor (kToEnd), unless it has one.
void anchor(ExecutableGroup& group, uint32_t node, uint8_t flag) {
  if ((group.anchored[node] & flag) != 0) return;
  if (flag == ExecutableGroup::kFromStart) {
    add_edge(group.graph, group.start, group.nodes[node]);
  } else {
    add_edge(group.graph, group.nodes[node], group.end);
  }
  group.anchored[node] |= flag;
}

// Whether `group` is a union whose anchors already hold the joining graph's first and last nodes.
bool anchors_hold(const ExecutableGroup& group, const core::UnionPlan& plan) {
  if (group.start == nullptr) return false;
  const auto holds = [&](const std::vector<uint32_t>& nodes, uint8_t flag) {
    return std::all_of(nodes.begin(), nodes.end(), [&](uint32_t node) {
      return node < group.anchored.size() && (group.anchored[node] & flag) != 0;
    });
  };
  return holds(plan.sources, ExecutableGroup::kFromStart) &&
         holds(plan.sinks, ExecutableGroup::kToEnd);
}

}  // namespace

size_t near_inserts(size_t nodes) { return std::max<size_t>(8, nodes / 8); }
size_t union_growth(size_t smallest) { return std::max<size_t>(16, smallest / 16); }

bool near_enough(size_t n, size_t m, size_t smallest_member, size_t added) {
  const size_t smallest = std::min(smallest_member, m);
  return m <= n + near_inserts(m) && n + added <= smallest + union_growth(smallest);
}

core::NodeGraph alignment_view(const GraphContents& contents) {
  core::NodeGraph graph;
  graph.keys = contents.keys;
  graph.variants = contents.variants;
  graph.edges = contents.edges;
  if (contents.plain_edges &&
      std::all_of(graph.edges.begin(), graph.edges.end(),
                  [](const core::Edge& e) { return e.first < e.second; })) {
    graph.order.resize(contents.nodes.size());
    std::iota(graph.order.begin(), graph.order.end(), 0u);
  }
  return graph;
}

std::optional<core::UnionPlan> plan_join(const ExecutableGroup& group, const core::NodeGraph& graph,
                                         const GraphContents& contents, NearRefusal& refused) {
  const size_t n = group.nodes.size();
  const size_t m = contents.nodes.size();
  if (!group.params || group.shape.order.size() != n || graph.order.size() != m) {
    refused = NearRefusal::kUnaligned;
    return std::nullopt;
  }
  std::optional<core::UnionPlan> plan;
  const auto known = group.node_of_topology.find(contents.topology);
  if (known != group.node_of_topology.end()) {
    plan = core::plan_as_mapped(group.shape, graph, known->second);
  }
  if (!plan) {
    // Inserted plus deleted nodes are (n - m) + 2 * inserted: this bounds the inserted ones.
    if (near_enough(n, m, group.smallest_member, 0)) {
      plan = core::plan_union(group.shape, graph, n + 2 * near_inserts(m) - m);
    }
    // Every member runs the whole union, its absent nodes as no-ops: keep that few.
    if (!plan || !near_enough(n, m, group.smallest_member, plan->added.size())) {
      refused = NearRefusal::kEdits;
      return std::nullopt;
    }
  }
  // The union's nodes the graph lacks, and the graph's nodes the union's shapes lack, must be
  // able to run as no-ops.
  std::vector<uint8_t> present(n, 0);
  for (uint32_t node : plan->node_of) {
    if (node < n) present[node] = 1;
  }
  bool all_have_noops = true;
  for (size_t node = 0; node < n && all_have_noops; ++node) {
    all_have_noops = present[node] != 0 || may_be_absent(group.nodes[node], group.kinds[node]);
  }
  for (size_t k = 0; k < plan->added.size() && all_have_noops; ++k) {
    const uint32_t h = plan->added[k];
    all_have_noops = may_be_absent(contents.nodes[h], contents.kinds[h]);
  }
  if (!all_have_noops) {
    refused = NearRefusal::kNoNoop;
    return std::nullopt;
  }
  return plan;
}

bool union_holds(const ExecutableGroup& group, const core::UnionPlan& plan) {
  return plan.added.empty() && plan.added_edges.empty() && anchors_hold(group, plan);
}

std::unique_ptr<ExecutableGroup> grow_union(const ExecutableGroup& group,
                                            const GraphContents& contents,
                                            const core::UnionPlan& plan) {
  const size_t n = group.nodes.size();
  auto grown = std::make_unique<ExecutableGroup>();
  check(cudaGraphClone(&grown->graph, group.graph), "cudaGraphClone");
  GraphOwner owner{grown->graph};
  grown->nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    check(cudaGraphNodeFindInClone(&grown->nodes[i], group.nodes[i], grown->graph),
          "cudaGraphNodeFindInClone");
  }
  grown->kinds = group.kinds;
  grown->shape = group.shape;
  grown->absent_in_base = group.absent_in_base;
  for (uint32_t h : plan.added) {
    const NodeKind kind = contents.kinds[h];
    grown->nodes.push_back(add_node_like(grown->graph, contents.nodes[h], kind));
    grown->kinds.push_back(kind);
    grown->shape.keys.push_back(contents.keys[h]);
    grown->shape.variants.push_back(contents.variants[h]);
    if (kind != NodeKind::kEmpty) {
      grown->absent_in_base.push_back(static_cast<uint32_t>(grown->nodes.size() - 1));
    }
  }
  for (const auto& [from, to] : plan.added_edges) {
    add_edge(grown->graph, grown->nodes[from], grown->nodes[to]);
    grown->shape.edges.emplace_back(from, to);
  }
  grown->anchored = group.anchored;
  grown->anchored.resize(grown->nodes.size(), 0);
  if (group.start != nullptr) {
    check(cudaGraphNodeFindInClone(&grown->start, group.start, grown->graph),
          "cudaGraphNodeFindInClone");
    check(cudaGraphNodeFindInClone(&grown->end, group.end, grown->graph),
          "cudaGraphNodeFindInClone");
  } else {
    check(add_noop_kernel_node(&grown->start, grown->graph), "cudaGraphAddKernelNode");
    check(add_noop_kernel_node(&grown->end, grown->graph), "cudaGraphAddKernelNode");
    // Until now every member had the base's topology: its first and last nodes are theirs.
    std::vector<uint32_t> first, last;
    core::first_and_last_nodes(group.shape, first, last);
    for (uint32_t node : first) anchor(*grown, node, ExecutableGroup::kFromStart);
    for (uint32_t node : last) anchor(*grown, node, ExecutableGroup::kToEnd);
  }
  for (uint32_t node : plan.sources) anchor(*grown, node, ExecutableGroup::kFromStart);
  for (uint32_t node : plan.sinks) anchor(*grown, node, ExecutableGroup::kToEnd);
  std::sort(grown->shape.edges.begin(), grown->shape.edges.end());
  grown->shape.order = plan.order;
  owner.graph = nullptr;  // the caller's now
  return grown;
}

namespace {

constexpr uint64_t kAbsentKernel = 1;  // kernels_of: the node runs as a no-op

// Per node of `shape`, the kernel it runs (its function or kernel handle; kAbsentKernel where the
// shape lacks the node; 0 for other nodes). Cached per shape.
const std::vector<uint64_t>& kernels_of(ExecutableGroup& group, uint32_t shape) {
  auto found = group.kernels.find(shape);
  if (found != group.kernels.end()) return found->second;
  std::vector<uint64_t> kernels(group.nodes.size(), 0);
  core::Blob scratch;
  for (uint32_t node = 0; node < kernels.size(); ++node) {
    if (group.kinds[node] != NodeKind::kKernel) continue;
    kernels[node] = kernel_in(group.params->view(shape, node, scratch)).value_or(kAbsentKernel);
  }
  return group.kernels.emplace(shape, std::move(kernels)).first->second;
}

}  // namespace

size_t kernel_swaps(ExecutableGroup& group, uint32_t from, uint32_t to) {
  const std::vector<uint64_t>& a = kernels_of(group, from);
  const std::vector<uint64_t>& b = kernels_of(group, to);
  // A shape cached before its union grew lacks the added nodes: they are no-ops for it.
  size_t swaps = 0;
  for (size_t node = 0; node < group.nodes.size(); ++node) {
    if (group.kinds[node] != NodeKind::kKernel) continue;
    const uint64_t x = node < a.size() ? a[node] : kAbsentKernel;
    const uint64_t y = node < b.size() ? b[node] : kAbsentKernel;
    swaps += x != y ? 1 : 0;
  }
  return swaps;
}

}  // namespace grape::cuda
