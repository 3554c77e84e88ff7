#include "cuda/shared_executables.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/executable_slots.h"
#include "core/param_codec.h"
#include "core/topology_union.h"
#include "cuda/driver.h"
#include "cuda/noop_nodes.h"

namespace grape::cuda {

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("grape: ") + what + " failed: " +
                           cudaGetErrorString(status));
}

void check(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  throw std::runtime_error(std::string("grape: ") + what + " failed: " +
                           driver_error_string(status));
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

// The memory type and device of `ptr`: what a copy's or memset's parameter update may not
// change (the memory type, for copies; the context, for both), unlike the address itself.
uint64_t memory_kind(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return UINT64_MAX;
  }
  return (static_cast<uint64_t>(attributes.type) << 32) |
         static_cast<uint32_t>(attributes.device);
}

// How a kernel's arguments lie in its parameter buffer, from the driver (CUDA 12.4).
struct ParamLayout {
  std::vector<std::pair<size_t, size_t>> params;  // (offset, size)
  size_t bytes = 0;
};

// The layout of the kernel launched by `p`, or null where the driver cannot tell. Cached: a
// function's layout never changes.
const ParamLayout* layout_of(const CUDA_KERNEL_NODE_PARAMS& p) {
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<const void*, std::unique_ptr<ParamLayout>>();
  const void* key = p.func != nullptr ? static_cast<const void*>(p.func)
                                      : static_cast<const void*>(p.kern);
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache->find(key);
  if (found != cache->end()) return found->second.get();
  const DriverApi& d = driver();
  auto layout = std::make_unique<ParamLayout>();
  constexpr size_t kMaxParams = 4096;  // CUDA's limit is 32 KB of parameters
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    CUresult status = CUDA_ERROR_NOT_SUPPORTED;
    if (p.func != nullptr && d.cuFuncGetParamInfo != nullptr) {
      status = d.cuFuncGetParamInfo(p.func, i, &offset, &size);
    } else if (p.func == nullptr && p.kern != nullptr && d.cuKernelGetParamInfo != nullptr) {
      status = d.cuKernelGetParamInfo(p.kern, i, &offset, &size);
    }
    if (status == CUDA_ERROR_INVALID_VALUE && i > 0) break;  // past the last parameter
    if (status == CUDA_ERROR_INVALID_VALUE && i == 0) break;  // no parameters
    if (status != CUDA_SUCCESS || i >= kMaxParams) {
      layout.reset();
      break;
    }
    layout->params.emplace_back(offset, size);
    layout->bytes = std::max(layout->bytes, offset + size);
  }
  const ParamLayout* result = layout.get();
  cache->emplace(key, std::move(layout));
  return result;
}

// A kernel node's blob starts with this; its argument bytes follow, laid out as on the device.
struct KernelHeader {
  uint64_t func;
  uint64_t kern;
  uint64_t ctx;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
  uint32_t packed;  // 1: launched with one packed argument buffer (`extra`), not kernelParams
};

// The kernel's name, for messages.
std::string kernel_name(const CUDA_KERNEL_NODE_PARAMS& p) {
  const DriverApi& d = driver();
  const char* name = nullptr;
  if (p.func != nullptr && d.cuFuncGetName != nullptr) {
    (void)d.cuFuncGetName(&name, p.func);
  } else if (p.kern != nullptr && d.cuKernelGetName != nullptr) {
    (void)d.cuKernelGetName(&name, p.kern);
  }
  return name != nullptr ? name : "a kernel";
}

// The argument buffer of a kernel launched with `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER and
// _SIZE), or false where `extra` holds anything else.
bool packed_arguments(void** extra, const void** buffer, size_t* size) {
  *buffer = nullptr;
  *size = 0;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      *buffer = extra[i + 1];
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      *size = *static_cast<const size_t*>(extra[i + 1]);
    } else {
      return false;
    }
  }
  return *buffer != nullptr || *size == 0;
}

}  // namespace

enum class NodeKind : uint8_t { kKernel, kMemcpy, kMemset, kEmpty };

// What a graph is made of, read node by node.
struct GraphContents {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<NodeKind> kinds;
  // Per node, for alignment (Note [Near topologies]): its type and launch attributes, and a
  // copy's or memset's memory kinds and dimensions.
  std::vector<uint64_t> keys;
  std::vector<uint64_t> variants;  // per node: a kernel's function, else 0
  std::vector<core::Edge> edges;  // sorted, by node index
  bool plain_edges = true;        // every edge a full dependency (no programmatic or port edges)
  std::vector<core::Blob> blobs;
  uint64_t topology = 0;
  bool readable = true;  // every node's parameters could be read and can be written back
  std::string why_not;   // what made it unreadable
};

