#include "core/forked.h"

#include <unistd.h>

namespace grape::core {

namespace {
// Set when the library is loaded, in the process that loaded it.
const pid_t loading_process = getpid();
}  // namespace

bool forked_child() { return getpid() != loading_process; }

}  // namespace grape::core
