#include "torch/graphs/graph_cache.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "core/host_memory.h"
#include "core/kernel_images.h"
#include "cuda/graph_nodes.h"
#include "cuda/module_images.h"

namespace grape {

namespace {

// `signature` as a stored signature: its words, and what each local word stands for here.
core::StoredSignature stored_signature(const core::Signature& signature,
                                       const Flattener& flattener) {
  core::StoredSignature stored;
  stored.words = signature.words();
  stored.local_positions = signature.local_positions();
  for (uint32_t at : stored.local_positions) {
    stored.local_descriptions.push_back(
        at == 0 ? std::string() : flattener.describe_local(stored.words[at - 1], stored.words[at]));
  }
  return stored;
}

// The arena's lanes, their whole reserved ranges. A word beyond what its lane maps is no block's:
// storing keeps it as a leftover (save), a live capture's is then not compared; a restored shape
// maps what it needs first (StoredEntry::lane_extents).
std::vector<core::AddressRange> arena_lanes(const GraphArena& arena) {
  std::vector<core::AddressRange> lanes;
  for (int lane = 0; lane < GraphArena::kLanes; ++lane) {
    lanes.push_back(arena.lane_range(static_cast<ArenaLane>(lane)));
  }
  return lanes;
}

// `ask` (a driver query) with each answer remembered for the life of the function returned: one
// save or one match, where a group's shapes hold the same workspaces and kernels node after node
// (RestoreContext::found_kernels does the same for kernels no live capture ran). Not longer: a
// library may unload a module, and its handles then name other code.
template <typename Result, typename... Args>
std::function<Result(Args...)> remembered(std::function<Result(Args...)> ask) {
  using Key = std::tuple<std::decay_t<Args>...>;
  return [answers = std::make_shared<std::map<Key, Result>>(), ask = std::move(ask)](
             Args... args) {
    const auto [known, added] = answers->try_emplace(Key(args...));
    if (added) known->second = ask(args...);
    return known->second;
  };
}

// The images of the group's kernels named with one that this process kept (Note [Kernel
// images]): a later process loads them where its live captures did not run those kernels.
void attach_images(core::StoredGroup& group) {
  for (const std::string& name : group.names.kernels) {
    const std::optional<uint64_t> digest = core::image_of(name);
    if (!digest || group.names.images.count(*digest) != 0) continue;
    if (std::optional<core::Blob> image = cuda::module_image(*digest)) {
      group.names.images.emplace(*digest, std::move(*image));
    }
  }
}

std::vector<core::NodeLayout> layouts_of(const cuda::SharedExecutables::MemberParams& params) {
  std::vector<core::NodeLayout> layouts;
  for (size_t node = 0; node < params.blobs.size(); ++node) {
    layouts.push_back(cuda::storable_layout(params.kinds[node], params.blobs[node]));
  }
  return layouts;
}

// The named tensors' storages, each once, under the first of its names: tied weights share one
// storage (a language model's head and embedding), and the name an address is stored under must
// not depend on which of them a lookup meets first.
std::vector<std::pair<std::string, core::AddressRange>> storage_ranges(const NamedTensors& named) {
  std::vector<std::pair<std::string, core::AddressRange>> ranges;
  core::AddressRangeSet seen;
  for (const auto& [name, tensor] : named.tensors) {
    const core::AddressRange range =
        core::make_range(tensor.storage().data(), tensor.storage().nbytes());
    if (range.empty() || seen.overlaps(range)) continue;
    seen.add(range);
    ranges.emplace_back(name, range);
  }
  return ranges;
}

// The same, by name, as a later process looks them up.
std::unordered_map<std::string, core::AddressRange> tensor_map(const NamedTensors& named) {
  const auto ranges = storage_ranges(named);
  return {ranges.begin(), ranges.end()};
}

}  // namespace

GraphCache::GraphCache(std::string path, std::string key)
    : path_(std::move(path)), key_(std::move(key)) {
  const auto start = core::Clock::now();
  std::string error;
  const core::Blob bytes = core::read_whole_file(path_, error);
  figures_.file_bytes = static_cast<int64_t>(bytes.size());
  if (!error.empty()) {
    figures_.status = "unreadable: " + error;
  } else if (bytes.empty()) {
    figures_.status = "no file";
  } else {
    core::DecodedGraphFile file = core::decode_graph_file(bytes, key_);
    switch (file.status) {
      case core::DecodedGraphFile::Status::kRead: figures_.status = "read"; break;
      case core::DecodedGraphFile::Status::kMiss: figures_.status = "miss: " + file.why; break;
      case core::DecodedGraphFile::Status::kUnreadable:
        figures_.status = "unreadable: " + file.why;
        break;
    }
    groups_ = std::move(file.groups);
  }
  restores_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    restores_[g].restored.assign(groups_[g].shapes.size(), false);
    figures_.stored_shapes += static_cast<int64_t>(groups_[g].shapes.size());
  }
  figures_.stored_groups = static_cast<int64_t>(groups_.size());
  figures_.load_ns = core::elapsed_ns(start);
}

