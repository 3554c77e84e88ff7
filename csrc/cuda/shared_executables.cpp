#include "cuda/shared_executables.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/clock.h"
#include "core/executable_slots.h"
#include "core/param_codec.h"
#include "core/topology_union.h"
#include "cuda/executable_group.h"
#include "cuda/graph_nodes.h"
#include "cuda/union_graphs.h"

namespace grape::cuda {

namespace {

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

// A member as a key of SharedExecutables::successor_.
uint64_t key(SharedExecutables::Member m) {
  return (static_cast<uint64_t>(m.group) << 32) | m.shape;
}

}  // namespace

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

SharedExecutables::SharedExecutables(Sharing sharing, size_t cache_bytes, SlotGrowth growth)
    : sharing_(sharing), cache_bytes_(cache_bytes), growth_(growth) {}

SharedExecutables::~SharedExecutables() {
  wait_settled();
  for (cudaGraph_t graph : joined_graphs_) (void)cudaGraphDestroy(graph);
  for (auto& group : groups_) {
    if (!group) continue;
    for (const Executable& e : group->executables) (void)cudaGraphExecDestroy(e.exec);
    if (group->graph != nullptr) (void)cudaGraphDestroy(group->graph);
  }
}

size_t SharedExecutables::instantiate(Group& group, cudaStream_t stream) {
  const auto start = core::Clock::now();
  struct Charge {  // on every way out
    int64_t& ns;
    core::Clock::time_point start;
    ~Charge() { ns += core::elapsed_ns(start); }
  } charge_time{counters_.instantiate_ns, start};
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
                                   bool host_paced, bool& costly) {
  // Whether the group grows is asked only where the shape would be patched: a hit, the most
  // common choice on the replay path, asks nothing more.
  core::SlotChoice choice = core::choose_slot(group.slots, shape, false);
  if (choice.kind == core::SlotChoice::Kind::kPatch) {
    bool grow = false;
    if (room_for_slot(group)) {
      if (growth_ == SlotGrowth::kWhileRoom) {
        grow = true;
      } else if (host_paced) {
        grow = group.admission.admits(shape);
        costly = !grow;
      }
    }
    choice = choose(group, shape, grow);
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
  if (device_limit_ != core::kNoLimit && device_bytes_ + bytes > device_limit_) return false;
  return cache_bytes_ == core::kNoLimit || cached_bytes_ + bytes <= cache_bytes_;
}

bool SharedExecutables::gpu_waits(cudaStream_t stream) {
  // Asked right after a patch, before the launch it served: where the stream still has work
  // queued, the patch overlapped that work and delayed nothing. Where it is idle, the GPU ran out
  // of work while the host patched (the few microseconds a generation queues between its
  // forwards end well within a patch), and the patch delayed the launch.
  const cudaError_t queried = cudaStreamQuery(stream);
  const bool idle = queried != cudaErrorNotReady;
  if (idle) {
    check(queried, "cudaStreamQuery");
  } else {
    (void)cudaGetLastError();  // not an error; cleared as c10's CUDAStream::query does
  }
  return idle;
}

// A shareable graph's view for alignment, made when first needed (not for a graph that joins a
// group of its own topology as it is); taken by the group the graph starts.
class SharedExecutables::LazyAlignment {
 public:
  explicit LazyAlignment(const GraphContents& contents) : contents_(contents) {}
  const core::NodeGraph& get() {
    if (!made_) view_ = alignment_view(contents_);
    made_ = true;
    return view_;
  }
  core::NodeGraph take() {
    get();
    return std::move(view_);
  }

 private:
  const GraphContents& contents_;
  core::NodeGraph view_;
  bool made_ = false;
};

namespace {

// Charges a join's time to join_ns, but for the instantiations and patches it makes (timed on
// their own).
struct JoinTimer {
  ExecutableStats& counters;
  core::Clock::time_point start = core::Clock::now();
  int64_t timed_apart_before = counters.instantiate_ns + counters.patch_ns;
  ~JoinTimer() {
    counters.join_ns += core::elapsed_ns(start) -
                        (counters.instantiate_ns + counters.patch_ns - timed_apart_before);
  }
};

}  // namespace

SharedExecutables::Member SharedExecutables::add(cudaGraph_t graph, cudaStream_t stream) {
  GraphOwner owner{graph};
  settle();
  wait_settled();
  const bool share = sharing_ != Sharing::kNone;
  const auto read_start = core::Clock::now();
  GraphContents contents = read_graph(graph, share);
  counters_.read_ns += core::elapsed_ns(read_start);
  const JoinTimer join_timer{counters_};
  const bool shareable = share && contents.readable;
  if (share && !contents.readable) unshareable_reason_ = contents.why_not;
  LazyAlignment view(contents);
  if (shareable) {
    if (std::optional<Member> joined = join_a_group(contents, view, stream)) {
      // A joined graph is destroyed once its first launch is queued (settle).
      joined_graphs_.push_back(owner.graph);
      owner.graph = nullptr;
      return *joined;
    }
  }
  return start_group(owner, contents, shareable ? &view : nullptr, stream);
}

std::optional<SharedExecutables::Member> SharedExecutables::join_a_group(
    const GraphContents& contents, LazyAlignment& view, cudaStream_t stream) {
  std::vector<uint32_t> tried;  // groups of this topology, joined or not
  auto [first, last] = by_topology_.equal_range(contents.topology);
  for (auto it = first; it != last; ++it) {
    Group& group = *groups_[it->second];
    tried.push_back(it->second);
    // Into a union (its anchors are no captured graph's nodes), or a group registered by a near
    // join, a graph joins by alignment: node i of the group is not node i of the graph.
    if (group.start != nullptr || contents.topology != group.topologies.front()) {
      Member joined;
      if (join_aligned(it->second, view.get(), contents, stream, joined)) return joined;
      continue;
    }
    // Node by node, what a patch may not change (a copy's memory kinds, a memset's element size)
    // must agree too: the topology key leaves those to the per-node keys.
    if (group.nodes.size() != contents.nodes.size() || group.kinds != contents.kinds ||
        group.shape.keys != contents.keys) {
      continue;
    }
    // Patching the graph's parameters into the slot it will replay in asks the driver, node by
    // node, whether they may share this group's executables: the nodes the slot's shape already
    // holds were asked when that shape joined. cudaGraphExecUpdate of the whole graph would ask
    // the same for every node, at several times the cost (docs/results.md).
    try {
      const uint32_t shape = join_as_is(it->second, contents.blobs, stream);
      group.topology_of_shape[shape] = contents.topology;
      ++group.members;
      ++counters_.joins;
      return Member{it->second, shape};
    } catch (const std::runtime_error&) {
      // The driver refused a node's parameters; without an executable, the group could not
      // instantiate one (out of memory), which another group would not help.
      if (group.slots.empty()) throw;
      continue;
    }
  }
  // A graph of no group's topology (or one whose parameters the driver refused, which alignment
  // would not check better) may join the most recent groups of a near topology.
  if (sharing_ != Sharing::kNearTopologies) return std::nullopt;
  return join_near_topology(contents, view, tried, stream);
}

std::optional<SharedExecutables::Member> SharedExecutables::join_near_topology(
    const GraphContents& contents, LazyAlignment& view, const std::vector<uint32_t>& tried,
    cudaStream_t stream) {
  int near_tried = 0;
  for (size_t index = groups_.size(); index-- > 0 && near_tried < kNearGroupsTried;) {
    if (!groups_[index] || std::find(tried.begin(), tried.end(), index) != tried.end()) continue;
    const Group& group = *groups_[index];
    if (!group.params ||
        !near_enough(group.nodes.size(), contents.nodes.size(), group.smallest_member, 0)) {
      continue;
    }
    ++near_tried;
    Member joined;
    if (join_aligned(static_cast<uint32_t>(index), view.get(), contents, stream, joined)) {
      return joined;
    }
  }
  if (near_tried == 0) ++counters_.near_refused_far;
  return std::nullopt;
}

SharedExecutables::Member SharedExecutables::start_group(GraphOwner& owner,
                                                         GraphContents& contents,
                                                         LazyAlignment* view,
                                                         cudaStream_t stream) {
  auto group = std::make_unique<Group>();
  group->graph = owner.graph;  // the group owns it from here
  owner.graph = nullptr;
  const size_t count = contents.nodes.size();
  // Without an order, no graph joins it by alignment.
  if (view != nullptr) group->shape = view->take();
  group->nodes = std::move(contents.nodes);
  group->kinds = std::move(contents.kinds);
  group->smallest_member = count;
  group->topologies = {contents.topology};
  group->topology_of_shape[core::ParamTable::kBase] = contents.topology;
  if (!group->shape.order.empty()) {
    group->node_of_topology.emplace(contents.topology, group->shape.order);
  }
  if (view != nullptr) group->params = std::make_unique<core::ParamTable>(std::move(contents.blobs));
  group->members = 1;
  const auto index = static_cast<uint32_t>(groups_.size());
  try {
    instantiate(*group, stream);
  } catch (...) {
    (void)cudaGraphDestroy(group->graph);
    throw;
  }
  group->slots.front().last_used = ++clock_;
  if (view != nullptr) by_topology_.emplace(contents.topology, index);
  groups_.push_back(std::move(group));
  return {index, core::ParamTable::kBase};
}

bool SharedExecutables::join_aligned(uint32_t index, const core::NodeGraph& graph,
                                     const GraphContents& contents, cudaStream_t stream,
                                     Member& joined) {
  Group& group = *groups_[index];
  const size_t n = group.nodes.size();
  const size_t m = contents.nodes.size();
  NearRefusal refused = NearRefusal::kNone;
  const std::optional<core::UnionPlan> plan = plan_join(group, graph, contents, refused);
  if (!plan) {
    switch (refused) {
      case NearRefusal::kUnaligned: ++counters_.near_refused_unaligned; break;
      case NearRefusal::kEdits: ++counters_.near_refused_edits; break;
      case NearRefusal::kNoNoop: ++counters_.near_refused_no_noop; break;
      case NearRefusal::kNone: break;
    }
    return false;
  }
  const size_t smallest = std::min(group.smallest_member, m);
  std::vector<core::Blob> blobs(n + plan->added.size());  // empty: absent
  for (size_t i = 0; i < m; ++i) blobs[plan->node_of[i]] = contents.blobs[i];
  uint32_t shape = 0;
  try {
    if (union_holds(group, *plan)) {
      shape = join_as_is(index, blobs, stream);
    } else {
      shape = join_grown(index, contents, *plan, blobs, stream);
    }
  } catch (const std::runtime_error&) {
    ++counters_.near_refused_driver;
    return false;  // the driver refused a node's parameters
  }
  Group& joined_group = *groups_[index];  // join_grown replaced it
  joined_group.smallest_member = smallest;
  const auto [known, added] =
      joined_group.node_of_topology.emplace(contents.topology, plan->node_of);
  // A graph of a known topology whose nodes paired otherwise (per-node keys the topology leaves
  // out: a copy's memory kinds) has no node order kept: the graph cache reads it out never.
  if (added || known->second == plan->node_of) {
    joined_group.topology_of_shape[shape] = contents.topology;
  }
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

uint32_t SharedExecutables::join_as_is(uint32_t index, const std::vector<core::Blob>& blobs,
                                       cudaStream_t stream) {
  Group& group = *groups_[index];
  // The blobs are copied, not taken: where the driver refuses them, the graph may still join
  // another group or start one.
  const uint32_t shape = group.params->add(blobs);
  try {
    // Patching the shape in now also asks the driver whether it takes these parameters.
    load(group, shape, stream, false);
  } catch (...) {
    group.kernels.erase(shape);
    group.params->remove(shape);
    throw;
  }
  uncompressed_.push_back({index, shape});
  return shape;
}

uint32_t SharedExecutables::join_grown(uint32_t index, const GraphContents& contents,
                                       const core::UnionPlan& plan,
                                       const std::vector<core::Blob>& blobs, cudaStream_t stream) {
  Group& group = *groups_[index];
  std::unique_ptr<Group> grown = grow_union(group, contents, plan);
  GraphOwner owner{grown->graph};
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
  grown->topology_of_shape = std::move(group.topology_of_shape);
  grown->admission = std::move(group.admission);
  grown->params->add_nodes(plan.added.size());
  const uint32_t shape = grown->params->add(blobs);
  uncompressed_.push_back({index, shape});
  grown->slots.front() = {shape, ++clock_};
  grown->admission.launched(shape, false);  // a join, as join_as_is's load: the stream drained
  grown->smallest_member = group.smallest_member;
  (void)cudaGraphDestroy(group.graph);
  owner.graph = nullptr;
  groups_[index] = std::move(grown);
  ++counters_.unions;
  return shape;
}

void SharedExecutables::remove(Member member) {
  wait_settled();
  if (!member.valid() || member.group >= groups_.size() || !groups_[member.group]) return;
  Group& group = *groups_[member.group];
  if (group.params) {
    group.params->remove(member.shape);
    group.kernels.erase(member.shape);
    group.topology_of_shape.erase(member.shape);
    group.admission.forget(member.shape);
    for (auto& slot : group.slots) {
      if (slot.shape != member.shape) continue;
      // The base's parameters stay readable (other shapes are patched from them), but its slot is
      // no shape's own any more.
      slot = {member.shape == core::ParamTable::kBase ? slot.shape : core::ExecutableSlot::kNoShape,
              slot.last_used};
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

size_t SharedExecutables::load(Group& group, uint32_t shape, cudaStream_t stream,
                               bool host_paced) {
  bool costly = false;
  const size_t slots_before = group.slots.size();
  const size_t slot = slot_for(group, shape, stream, host_paced, costly);
  // A slot made for this shape is its own; a group's only executable (its first, or made again
  // after an eviction) is every shape's.
  const bool own = slots_before > 0 && group.slots.size() > slots_before;
  if (group.slots[slot].shape != shape) {
    try {
      patch(group, slot, shape);
    } catch (...) {
      if (own) destroy_slot(group, slot);
      group.admission.launched(shape, false);  // no launch follows: the call is refused
      throw;
    }
  }
  // A join, or a launch after a capture or an eager run (not host-paced), drained the stream.
  group.admission.launched(shape, costly && gpu_waits(stream));
  if (own) group.slots[slot].bought = true;
  group.slots[slot].last_used = ++clock_;
  return slot;
}

cudaGraphExec_t SharedExecutables::prepare(Member member, cudaStream_t stream, bool host_paced) {
  wait_settled();
  Group& group = *groups_.at(member.group);
  return group.executables[load(group, member.shape, stream, host_paced)].exec;
}

void SharedExecutables::prepare_ahead(Member member) {
  wait_settled();
  if (!member.valid() || member.group >= groups_.size() || !groups_[member.group]) return;
  Group& group = *groups_[member.group];
  if (group.slots.empty() || !group.params || !group.params->contains(member.shape)) return;
  // Where the cache has room, prepare() decides, as the launch finds the GPU: a slot of its own,
  // or a patch that counts towards one. The executable just launched is left to prepare()
  // too (the one slot a shape without its own may take can be it).
  const core::SlotChoice choice = choose(group, member.shape, room_for_slot(group));
  if (choice.kind != core::SlotChoice::Kind::kPatch) return;
  const uint64_t chosen_use = group.slots[choice.slot].last_used;
  const bool launched_last = std::all_of(group.slots.begin(), group.slots.end(),
                                         [&](const auto& s) { return s.last_used <= chosen_use; });
  if (launched_last && group.slots.size() > 1) return;
  patch(group, choice.slot, member.shape);
  ++counters_.patches_ahead;
}

void SharedExecutables::settle() {
  if (uncompressed_.empty() && joined_graphs_.empty()) return;
  // The joined graphs are destroyed here, on the caller's thread: the worker makes no CUDA call,
  // which from a thread whose device was never set would create a context on device 0, and
  // during another thread's capture could invalidate it.
  const auto start = core::Clock::now();
  for (cudaGraph_t graph : joined_graphs_) (void)cudaGraphDestroy(graph);
  joined_graphs_.clear();
  counters_.settle_ns += core::elapsed_ns(start);
  std::vector<std::pair<core::ParamTable*, uint32_t>> shapes;
  for (const Member m : uncompressed_) {
    // A shape removed since (its group ended, or its graph was refused) has nothing to compress.
    if (m.group < groups_.size() && groups_[m.group] && groups_[m.group]->params) {
      shapes.emplace_back(groups_[m.group]->params.get(), m.shape);
    }
  }
  uncompressed_.clear();
  if (shapes.empty()) return;
  auto compress = [shapes = std::move(shapes), &ns = settle_ns_] {
    const auto start = core::Clock::now();
    try {
      for (const auto& [table, shape] : shapes) table->compress(shape);
    } catch (const std::exception&) {
      // Out of host memory: a shape left whole decodes all the same.
    }
    ns += core::elapsed_ns(start);
  };
  try {
    settler_.post(compress);
  } catch (const std::exception&) {
    compress();  // no thread to be had: here, then
  }
}

void SharedExecutables::wait_settled() {
  settler_.wait();
  counters_.settle_ns += settle_ns_.exchange(0);
}

void SharedExecutables::launched(Member member) {
  settle();
  // Graphs tend to follow one another in the same order (a generation's growing shapes). A
  // successor seen once predicts nothing in a shuffled order (an epoch's batches), where a patch
  // ahead would only be undone by the next launch.
  if (last_launched_.valid()) {
    Successor& s = successor_[key(last_launched_)];
    s.confirmed = key(s.next) == key(member);
    s.next = member;
  }
  last_launched_ = member;
  auto next = successor_.find(key(member));
  if (next != successor_.end() && next->second.confirmed &&
      next->second.next.group == member.group) {
    prepare_ahead(next->second.next);
  }
}

void SharedExecutables::patch(Group& group, size_t slot, uint32_t shape) {
  const auto start = core::Clock::now();
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
  group.slots[slot].bought = false;  // a bought slot patched to another shape is the buyer's no more
  core::Blob scratch;
  cudaGraphExec_t exec = group.executables[slot].exec;
  for (uint32_t node : changed) {
    write_node(exec, group.nodes[node], group.kinds[node], group.params->view(shape, node, scratch));
  }
  group.slots[slot].shape = shape;
  ++counters_.switches;
  counters_.nodes_patched += static_cast<int64_t>(changed.size());
  counters_.patch_ns += core::elapsed_ns(start);
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

ExecutableStats SharedExecutables::stats() {
  wait_settled();
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
