#include "cuda/module_images.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "core/kernel_images.h"
#include "core/module_image_registry.h"
#include "cuda/driver.h"

namespace grape::cuda {
namespace {

// CUPTI's callback ABI (cupti_callbacks.h, cupti_driver_cbid.h, generated_cuda_meta.h), spelled
// out: only what the watch reads.
using CuptiResult = int;
using Subscriber = void*;
using Callback = void (*)(void* userdata, int domain, uint32_t callback_id, const void* data);
constexpr int kDriverApiDomain = 1;  // CUPTI_CB_DOMAIN_DRIVER_API
constexpr int kResourceDomain = 3;   // CUPTI_CB_DOMAIN_RESOURCE
constexpr uint32_t kContextDestroyStarting = 2;  // CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING
constexpr int kApiEnter = 0, kApiExit = 1;  // CUPTI_API_ENTER, CUPTI_API_EXIT
constexpr uint32_t kModuleLoadData = 19, kModuleLoadDataEx = 20, kLibraryLoadData = 678;
constexpr uint32_t kModuleUnload = 22, kLibraryUnload = 680;
struct CallbackData {  // CUpti_CallbackData's first members
  int site;
  const char* function_name;
  const void* params;
  const void* return_value;  // a CUresult
};
struct LoadParams {  // cuModuleLoadData(Ex)_params' and cuLibraryLoadData_params' first members
  void** loaded;     // the CUmodule or CUlibrary made
  const void* image;
};
struct UnloadParams {  // cuModuleUnload_params, cuLibraryUnload_params
  void* unloaded;
};

// Larger images are libraries' own fat binaries, never generated code: not hashed, not kept.
constexpr size_t kMaxImageBytes = size_t{16} << 20;
// What the kept images may take in all; past it, images are still named but not kept (a later
// process then captures the shapes that need them).
constexpr size_t kMaxKeptBytes = size_t{512} << 20;

struct Registry {
  std::mutex starting;  // held across CUPTI's calls, which may wait for a callback in flight
  std::mutex mutex;     // `known`; callbacks take it
  // The watch's subscription, and how to end it (stop_watching_module_images).
  Subscriber subscriber = nullptr;
  CuptiResult (*unsubscribe)(Subscriber) = nullptr;
  core::ModuleImageRegistry known{kMaxKeptBytes};
};

Registry& registry() {
  static Registry* const r = new Registry;  // never destroyed: callbacks may come at exit
  return *r;
}

uint64_t handle_number(const void* handle) { return reinterpret_cast<uint64_t>(handle); }

// A library's module in the current context, where the driver tells it.
std::optional<uint64_t> module_of_library(CUlibrary library) {
  const DriverApi& d = driver();
  CUmodule module = nullptr;
  return d.cuLibraryGetModule != nullptr && d.cuLibraryGetModule(&module, library) == CUDA_SUCCESS
             ? std::optional<uint64_t>(handle_number(module))
             : std::nullopt;
}

void on_driver_call(void*, int domain, uint32_t callback_id, const void* data) {
  if (domain == kResourceDomain && callback_id == kContextDestroyStarting) {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    r.known.context_ended();
    return;
  }
  if (domain != kDriverApiDomain || data == nullptr) return;
  const auto* call = static_cast<const CallbackData*>(data);
  if (callback_id == kModuleUnload || callback_id == kLibraryUnload) {
    if (call->site != kApiEnter || call->params == nullptr) return;
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    r.known.unloaded(callback_id == kLibraryUnload,
                     handle_number(static_cast<const UnloadParams*>(call->params)->unloaded));
    return;
  }
  if (call->site != kApiExit || call->return_value == nullptr || call->params == nullptr ||
      *static_cast<const CUresult*>(call->return_value) != CUDA_SUCCESS) {
    return;
  }
  const auto* params = static_cast<const LoadParams*>(call->params);
  const auto* image = static_cast<const uint8_t*>(params->image);
  if (params->loaded == nullptr || image == nullptr) return;
  const std::optional<size_t> length = core::image_length(image, kMaxImageBytes);
  if (!length) return;
  const uint64_t digest = core::image_digest(image, *length);
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.known.loaded(callback_id == kLibraryLoadData, handle_number(*params->loaded), digest, image,
                 *length);
}

// The library that generated a kernel may have let it take more dynamic shared memory than the
// default 48 KiB (cuDNN's attention does); a loaded copy may take all the device gives.
bool allow_all_shared_memory(CUkernel kernel) {
  const DriverApi& d = driver();
  if (!d.cuCtxGetDevice || !d.cuDeviceGetAttribute || !d.cuKernelGetAttribute ||
      !d.cuKernelSetAttribute) {
    return false;
  }
  CUdevice device = 0;
  int most = 0, fixed = 0;
  return d.cuCtxGetDevice(&device) == CUDA_SUCCESS &&
         d.cuDeviceGetAttribute(&most, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                device) == CUDA_SUCCESS &&
         d.cuKernelGetAttribute(&fixed, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel, device) ==
             CUDA_SUCCESS &&
         d.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, most - fixed,
                                kernel, device) == CUDA_SUCCESS;
}

std::string start_watch(void* cupti, Registry& r) {
  using Subscribe = CuptiResult (*)(Subscriber*, Callback, void*);
  using Enable = CuptiResult (*)(uint32_t, Subscriber, int, uint32_t);
  using Describe = CuptiResult (*)(CuptiResult, const char**);
  using Unsubscribe = CuptiResult (*)(Subscriber);
  const auto subscribe = reinterpret_cast<Subscribe>(dlsym(cupti, "cuptiSubscribe"));
  const auto unsubscribe = reinterpret_cast<Unsubscribe>(dlsym(cupti, "cuptiUnsubscribe"));
  const auto enable = reinterpret_cast<Enable>(dlsym(cupti, "cuptiEnableCallback"));
  const auto describe = reinterpret_cast<Describe>(dlsym(cupti, "cuptiGetResultString"));
  if (subscribe == nullptr || unsubscribe == nullptr || enable == nullptr) {
    return "libcupti lacks cuptiSubscribe";
  }
  const auto failed = [describe](const char* what, CuptiResult result) {
    const char* text = nullptr;
    if (describe == nullptr || describe(result, &text) != 0 || text == nullptr) text = "?";
    return std::string(what) + " failed: " + text;
  };
  Subscriber subscriber = nullptr;
  if (const CuptiResult result = subscribe(&subscriber, on_driver_call, nullptr); result != 0) {
    return failed("cuptiSubscribe", result);
  }
  // What forgets first, then what learns: a watch that could not forget must learn nothing.
  const std::pair<int, uint32_t> callbacks[] = {
      {kResourceDomain, kContextDestroyStarting}, {kDriverApiDomain, kModuleUnload},
      {kDriverApiDomain, kLibraryUnload},         {kDriverApiDomain, kModuleLoadData},
      {kDriverApiDomain, kModuleLoadDataEx},      {kDriverApiDomain, kLibraryLoadData}};
  for (const auto& [domain, id] : callbacks) {
    if (const CuptiResult result = enable(1, subscriber, domain, id); result != 0) {
      unsubscribe(subscriber);
      return failed("cuptiEnableCallback", result);
    }
  }
  r.subscriber = subscriber;
  r.unsubscribe = unsubscribe;
  return {};
}

}  // namespace

