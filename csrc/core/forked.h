#pragma once
// Whether this process is a fork of one in which grape made CUDA state (a graph pool: its stream,
// arena, graphs). A forked child has none of its parent's CUDA state, though its objects still
// point to it: it runs compiled functions eagerly and its destructors make no CUDA call, leaving
// the parent's resources to the process's end. A fork of a process in which grape made none (a
// server that imports grape and forks its workers before they touch CUDA) is no such child.

namespace grape::core {

bool forked_child();
// Where grape makes CUDA state, before it does (GraphPool): children forked from here on are
// forked children.
void making_cuda_state();

}  // namespace grape::core