std::optional<GraphCache::Found> GraphCache::find(const core::Signature& signature,
                                                  const Flattener& flattener) {
  if (groups_.empty()) return std::nullopt;
  const core::StoredSignature live = stored_signature(signature, flattener);
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    if (restores_[g].state == GroupState::kDropped) continue;
    for (uint32_t s = 0; s < groups_[g].shapes.size(); ++s) {
      const core::StoredSignature& stored = groups_[g].shapes[s].signature;
      // An object keyed by identity is described by its type alone: which of this process's
      // objects of that type the stored one was, no call can tell (a module argument: one
      // layer for another). Such shapes are captured.
      const bool by_identity = std::any_of(
          stored.local_descriptions.begin(), stored.local_descriptions.end(),
          [](const std::string& d) { return d.rfind("identity ", 0) == 0; });
      if (!by_identity && !restores_[g].restored[s] &&
          restores_[g].local_words.learn(stored, live)) {
        return Found{g, s};
      }
    }
  }
  return std::nullopt;
}

bool GraphCache::validated(const Found& found) const {
  return restores_.at(found.group).state == GroupState::kValidated;
}

bool GraphCache::awaits_validation(const Found& found) const {
  return restores_.at(found.group).state == GroupState::kUnseen;
}

void GraphCache::drop(GroupRestore& group, uint32_t index, std::string why) {
  group.state = GroupState::kDropped;
  figures_.dropped_groups.push_back("group " + std::to_string(index) + ": " + why);
}

void GraphCache::validate(const Found& found, const CapturedGraph& graph,
                          cuda::SharedExecutables& executables, const NamedTensors& named,
                          bool may_run) {
  GroupRestore& group = restores_.at(found.group);
  if (group.state != GroupState::kUnseen) return;
  const auto start = core::Clock::now();
  std::string why;
  try {
    why = match(found, graph, executables, named, group);
  } catch (const std::exception& e) {
    why = std::string("validating it failed: ") + e.what();
    group.context.differing.clear();
  }
  // A run can tell bytes no kernel reads, once, where the graph does not write its inputs (a
  // second run would write them again).
  bool run_twice = may_run && !group.context.differing.empty() && group.context.unread.empty() &&
                   graph.graph != nullptr && !pending_;
  for (const auto& p : graph.placeholders) run_twice = run_twice && !p.mutated;
  if (why.empty()) {
    group.state = GroupState::kValidated;
    group.live = graph.member;
    group.restored[found.shape] = true;
    ++figures_.validated_groups;
    figures_.leftover_halves += static_cast<int64_t>(group.context.leftover_halves);
    figures_.taken_from_live += static_cast<int64_t>(group.context.taken_from_live);
    figures_.unread_bytes += static_cast<int64_t>(group.context.unread_bytes);
    from_file_.insert(graph.id);
  } else if (run_twice) {
    group.state = GroupState::kPending;
    // The live blobs the match read (RestoreContext::live_blobs), with the stored bytes.
    pending_ = Pending{found, graph.id,
                       core::with_stored_bytes(group.context.live_blobs,
                                               groups_[found.group].shapes[found.shape].nodes,
                                               group.context.differing),
                       why};
  } else {
    drop(group, found.group, why);
  }
  charge_validation(start);
}

void GraphCache::charge_validation(core::Clock::time_point start) {
  const int64_t took = core::elapsed_ns(start);
  figures_.restore_ns += took;
  figures_.restore_validate_ns += took;
}

