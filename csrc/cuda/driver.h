#pragma once
// The CUDA driver calls the extension makes, looked up through the runtime
// (cudaGetDriverEntryPointByVersion) so that the extension does not link libcuda: it must load on
// machines without a driver. A member is null where the installed driver lacks the call.

#include <cuda.h>

namespace grape::cuda {

struct DriverApi {
#define GRAPE_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  // Virtual memory (the capture arena).
  GRAPE_DRIVER_MEMBER(cuMemGetAllocationGranularity)
  GRAPE_DRIVER_MEMBER(cuMemAddressReserve)
  GRAPE_DRIVER_MEMBER(cuMemAddressFree)
  GRAPE_DRIVER_MEMBER(cuMemCreate)
  GRAPE_DRIVER_MEMBER(cuMemRelease)
  GRAPE_DRIVER_MEMBER(cuMemMap)
  GRAPE_DRIVER_MEMBER(cuMemUnmap)
  GRAPE_DRIVER_MEMBER(cuMemSetAccess)
  // Reading captured graphs node by node: called per node, without the runtime's wrapper.
  GRAPE_DRIVER_MEMBER(cuGraphNodeGetType)
  GRAPE_DRIVER_MEMBER(cuGraphKernelNodeGetAttribute)
  // Kernel nodes of shared executables (CUDA 12.4: the parameter layout of a kernel).
  GRAPE_DRIVER_MEMBER(cuGraphKernelNodeGetParams)
  GRAPE_DRIVER_MEMBER(cuGraphExecKernelNodeSetParams)
  GRAPE_DRIVER_MEMBER(cuGraphAddKernelNode)
  GRAPE_DRIVER_MEMBER(cuFuncGetParamInfo)
  GRAPE_DRIVER_MEMBER(cuKernelGetParamInfo)
  GRAPE_DRIVER_MEMBER(cuFuncGetName)
  GRAPE_DRIVER_MEMBER(cuKernelGetName)
  GRAPE_DRIVER_MEMBER(cuGetErrorString)
  // Storing graphs (the graph cache): which words are addresses the driver knows.
  GRAPE_DRIVER_MEMBER(cuPointerGetAttribute)
  // Restoring graphs: a kernel no live capture ran, found by name beside one that did.
  GRAPE_DRIVER_MEMBER(cuFuncGetModule)
  GRAPE_DRIVER_MEMBER(cuModuleGetFunction)
  GRAPE_DRIVER_MEMBER(cuKernelGetLibrary)
  GRAPE_DRIVER_MEMBER(cuLibraryGetKernel)
  // A stored kernel image loaded back (Note [Kernel images]), and the modules of libraries.
  GRAPE_DRIVER_MEMBER(cuLibraryLoadData)
  GRAPE_DRIVER_MEMBER(cuLibraryGetModule)
  GRAPE_DRIVER_MEMBER(cuKernelGetFunction)
  GRAPE_DRIVER_MEMBER(cuKernelGetAttribute)
  GRAPE_DRIVER_MEMBER(cuKernelSetAttribute)
  GRAPE_DRIVER_MEMBER(cuCtxGetDevice)
  GRAPE_DRIVER_MEMBER(cuDeviceGetAttribute)
#undef GRAPE_DRIVER_MEMBER
  // CUDA 13.2, newer than the toolkits we build with, hence spelled out: a kernel's parameter
  // count, so that reading its layout need not probe past the last parameter.
  CUresult (*cuFuncGetParamCount)(CUfunction, size_t*) = nullptr;
  CUresult (*cuKernelGetParamCount)(CUkernel, size_t*) = nullptr;
};

// Loaded on first use; members the driver lacks stay null. Never throws.
const DriverApi& driver();

// The driver's text for `status` ("unknown error" where it has none).
const char* driver_error_string(CUresult status);

}  // namespace grape::cuda
