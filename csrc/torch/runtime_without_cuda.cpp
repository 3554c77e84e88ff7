// The Runtime's side that needs CUDA, in a build without it (GRAPE_WITH_CUDA unset, see
// runtime_graphs.cpp): no call can have graphs, so every call runs eagerly and says why (the
// runtime's first call reports it), and there is no graph state to make, free or count.
#include "torch/graph_types.h"
#include "torch/runtime.h"

namespace grape {

void Runtime::make_graph_state(bool, const std::string&) {}

core::Reason Runtime::graphs_unavailable() {
  return {core::ReasonKind::kNoCuda, "grape was built without CUDA"};
}

py::object Runtime::call_with_graphs(const py::args& args, const py::kwargs& kwargs) {
  return run_eager(args, kwargs);  // not reached: graphs_unavailable() is never empty
}

void Runtime::release_executable(CapturedGraph&) {}

int64_t Runtime::node_count(const Entry&) { return 0; }

void Runtime::restart_site_learning() {}

Runtime::GraphFigures Runtime::graph_figures() { return {}; }

// No graphs, so no graph cache: nothing is read, restored or written.
void Runtime::open_graph_cache() {}
void Runtime::find_in_graph_cache(Entry&, const FlatCall&) {}
bool Runtime::restore_from_graph_cache(Entry&) { return false; }
void Runtime::validate_graph_cache(Entry&) {}
void Runtime::settle_graph_cache(const Entry&, bool) {}
std::string Runtime::save_graph_cache() { return ""; }
py::object Runtime::graph_cache_stats() const { return py::none(); }

}  // namespace grape