void GraphCache::settle(const CapturedGraph* current, bool replayed,
                        cuda::SharedExecutables& executables, const NamedTensors& named) {
  if (!pending_) return;
  Pending pending = std::move(*pending_);
  pending_.reset();
  GroupRestore& group = restores_.at(pending.found.group);
  std::string why = pending.why;
  bool same = false;
  if (!replayed || current == nullptr || current->id != pending.graph) {
    why += "(untested: its call did not replay the live capture)";
  } else {
    const auto start = core::Clock::now();
    std::string failed;
    try {
      same = same_outputs(*current, groups_[pending.found.group].topology, executables,
                          pending.variant, failed);
    } catch (const std::exception& e) {
      failed = std::string("the run failed: ") + e.what();
    }
    charge_validation(start);
    why += failed.empty() ? "(a run with the stored bytes gave other outputs)" : "(" + failed + ")";
  }
  if (!same) {
    drop(group, pending.found.group, why);
    return;
  }
  group.context.unread = std::move(group.context.differing);
  group.state = GroupState::kUnseen;
  validate(pending.found, *current, executables, named, /*may_run=*/false);  // matches now
}

bool GraphCache::same_outputs(const CapturedGraph& graph, uint64_t topology,
                              cuda::SharedExecutables& executables,
                              const std::vector<core::Blob>& variant, std::string& why) {
  // What the run may change that the call's replay left: its outputs in the pool. It writes no
  // input (validate runs none that does) and no module tensor (none whose version moved), and
  // the arena's other bytes are the next replay's to write.
  const c10::Device device(c10::DeviceType::CUDA, graph.pool->device());
  std::vector<std::pair<at::Tensor, at::Tensor>> kept;  // memory, and a copy of it
  const c10::cuda::CUDAGuard device_guard(device);
  for (const auto& storage : graph.output_storages) {
    if (storage.source != CapturedGraph::OutputStorage::Source::kPool || storage.bytes == 0) {
      continue;
    }
    at::Tensor memory = at::from_blob(storage.ptr, {static_cast<int64_t>(storage.bytes)},
                                      at::TensorOptions().dtype(at::kByte).device(device));
    kept.emplace_back(memory, memory.clone());
  }
  if (kept.empty()) {
    why = "untested: no output in the pool to compare";
    return false;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
  const cuda::SharedExecutables::Member member =
      executables.add_shape(graph.member, topology, variant, stream);
  bool same = true;
  try {
    C10_CUDA_CHECK(cudaGraphLaunch(executables.prepare(member, stream), stream));
    for (auto& [memory, copy] : kept) {
      if (at::equal(memory, copy)) continue;
      same = false;
      memory.copy_(copy);
    }
  } catch (...) {
    executables.remove(member);
    throw;
  }
  executables.remove(member);
  return same;
}

std::string GraphCache::match(const Found& found, const CapturedGraph& graph,
                              cuda::SharedExecutables& executables, const NamedTensors& named,
                              GroupRestore& group) {
  const core::StoredGroup& stored = groups_[found.group];
  // What the replay needs besides the nodes must agree too: the result's tree, the inputs'
  // places, the effects, the static state (the lanes' extents aside: a later process maps more).
  std::string why;
  std::optional<core::StoredEntry> stored_entry =
      core::decode_entry(stored.shapes[found.shape].entry, why);
  if (!stored_entry) return "its stored entry is " + why;
  std::optional<core::StoredEntry> live_entry =
      store_entry(graph, graph.pool->arena(), named, why);
  if (!live_entry) return "the live capture cannot be stored: " + why;
  live_entry->lane_extents = stored_entry->lane_extents;
  if (!core::same_replay(*live_entry, *stored_entry)) {
    return "the live capture's inputs, outputs, effects or static state differ";
  }
  const std::optional<cuda::SharedExecutables::MemberParams> live =
      executables.params_of(graph.member, &why);
  if (!live) {
    why = "the live capture's graph: " + why;
  } else if (live->topology != stored.topology) {
    why = "the live capture has another topology (" + std::to_string(live->blobs.size()) +
          " nodes)";
  } else {
    core::RestoreContext& context = group.context;
    context.lanes = arena_lanes(graph.pool->arena());  // reserved once: they never move
    context.tensors = tensor_map(named);
    context.is_device_address = cuda::is_driver_address;
    context.kernel_name = remembered(decltype(context.kernel_name)(cuda::stored_kernel_name));
    group.live_host = core::this_process_host_addresses();
    context.stored_host = &stored.host;
    context.live_host = &group.live_host;
    // Read from every stored shape once: a match after a run with the stored bytes (settle)
    // has the same shapes.
    if (context.group_bytes.empty()) {
      std::vector<const std::vector<core::StoredNode>*> shapes;
      for (const core::StoredShape& shape : stored.shapes) shapes.push_back(&shape.nodes);
      context.group_bytes = core::group_bytes(shapes);
    }
    // A kernel no live capture ran is looked for beside the ones that did (the same library),
    // and a generated one is loaded from its stored image (Note [Kernel images]).
    context.find_kernel = [&kernels = context.kernels, &images = stored.names.images](
                              const std::string& name, uint32_t at) {
      std::optional<uint64_t> found;
      for (const auto& [known, handle] : kernels) {
        if ((found = cuda::kernel_beside(handle, at, name))) return found;
      }
      const std::optional<uint64_t> digest = core::image_of(name);
      const auto image = digest ? images.find(*digest) : images.end();
      if (image != images.end()) found = cuda::kernel_in_image(image->second, at, name);
      return found;
    };
    context.live_blobs = std::move(live->blobs);  // kept: a pending group's run starts from them
    why = core::match_live_shape(stored.shapes[found.shape].nodes, stored.names,
                                 context.live_blobs, context);
  }
  return why;
}

std::unique_ptr<CapturedGraph> GraphCache::restore(
    const Found& found, const std::shared_ptr<GraphPool>& pool,
    const std::shared_ptr<cuda::SharedExecutables>& executables, const NamedTensors& named) {
  GroupRestore& group = restores_.at(found.group);
  const core::StoredGroup& stored = groups_[found.group];
  const core::StoredShape& shape = stored.shapes[found.shape];
  const auto start = core::Clock::now();
  struct Charge {
    Figures& figures;
    core::Clock::time_point start;
    ~Charge() { figures.restore_ns += core::elapsed_ns(start); }
  } charge{figures_, start};
  group.restored[found.shape] = true;  // tried once: a shape that fails captures from now on
  std::string why;
  std::optional<core::StoredEntry> entry = core::decode_entry(shape.entry, why);
  std::unique_ptr<CapturedGraph> graph;
  core::RelocateResult blobs;
  if (entry) {
    try {
      for (size_t lane = 0; lane < entry->lane_extents.size() && lane < GraphArena::kLanes;
           ++lane) {
        pool->arena().map_at_least(static_cast<ArenaLane>(lane), entry->lane_extents[lane]);
      }
    } catch (const c10::Error& e) {
      why = std::string("mapping its arena lanes: ") + e.what_without_backtrace();
    }
  }
  if (entry && why.empty()) {
    // The module tensors as they are now: a weight moved since the group was validated is read
    // where it is.
    const auto relocate_start = core::Clock::now();
    group.context.tensors = tensor_map(named);
    blobs = core::relocate_shape(shape.nodes, stored.names, group.context);
    figures_.restore_relocate_ns += core::elapsed_ns(relocate_start);
    why = blobs.why_not;
  }
  if (entry && why.empty()) {
    graph = restore_entry(*entry, pool, executables, {}, shape.nodes.size(), named, why);
  }
  if (graph) {
    try {
      const c10::cuda::CUDAGuard device_guard(pool->device());
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream(pool->device()).stream();
      const auto join_start = core::Clock::now();
      graph->member = executables->add_shape(group.live, stored.topology, blobs.blobs, stream);
      figures_.restore_join_ns += core::elapsed_ns(join_start);
    } catch (const std::exception& e) {
      why = std::string("the driver refused its parameters: ") + e.what();
      graph.reset();
    }
  }
  if (!graph) {
    ++figures_.unrestored[why];
    return nullptr;
  }
  ++figures_.restored_shapes;
  from_file_.insert(graph->id);
  return graph;
}

std::string GraphCache::save(const std::vector<ShapeToStore>& shapes, const std::string& key,
                             cuda::SharedExecutables& executables, const GraphArena& arena,
                             const NamedTensors& named, const Flattener& flattener) {
  // Nothing captured since the last write (or the read): nothing to store, at no cost (a save at
  // exit follows the one as the function went away).
  if (std::all_of(shapes.begin(), shapes.end(), [this](const ShapeToStore& item) {
        return from_file_.count(item.graph->id) != 0 || written_.count(item.graph->id) != 0;
      })) {
    return "";
  }
  const auto start = core::Clock::now();
  core::StoreContext context;
  context.lanes = arena_lanes(arena);
  context.tensors = storage_ranges(named);
  context.is_device_address =
      remembered(decltype(context.is_device_address)(cuda::is_driver_address));
  context.kernel_name = remembered(decltype(context.kernel_name)(cuda::stored_kernel_name));
  // Words no kernel reads through: pageable host memory, and the arena beyond what it maps
  // (Note [Relocating stored graphs], kLeftover).
  const std::string maps = core::this_process_maps();
  const core::AddressRangeSet host = core::readable_ranges(maps);
  const core::HostAddresses host_addresses = core::host_addresses(maps);
  core::AddressRangeSet unmapped;
  for (int lane = 0; lane < GraphArena::kLanes; ++lane) {
    const core::AddressRange range = arena.lane_range(static_cast<ArenaLane>(lane));
    // Past the mapped extent by a byte at least: a block's end pointer may be the extent itself.
    unmapped.add({range.begin + arena.mapped_bytes(static_cast<ArenaLane>(lane)) + 1, range.end});
  }
  context.is_leftover = [&host, &unmapped](uint64_t value) {
    const core::AddressRange word{static_cast<uintptr_t>(value),
                                  static_cast<uintptr_t>(value) + 1};
    return host.contains(word) || unmapped.contains(word);
  };
  // By executable group and topology: a union's members are stored by their own topologies.
  std::map<std::pair<uint32_t, uint64_t>, core::StoredGroup> groups;
  std::map<std::string, int64_t> unstored;
  int64_t stored = 0;
  bool anything_new = false;
  for (const ShapeToStore& item : shapes) {
    if (from_file_.count(item.graph->id) != 0) continue;  // its group is carried over as read
    std::string why;
    const std::optional<cuda::SharedExecutables::MemberParams> params =
        executables.params_of(item.graph->member, &why);
    if (!params) {
      ++unstored[why];
      continue;
    }
    std::optional<core::StoredEntry> entry = store_entry(*item.graph, arena, named, why);
    if (!entry) {
      ++unstored[why];
      continue;
    }
    core::StoredGroup& group = groups[{item.graph->member.group, params->topology}];
    group.topology = params->topology;
    group.host = host_addresses;
    core::StoreResult result = core::store_shape(params->blobs, layouts_of(*params), context,
                                                 group.names);
    if (!result.why_not.empty()) {
      ++unstored[result.why_not];
      continue;
    }
    group.shapes.push_back({stored_signature(*item.signature, flattener), std::move(result.nodes),
                            core::encode_entry(*entry)});
    ++stored;
    anything_new = anything_new || written_.count(item.graph->id) == 0;
  }
  figures_.unstored = std::move(unstored);
  std::string error;
  if (anything_new) {
    std::vector<core::StoredGroup> list;
    // The file's groups that were not dropped, as read: under the key they were read with only.
    if (key == key_) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        if (restores_[g].state == GroupState::kDropped) continue;
        list.push_back(groups_[g]);
        stored += static_cast<int64_t>(groups_[g].shapes.size());
      }
    }
    for (auto& [index, group] : groups) {
      if (group.shapes.empty()) continue;
      attach_images(group);
      list.push_back(std::move(group));
    }
    error = core::write_file_atomically(path_, core::encode_graph_file(key, list));
    if (error.empty()) {
      figures_.saved_shapes = stored;
      ++figures_.writes;
      for (const ShapeToStore& item : shapes) written_.insert(item.graph->id);
    }
  }
  figures_.store_ns += core::elapsed_ns(start);
  return error;
}

}  // namespace grape