namespace {

core::Blob kernel_blob(const CUDA_KERNEL_NODE_PARAMS& p, size_t argument_bytes) {
  core::Blob blob(sizeof(KernelHeader) + argument_bytes, 0);
  KernelHeader h{};
  h.func = reinterpret_cast<uint64_t>(p.func);
  h.kern = reinterpret_cast<uint64_t>(p.kern);
  h.ctx = reinterpret_cast<uint64_t>(p.ctx);
  h.grid[0] = p.gridDimX;
  h.grid[1] = p.gridDimY;
  h.grid[2] = p.gridDimZ;
  h.block[0] = p.blockDimX;
  h.block[1] = p.blockDimY;
  h.block[2] = p.blockDimZ;
  h.shared_bytes = p.sharedMemBytes;
  std::memcpy(blob.data(), &h, sizeof(h));
  return blob;
}

// A kernel node's blob, or an empty blob with `why_not` set where its arguments cannot be read.
core::Blob read_kernel(const CUDA_KERNEL_NODE_PARAMS& p, std::string& why_not) {
  if (p.extra != nullptr) {
    const void* buffer = nullptr;
    size_t size = 0;
    if (!packed_arguments(p.extra, &buffer, &size)) {
      why_not = kernel_name(p) + " was launched with launch options other than an argument buffer";
      return {};
    }
    core::Blob blob = kernel_blob(p, size);
    reinterpret_cast<KernelHeader*>(blob.data())->packed = 1;
    if (size > 0) std::memcpy(blob.data() + sizeof(KernelHeader), buffer, size);
    return blob;
  }
  const ParamLayout* layout = layout_of(p);
  if (layout == nullptr) {
    why_not = "the driver does not report the parameter layout of " + kernel_name(p) +
              " (cuFuncGetParamInfo needs CUDA 12.4)";
    return {};
  }
  if (!layout->params.empty() && p.kernelParams == nullptr) {
    why_not = kernel_name(p) + " has no readable arguments";
    return {};
  }
  core::Blob blob = kernel_blob(p, layout->bytes);
  for (size_t i = 0; i < layout->params.size(); ++i) {
    const auto [offset, size] = layout->params[i];
    std::memcpy(blob.data() + sizeof(KernelHeader) + offset, p.kernelParams[i], size);
  }
  return blob;
}

template <typename T>
core::Blob struct_blob(const T& value) {
  core::Blob blob(sizeof(T));
  std::memcpy(blob.data(), &value, sizeof(T));
  return blob;
}

std::string node_type_name(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeConditional: return "conditional";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeHost: return "host function";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeMemAlloc: return "memory allocation";
    case cudaGraphNodeTypeMemFree: return "memory free";
    default: return "type " + std::to_string(static_cast<int>(type));
  }
}

GraphContents read_graph(cudaGraph_t graph, bool with_params) {
  GraphContents g;
  size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  g.nodes.resize(count);
  check(cudaGraphGetNodes(graph, g.nodes.data(), &count), "cudaGraphGetNodes");
  std::unordered_map<cudaGraphNode_t, uint32_t> index;
  for (uint32_t i = 0; i < count; ++i) index.emplace(g.nodes[i], i);
  uint64_t h = mix(0, count);
  const DriverApi& d = driver();
  for (uint32_t i = 0; i < count && g.readable; ++i) {
    cudaGraphNode_t node = g.nodes[i];
    cudaGraphNodeType type;
    check(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
    uint64_t key = mix(0, static_cast<uint64_t>(type));
    uint64_t detail = 0, variant = 0;
    switch (type) {
      case cudaGraphNodeTypeKernel: {
        g.kinds.push_back(NodeKind::kKernel);
        // Launch attributes are not parameters: a member must agree with the group on them.
        cudaLaunchAttributeValue cluster{};
        if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &cluster) ==
            cudaSuccess) {
          key = mix(mix(mix(key, cluster.clusterDim.x), cluster.clusterDim.y),
                    cluster.clusterDim.z);
        }
        cudaLaunchAttributeValue value{};
        if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePriority, &value) ==
            cudaSuccess) {
          key = mix(key, static_cast<uint64_t>(value.priority));
        }
        // Node updates neither check nor change these: graphs joined by alignment must agree.
        value = {};
        if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeCooperative, &value) ==
            cudaSuccess) {
          key = mix(key, static_cast<uint64_t>(value.cooperative));
        }
        value = {};
        if (cudaGraphKernelNodeGetAttribute(
                node, cudaLaunchAttributeProgrammaticStreamSerialization, &value) == cudaSuccess) {
          key = mix(key, static_cast<uint64_t>(value.programmaticStreamSerializationAllowed));
        }
        value = {};
        if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeMemSyncDomain, &value) ==
            cudaSuccess) {
          key = mix(key, static_cast<uint64_t>(value.memSyncDomain));
        }
        (void)cudaGetLastError();
        if (!with_params) break;
        if (d.cuGraphKernelNodeGetParams == nullptr ||
            d.cuGraphExecKernelNodeSetParams == nullptr) {
          g.readable = false;
          g.why_not = "the CUDA driver lacks cuGraphKernelNodeGetParams";
          break;
        }
        CUDA_KERNEL_NODE_PARAMS p{};
        check(d.cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &p),
              "cuGraphKernelNodeGetParams");
        variant = reinterpret_cast<uint64_t>(p.func != nullptr ? static_cast<const void*>(p.func)
                                                               : static_cast<const void*>(p.kern));
        core::Blob blob = read_kernel(p, g.why_not);
        if (!g.why_not.empty()) {
          g.readable = false;
          break;
        }
        g.blobs.push_back(std::move(blob));
        break;
      }
      case cudaGraphNodeTypeMemcpy: {
        g.kinds.push_back(NodeKind::kMemcpy);
        if (!with_params) break;
        cudaMemcpy3DParms p{};
        check(cudaGraphMemcpyNodeGetParams(node, &p), "cudaGraphMemcpyNodeGetParams");
        const bool arrays = p.srcArray != nullptr || p.dstArray != nullptr;
        const bool one_dimensional = p.extent.height <= 1 && p.extent.depth <= 1;
        detail = mix(mix(static_cast<uint64_t>(p.kind), arrays ? 1 : one_dimensional ? 2 : 3),
                     arrays ? 0 : mix(memory_kind(p.srcPtr.ptr), memory_kind(p.dstPtr.ptr)));
        g.blobs.push_back(struct_blob(p));
        break;
      }
      case cudaGraphNodeTypeMemset: {
        g.kinds.push_back(NodeKind::kMemset);
        if (!with_params) break;
        cudaMemsetParams p{};
        check(cudaGraphMemsetNodeGetParams(node, &p), "cudaGraphMemsetNodeGetParams");
        detail = mix(mix(memory_kind(p.dst), p.elementSize), p.height > 1 ? 1 : 0);
        g.blobs.push_back(struct_blob(p));
        break;
      }
      case cudaGraphNodeTypeEmpty:
        g.kinds.push_back(NodeKind::kEmpty);
        if (with_params) g.blobs.emplace_back();
        break;
      default:  // conditional, child graph, event, host, memory nodes
        g.readable = false;
        g.why_not = "it holds a " + node_type_name(type) + " node";
        break;
    }
    // A topology leaves kernels and addresses to executable updates; alignment pairs copies and
    // memsets by what an update may not change, and kernel nodes with kernel nodes, preferably
    // of the same kernel (Note [Near topologies]).
    h = mix(h, key);
    g.keys.push_back(mix(key, detail));
    if (with_params) g.variants.push_back(variant);
  }
  if (!g.readable) return g;
  size_t edge_count = 0;
