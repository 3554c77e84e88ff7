#pragma once
// Whether this process is a fork of the one that loaded grape. A forked child has none of its
// parent's CUDA state (contexts, streams, graphs, mapped memory), though its objects still point to
// it: it runs compiled functions eagerly and its destructors make no CUDA call, leaving the
// parent's resources to the process's end.

namespace grape::core {

bool forked_child();

}  // namespace grape::core
