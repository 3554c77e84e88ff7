#pragma once
// The graph types a Runtime owns, complete where runtime.cpp destroys them: the real ones in a
// build with CUDA; in a build without it, empty types, since no graph or site predictor is ever
// made there (runtime_without_cuda.cpp is that build's side of the runtime, runtime_graphs.cpp the
// CUDA build's). The one place the runtime's shared files meet the choice between the builds.

#ifdef GRAPE_WITH_CUDA
#include "torch/graphs/captured_graph.h"
#include "torch/memory/site_predictor.h"
#else
namespace grape {
struct CapturedGraph {};
class InputSites {};
}  // namespace grape
#endif
