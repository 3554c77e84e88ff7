#pragma once
// A CUDA graph node by node, for shared executables (Note [Shared executables]): reading a captured
// graph's nodes and parameters, writing a node's parameters into an executable (or a no-op where a
// shape lacks the node: Note [Near topologies]), and copying nodes into another graph. A node's
// parameters are a blob (core/param_codec.h); how a kernel's blob is laid out is this file's
// business alone.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/graph_relocation.h"
#include "core/param_codec.h"
#include "core/topology_union.h"

namespace grape::cuda {

// Throws std::runtime_error ("grape: `what` failed: ...") unless `status` is cudaSuccess,
// clearing the error.
void check(cudaError_t status, const char* what);

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

// Reads `graph` in creation order (cudaGraphGetNodes, the order cudaGraphExecUpdate matches nodes
// by). `with_params`: also every node's blob and variant, or why one cannot be read (`readable`);
// without, only the topology. Throws std::runtime_error where the runtime fails.
GraphContents read_graph(cudaGraph_t graph, bool with_params);

// The kernel (its function or kernel handle) that a kernel node's blob launches; nothing for a
// blob too short to be one (an absent node's, which is empty).
std::optional<uint64_t> kernel_in(const core::Blob& blob);

// Where a node's blob holds addresses and driver handles, for storing it (Note [Relocating stored
// graphs]): a kernel's function (or kernel) handle, its context, and every 8-byte word of its
// arguments (pointers also sit inside argument structs); a copy's and a memset's pointers.
core::NodeLayout storable_layout(NodeKind kind, const core::Blob& blob);

// The name a stored graph keeps for the kernel handle at byte `at` of a kernel node's blob: the
// driver's mangled name and its parameters' sizes; nothing where the driver names none.
std::optional<std::string> stored_kernel_name(uint64_t handle, uint32_t at);

// A kernel named `name` (as stored_kernel_name names it) in the module or library of `beside`, a
// kernel handle of this process held at byte `at` of a kernel node's blob: how a restored graph
// finds a kernel that no live capture ran (cuBLAS runs another GEMM at another length, from the
// same library). Nothing where there is none of that name and parameter sizes.
std::optional<uint64_t> kernel_beside(uint64_t beside, uint32_t at, const std::string& name);

// The kernel named `name` (with its image: Note [Kernel images]) from the stored image `image`,
// as a handle for byte `at` of a kernel node's blob: how a restored graph runs a generated kernel
// that no live capture ran. Nothing where the image lacks it.
std::optional<uint64_t> kernel_in_image(const core::Blob& image, uint32_t at,
                                        const std::string& name);

// Whether `value` is an address the driver knows (device, managed or registered host memory).
bool is_driver_address(uint64_t value);

// Whether a shape may lack node `node` (of `kind`): a kernel or a one-dimensional memset, run as a
// no-op in its place (Note [Near topologies]). A copy's no-op would need its memory kinds.
bool may_be_absent(cudaGraphNode_t node, NodeKind kind);

// Makes node `node` of `exec`, which the shape lacks, do nothing: a kernel that does nothing (in
// the node's clusters), a memset of an element nothing reads. Not disabled: see cuda/noop_nodes.h.
void write_absent(cudaGraphExec_t exec, cudaGraphNode_t node, NodeKind kind);

// Writes node `node`'s parameters `blob` into `exec`. An empty blob (other than an empty node's)
// is a node the shape lacks (Note [Near topologies]). Throws std::runtime_error where the driver
// refuses them.
void write_node(cudaGraphExec_t exec, cudaGraphNode_t node, NodeKind kind, const core::Blob& blob);

// A node in `graph` like `source` (a node of a captured graph, read as `kind`): same parameters
// and launch attributes, no dependencies yet.
cudaGraphNode_t add_node_like(cudaGraph_t graph, cudaGraphNode_t source, NodeKind kind);

void add_edge(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to);

// Destroys a graph it holds at scope exit: set `graph` to null to keep it.
struct GraphOwner {
  cudaGraph_t graph;
  ~GraphOwner() {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

}  // namespace grape::cuda