#if CUDART_VERSION >= 12030
  // With edge data: the query without it fails where an edge carries any (CUDA 12.3+).
#if CUDART_VERSION >= 13000
  constexpr auto get_edges = cudaGraphGetEdges;
#else
  constexpr auto get_edges = cudaGraphGetEdges_v2;
#endif
  check(get_edges(graph, nullptr, nullptr, nullptr, &edge_count), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  std::vector<cudaGraphEdgeData> data(edge_count);
  check(get_edges(graph, from.data(), to.data(), data.data(), &edge_count), "cudaGraphGetEdges");
  for (const cudaGraphEdgeData& e : data) {
    if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0 || e.to_port != 0) {
      g.plain_edges = false;
    }
  }
#else
  check(cudaGraphGetEdges(graph, nullptr, nullptr, &edge_count), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  check(cudaGraphGetEdges(graph, from.data(), to.data(), &edge_count), "cudaGraphGetEdges");
#endif
  g.edges.reserve(edge_count);
  for (size_t e = 0; e < edge_count; ++e) g.edges.emplace_back(index.at(from[e]), index.at(to[e]));
  std::sort(g.edges.begin(), g.edges.end());
  for (const auto& [a, b] : g.edges) h = mix(h, (static_cast<uint64_t>(a) << 32) | b);
  g.topology = h;
  return g;
}

// Whether a shape may lack node `node` (of `kind`): a kernel or a one-dimensional memset, run as a
// no-op in its place (Note [Near topologies]). A copy's no-op would need its memory kinds.
bool may_be_absent(cudaGraphNode_t node, NodeKind kind) {
  switch (kind) {
    case NodeKind::kKernel:
    case NodeKind::kEmpty:
      return true;
    case NodeKind::kMemset: {
      cudaMemsetParams p{};
      if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      return p.height <= 1;
    }
    case NodeKind::kMemcpy:
      return false;
  }
  return false;
}

// Makes node `node` of `exec`, which the shape lacks, do nothing: a kernel that does nothing (in
// the node's clusters), a memset of an element nothing reads. Not disabled: see cuda/noop_nodes.h.
void write_absent(cudaGraphExec_t exec, cudaGraphNode_t node, NodeKind kind) {
  switch (kind) {
    case NodeKind::kKernel: {
      cudaLaunchAttributeValue cluster{};
      dim3 grid(1);
      if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &cluster) !=
          cudaSuccess) {
        (void)cudaGetLastError();  // no cluster attribute: one block
      } else if (cluster.clusterDim.x > 0) {
        grid = dim3(cluster.clusterDim.x, std::max(1u, cluster.clusterDim.y),
                    std::max(1u, cluster.clusterDim.z));
      }
      check(set_noop_kernel(exec, node, grid), "cudaGraphExecKernelNodeSetParams (no-op)");
      break;
    }
    case NodeKind::kMemset: {
      cudaMemsetParams p{};  // the node's element size: an update may not change it
      check(cudaGraphMemsetNodeGetParams(node, &p), "cudaGraphMemsetNodeGetParams");
      check(set_noop_memset(exec, node, p.elementSize), "cudaGraphExecMemsetNodeSetParams (no-op)");
      break;
    }
    case NodeKind::kMemcpy:
      throw std::logic_error("grape: a union lacks a copy node for a shape (may_be_absent)");
    case NodeKind::kEmpty:
      break;
  }
}

// Writes node `node`'s parameters `blob` into `exec`. An empty blob (other than an empty node's)
// is a node the shape lacks (Note [Near topologies]).
void write_node(cudaGraphExec_t exec, cudaGraphNode_t node, NodeKind kind,
                const core::Blob& blob) {
  if (blob.empty()) {
    write_absent(exec, node, kind);
    return;
  }
  switch (kind) {
    case NodeKind::kKernel: {
      KernelHeader h;
      std::memcpy(&h, blob.data(), sizeof(h));
      CUDA_KERNEL_NODE_PARAMS p{};
      p.func = reinterpret_cast<CUfunction>(h.func);
      p.kern = reinterpret_cast<CUkernel>(h.kern);
      p.ctx = reinterpret_cast<CUcontext>(h.ctx);
      p.gridDimX = h.grid[0];
      p.gridDimY = h.grid[1];
      p.gridDimZ = h.grid[2];
      p.blockDimX = h.block[0];
      p.blockDimY = h.block[1];
      p.blockDimZ = h.block[2];
      p.sharedMemBytes = h.shared_bytes;
      auto* bytes = const_cast<uint8_t*>(blob.data()) + sizeof(KernelHeader);
      if (h.packed != 0) {
        size_t size = blob.size() - sizeof(KernelHeader);
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, bytes, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        p.extra = extra;
        check(driver().cuGraphExecKernelNodeSetParams(reinterpret_cast<CUgraphExec>(exec),
                                                      reinterpret_cast<CUgraphNode>(node), &p),
              "cuGraphExecKernelNodeSetParams");
        break;
      }
      const ParamLayout* layout = layout_of(p);  // known: read when the blob was made
      if (layout == nullptr) {
        throw std::runtime_error("grape: a kernel's parameter layout is unknown");
      }
      void* args[64];
      std::vector<void*> many;
      void** argv = args;
      if (layout->params.size() > 64) {
        many.resize(layout->params.size());
        argv = many.data();
      }
      for (size_t i = 0; i < layout->params.size(); ++i) argv[i] = bytes + layout->params[i].first;
      p.kernelParams = argv;
      check(driver().cuGraphExecKernelNodeSetParams(reinterpret_cast<CUgraphExec>(exec),
                                                    reinterpret_cast<CUgraphNode>(node), &p),
            "cuGraphExecKernelNodeSetParams");
      break;
    }
    case NodeKind::kMemcpy: {
      cudaMemcpy3DParms p;
      std::memcpy(&p, blob.data(), sizeof(p));
      check(cudaGraphExecMemcpyNodeSetParams(exec, node, &p), "cudaGraphExecMemcpyNodeSetParams");
      break;
    }
    case NodeKind::kMemset: {
      cudaMemsetParams p;
      std::memcpy(&p, blob.data(), sizeof(p));
      check(cudaGraphExecMemsetNodeSetParams(exec, node, &p), "cudaGraphExecMemsetNodeSetParams");
      break;
    }
    case NodeKind::kEmpty:
      break;
  }
}

