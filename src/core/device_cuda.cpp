// CUDA side of the device policy; compiled only when the Torch found carries CUDA.
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include "headroom/core/device.h"

namespace headroom {

DeviceMemory cuda_device_memory(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  // Entry 0 is StatType::AGGREGATE (all pools); the enum moved namespaces between 2.x releases.
  const size_t all = 0;
  DeviceMemory m;
  m.allocated = stats.allocated_bytes[all].current;
  m.reserved = stats.reserved_bytes[all].current;
  m.peak = stats.allocated_bytes[all].peak;
  return m;
}

void set_cuda_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

CudaStatus query_cuda() {
  CudaStatus s;
  s.built = true;
  s.runtime_version = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    switch (err) {
      case cudaErrorInsufficientDriver:
        s.reason = "no usable NVIDIA driver (libcuda.so is missing or older than CUDA " +
                   s.runtime_version + " needs); install or update the NVIDIA driver";
        break;
      case cudaErrorNoDevice:
        s.reason = "the NVIDIA driver reports no CUDA device (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)";
        break;
      default:
        s.reason = std::string("the CUDA runtime failed: ") + cudaGetErrorString(err);
    }
    cudaGetLastError();  // clear the sticky error state for later callers
    return s;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    s.devices.push_back(GpuInfo{i, p.name, static_cast<int64_t>(p.totalGlobalMem), p.major, p.minor});
  }
  if (!torch::cuda::is_available()) {
    s.reason = "the CUDA runtime sees devices but LibTorch cannot use them";
    return s;
  }
  s.available = !s.devices.empty();
  if (!s.available) s.reason = "no CUDA device answered";
  s.cudnn = torch::cuda::cudnn_is_available();
  if (s.cudnn) s.cudnn_version = at::detail::getCUDAHooks().versionCuDNN();
  return s;
}

}  // namespace headroom
