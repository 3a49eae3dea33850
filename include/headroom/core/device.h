// Device policy: what CUDA this build and machine offer, and which device a run gets.
// Training never lands on the CPU silently: `auto` falling back warns with the reason,
// an explicit CUDA request that cannot be met is a DeviceError (exit code 2).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/core/json.h"

namespace headroom {

struct GpuInfo {
  int index = 0;
  std::string name;
  int64_t total_memory = 0;   // bytes
  int major = 0, minor = 0;   // compute capability
};

struct CudaStatus {
  bool built = false;        // this binary and its LibTorch carry CUDA
  bool available = false;    // ... and a driver and at least one device answered
  std::string reason;        // why not available (empty when available)
  std::vector<GpuInfo> devices;
  bool cudnn = false;
  int64_t cudnn_version = 0;
  std::string runtime_version;  // CUDA runtime the binary was built with, "" without CUDA
};

// Asks the CUDA runtime (when built with CUDA); cheap enough to call at start-up.
CudaStatus query_cuda();

struct DeviceChoice {
  c10::Device device = c10::Device(c10::kCPU);
  std::string warning;       // non-empty when `auto` fell back to the CPU: say it loudly
};

// `spec` is auto | cpu | cuda | cuda:N. Throws DeviceError saying why and how to fix it.
DeviceChoice resolve_device(const std::string& spec, const CudaStatus& cuda);

Json cuda_status_json(const CudaStatus& s);

// Makes a CUDA `device` the calling thread's current one (a rank's cuda:LOCAL_RANK): CUDA calls
// on the current device would otherwise open a context on GPU 0 in every rank. Nothing for the CPU.
void set_current_device(c10::Device device);

// Memory in use on a device, read without a sync. CUDA: the caching allocator (allocated,
// reserved, peak allocated); CPU: the process (resident, resident, peak resident).
struct DeviceMemory {
  int64_t allocated = 0, reserved = 0, peak = 0;
};
DeviceMemory device_memory(c10::Device device);

// The host's memory from /proc/meminfo: MemTotal and MemAvailable, in bytes (0 when unknown).
struct HostMemory {
  int64_t total = 0, available = 0;
};
HostMemory host_memory();

// This process's resident memory from /proc/self/status: VmRSS now and VmHWM, its peak (since the
// start or the last reset_peak_rss), in bytes (0 when unknown).
struct ProcessMemory {
  int64_t rss = 0, peak_rss = 0;
};
ProcessMemory process_memory();
// Hands the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere), so
// that RSS read next counts memory in use, not what the heap kept after a free: once the
// snapshot of a checkpoint or a worker's buffers are freed, glibc may hold 10 MiB or more of it.
void return_free_heap();
// Restarts VmHWM from the current RSS (/proc/self/clear_refs); false where the kernel refuses.
bool reset_peak_rss();

}  // namespace headroom