// A node in `graph` like `source` (a node of a captured graph, read as `kind`): same parameters
// and launch attributes, no dependencies yet.
cudaGraphNode_t add_node_like(cudaGraph_t graph, cudaGraphNode_t source, NodeKind kind) {
  cudaGraphNode_t node = nullptr;
  switch (kind) {
    case NodeKind::kKernel: {
      const DriverApi& d = driver();
      if (d.cuGraphAddKernelNode == nullptr) {
        throw std::runtime_error("grape: the CUDA driver lacks cuGraphAddKernelNode");
      }
      CUDA_KERNEL_NODE_PARAMS p{};
      check(d.cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(source), &p),
            "cuGraphKernelNodeGetParams");
      check(d.cuGraphAddKernelNode(reinterpret_cast<CUgraphNode*>(&node),
                                   reinterpret_cast<CUgraph>(graph), nullptr, 0, &p),
            "cuGraphAddKernelNode");
#if CUDART_VERSION >= 13000
      check(cudaGraphKernelNodeCopyAttributes(node, source), "cudaGraphKernelNodeCopyAttributes");
#else  // (source, destination) before CUDA 13
      check(cudaGraphKernelNodeCopyAttributes(source, node), "cudaGraphKernelNodeCopyAttributes");
#endif
      break;
    }
    case NodeKind::kMemcpy: {
      cudaMemcpy3DParms p{};
      check(cudaGraphMemcpyNodeGetParams(source, &p), "cudaGraphMemcpyNodeGetParams");
      check(cudaGraphAddMemcpyNode(&node, graph, nullptr, 0, &p), "cudaGraphAddMemcpyNode");
      break;
    }
    case NodeKind::kMemset: {
      cudaMemsetParams p{};
      check(cudaGraphMemsetNodeGetParams(source, &p), "cudaGraphMemsetNodeGetParams");
      check(cudaGraphAddMemsetNode(&node, graph, nullptr, 0, &p), "cudaGraphAddMemsetNode");
      break;
    }
    case NodeKind::kEmpty:
      check(cudaGraphAddEmptyNode(&node, graph, nullptr, 0), "cudaGraphAddEmptyNode");
      break;
  }
  return node;
}

void add_edge(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to) {
#if CUDART_VERSION >= 13000
  check(cudaGraphAddDependencies(graph, &from, &to, nullptr, 1), "cudaGraphAddDependencies");
#else
  check(cudaGraphAddDependencies(graph, &from, &to, 1), "cudaGraphAddDependencies");
#endif
}

// How near a graph must be to join a union (Note [Near topologies]): it may bring
// near_inserts(its nodes) nodes the union lacks, and the union may hold union_growth(smallest)
// nodes more than its smallest member, which runs them all, as no-ops. Deleted nodes (the union's
// that the graph lacks) are bounded by the growth alone: a union is meant to hold many variants.
// Each no-op is a launch on the GPU: with kernels paired as swaps, most of wav2vec2's shapes
// joined unions, and a growth of a quarter of the smallest member made inference 13 to 20%
// slower than per-shape graphs (H100).
size_t near_inserts(size_t nodes) { return std::max<size_t>(8, nodes / 8); }
size_t union_growth(size_t smallest) { return std::max<size_t>(16, smallest / 16); }

// Whether a graph of m nodes that brings `added` new ones is near enough to join a union of n
// nodes whose smallest member has `smallest_member`.
bool near_enough(size_t n, size_t m, size_t smallest_member, size_t added) {
  const size_t smallest = std::min(smallest_member, m);
  return m <= n + near_inserts(m) && n + added <= smallest + union_growth(smallest);
}

// Anchored flags of a union's node (Group::anchored).
constexpr uint8_t kFromStart = 1, kToEnd = 2;

// A captured graph as plan_union sees it, its creation order as its order. No order (no
// alignment) where an edge is not a plain dependency, since alignment reasons about full
// dependencies only, or where creation order is not topological.
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

