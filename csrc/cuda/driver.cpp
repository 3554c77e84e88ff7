#include "cuda/driver.h"

#include <cuda_runtime_api.h>

#include <type_traits>

namespace grape::cuda {

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi d;
    auto load = [](const char* symbol, int version, auto& fn) {
      void* ptr = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        ptr = nullptr;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(ptr);
    };
    load("cuMemGetAllocationGranularity", 12000, d.cuMemGetAllocationGranularity);
    load("cuMemAddressReserve", 12000, d.cuMemAddressReserve);
    load("cuMemAddressFree", 12000, d.cuMemAddressFree);
    load("cuMemCreate", 12000, d.cuMemCreate);
    load("cuMemRelease", 12000, d.cuMemRelease);
    load("cuMemMap", 12000, d.cuMemMap);
    load("cuMemUnmap", 12000, d.cuMemUnmap);
    load("cuMemSetAccess", 12000, d.cuMemSetAccess);
    load("cuGraphNodeGetType", 12000, d.cuGraphNodeGetType);
    load("cuGraphKernelNodeGetAttribute", 12000, d.cuGraphKernelNodeGetAttribute);
    load("cuGraphKernelNodeGetParams", 12000, d.cuGraphKernelNodeGetParams);
    load("cuGraphExecKernelNodeSetParams", 12000, d.cuGraphExecKernelNodeSetParams);
    load("cuGraphAddKernelNode", 12000, d.cuGraphAddKernelNode);
    load("cuFuncGetParamInfo", 12040, d.cuFuncGetParamInfo);
    load("cuKernelGetParamInfo", 12040, d.cuKernelGetParamInfo);
    load("cuFuncGetName", 12030, d.cuFuncGetName);
    load("cuKernelGetName", 12030, d.cuKernelGetName);
    load("cuGetErrorString", 12000, d.cuGetErrorString);
    load("cuPointerGetAttribute", 12000, d.cuPointerGetAttribute);
    load("cuFuncGetModule", 12000, d.cuFuncGetModule);
    load("cuModuleGetFunction", 12000, d.cuModuleGetFunction);
    load("cuKernelGetLibrary", 12050, d.cuKernelGetLibrary);
    load("cuLibraryGetKernel", 12000, d.cuLibraryGetKernel);
    load("cuLibraryLoadData", 12000, d.cuLibraryLoadData);
    load("cuLibraryGetModule", 12000, d.cuLibraryGetModule);
    load("cuKernelGetFunction", 12000, d.cuKernelGetFunction);
    load("cuKernelGetAttribute", 12000, d.cuKernelGetAttribute);
    load("cuKernelSetAttribute", 12000, d.cuKernelSetAttribute);
    load("cuCtxGetDevice", 12000, d.cuCtxGetDevice);
    load("cuDeviceGetAttribute", 12000, d.cuDeviceGetAttribute);
    // CUDA 13.2; asked only of a driver that new (an older one refuses the version as invalid).
    int version = 0;
    if (cudaDriverGetVersion(&version) == cudaSuccess && version >= 13020) {
      load("cuFuncGetParamCount", 13020, d.cuFuncGetParamCount);
      load("cuKernelGetParamCount", 13020, d.cuKernelGetParamCount);
    }
    return d;
  }();
  return api;
}

const char* driver_error_string(CUresult status) {
  const char* text = nullptr;
  const DriverApi& d = driver();
  if (d.cuGetErrorString == nullptr || d.cuGetErrorString(status, &text) != CUDA_SUCCESS ||
      text == nullptr) {
    return "unknown error";
  }
  return text;
}

}  // namespace grape::cuda
