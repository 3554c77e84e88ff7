#include "core/module_image_registry.h"

#include <utility>

namespace grape::core {

void ModuleImageRegistry::forget_handles() {
  modules_.clear();
  libraries_.clear();
  library_order_.clear();
  library_modules_.clear();
  resolved_libraries_ = 0;
}

void ModuleImageRegistry::started(std::string why_not) {
  watching_ = why_not.empty();
  why_not_ = std::move(why_not);
  if (!watching_) forget_handles();  // callbacks enabled for a while saw loads, not all unloads
}

void ModuleImageRegistry::stop(std::string why) {
  watching_ = false;
  stopped_ = true;
  why_not_ = std::move(why);
  forget_handles();
  images_.clear();
  kept_bytes_ = 0;
}

void ModuleImageRegistry::loaded(bool library, uint64_t handle, uint64_t digest,
                                 const uint8_t* image, size_t length) {
  if (stopped_) return;
  if (library) {
    libraries_[handle] = digest;
    library_order_.push_back(handle);
  } else {
    modules_[handle] = digest;
  }
  ++seen_;
  if (kept_bytes_ + length <= max_kept_bytes_ &&
      images_.try_emplace(digest, image, image + length).second) {
    kept_bytes_ += length;
  }
}

void ModuleImageRegistry::unloaded(bool library, uint64_t handle) {
  if (stopped_) return;
  if (!library) {
    modules_.erase(handle);
    return;
  }
  libraries_.erase(handle);
  if (const auto module = library_modules_.find(handle); module != library_modules_.end()) {
    modules_.erase(module->second);
    library_modules_.erase(module);
  }
}

void ModuleImageRegistry::context_ended() {
  loaded_modules_.clear();  // a loaded-back library's module was the context's
  if (stopped_) return;
  modules_.clear();
  library_modules_.clear();
  resolved_libraries_ = 0;  // asked again, in the context current then
}

std::optional<uint64_t> ModuleImageRegistry::module_image(
    uint64_t module, const std::function<std::optional<uint64_t>(uint64_t)>& module_of_library) {
  if (const auto loaded = loaded_modules_.find(module); loaded != loaded_modules_.end()) {
    return loaded->second;
  }
  if (!watching_) return std::nullopt;
  // Libraries seen since the last question first give their modules.
  for (; resolved_libraries_ < library_order_.size(); ++resolved_libraries_) {
    const uint64_t library = library_order_[resolved_libraries_];
    const auto digest = libraries_.find(library);  // none where it was unloaded since
    if (digest == libraries_.end()) continue;
    if (const std::optional<uint64_t> of_library = module_of_library(library)) {
      modules_[*of_library] = digest->second;
      library_modules_[library] = *of_library;
    }
  }
  const auto found = modules_.find(module);
  return found != modules_.end() ? std::optional<uint64_t>(found->second) : std::nullopt;
}

std::optional<uint64_t> ModuleImageRegistry::library_image(uint64_t library) const {
  if (const auto loaded = loaded_libraries_.find(library); loaded != loaded_libraries_.end()) {
    return loaded->second;
  }
  if (!watching_) return std::nullopt;
  const auto found = libraries_.find(library);
  return found != libraries_.end() ? std::optional<uint64_t>(found->second) : std::nullopt;
}

std::optional<Blob> ModuleImageRegistry::image(uint64_t digest) const {
  const auto found = images_.find(digest);
  return found != images_.end() ? std::optional<Blob>(found->second) : std::nullopt;
}

std::optional<uint64_t> ModuleImageRegistry::loaded_library(uint64_t digest) const {
  const auto found = loaded_.find(digest);
  return found != loaded_.end() ? std::optional<uint64_t>(found->second) : std::nullopt;
}

uint64_t ModuleImageRegistry::loaded_back(uint64_t digest, uint64_t library,
                                          std::optional<uint64_t> module) {
  const uint64_t kept = loaded_.emplace(digest, library).first->second;
  loaded_libraries_.emplace(kept, digest);
  if (module) loaded_modules_.emplace(*module, digest);
  return kept;
}

ModuleImageCounts ModuleImageRegistry::counts() const {
  return {watching_, watching_ ? std::string() : why_not_, seen_, kept_bytes_, loaded_.size()};
}

}  // namespace grape::core
