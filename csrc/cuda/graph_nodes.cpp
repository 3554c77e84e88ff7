#include "cuda/graph_nodes.h"

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "core/kernel_images.h"
#include "cuda/driver.h"
#include "cuda/module_images.h"
#include "cuda/noop_nodes.h"

namespace grape::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("grape: ") + what + " failed: " +
                           cudaGetErrorString(status));
}

namespace {

// The driver API's check. Inside this namespace it hides cuda::check, the runtime API's: call
// that one qualified.
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

// Kernel node `node`'s launch attribute `id`, asked of the driver (as its parameters are: every
// graph a capture reads asks four per kernel node); false where the driver has none for it.
bool kernel_attribute(cudaGraphNode_t node, CUlaunchAttributeID id,
                      CUlaunchAttributeValue& value) {
  const DriverApi& d = driver();
  value = {};
  return d.cuGraphKernelNodeGetAttribute != nullptr &&
         d.cuGraphKernelNodeGetAttribute(reinterpret_cast<CUgraphNode>(node), id, &value) ==
             CUDA_SUCCESS;
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
  auto info = [&](size_t i, size_t* offset, size_t* size) {
    if (p.func != nullptr) {
      return d.cuFuncGetParamInfo != nullptr ? d.cuFuncGetParamInfo(p.func, i, offset, size)
                                             : CUDA_ERROR_NOT_SUPPORTED;
    }
    return p.kern != nullptr && d.cuKernelGetParamInfo != nullptr
               ? d.cuKernelGetParamInfo(p.kern, i, offset, size)
               : CUDA_ERROR_NOT_SUPPORTED;
  };
  // The count where the driver tells it; otherwise parameters are asked for until the driver
  // answers that there are no more (CUDA_ERROR_INVALID_VALUE), once per kernel.
  size_t count = 0;
  const bool counted =
      p.func != nullptr
          ? d.cuFuncGetParamCount != nullptr && d.cuFuncGetParamCount(p.func, &count) == CUDA_SUCCESS
          : p.kern != nullptr && d.cuKernelGetParamCount != nullptr &&
                d.cuKernelGetParamCount(p.kern, &count) == CUDA_SUCCESS;
  constexpr size_t kMaxParams = 4096;  // CUDA's limit is 32 KB of parameters
  for (size_t i = 0; !counted || i < count; ++i) {
    size_t offset = 0, size = 0;
    const CUresult status = info(i, &offset, &size);
    if (!counted && status == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
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

core::Blob kernel_blob(const CUDA_KERNEL_NODE_PARAMS& p, size_t argument_bytes) {
  core::Blob blob(sizeof(KernelHeader) + argument_bytes, 0);
  KernelHeader h{};
  h.func = reinterpret_cast<uint64_t>(p.func);
  // Where a function is set the driver ignores the kernel handle and the context; cleared, they
  // are not process-specific words a stored graph would have to map.
  h.kern = p.func != nullptr ? 0 : reinterpret_cast<uint64_t>(p.kern);
  h.ctx = p.func != nullptr ? 0 : reinterpret_cast<uint64_t>(p.ctx);
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

// A kernel node's launch attributes, mixed into its key: they are not parameters, so a member
// must agree with its group on them.
uint64_t with_launch_attributes(cudaGraphNode_t node, uint64_t key) {
  CUlaunchAttributeValue value;
  if (kernel_attribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, value)) {
    key = mix(mix(mix(key, value.clusterDim.x), value.clusterDim.y), value.clusterDim.z);
  }
  if (kernel_attribute(node, CU_LAUNCH_ATTRIBUTE_PRIORITY, value)) {
    key = mix(key, static_cast<uint64_t>(value.priority));
  }
  // Node updates neither check nor change these: graphs joined by alignment must agree. (A
  // captured programmatic launch is no node attribute but a programmatic edge, read with the
  // edges: asking a node for it fails.)
  if (kernel_attribute(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, value)) {
    key = mix(key, static_cast<uint64_t>(value.cooperative));
  }
  if (kernel_attribute(node, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, value)) {
    key = mix(key, static_cast<uint64_t>(value.memSyncDomain));
  }
  return key;
}

// A kernel node's parameters appended to g.blobs; its kernel, the node's variant. Where they
// cannot be read, g is marked unreadable with the reason.
uint64_t read_kernel_node(cudaGraphNode_t node, GraphContents& g) {
  const DriverApi& d = driver();
  if (d.cuGraphKernelNodeGetParams == nullptr || d.cuGraphExecKernelNodeSetParams == nullptr) {
    g.readable = false;
    g.why_not = "the CUDA driver lacks cuGraphKernelNodeGetParams";
    return 0;
  }
  CUDA_KERNEL_NODE_PARAMS p{};
  check(d.cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &p),
        "cuGraphKernelNodeGetParams");
  const uint64_t variant = reinterpret_cast<uint64_t>(
      p.func != nullptr ? static_cast<const void*>(p.func) : static_cast<const void*>(p.kern));
  core::Blob blob = read_kernel(p, g.why_not);
  if (!g.why_not.empty()) {
    g.readable = false;
    return variant;
  }
  g.blobs.push_back(std::move(blob));
  return variant;
}

// One node read into g: its kind, its key (what alignment pairs it by), and with its parameters
// its blob and variant (Note [Near topologies]). Returns the key's part that the topology hash
// covers.
uint64_t read_node(cudaGraphNode_t node, bool with_params, GraphContents& g) {
  CUgraphNodeType driver_type;
  check(driver().cuGraphNodeGetType(reinterpret_cast<CUgraphNode>(node), &driver_type),
        "cuGraphNodeGetType");
  const auto type = static_cast<cudaGraphNodeType>(driver_type);  // the same values
  uint64_t key = mix(0, static_cast<uint64_t>(type));
  uint64_t detail = 0, variant = 0;
  switch (type) {
    case cudaGraphNodeTypeKernel:
      g.kinds.push_back(NodeKind::kKernel);
      key = with_launch_attributes(node, key);
      if (with_params) variant = read_kernel_node(node, g);
      break;
    case cudaGraphNodeTypeMemcpy: {
      g.kinds.push_back(NodeKind::kMemcpy);
      if (!with_params) break;
      cudaMemcpy3DParms p{};
      cuda::check(cudaGraphMemcpyNodeGetParams(node, &p), "cudaGraphMemcpyNodeGetParams");
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
      cuda::check(cudaGraphMemsetNodeGetParams(node, &p), "cudaGraphMemsetNodeGetParams");
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
  // memsets by what an update may not change, and kernel nodes with kernel nodes, preferably of
  // the same kernel (Note [Near topologies]).
  g.keys.push_back(mix(key, detail));
  if (with_params) g.variants.push_back(variant);
  return key;
}

// The graph's edges as node index pairs, sorted; plain_edges cleared where one carries data.
void read_edges(cudaGraph_t graph, const std::unordered_map<cudaGraphNode_t, uint32_t>& index,
                GraphContents& g) {
  size_t edge_count = 0;
#if CUDART_VERSION >= 12030
  // With edge data: the query without it fails where an edge carries any (CUDA 12.3+).
#if CUDART_VERSION >= 13000
  constexpr auto get_edges = cudaGraphGetEdges;
#else
  constexpr auto get_edges = cudaGraphGetEdges_v2;
#endif
  cuda::check(get_edges(graph, nullptr, nullptr, nullptr, &edge_count), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  std::vector<cudaGraphEdgeData> data(edge_count);
  cuda::check(get_edges(graph, from.data(), to.data(), data.data(), &edge_count), "cudaGraphGetEdges");
  for (const cudaGraphEdgeData& e : data) {
    if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0 || e.to_port != 0) {
      g.plain_edges = false;
    }
  }
#else
  cuda::check(cudaGraphGetEdges(graph, nullptr, nullptr, &edge_count), "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  cuda::check(cudaGraphGetEdges(graph, from.data(), to.data(), &edge_count), "cudaGraphGetEdges");
#endif
  g.edges.reserve(edge_count);
  for (size_t e = 0; e < edge_count; ++e) g.edges.emplace_back(index.at(from[e]), index.at(to[e]));
  std::sort(g.edges.begin(), g.edges.end());
}

// The driver's mangled name in a stored one: without its image and its parameters' sizes.
std::string mangled_name(const std::string& stored) {
  const std::string plain = core::without_image(stored);
  return plain.substr(0, plain.find('('));
}

}  // namespace

GraphContents read_graph(cudaGraph_t graph, bool with_params) {
  GraphContents g;
  size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  g.nodes.resize(count);
  check(cudaGraphGetNodes(graph, g.nodes.data(), &count), "cudaGraphGetNodes");
  std::unordered_map<cudaGraphNode_t, uint32_t> index;
  index.reserve(count);
  for (uint32_t i = 0; i < count; ++i) index.emplace(g.nodes[i], i);
  g.kinds.reserve(count);
  g.keys.reserve(count);
  if (with_params) {
    g.blobs.reserve(count);
    g.variants.reserve(count);
  }
  const DriverApi& d = driver();
  if (d.cuGraphNodeGetType == nullptr || d.cuGraphKernelNodeGetAttribute == nullptr) {
    throw std::runtime_error(
        "grape: the CUDA driver lacks cuGraphNodeGetType or cuGraphKernelNodeGetAttribute");
  }
  uint64_t h = mix(0, count);
  for (uint32_t i = 0; i < count && g.readable; ++i) h = mix(h, read_node(g.nodes[i], with_params, g));
  if (!g.readable) return g;
  read_edges(graph, index, g);
  for (const auto& [a, b] : g.edges) h = mix(h, (static_cast<uint64_t>(a) << 32) | b);
  g.topology = h;
  return g;
}

std::optional<uint64_t> kernel_in(const core::Blob& blob) {
  if (blob.size() < sizeof(KernelHeader)) return std::nullopt;
  KernelHeader h;
  std::memcpy(&h, blob.data(), sizeof(h));
  return h.func != 0 ? h.func : h.kern;
}

core::NodeLayout storable_layout(NodeKind kind, const core::Blob& blob) {
  core::NodeLayout layout;
  if (blob.empty()) return layout;  // a node the shape lacks
  auto at = [](size_t offset) { return static_cast<uint32_t>(offset); };
  switch (kind) {
    case NodeKind::kKernel: {
      if (blob.size() < sizeof(KernelHeader)) return layout;
      KernelHeader h;
      std::memcpy(&h, blob.data(), sizeof(h));
      // The handle launched names the kernel. The context (and a kernel handle beside a
      // function) the driver ignores where a function is set, and kernel_blob clears them then.
      layout.kernel_word = at(h.func != 0 ? offsetof(KernelHeader, func)
                                          : offsetof(KernelHeader, kern));
      if (h.func == 0) layout.handle_words.push_back(at(offsetof(KernelHeader, ctx)));
      layout.arguments_begin = at(sizeof(KernelHeader));
      // Arguments start 8-aligned (the header's size), and device pointers are 8-aligned in them:
      // each 8-byte parameter, and each 8-byte word of a larger one (a struct may hold pointers).
      // Smaller parameters (an int) are never addresses; with no layout (an argument buffer),
      // every word may be.
      static_assert(sizeof(KernelHeader) % sizeof(uint64_t) == 0, "arguments must start aligned");
      CUDA_KERNEL_NODE_PARAMS p{};
      p.func = reinterpret_cast<CUfunction>(h.func);
      p.kern = reinterpret_cast<CUkernel>(h.kern);
      const ParamLayout* params = h.packed == 0 ? layout_of(p) : nullptr;
      const size_t arguments = blob.size() - sizeof(KernelHeader);
      auto add_words = [&](size_t begin, size_t end) {
        for (size_t word = (begin + 7) / 8 * 8; word + sizeof(uint64_t) <= std::min(end, arguments);
             word += sizeof(uint64_t)) {
          layout.address_words.push_back(at(sizeof(KernelHeader) + word));
        }
      };
      if (params == nullptr) {
        add_words(0, arguments);
      } else {
        for (const auto& [offset, size] : params->params) {
          if (size >= sizeof(uint64_t)) add_words(offset, offset + size);
        }
        std::sort(layout.address_words.begin(), layout.address_words.end());
        layout.address_words.erase(
            std::unique(layout.address_words.begin(), layout.address_words.end()),
            layout.address_words.end());
      }
      break;
    }
    case NodeKind::kMemcpy:
      layout.handle_words = {at(offsetof(cudaMemcpy3DParms, srcArray)),
                             at(offsetof(cudaMemcpy3DParms, dstArray))};
      layout.address_words = {
          at(offsetof(cudaMemcpy3DParms, srcPtr) + offsetof(cudaPitchedPtr, ptr)),
          at(offsetof(cudaMemcpy3DParms, dstPtr) + offsetof(cudaPitchedPtr, ptr))};
      break;
    case NodeKind::kMemset:
      layout.address_words = {at(offsetof(cudaMemsetParams, dst))};
      break;
    case NodeKind::kEmpty:
      break;
  }
  return layout;
}

std::optional<std::string> stored_kernel_name(uint64_t handle, uint32_t at) {
  CUDA_KERNEL_NODE_PARAMS p{};
  if (at == offsetof(KernelHeader, func)) {
    p.func = reinterpret_cast<CUfunction>(handle);
  } else if (at == offsetof(KernelHeader, kern)) {
    p.kern = reinterpret_cast<CUkernel>(handle);
  } else {
    return std::nullopt;
  }
  const DriverApi& d = driver();
  const char* name = nullptr;
  const CUresult named = p.func != nullptr
                             ? (d.cuFuncGetName ? d.cuFuncGetName(&name, p.func)
                                                : CUDA_ERROR_NOT_SUPPORTED)
                             : (d.cuKernelGetName ? d.cuKernelGetName(&name, p.kern)
                                                  : CUDA_ERROR_NOT_SUPPORTED);
  if (named != CUDA_SUCCESS || name == nullptr) return std::nullopt;
  // Generated kernels may repeat a name: their parameters' sizes tell more of them apart, and
  // their images' digests tell them apart (Note [Kernel images]).
  std::string stored = name;
  if (const ParamLayout* layout = layout_of(p)) {
    stored += "(";
    for (const auto& [offset, size] : layout->params) stored += std::to_string(size) + ",";
    stored += ")";
  }
  const std::optional<uint64_t> image = p.func ? function_image(p.func) : kernel_image(p.kern);
  return image ? core::with_image(stored, *image) : stored;
}

std::optional<uint64_t> kernel_in_image(const core::Blob& image, uint32_t at,
                                        const std::string& name) {
  if (at != offsetof(KernelHeader, func) && at != offsetof(KernelHeader, kern)) return {};
  const std::optional<uint64_t> found =
      kernel_from_image(image, mangled_name(name), at == offsetof(KernelHeader, func));
  if (!found || stored_kernel_name(*found, at) != name) return std::nullopt;
  return found;
}

std::optional<uint64_t> kernel_beside(uint64_t beside, uint32_t at, const std::string& name) {
  const std::string mangled = mangled_name(name);
  const DriverApi& d = driver();
  uint64_t found = 0;
  if (at == offsetof(KernelHeader, func)) {
    CUmodule module = nullptr;
    CUfunction function = nullptr;
    if (!d.cuFuncGetModule || !d.cuModuleGetFunction ||
        d.cuFuncGetModule(&module, reinterpret_cast<CUfunction>(beside)) != CUDA_SUCCESS ||
        d.cuModuleGetFunction(&function, module, mangled.c_str()) != CUDA_SUCCESS) {
      return std::nullopt;
    }
    found = reinterpret_cast<uint64_t>(function);
  } else if (at == offsetof(KernelHeader, kern)) {
    CUlibrary library = nullptr;
    CUkernel kernel = nullptr;
    if (!d.cuKernelGetLibrary || !d.cuLibraryGetKernel ||
        d.cuKernelGetLibrary(&library, reinterpret_cast<CUkernel>(beside)) != CUDA_SUCCESS ||
        d.cuLibraryGetKernel(&kernel, library, mangled.c_str()) != CUDA_SUCCESS) {
      return std::nullopt;
    }
    found = reinterpret_cast<uint64_t>(kernel);
  } else {
    return std::nullopt;
  }
  // The parameters' sizes must agree too: a name alone may stand for other code.
  if (stored_kernel_name(found, at) != name) return std::nullopt;
  return found;
}

bool is_driver_address(uint64_t value) {
  // Small numbers are sizes and counts, never mapped memory: no driver call for them.
  if (value < (uint64_t{1} << 16)) return false;
  const DriverApi& d = driver();
  if (d.cuPointerGetAttribute == nullptr) return false;
  unsigned int type = 0;
  return d.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 static_cast<CUdeviceptr>(value)) == CUDA_SUCCESS;
}

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

void write_absent(cudaGraphExec_t exec, cudaGraphNode_t node, NodeKind kind) {
  switch (kind) {
    case NodeKind::kKernel: {
      CUlaunchAttributeValue cluster;
      dim3 grid(1);  // no cluster attribute: one block
      if (kernel_attribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, cluster) &&
          cluster.clusterDim.x > 0) {
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

}  // namespace grape::cuda