std::string watch_module_images(const std::vector<std::string>& libraries) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> starting(r.starting);
  {
    const std::lock_guard<std::mutex> lock(r.mutex);
    if (r.known.watching()) return {};
    if (r.known.stopped()) return r.known.why_not();  // it yielded CUPTI to another tool
  }
  void* cupti = nullptr;
  for (const std::string& library : libraries) {
    if ((cupti = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  std::string why_not = cupti == nullptr ? "libcupti was not found" : start_watch(cupti, r);
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.known.started(std::move(why_not));
  return r.known.why_not();
}

void stop_watching_module_images(const std::string& why) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> starting(r.starting);
  {
    const std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.known.watching()) return;
  }
  // Outside `mutex`: CUPTI may wait for a callback in flight, which takes it.
  const CuptiResult unsubscribed = r.unsubscribe(r.subscriber);
  r.subscriber = nullptr;
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.known.stop(unsubscribed == 0 ? why
                                 : why + " (but cuptiUnsubscribe failed: CUPTI stays taken)");
}

ModuleImageCounts module_image_counts() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.known.counts();
}

std::optional<uint64_t> function_image(CUfunction function) {
  const DriverApi& d = driver();
  CUmodule module = nullptr;
  if (d.cuFuncGetModule == nullptr || d.cuFuncGetModule(&module, function) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.known.module_image(handle_number(module), [](uint64_t library) {
    return module_of_library(reinterpret_cast<CUlibrary>(library));
  });
}

std::optional<uint64_t> kernel_image(CUkernel kernel) {
  const DriverApi& d = driver();
  CUlibrary library = nullptr;
  if (d.cuKernelGetLibrary == nullptr || d.cuKernelGetLibrary(&library, kernel) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.known.library_image(handle_number(library));
}

std::optional<core::Blob> module_image(uint64_t digest) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.known.image(digest);
}

std::optional<uint64_t> kernel_from_image(const core::Blob& image, const std::string& mangled,
                                          bool as_function) {
  const DriverApi& d = driver();
  if (d.cuLibraryLoadData == nullptr || d.cuLibraryGetKernel == nullptr) return std::nullopt;
  const uint64_t digest = core::image_digest(image.data(), image.size());
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mutex);
  CUlibrary library = nullptr;
  if (const std::optional<uint64_t> loaded = r.known.loaded_library(digest)) {
    library = reinterpret_cast<CUlibrary>(*loaded);
  } else {
    lock.unlock();  // a watched load calls back, which takes the lock
    if (d.cuLibraryLoadData(&library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0) !=
        CUDA_SUCCESS) {
      return std::nullopt;
    }
    const std::optional<uint64_t> module = module_of_library(library);
    lock.lock();
    library = reinterpret_cast<CUlibrary>(r.known.loaded_back(digest, handle_number(library),
                                                               module));
  }
  lock.unlock();
  CUkernel kernel = nullptr;
  if (d.cuLibraryGetKernel(&kernel, library, mangled.c_str()) != CUDA_SUCCESS ||
      !allow_all_shared_memory(kernel)) {
    return std::nullopt;
  }
  if (!as_function) return reinterpret_cast<uint64_t>(kernel);
  CUfunction function = nullptr;
  if (d.cuKernelGetFunction == nullptr ||
      d.cuKernelGetFunction(&function, kernel) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return reinterpret_cast<uint64_t>(function);
}

}  // namespace grape::cuda
