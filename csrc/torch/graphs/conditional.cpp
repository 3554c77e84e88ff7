#include "torch/graphs/conditional.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "torch/memory/allocator_hook.h"
#include "torch/memory/capture_state.h"

namespace grape {

namespace {

cuda::ConditionalKind parse_kind(const std::string& kind) {
  if (kind == "if") return cuda::ConditionalKind::kIf;
  if (kind == "if_else") return cuda::ConditionalKind::kIfElse;
  if (kind == "while") return cuda::ConditionalKind::kWhile;
  TORCH_CHECK(false, "grape: unknown conditional kind '", kind, "'");
}

void check_condition(const at::Tensor& condition, const char* what) {
  TORCH_CHECK_TYPE(condition.defined() && condition.is_cuda(), what,
                   " needs a one-element CUDA bool tensor as its condition, got ",
                   condition.defined() ? "a tensor on " + condition.device().str() : "None");
  TORCH_CHECK_TYPE(condition.scalar_type() == at::kBool, what,
                   " needs a one-element CUDA bool tensor as its condition, got dtype ",
                   condition.scalar_type(), " (compare it, e.g. x > 0)");
  TORCH_CHECK_VALUE(condition.numel() == 1, what,
                    " needs a one-element CUDA bool tensor as its condition, got ",
                    condition.numel(), " elements (reduce it, e.g. x.any() or x.all())");
}

int version_of(cudaError_t (*get)(int*)) {
  int v = 0;
  if (get(&v) != cudaSuccess) (void)cudaGetLastError();
  return v;
}

}  // namespace

std::string conditional_unsupported_reason(const std::string& kind) {
  const bool supported = parse_kind(kind) == cuda::ConditionalKind::kIfElse
                             ? cuda::if_else_supported()
                             : cuda::conditional_nodes_supported();
  if (supported) return "";
  const char* needs = parse_kind(kind) == cuda::ConditionalKind::kIfElse ? "12.8" : "12.4";
  return "CUDA conditional graph nodes need a CUDA " + std::string(needs) +
         " runtime and driver; this process has runtime " +
         std::to_string(version_of(&cudaRuntimeGetVersion)) + " and driver " +
         std::to_string(version_of(&cudaDriverGetVersion));
}

ConditionalBranch::ConditionalBranch(const at::Tensor& condition, const std::string& kind)
    : condition_(condition), parent_stream_(c10::cuda::getCurrentCUDAStream()) {
  check_condition(condition, kind == "while" ? "grape.while_loop" : "grape.Predicate");
  const std::string unsupported = conditional_unsupported_reason(kind);
  TORCH_CHECK(unsupported.empty(), "grape: ", unsupported);
  TORCH_CHECK(condition.device().index() == parent_stream_.device_index(),
              "grape: the condition is on ", condition.device().str(),
              " but the capture runs on cuda:", static_cast<int>(parent_stream_.device_index()));
  TORCH_CHECK(current_stream_is_capturing(), "grape: the current stream is not capturing");
  C10_CUDA_CHECK(cuda::add_conditional_node(parent_stream_.stream(),
                                            condition.const_data_ptr<bool>(), parse_kind(kind),
                                            &node_));
}

ConditionalBranch::~ConditionalBranch() {
  if (body_ >= 0) {
    try {
      end_body();
    } catch (const std::exception& e) {
      TORCH_WARN("grape: ending a branch body failed: ", e.what());
    }
  }
}

void ConditionalBranch::begin_body(int index) {
  TORCH_CHECK(body_ < 0, "grape: a body of this branch is already being captured");
  TORCH_CHECK(index >= 0 && index < node_.body_count, "grape: this branch has no body ", index,
              index == 1 ? " (otherwise() needs CUDA 12.8 conditional IF/ELSE nodes)" : "");
  if (index == 1) {
    // The ELSE body runs where the IF node is: nothing may have been captured since the IF body.
    TORCH_CHECK(if_body_done_, "grape: otherwise() follows its Predicate block");
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    size_t count = 0;
    C10_CUDA_CHECK(cuda::capture_position(parent_stream_.stream(), &graph, &deps, &count));
    TORCH_CHECK(count == 1 && deps[0] == node_.node,
                "grape: otherwise() must directly follow its Predicate block: GPU work between "
                "them would run after the else body in eager but before it in the graph");
  }
  // The pool hands out its streams in turn: skip one still capturing (an enclosing body's, or the
  // capture stream of a torch.cuda.graph).
  auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, parent_stream_.device_index());
  for (int tries = 0; tries < 64; ++tries) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
    if (status == cudaStreamCaptureStatusNone) break;
    stream = c10::cuda::getStreamFromPool(false, parent_stream_.device_index());
  }
  C10_CUDA_CHECK(cudaStreamBeginCaptureToGraph(stream.stream(), node_.bodies[index], nullptr,
                                               nullptr, 0, cudaStreamCaptureModeThreadLocal));
  body_stream_ = stream;
  body_ = index;
  // Allocations of the body come from the arena of the capture around it.
  if (AllocationRoute* around = current_allocation_route()) {
    route_ = std::make_unique<AllocationRoute>(around->arena(), stream.stream(), false);
  }
  c10::cuda::setCurrentCUDAStream(stream);
}

void ConditionalBranch::end_body() {
  TORCH_CHECK(body_ >= 0, "grape: no body of this branch is being captured");
  route_.reset();
  c10::cuda::setCurrentCUDAStream(parent_stream_);
  cudaGraph_t body = nullptr;
  const cudaError_t err = cudaStreamEndCapture(body_stream_->stream(), &body);
  if (body_ == 0) if_body_done_ = true;
  body_ = -1;
  body_stream_.reset();
  C10_CUDA_CHECK(err);
}

void ConditionalBranch::set_condition(const at::Tensor& condition) {
  check_condition(condition, "grape.while_loop");
  TORCH_CHECK(body_ == 0 && body_stream_, "grape: set_condition belongs at the end of a body");
  C10_CUDA_CHECK(cuda::launch_set_condition(node_.handle, condition.const_data_ptr<bool>(),
                                            body_stream_->stream()));
  condition_ = condition;  // kept alive with the branch object
}

}  // namespace grape
