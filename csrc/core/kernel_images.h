#pragma once
// Note [Kernel images]
// ~~~~~~~~~~~~~~~~~~~~
// A library that generates code at run time loads many modules whose kernels share one name:
// cuDNN's attention compiles a module per execution plan (NVRTC), and plans for other lengths
// bring modules of the same kernel name, often byte for byte the same image, sometimes not. A name
// alone cannot then say which code a stored graph ran. Where the process saw the image a module
// was loaded from (csrc/cuda/module_images.h watches module loads through CUPTI), a stored
// kernel's name carries the image's digest, "<name>@image:<16 hex digits>": kernels of one marked
// name are one code whatever module holds them, so two handles of it may stand for each other,
// and a group stores each such image once (StoredNames::images). A later process takes such a
// kernel from its live captures by the marked name, else loads the stored image itself and takes
// the kernel from it: a shape cuDNN would plan for is restored without planning. A kernel whose
// image was not seen (a module loaded before the watch began, or no CUPTI) keeps its plain name,
// and two kernels of one plain name still make a shape unstorable.
// A loaded copy is its image as loaded: a library that wrote into a generated module's globals
// after loading it would differ from it (cuDNN's kernels take everything as arguments), and it
// may take all the dynamic shared memory the device gives (cuDNN raises its kernels' limit).
// The images stand for their modules only while the watch sees every way a module goes: unloads
// and a context's end forget what they took, and a watch that could not follow them names
// nothing.
// This file is torch-free and CUDA-free: it reads images' lengths and marks names.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace grape::core {

// `kernel_name` marked with the digest of its module's image, and the digest a name is marked
// with (nothing for a plain name).
std::string with_image(const std::string& kernel_name, uint64_t digest);
std::optional<uint64_t> image_of(const std::string& kernel_name);
// `kernel_name` without its mark (itself where it has none).
std::string without_image(const std::string& kernel_name);

// The length of the loadable image at `image` from its headers: an ELF object (a cubin: the
// furthest of its header tables, its sections' and its segments' contents) or a fat binary (its
// header's length). Nothing for another format (PTX text), headers that make no sense (an ELF
// object without sections among them), or a length over `limit`. Reads only within the length
// it finds.
std::optional<size_t> image_length(const uint8_t* image, size_t limit);

// An image's digest: what a marked name carries.
uint64_t image_digest(const uint8_t* image, size_t size);

}  // namespace grape::core