// Destroys a graph it holds at scope exit: set `graph` to null to keep it.
struct GraphOwner {
  cudaGraph_t graph;
  ~GraphOwner() {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

// The driver takes executables' memory in chunks, so one instantiation may take a chunk and the
// next nothing. An executable is charged its nodes' share of all that instantiations in this
// process took, which sums to what was measured.
std::atomic<uint64_t> instantiated_bytes{0}, instantiated_nodes{0};

void record_instantiation(uint64_t bytes, size_t nodes) {
  instantiated_bytes += bytes;
  instantiated_nodes += nodes;
}

// At least a byte, so that a finite cache bounds the count of executables.
size_t executable_charge(size_t nodes) {
  const double per_node = static_cast<double>(instantiated_bytes.load()) /
                          static_cast<double>(std::max<uint64_t>(1, instantiated_nodes.load()));
  return std::max<size_t>(1, static_cast<size_t>(per_node * static_cast<double>(nodes)));
}

}  // namespace

struct SharedExecutables::Executable {
  cudaGraphExec_t exec = nullptr;
};

struct SharedExecutables::Group {
  cudaGraph_t graph = nullptr;  // the base graph, or the union of its members' graphs; owned
  std::vector<cudaGraphNode_t> nodes;
  std::vector<NodeKind> kinds;
  std::unique_ptr<core::ParamTable> params;  // null: this group has one graph and never shares
  // Note [Near topologies]: the graph as aligned, and the nodes the base lacks (a union's added
  // nodes, empty ones aside), made no-ops at instantiation.
  core::NodeGraph shape;
  std::vector<uint32_t> absent_in_base;
  // The union's start and end anchors, no-op kernels (cuda/noop_nodes.h),
  // null until the group first becomes a union (from then on members join by alignment only,
  // add()); and per node whether an edge from the start (kFromStart) or to the end (kToEnd)
  // holds it.
  cudaGraphNode_t start = nullptr;
  cudaGraphNode_t end = nullptr;
  std::vector<uint8_t> anchored;
  size_t smallest_member = 0;    // node count of its smallest member
  std::vector<uint64_t> topologies;  // its keys in by_topology_
  // Per topology of its members, their nodes' union nodes (UnionPlan::node_of), so that another
  // graph of that topology joins as it did, without aligning (which may pair it otherwise).
  std::unordered_map<uint64_t, std::vector<uint32_t>> node_of_topology;
  int64_t members = 0;
  // Resident slots (Note [Executable slots]): which shape each holds and when it was last
  // prepared, and its executable, by the same index. Empty while evicted.
  std::vector<core::ExecutableSlot> slots;
  std::vector<Executable> executables;
  size_t executable_bytes = 0;  // each executable's charge (instantiate())
  std::unordered_map<uint32_t, std::vector<uint64_t>> kernels;  // kernels_of, by shape
};

namespace {
constexpr uint64_t kAbsentKernel = 1;  // kernels_of: the node runs as a no-op
}  // namespace

const std::vector<uint64_t>& SharedExecutables::kernels_of(Group& group, uint32_t shape) {
  auto found = group.kernels.find(shape);
  if (found != group.kernels.end()) return found->second;
  std::vector<uint64_t> kernels(group.nodes.size(), 0);
  core::Blob blob;
  for (uint32_t node = 0; node < kernels.size(); ++node) {
    if (group.kinds[node] != NodeKind::kKernel) continue;
    group.params->decode(shape, node, blob);
    if (blob.size() < sizeof(KernelHeader)) {
      kernels[node] = kAbsentKernel;
      continue;
    }
    KernelHeader h;
    std::memcpy(&h, blob.data(), sizeof(h));
    kernels[node] = h.func != 0 ? h.func : h.kern;
  }
  return group.kernels.emplace(shape, std::move(kernels)).first->second;
}

size_t SharedExecutables::kernel_swaps(Group& group, uint32_t from, uint32_t to) {
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

core::SlotChoice SharedExecutables::choose(Group& group, uint32_t shape, bool room) {
  core::SlotChoice choice = core::choose_slot(group.slots, shape, room);
  // With two slots or fewer, the one launched last is kept: there is nothing to choose from.
  if (choice.kind != core::SlotChoice::Kind::kPatch || group.slots.size() <= 2 || !group.params ||
      shape == core::ExecutableSlot::kNoShape) {
    return choice;
  }
  std::vector<size_t> swaps(group.slots.size(), 0);
  for (size_t i = 0; i < group.slots.size(); ++i) {
    if (group.slots[i].shape != core::ExecutableSlot::kNoShape) {
      swaps[i] = kernel_swaps(group, group.slots[i].shape, shape);
    }
  }
  return core::choose_slot(group.slots, shape, room, &swaps);
}

void SharedExecutables::anchor(Group& group, uint32_t node, uint8_t flag) {
  if ((group.anchored[node] & flag) != 0) return;
  if (flag == kFromStart) {
    add_edge(group.graph, group.start, group.nodes[node]);
  } else {
    add_edge(group.graph, group.nodes[node], group.end);
  }
  group.anchored[node] |= flag;
}

bool SharedExecutables::anchors_hold(const Group& group, const core::UnionPlan& plan) {
  if (group.start == nullptr) return false;
  const auto holds = [&](const std::vector<uint32_t>& nodes, uint8_t flag) {
    return std::all_of(nodes.begin(), nodes.end(), [&](uint32_t node) {
      return node < group.anchored.size() && (group.anchored[node] & flag) != 0;
    });
  };
  return holds(plan.sources, kFromStart) && holds(plan.sinks, kToEnd);
}

SharedExecutables::SharedExecutables(Sharing sharing, size_t cache_bytes, SlotGrowth growth)
    : sharing_(sharing), cache_bytes_(cache_bytes), growth_(growth) {}

SharedExecutables::~SharedExecutables() {
  for (auto& group : groups_) {
    if (!group) continue;
    for (const Executable& e : group->executables) (void)cudaGraphExecDestroy(e.exec);
    if (group->graph != nullptr) (void)cudaGraphDestroy(group->graph);
  }
}

size_t SharedExecutables::instantiate(Group& group, cudaStream_t stream) {
  size_t free_before = 0, free_after = 0, total = 0;
  (void)cudaMemGetInfo(&free_before, &total);
  Executable made;
  // The flags PyTorch's CUDAGraph instantiates with.
  check(cudaGraphInstantiateWithFlags(
            &made.exec, group.graph,
            cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority),
        "cudaGraphInstantiateWithFlags");
  // The base's parameters: the nodes a union added are absent from it (before the upload, which
  // a later change would make the first launch redo).
  try {
    for (uint32_t node : group.absent_in_base) {
      write_absent(made.exec, group.nodes[node], group.kinds[node]);
    }
  } catch (...) {
    (void)cudaGraphExecDestroy(made.exec);
    throw;
  }
  // The upload allocates the executable's device memory now rather than at its first launch.
  const cudaError_t uploaded = cudaGraphUpload(made.exec, stream);
  (void)cudaMemGetInfo(&free_after, &total);
  if (uploaded != cudaSuccess) {
    (void)cudaGraphExecDestroy(made.exec);
    check(uploaded, "cudaGraphUpload");
  }
  record_instantiation(free_before > free_after ? free_before - free_after : 0, group.nodes.size());
  // Executables of one graph are of one size, so a group's are charged alike, at the estimate
  // refined by this instantiation: a charge fixed at the first would keep the first
  // instantiations' chunks (several times an executable's share) for the group's lifetime.
  const size_t charge = executable_charge(group.nodes.size());
  const size_t resident = group.executables.size();
  device_bytes_ = device_bytes_ - std::min(device_bytes_, resident * group.executable_bytes) +
                  (resident + 1) * charge;
  const size_t beyond_first = resident == 0 ? 0 : resident - 1;
  cached_bytes_ = cached_bytes_ - std::min(cached_bytes_, beyond_first * group.executable_bytes) +
                  resident * charge;
  group.executable_bytes = charge;
  group.executables.push_back(made);
  group.slots.push_back({core::ParamTable::kBase, 0});
  ++counters_.instantiations;
  return group.slots.size() - 1;
}

void SharedExecutables::destroy_slot(Group& group, size_t slot) {
  // A launch still in flight completes: the driver frees the executable after it.
  (void)cudaGraphExecDestroy(group.executables[slot].exec);
  const size_t bytes = group.executable_bytes;
  device_bytes_ -= std::min(device_bytes_, bytes);
  // A group's executables are charged alike: any but the last one was beyond the first.
  if (group.executables.size() > 1) cached_bytes_ -= std::min(cached_bytes_, bytes);
  group.executables.erase(group.executables.begin() + static_cast<std::ptrdiff_t>(slot));
  group.slots.erase(group.slots.begin() + static_cast<std::ptrdiff_t>(slot));
}

size_t SharedExecutables::slot_for(Group& group, uint32_t shape, cudaStream_t stream,
                                   bool host_paced) {
  // Whether the group grows is asked only where the shape would be patched: a hit, the most
  // common choice on the replay path, makes no stream query.
  core::SlotChoice choice = core::choose_slot(group.slots, shape, false);
  if (choice.kind == core::SlotChoice::Kind::kPatch) {
    choice = choose(group, shape, grows(group, stream, host_paced));
  }
  if (choice.kind != core::SlotChoice::Kind::kNewSlot) return choice.slot;
  try {
    return instantiate(group, stream);
  } catch (const std::runtime_error&) {
    if (group.slots.empty()) throw;
    // No memory for another: patch one, and make no more slots until executables are freed.
    slots_refused_ = true;
    return choose(group, shape, false).slot;
  }
}

bool SharedExecutables::room_for_slot(const Group& group) const {
  if (!group.params || group.executables.empty() || cache_bytes_ == 0 || slots_refused_) {
    return false;
  }
  const size_t bytes = executable_charge(group.nodes.size());
  if (device_limit_ != SIZE_MAX && device_bytes_ + bytes > device_limit_) return false;
  return cache_bytes_ == SIZE_MAX || cached_bytes_ + bytes <= cache_bytes_;
}

bool SharedExecutables::grows(const Group& group, cudaStream_t stream, bool host_paced) {
  if (!room_for_slot(group)) return false;
  if (growth_ == SlotGrowth::kWhileRoom) return true;
  // A capture's join, or a launch right after a capture or an eager run: the stream drained while
  // the host did that work, which says nothing about whether launches alone keep the GPU busy.
  if (!host_paced) return false;
  // Where work is still queued, patching overlaps it and delays nothing; a slot would only take
  // memory. Where the stream is idle, the GPU waits for this launch and patching delays it.
  const cudaError_t queried = cudaStreamQuery(stream);
  const bool idle = queried != cudaErrorNotReady;
  if (idle) {
    check(queried, "cudaStreamQuery");
  } else {
    (void)cudaGetLastError();  // not an error; cleared as c10's CUDAStream::query does
  }
  // A slot is worth its memory where nearly every patch finds the GPU waiting (the host is the
  // bottleneck: a decode loop), not where the queue drains now and then (wav2vec2 inference over
  // shuffled lengths, whose shorter clips the host outpaces: 79 slots, 90 MB, at 75%).
  idle_share_ += ((idle ? 1.0 : 0.0) - idle_share_) * kIdleShareWeight;
  return idle && idle_share_ >= kIdleShareToGrow;
}

SharedExecutables::Member SharedExecutables::add(cudaGraph_t graph, cudaStream_t stream) {
  GraphOwner owner{graph};
  const bool share = sharing_ != Sharing::kNone;
  GraphContents contents = read_graph(graph, share);
  const bool shareable = share && contents.readable;
  if (share && !contents.readable) unshareable_reason_ = contents.why_not;

  core::NodeGraph aligned;  // a shareable graph's view for alignment; kept if it starts a group
  if (shareable) {
    aligned = alignment_view(contents);
    std::vector<uint32_t> tried;  // groups of this topology, joined or not
    auto [first, last] = by_topology_.equal_range(contents.topology);
    for (auto it = first; it != last; ++it) {
      Group& group = *groups_[it->second];
      tried.push_back(it->second);
      // cudaGraphExecUpdate takes graphs of the group's base topology only, and would not make
      // the nodes the graph lacks no-ops: into a union (its anchors are no captured graph's
      // nodes), or a group registered by a near join, a graph joins by alignment.
      if (group.start != nullptr || contents.topology != group.topologies.front()) {
        Member joined;
        if (join_aligned(it->second, aligned, contents, stream, joined)) return joined;
        continue;
      }
      if (group.nodes.size() != contents.nodes.size() || group.kinds != contents.kinds) continue;
      // The update both asks the driver whether the graph may share this group's executables and
      // writes its parameters into the slot it will replay in: one holding no live shape, a new
      // one where the cache has room, else the one a shape without a slot is patched into.
      const size_t slots_before = group.slots.size();
      const size_t slot = slot_for(group, core::ExecutableSlot::kNoShape, stream, false);
      const bool fresh = group.slots.size() > slots_before;
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(group.executables[slot].exec, graph, &info) != cudaSuccess) {
        (void)cudaGetLastError();
        if (fresh) {
          destroy_slot(group, slot);
        } else {
          group.slots[slot].shape = core::ExecutableSlot::kNoShape;  // maybe partly updated
        }
        continue;
      }
      const uint32_t shape = group.params->add(contents.blobs);
      group.slots[slot] = {shape, ++clock_};
      ++group.members;
      ++counters_.joins;
      return {it->second, shape};
    }
    // A graph of no group's topology (or one whose update the driver refused, which alignment
    // would not check better) may join the most recent groups of a near topology.
    if (sharing_ == Sharing::kNearTopologies) {
      int near_tried = 0;
      for (size_t index = groups_.size(); index-- > 0 && near_tried < kNearGroupsTried;) {
        if (!groups_[index] || std::find(tried.begin(), tried.end(), index) != tried.end()) {
          continue;
        }
        const Group& group = *groups_[index];
        if (!group.params ||
            !near_enough(group.nodes.size(), contents.nodes.size(), group.smallest_member, 0)) {
          continue;
        }
        ++near_tried;
        Member joined;
        if (join_aligned(static_cast<uint32_t>(index), aligned, contents, stream, joined)) {
          return joined;
        }
      }
      if (near_tried == 0) ++counters_.near_refused_far;
    }
  }

  auto group = std::make_unique<Group>();
  group->graph = graph;
  owner.graph = nullptr;
  const size_t count = contents.nodes.size();
  group->shape = std::move(aligned);  // without an order, no graph joins it by alignment
  group->nodes = std::move(contents.nodes);
  group->kinds = std::move(contents.kinds);
  group->smallest_member = count;
  group->topologies = {contents.topology};
  if (!group->shape.order.empty()) {
    group->node_of_topology.emplace(contents.topology, group->shape.order);
  }
  if (shareable) group->params = std::make_unique<core::ParamTable>(std::move(contents.blobs));
  group->members = 1;
  const auto index = static_cast<uint32_t>(groups_.size());
  try {
    instantiate(*group, stream);
  } catch (...) {
    (void)cudaGraphDestroy(group->graph);
    throw;
  }
  group->slots.front().last_used = ++clock_;
  if (shareable) by_topology_.emplace(contents.topology, index);
  groups_.push_back(std::move(group));
  return {index, core::ParamTable::kBase};
}

bool SharedExecutables::join_aligned(uint32_t index, const core::NodeGraph& graph,
                                     const GraphContents& contents, cudaStream_t stream,
                                     Member& joined) {
  Group& group = *groups_[index];
  const size_t n = group.nodes.size();
  const size_t m = contents.nodes.size();
  if (!group.params || group.shape.order.size() != n || graph.order.size() != m) {
    ++counters_.near_refused_unaligned;
    return false;
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
      ++counters_.near_refused_edits;
      return false;
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
    ++counters_.near_refused_no_noop;
    return false;
  }
  const size_t smallest = std::min(group.smallest_member, m);
  std::vector<core::Blob> blobs(n + plan->added.size());  // empty: absent
  for (size_t i = 0; i < m; ++i) blobs[plan->node_of[i]] = contents.blobs[i];
  uint32_t shape = 0;
  try {
    if (plan->added.empty() && plan->added_edges.empty() && anchors_hold(group, *plan)) {
      shape = join_as_is(group, blobs, stream);
    } else {
      shape = join_grown(index, contents, *plan, blobs, stream);
    }
  } catch (const std::runtime_error&) {
    ++counters_.near_refused_driver;
    return false;  // the driver refused a node's parameters
  }
  Group& joined_group = *groups_[index];  // join_grown replaced it
  joined_group.smallest_member = smallest;
  joined_group.node_of_topology.emplace(contents.topology, plan->node_of);
  ++joined_group.members;
  if (std::find(joined_group.topologies.begin(), joined_group.topologies.end(),
                contents.topology) == joined_group.topologies.end()) {
    joined_group.topologies.push_back(contents.topology);
    by_topology_.emplace(contents.topology, index);
  }
  ++counters_.joins;
  ++counters_.near_joins;
  counters_.near_swaps += static_cast<int64_t>(plan->swaps);
  joined = {index, shape};
  return true;
}

uint32_t SharedExecutables::join_as_is(Group& group, const std::vector<core::Blob>& blobs,
                                       cudaStream_t stream) {
  const uint32_t shape = group.params->add(blobs);
  try {
    // Patching the shape in now also asks the driver whether it takes these parameters.
    const size_t slot = slot_for(group, shape, stream, false);
    patch(group, slot, shape);
    group.slots[slot].last_used = ++clock_;
  } catch (...) {
    group.params->remove(shape);
    throw;
  }
  return shape;
}

uint32_t SharedExecutables::join_grown(uint32_t index, const GraphContents& contents,
                                       const core::UnionPlan& plan,
                                       const std::vector<core::Blob>& blobs, cudaStream_t stream) {
  Group& group = *groups_[index];
  const size_t n = group.nodes.size();
  auto grown = std::make_unique<Group>();
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
    for (uint32_t node : first) anchor(*grown, node, kFromStart);
    for (uint32_t node : last) anchor(*grown, node, kToEnd);
  }
  for (uint32_t node : plan.sources) anchor(*grown, node, kFromStart);
  for (uint32_t node : plan.sinks) anchor(*grown, node, kToEnd);
  std::sort(grown->shape.edges.begin(), grown->shape.edges.end());
  grown->shape.order = plan.order;
  grown->topologies = group.topologies;
  grown->node_of_topology = group.node_of_topology;
  grown->members = group.members;

