#pragma once
// What the kernel image watch knows (Note [Kernel images]; csrc/cuda/module_images.cpp feeds it
// from CUPTI's callbacks and asks the driver what it cannot know): which image each module and
// library loaded from memory came from, the images' bytes within a cap, and the stored images
// this process loaded back. Handles are the driver's, as numbers. Not thread-safe: its owner
// locks.
// A module's or library's handle may come back for other code once it is gone, so what the
// registry says of handles holds only while every way one goes is seen: unloads and a context's
// end forget what they took, and a watch that did not start, or stopped for good (another tool
// took CUPTI), names nothing from the callbacks. Stored images loaded back are never unloaded:
// their libraries name their kernels whatever the watch does, and their modules until their
// context ends.
// This file is torch-free and CUDA-free.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/param_codec.h"

namespace grape::core {

struct ModuleImageCounts {
  bool watching = false;
  std::string why_not;    // the last failed start's reason, or why the watch stopped
  size_t seen = 0;        // images of modules and libraries loaded while the callbacks ran
  size_t kept_bytes = 0;  // of their bytes, kept for storing
  size_t loaded = 0;      // stored images this process loaded back
};

class ModuleImageRegistry {
 public:
  // What the kept images may take in all; past it, images are still named but not kept.
  explicit ModuleImageRegistry(size_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}

  // The watch's start: `why_not` empty where it runs. What callbacks enabled for a while before a
  // failed start taught is forgotten.
  void started(std::string why_not);
  // Ends the watch for good: it names nothing from the callbacks from now on, learns nothing from
  // callbacks still in flight, and its kept images are dropped (they would never be stored).
  void stop(std::string why);
  bool watching() const { return watching_; }
  bool stopped() const { return stopped_; }
  const std::string& why_not() const { return why_not_; }

  // The callbacks: a module or library loaded from `image` (`length` bytes, `digest` its
  // image_digest), one unloaded, and a context's end (its modules go, without unload calls).
  void loaded(bool library, uint64_t handle, uint64_t digest, const uint8_t* image,
              size_t length);
  void unloaded(bool library, uint64_t handle);
  void context_ended();

  // The digest of the image a module's or a library's code came from, where known.
  // `module_of_library` asks the driver for a library's module (in the current context): each
  // library seen while watching is asked once, when a module is first looked up after it, and
  // again after a context's end.
  std::optional<uint64_t> module_image(
      uint64_t module, const std::function<std::optional<uint64_t>(uint64_t)>& module_of_library);
  std::optional<uint64_t> library_image(uint64_t library) const;
  // The bytes of the image of `digest`, where one was kept.
  std::optional<Blob> image(uint64_t digest) const;

  // Stored images loaded back: the library made from `digest`'s, where one was; and the record
  // of a load, which returns the library kept for the digest (the first, where two threads
  // loaded one image).
  std::optional<uint64_t> loaded_library(uint64_t digest) const;
  uint64_t loaded_back(uint64_t digest, uint64_t library, std::optional<uint64_t> module);

  ModuleImageCounts counts() const;

 private:
  void forget_handles();

  size_t max_kept_bytes_;
  bool watching_ = false;
  bool stopped_ = false;
  std::string why_not_ = "never asked";
  std::unordered_map<uint64_t, uint64_t> modules_;    // module -> image digest
  std::unordered_map<uint64_t, uint64_t> libraries_;  // library -> image digest
  // The libraries in the order seen, and how many of them have their module in `modules_`.
  std::vector<uint64_t> library_order_;
  size_t resolved_libraries_ = 0;
  std::unordered_map<uint64_t, uint64_t> library_modules_;  // what resolving put in `modules_`
  std::unordered_map<uint64_t, Blob> images_;               // digest -> bytes
  size_t seen_ = 0, kept_bytes_ = 0;
  std::unordered_map<uint64_t, uint64_t> loaded_;            // digest -> library loaded back
  std::unordered_map<uint64_t, uint64_t> loaded_libraries_;  // and back: library -> digest
  std::unordered_map<uint64_t, uint64_t> loaded_modules_;    // their modules -> digest
};

}  // namespace grape::core
