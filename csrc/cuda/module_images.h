#pragma once
// Which image each module came from (Note [Kernel images], csrc/core/kernel_images.h; what is
// known is kept in a core::ModuleImageRegistry): the modules and libraries the process loads
// from memory (cuModuleLoadData, cuModuleLoadDataEx, cuLibraryLoadData: how a library loads
// code it generated) are seen through CUPTI's driver callbacks, and a stored image is loaded
// back. libcupti is opened at run time (the extension
// links no CUPTI, and builds without its headers). A process has one CUPTI subscriber: where
// another tool holds it (a profiler, Nsight), the watch does not start and says why, and kernels
// are stored by their plain names, as without it. torch.profiler takes it as it first prepares a
// trace of CUDA activities, which stops the watch first (grape/_graph_cache.py): it yields.

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/module_image_registry.h"
#include "core/param_codec.h"

namespace grape::cuda {

// Starts the watch with the first of `libraries` (libcupti's paths or sonames) that opens: empty
// once watching (at once where it already is), else why not. Modules loaded before it began are
// not seen.
std::string watch_module_images(const std::vector<std::string>& libraries);

// Ends the watch for good, where one runs, so that another tool can subscribe; `why` is what
// module_image_counts says, and it does not start again. What it taught is forgotten (unloads go
// unseen from now on): kernels are stored by their plain names, except those of stored images
// loaded back, which stay loaded and named (a later shape of theirs still restores).
void stop_watching_module_images(const std::string& why);

using ModuleImageCounts = core::ModuleImageCounts;
ModuleImageCounts module_image_counts();

// The digest of the image a function's or a library kernel's code was loaded from; nothing where
// no watch saw it, unless it is a stored image loaded back (kernel_from_image).
std::optional<uint64_t> function_image(CUfunction function);
std::optional<uint64_t> kernel_image(CUkernel kernel);

// The bytes of the image of `digest`, where one was seen and kept.
std::optional<core::Blob> module_image(uint64_t digest);

// The kernel `mangled` from `image` (a stored one) as a function handle (`as_function`) or a
// library kernel; the image is loaded as a library once per process and never unloaded (graphs
// hold its kernels). Nothing where the driver refuses.
std::optional<uint64_t> kernel_from_image(const core::Blob& image, const std::string& mangled,
                                          bool as_function);

}  // namespace grape::cuda
