#pragma once
// grape.Predicate and grape.while_loop under capture: one conditional node and the capture of its
// bodies (Note [Conditional capture] in cuda/conditional.h). Allocations in a body come from the
// arena of the capture it belongs to, like the rest of the capture.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <optional>
#include <string>

#include "cuda/conditional.h"

namespace grape {

class AllocationRoute;

class ConditionalBranch {
 public:
  // Adds the node at the current position of the capture on the current stream. `kind`: "if",
  // "if_else" or "while". `condition`: a one-element CUDA bool tensor.
  ConditionalBranch(const at::Tensor& condition, const std::string& kind);
  ~ConditionalBranch();
  ConditionalBranch(const ConditionalBranch&) = delete;
  ConditionalBranch& operator=(const ConditionalBranch&) = delete;

  // Captures what follows, until end_body(), into body `index` (0: IF and WHILE, 1: ELSE) on a
  // side stream made current. The ELSE body must directly follow the IF body: nothing may be
  // captured between them.
  void begin_body(int index);
  void end_body();
  // At the end of a WHILE body: the condition for the next iteration.
  void set_condition(const at::Tensor& condition);
  int bodies() const { return node_.body_count; }

 private:
  at::Tensor condition_;
  cuda::ConditionalNode node_;
  c10::cuda::CUDAStream parent_stream_;
  std::optional<c10::cuda::CUDAStream> body_stream_;
  std::unique_ptr<AllocationRoute> route_;
  int body_ = -1;  // the body being captured
  bool if_body_done_ = false;
};

// Why conditional capture cannot work in this process, or "" when it can (`kind` as above).
std::string conditional_unsupported_reason(const std::string& kind);

}  // namespace grape