  // An executable of the union, holding the joining graph's parameters: the driver checks them.
  instantiate(*grown, stream);
  try {
    const cudaGraphExec_t exec = grown->executables.front().exec;
    for (size_t node = 0; node < blobs.size(); ++node) {
      write_node(exec, grown->nodes[node], grown->kinds[node], blobs[node]);
    }
  } catch (...) {
    destroy_slot(*grown, 0);
    throw;
  }

  // The old graph's executables cannot run the union: its shapes move to the new ones.
  while (!group.slots.empty()) destroy_slot(group, group.slots.size() - 1);
  slots_refused_ = false;
  grown->params = std::move(group.params);
  grown->kernels = std::move(group.kernels);
  grown->params->add_nodes(plan.added.size());
  const uint32_t shape = grown->params->add(blobs);
  grown->slots.front() = {shape, ++clock_};
  grown->smallest_member = group.smallest_member;
  (void)cudaGraphDestroy(group.graph);
  owner.graph = nullptr;
  groups_[index] = std::move(grown);
  ++counters_.unions;
  return shape;
}

void SharedExecutables::remove(Member member) {
  if (!member.valid() || member.group >= groups_.size() || !groups_[member.group]) return;
  Group& group = *groups_[member.group];
  if (group.params) {
    group.params->remove(member.shape);
    group.kernels.erase(member.shape);
    if (member.shape != core::ParamTable::kBase) {  // the base's parameters stay readable
      for (auto& slot : group.slots) {
        if (slot.shape == member.shape) slot.shape = core::ExecutableSlot::kNoShape;
      }
    }
  }
  if (--group.members > 0) return;
  while (!group.slots.empty()) destroy_slot(group, group.slots.size() - 1);
  slots_refused_ = false;
  (void)cudaGraphDestroy(group.graph);
  for (uint64_t topology : group.topologies) {
    auto [first, last] = by_topology_.equal_range(topology);
    for (auto it = first; it != last; ++it) {
      if (it->second == member.group) {
        by_topology_.erase(it);
        break;
      }
    }
  }
  groups_[member.group].reset();
}

