#include "torch/memory/budget.h"

namespace grape {

void limit_arena_to_budget(const core::MemoryBudget& budget, GraphArena& arena,
                           const cuda::SharedExecutables& executables) {
  if (!budget.limited()) return;
  arena.set_limit(budget.arena_limit(executables.device_bytes()));
}

void enforce_memory_budget(const core::MemoryBudget& budget, const GraphPool& pool,
                           cuda::SharedExecutables& executables,
                           cuda::SharedExecutables::Member keep) {
  if (!budget.limited()) return;
  const size_t for_executables = budget.executable_limit(pool.arena().mapped_bytes());
  executables.set_device_limit(for_executables);
  executables.evict_to(for_executables, keep);
}

}  // namespace grape
