// The Runtime's graph cache (Note [The graph cache in the runtime]): opening it, restoring a new
// signature's shape instead of capturing it, validating a group by its live capture, and saving.
#include <torch/csrc/autograd/python_variable.h>

#include "core/clock.h"
#include "core/forked.h"
#include "cuda/module_images.h"
#include "torch/call_lock.h"
#include "torch/memory/capture_state.h"
#include "torch/graphs/captured_graph.h"
#include "torch/graphs/graph_cache.h"
#include "torch/runtime.h"

namespace grape {

namespace {

// The (path, key) the hooks give, or nothing.
struct CacheFile {
  std::string path;
  std::string key;
};

std::optional<CacheFile> cache_file(const PythonHooks& hooks) {
  py::object file = hooks.graph_cache_file();
  if (file.is_none()) return std::nullopt;
  auto tuple = py::reinterpret_borrow<py::tuple>(file);
  return CacheFile{py::cast<std::string>(tuple[0]), py::cast<std::string>(tuple[1])};
}

// The function's modules' tensors by name, as they are now.
NamedTensors named_tensors(const PythonHooks& hooks) {
  NamedTensors named;
  for (py::handle item : py::reinterpret_borrow<py::list>(hooks.graph_cache_tensors())) {
    auto pair = py::reinterpret_borrow<py::tuple>(item);
    // Unpacked as the Python variables they are: pybind's generic caster refuses a Parameter.
    named.tensors.emplace_back(py::cast<std::string>(pair[0]), THPVariable_Unpack(pair[1].ptr()));
  }
  return named;
}

std::vector<int64_t> module_versions(const NamedTensors& named) {
  std::vector<int64_t> versions;
  for (const auto& [name, tensor] : named.tensors) versions.push_back(tensor._version());
  return versions;
}

void warn(const std::string& message) {
  if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

py::dict counts(const std::map<std::string, int64_t>& by_reason) {
  py::dict d;
  for (const auto& [reason, count] : by_reason) d[py::str(reason)] = count;
  return d;
}

}  // namespace

void Runtime::open_graph_cache() {
  if (graph_cache_opened_) return;
  graph_cache_opened_ = true;
  std::optional<CacheFile> file;
  try {
    file = cache_file(hooks_);
  } catch (const py::error_already_set& e) {
    // The key could not be computed: the function runs without a cache, and says so.
    warn(std::string("grape: the graph cache cannot be opened (") + e.what() +
         "); graphs are captured as without one");
    return;
  }
  if (!file) return;
  graph_cache_ = std::make_shared<GraphCache>(file->path, file->key);
  const std::string& status = graph_cache_->figures().status;
  if (status.rfind("miss", 0) == 0 || status.rfind("unreadable", 0) == 0) {
    warn("grape: the graph cache " + file->path + " is not used (" + status +
         "); its graphs are captured again");
  }
}

void Runtime::find_in_graph_cache(Entry& entry, const FlatCall& flat) {
  if (!graph_cache_) return;
  if (std::optional<GraphCache::Found> found = graph_cache_->find(flat.signature, flattener_)) {
    entry.stored_group = static_cast<int32_t>(found->group);
    entry.stored_shape = static_cast<int32_t>(found->shape);
    if (graph_cache_->awaits_validation(*found)) {
      try {
        entry.module_versions = module_versions(named_tensors(hooks_));
      } catch (const py::error_already_set&) {
        // Unknown: validation will not run the capture twice (the versions differ).
      }
    }
  }
}

bool Runtime::restore_from_graph_cache(Entry& entry) {
  if (!graph_cache_ || entry.stored_group < 0 || !pool_) return false;
  const GraphCache::Found found{static_cast<uint32_t>(entry.stored_group),
                                static_cast<uint32_t>(entry.stored_shape)};
  if (!graph_cache_->validated(found)) return false;
  entry.stored_group = -1;  // tried once
  std::unique_ptr<CapturedGraph> graph;
  try {
    graph = graph_cache_->restore(found, pool_, executables_,
                                  named_tensors(hooks_));
  } catch (const std::exception&) {
    return false;  // the shape is captured, as without a cache
  }
  if (!graph) return false;
  entry.graph = std::move(graph);
  return true;
}

void Runtime::validate_graph_cache(Entry& entry) {
  if (!graph_cache_ || entry.stored_group < 0 || !entry.graph) return;
  const GraphCache::Found found{static_cast<uint32_t>(entry.stored_group),
                                static_cast<uint32_t>(entry.stored_shape)};
  entry.stored_group = -1;
  entry.graph->gather_static_tensors();  // now, not after the first launch: they are compared
  const NamedTensors named = named_tensors(hooks_);
  // Written in place since it was found (by its warm-up or capture): a second run would write
  // them again.
  const bool writes_modules = module_versions(named) != entry.module_versions;
  graph_cache_->validate(found, *entry.graph, *executables_, named, /*may_run=*/!writes_modules);
}

void Runtime::settle_graph_cache(const Entry& entry, bool replayed) {
  if (!graph_cache_ || !graph_cache_->pending()) return;
  std::optional<NamedTensors> named;
  try {
    named = named_tensors(hooks_);
  } catch (const py::error_already_set&) {
    replayed = false;  // the call's own result stands; the group is dropped untested
  }
  graph_cache_->settle(entry.graph.get(), replayed, *executables_,
                       named ? *named : NamedTensors{});
}

std::string Runtime::save_graph_cache() {
  // A forked child's graphs are its parent's (and so is the file).
  if (core::forked_child() || !pool_) return "nothing to store: no graph was captured here";
  // Not while another thread's compiled call captures or replays (Note [One compiled call at a
  // time]).
  const CallLock lock(/*unless_busy=*/&in_backward_pass);
  if (!lock.held()) return "not written: a compiled call of another thread runs";
  // A function that goes away inside another's capture (the garbage collector) saves nothing.
  if (current_stream_is_capturing()) return "not written: a capture is underway";
  std::optional<CacheFile> file = cache_file(hooks_);
  if (!file) return "";
  if (!graph_cache_) graph_cache_ = std::make_shared<GraphCache>(file->path, file->key);
  std::vector<GraphCache::ShapeToStore> shapes;
  for (auto& [signature, entry] : cache_) {
    if (!entry->graph || !entry->fallback.empty()) continue;
    std::string changed;
    // A graph whose static state moved is captured again at its next call, not stored.
    if (entry->graph->static_state_change(changed) != CapturedGraph::StateChange::kNone) continue;
    shapes.push_back({&signature, entry->graph.get()});
  }
  const int64_t writes = graph_cache_->figures().writes;
  const std::string error = graph_cache_->save(shapes, file->key, *executables_, pool_->arena(),
                                                named_tensors(hooks_), flattener_);
  if (!error.empty()) return "not written: " + error;
  const GraphCache::Figures& f = graph_cache_->figures();
  return f.writes == writes ? "nothing new to write"
                            : std::to_string(f.saved_shapes) + " shapes written to " + file->path;
}

py::object Runtime::graph_cache_stats() const {
  if (!graph_cache_) return py::none();
  const GraphCache::Figures& f = graph_cache_->figures();
  py::list dropped;
  for (const auto& why : f.dropped_groups) dropped.append(why);
  py::dict d;
  d["file"] = graph_cache_->path();
  d["status"] = f.status;
  d["stored_groups"] = f.stored_groups;
  d["stored_shapes"] = f.stored_shapes;
  d["validated_groups"] = f.validated_groups;
  d["leftover_halves"] = f.leftover_halves;
  d["taken_from_live"] = f.taken_from_live;
  d["unread_bytes"] = f.unread_bytes;
  d["restored_shapes"] = f.restored_shapes;
  d["dropped_groups"] = dropped;
  d["unrestored"] = counts(f.unrestored);
  d["file_bytes"] = f.file_bytes;
  d["cache_load_seconds"] = core::seconds(f.load_ns);
  d["restore_seconds"] = core::seconds(f.restore_ns);
  d["restore_join_seconds"] = core::seconds(f.restore_join_ns);
  d["restore_validate_seconds"] = core::seconds(f.restore_validate_ns);
  d["restore_relocate_seconds"] = core::seconds(f.restore_relocate_ns);
  d["saved_shapes"] = f.saved_shapes;
  d["unstored"] = counts(f.unstored);
  d["store_seconds"] = core::seconds(f.store_ns);
  const cuda::ModuleImageCounts images = cuda::module_image_counts();
  py::dict kernel_images;
  kernel_images["watching"] = images.watching;
  kernel_images["why_not"] = images.why_not;
  kernel_images["seen"] = images.seen;
  kernel_images["kept_bytes"] = images.kept_bytes;
  kernel_images["loaded"] = images.loaded;
  d["kernel_images"] = kernel_images;
  return d;
}

}  // namespace grape
