#pragma once
// What one capture recorded: the graph, where its inputs go, how to rebuild its outputs, and the
// state outside the arguments that it read (module parameters, gradients, optimizer settings).
// capture.cpp builds it, replay.cpp replays it, runtime.cpp keeps it per call signature.

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/shared_executables.h"
#include "torch/memory/graph_pool.h"
#include "torch/python/pytree.h"
#include "torch/python/side_effects.h"
#include "torch/graphs/training.h"

namespace grape {

namespace py = pybind11;

struct InputBuffer;
class InputSites;

struct CapturedGraph {
  struct Placeholder {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool mutated = false;
    bool chained = false;                 // predicted: an earlier replay's output, used in place
    std::shared_ptr<InputBuffer> buffer;  // predicted: a site's input buffer, used in place
    // An allocation site's buffer: `buffer` where captured; where restored from the graph cache,
    // the memory this process's sites hand out there (a replay asks them whether a tensor holds
    // a buffer over it).
    bool site_buffer = false;
    // Whether a tensor holds the site's buffer that this placeholder is (`sites`: the function's,
    // null without alias prediction), so that no copy may go there.
    bool site_buffer_held(const InputSites* sites) const;
  };
  // Where an output's storage comes from, and so what a replay returns (docs/design.md, Capture).
  struct OutputStorage {
    enum class Source {
      kPool,    // the function's arena or private pool: a fresh tensor over the same memory
      kInput,   // an input's placeholder: a view of the caller's input
      kStatic,  // anything else (a parameter, a global tensor): the captured tensor itself
    };
    Source source = Source::kPool;
    void* ptr = nullptr;  // kPool
    size_t bytes = 0;     // kPool
    int input = -1;       // kInput: the input whose placeholder this is
  };
  struct OutputTensor {
    int storage = -1;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t offset = 0;  // elements from the storage's start (the placeholder's, for kInput)
    at::ScalarType dtype = at::kFloat;
    at::Tensor static_tensor;  // returned as is when its storage is static state
  };

  CapturedGraph() = default;
  static uint64_t next_id();
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // This process's number for it, never reused (an address is, once a graph is freed).
  const uint64_t id = next_id();
  std::shared_ptr<GraphPool> pool;  // outlives the graph
  std::unique_ptr<ReplayGraph> graph;  // null for a shape restored from the graph cache
  size_t nodes = 0;  // of the captured graph (core::CaptureCost)
  // The executable that replays it, shared with the graphs of its topology.
  std::shared_ptr<cuda::SharedExecutables> executables;
  cuda::SharedExecutables::Member member;

  std::vector<Placeholder> placeholders;
  // Set once a later capture reads an output of this graph in place (chain prediction): a variant
  // of its signature, laying out its outputs anew, would break that chain (Note [Chain variants]).
  // Shared with the outputs handed out, which outlive nothing they point to.
  std::shared_ptr<bool> outputs_read_in_place = std::make_shared<bool>(false);
  TreeSpec output_spec;
  std::vector<OutputStorage> output_storages;
  std::vector<OutputTensor> output_tensors;
  // Static state, checked before every replay: the parameters and buffers of the compiled module
  // and of module arguments, the leaves a training step tracks and the optimizers' state, each with
  // its address.
  std::vector<std::pair<at::Tensor, const void*>> static_tensors;
  // Where the modules' share of static_tensors is still to be gathered (gather_static_tensors):
  // walking every module costs a capture about as much as reading its graph, and nothing checks
  // the static state before the graph's first replay has been launched.
  struct PendingStatics {
    py::object static_module;          // the compiled module, or None
    std::vector<py::object> modules;   // module arguments
    std::vector<at::Tensor> leaves;    // tracked leaves (Note [Gradients of a captured step])
  };
  std::optional<PendingStatics> pending_statics;
  // Attributes of argument objects that f rebinds (Note [Argument objects]) and gradients that
  // its backward pass replaces (Note [Gradients of a captured step]); when there are any, the
  // outputs are (f's result, the effects' values).
  std::vector<Effect> effects;
  // Gradients the graph reads or accumulates into where they are.
  std::vector<GradGuard> grad_guards;
  // (param group, key, value): the optimizers' settings the graph baked in.
  py::list hyperparameters;
  // grape._training.DeviceSettings: the settings it reads from device memory (Note [Device
  // settings]), written before each replay.
  py::list device_settings;
  // Pinned host tensors the graph copies to the device (Note [Host constants]).
  py::list host_constants;

  // Records where each tensor of `results` (f's flattened outputs) lives, given the capture's
  // `placeholders` and the pool (whose segments must be fresh).
  void classify_outputs(const FlatCall& results, const std::vector<at::Tensor>& placeholders);
  // After a launch: f's result for the call `flat`, over the memory the graph wrote, with the
  // effects applied to the call's argument objects.
  py::object rebuild_outputs(FlatCall& flat) const;
  // Adds the pending modules' parameters and buffers and the leaves not among them to
  // static_tensors; does nothing once they are there. Called after the first launch.
  void gather_static_tensors();

  // What of the static state is not as it was captured, if anything; `changed` says it in words.
  enum class StateChange { kNone, kTensorMoved, kGradientMoved, kOptimizerSetting };
  StateChange static_state_change(std::string& changed);
};

// Bytes from a tensor's first element to one past its last (its placeholder's storage size).
size_t span_bytes(const at::Tensor& t);
// Whether `t` is its whole storage of `bytes` bytes, laid out from the storage's start: what a
// placeholder of `t`'s sizes and strides would be.
bool is_whole_storage(const at::Tensor& t, size_t bytes);
// The index of the placeholder whose storage is `impl`, or -1.
int placeholder_of(const std::vector<at::Tensor>& placeholders, const c10::StorageImpl* impl);

}  // namespace grape