cudaGraphExec_t SharedExecutables::prepare(Member member, cudaStream_t stream, bool host_paced) {
  Group& group = *groups_.at(member.group);
  const size_t slot = slot_for(group, member.shape, stream, host_paced);
  if (group.slots[slot].shape != member.shape) patch(group, slot, member.shape);
  group.slots[slot].last_used = ++clock_;
  return group.executables[slot].exec;
}

void SharedExecutables::prepare_ahead(Member member) {
  if (!member.valid() || member.group >= groups_.size() || !groups_[member.group]) return;
  Group& group = *groups_[member.group];
  if (group.slots.empty() || !group.params || !group.params->contains(member.shape)) return;
  const core::SlotChoice choice = choose(group, member.shape, room_for_slot(group));
  if (choice.kind != core::SlotChoice::Kind::kPatch) return;
  patch(group, choice.slot, member.shape);
  ++counters_.patches_ahead;
}

void SharedExecutables::patch(Group& group, size_t slot, uint32_t shape) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint32_t> changed;
  const uint32_t from = group.slots[slot].shape;
  if (from == core::ExecutableSlot::kNoShape) {
    changed.resize(group.nodes.size());
    for (uint32_t i = 0; i < changed.size(); ++i) changed[i] = i;
  } else {
    group.params->changed_nodes(from, shape, changed);
    counters_.kernels_swapped += static_cast<int64_t>(kernel_swaps(group, from, shape));
  }
  group.slots[slot].shape = core::ExecutableSlot::kNoShape;  // until every node is written
  core::Blob blob;
  cudaGraphExec_t exec = group.executables[slot].exec;
  for (uint32_t node : changed) {
    group.params->decode(shape, node, blob);
    write_node(exec, group.nodes[node], group.kinds[node], blob);
  }
  group.slots[slot].shape = shape;
  ++counters_.switches;
  counters_.nodes_patched += static_cast<int64_t>(changed.size());
  counters_.patch_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
}

