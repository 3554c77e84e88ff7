#pragma once
// Between a CapturedGraph and what the graph cache keeps of it besides its nodes (Note [Stored
// entries] in core/stored_entry.h): a captured graph written as a stored entry, or why it cannot
// be, and a stored entry made into a graph that replays in this process without a capture.

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/stored_entry.h"
#include "torch/graphs/captured_graph.h"

namespace grape {

// The tensors of the function's modules by name (grape/_graph_cache.py names them: the compiled
// module's, and those of the modules its code reaches), which stored graphs refer to by name.
struct NamedTensors {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // The name of the tensor whose storage is `t`'s, its view equal to `t`'s; "" where none is.
  std::string name_of(const at::Tensor& t) const;
  const at::Tensor* find(const std::string& name) const;
};

// `graph`'s stored entry, or nothing with `why` set: a graph whose capture recorded what a stored
// entry cannot hold (a training step's state, pinned host constants, random numbers, a
// placeholder, output or static tensor outside the arena and the named tensors, a result the tree
// cannot name).
std::optional<core::StoredEntry> store_entry(const CapturedGraph& graph, const GraphArena& arena,
                                             const NamedTensors& named, std::string& why);

// A graph of `entry` that replays member `member` of `executables`, reading and writing `pool`'s
// arena at the stored offsets (which the caller mapped); or null with `why` set (a module tensor
// or a result type this process lacks).
std::unique_ptr<CapturedGraph> restore_entry(
    const core::StoredEntry& entry, const std::shared_ptr<GraphPool>& pool,
    const std::shared_ptr<cuda::SharedExecutables>& executables,
    cuda::SharedExecutables::Member member, size_t nodes, const NamedTensors& named,
    std::string& why);

}  // namespace grape
