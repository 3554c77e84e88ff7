#pragma once
// A compiled function's memory budget carried out (the policy: core/memory_budget.h): the two
// places it bounds memory, side by side. A capture's arena may grow into what the resident
// executables leave of the budget; after a capture or before a replay, executables are evicted,
// least recently used first, until the budget holds with the arena as it is. (The arena refuses an
// allocation past its limit itself: graph_arena.cpp.)

#include "core/memory_budget.h"
#include "cuda/shared_executables.h"
#include "torch/memory/graph_pool.h"

namespace grape {

// Before a capture: the most `arena` may map, given the executables resident now (no limit
// without a budget).
void limit_arena_to_budget(const core::MemoryBudget& budget, GraphArena& arena,
                           const cuda::SharedExecutables& executables);

// Evicts least recently used executables until the budget holds with the arena as it is now,
// sparing `keep`'s executable.
void enforce_memory_budget(const core::MemoryBudget& budget, const GraphPool& pool,
                           cuda::SharedExecutables& executables,
                           cuda::SharedExecutables::Member keep);

}  // namespace grape