int SharedExecutables::evict_to(size_t bytes, Member keep) {
  // The executable serving `keep`: its shape's slot, else the slot its group launched last.
  cudaGraphExec_t kept = nullptr;
  if (keep.valid() && keep.group < groups_.size() && groups_[keep.group]) {
    const Group& g = *groups_[keep.group];
    uint64_t kept_use = 0;
    for (size_t i = 0; i < g.slots.size(); ++i) {
      if (g.slots[i].shape == keep.shape) {
        kept = g.executables[i].exec;
        break;
      }
      if (kept == nullptr || g.slots[i].last_used > kept_use) {
        kept = g.executables[i].exec;
        kept_use = g.slots[i].last_used;
      }
    }
  }
  int evicted = 0;
  while (device_bytes_ > bytes) {
    Group* oldest = nullptr;
    size_t oldest_slot = 0;
    for (auto& group : groups_) {
      if (!group) continue;
      for (size_t i = 0; i < group->slots.size(); ++i) {
        if (group->executables[i].exec == kept) continue;
        if (oldest == nullptr || group->slots[i].last_used < oldest->slots[oldest_slot].last_used) {
          oldest = group.get();
          oldest_slot = i;
        }
      }
    }
    if (oldest == nullptr) break;
    destroy_slot(*oldest, oldest_slot);
    ++counters_.evictions;
    ++evicted;
  }
  if (evicted > 0) slots_refused_ = false;
  return evicted;
}

ExecutableStats SharedExecutables::stats() const {
  ExecutableStats s = counters_;
  s.device_bytes = device_bytes_;
  s.cached_bytes = cached_bytes_;
  for (const auto& g : groups_) {
    if (!g) continue;
    ++s.groups;
    s.members += g->members;
    s.resident += static_cast<int64_t>(g->slots.size());
    if (g->start != nullptr) {
      s.union_extra_nodes += static_cast<int64_t>(g->nodes.size() - g->smallest_member);
    }
    if (g->params) {
      s.params_bytes += g->params->compressed_bytes();
      s.params_raw_bytes += g->params->raw_bytes();
    } else {
      ++s.unshareable;
    }
  }
  return s;
}

}  // namespace grape::cuda
