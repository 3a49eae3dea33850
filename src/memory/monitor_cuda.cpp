// CUDA side of the memory monitor; compiled only when the Torch found carries CUDA.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "headroom/core/errors.h"
#include "headroom/memory/monitor.h"

namespace headroom::memory {

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class CudaMonitor final : public MemoryMonitor {
 public:
  explicit CudaMonitor(c10::Device d) : MemoryMonitor(d), index_(d.has_index() ? d.index() : 0) {
    // The caching allocator creates its per-device state with the first CUDA tensor; until then
    // its statistics and memory fraction refuse the device. (The allocator settings are applied
    // before this, so they still precede the first allocation that matters.)
    (void)at::empty({1}, at::TensorOptions().dtype(at::kByte).device(d));
    size_t free = 0;
    device_info(free, total_);
  }
  MemoryStats sample() const override {
    const auto st = alloc::getDeviceStats(index_);
    const size_t all = 0;  // StatType::AGGREGATE; the enum moved namespaces between 2.x releases
    MemoryStats s;
    s.allocated = st.allocated_bytes[all].current;
    s.reserved = st.reserved_bytes[all].current;
    s.active = st.active_bytes[all].current;
    s.peak_allocated = st.allocated_bytes[all].peak;
    s.peak_active = st.active_bytes[all].peak;
    s.peak_reserved = st.reserved_bytes[all].peak;
    s.alloc_retries = st.num_alloc_retries;
    s.ooms = st.num_ooms;
    s.limit = limit_;
    return s;
  }
  void reset_peak() override { alloc::resetPeakStats(index_); }
  int64_t capacity() const override { return int64_t(total_); }
  int64_t available() const override {
    size_t free = 0, total = 0;
    device_info(free, total);
    return int64_t(free) + sample().reserved;
  }
  void set_limit(int64_t bytes) override {
    limit_ = bytes;
    alloc::setMemoryFraction(bytes > 0 ? std::min(1.0, double(bytes) / double(total_)) : 1.0, index_);
  }
  void release_cache() override { alloc::emptyCache(); }
  // A guard, not cudaSetDevice back and forth: LibTorch 2.x's guard restores the previous device
  // without opening a context there (GPU 0, on a thread that never chose one).
  void synchronize() override {
    const c10::cuda::CUDAGuard guard(index_);
    cudaDeviceSynchronize();
  }

 private:
  void device_info(size_t& free, size_t& total) const {
    const c10::cuda::CUDAGuard guard(index_);
    const cudaError_t err = cudaMemGetInfo(&free, &total);
    if (err != cudaSuccess) throw DeviceError(std::string("cudaMemGetInfo failed: ") + cudaGetErrorString(err));
  }
  c10::DeviceIndex index_;
  size_t total_ = 0;
  int64_t limit_ = 0;
};

}  // namespace

std::unique_ptr<MemoryMonitor> make_cuda_monitor(c10::Device device) { return std::make_unique<CudaMonitor>(device); }

void set_cuda_allocator_settings(const std::string& settings) { alloc::setAllocatorSettings(settings); }

}  // namespace headroom::memory
