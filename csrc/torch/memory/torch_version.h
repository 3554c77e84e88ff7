#pragma once
// Feature detection by the version of the torch grape is built against (2.11 on the GPU machine,
// newer in CI): GRAPE_TORCH_AT_LEAST(2, 13) selects code for torch >= 2.13.

#include <torch/version.h>

#define GRAPE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
