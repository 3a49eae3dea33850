// What a device has in use, read without a device sync: the trainer measures each step with it.
// The interface is the trainer's; memory/ implements it (CUDA caching-allocator statistics, the
// caching CPU allocator) and builds the governor on top of train/.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace headroom {

struct MemoryStats {
  int64_t allocated = 0;       // bytes held by live tensors
  int64_t reserved = 0;        // bytes the allocator holds: in use and cached (CUDA: its segments; CPU: its blocks)
  int64_t active = 0;          // bytes in blocks in use (CUDA: includes the unused tail of split blocks; CPU: page-rounded)
  int64_t peak_allocated = 0;  // since the last reset_peak
  int64_t peak_active = 0;
  int64_t peak_reserved = 0;
  int64_t alloc_retries = 0;   // CUDA: allocations that freed the cache and retried (thrashing). The CPU
                               // allocator returns cached blocks one by one, with no device to wait for: 0
  int64_t ooms = 0;            // out-of-memory errors raised by the allocator
  int64_t limit = 0;           // the enforced budget; 0 = none
  double fragmentation() const { return reserved > 0 ? 1.0 - double(allocated) / double(reserved) : 0.0; }
};

class MemoryMonitor {
 public:
  virtual ~MemoryMonitor() = default;
  virtual MemoryStats sample() const = 0;  // host-side counters only: never syncs the device
  virtual void reset_peak() = 0;
  virtual int64_t capacity() const = 0;   // the device's total memory
  virtual int64_t available() const = 0;  // free now, plus what this process's allocator holds
  // Enforces a budget (0 lifts it). Allocations above it raise c10::OutOfMemoryError.
  virtual void set_limit(int64_t bytes) = 0;
  virtual void release_cache() = 0;       // returns cached blocks to the system (CUDA emptyCache; CPU: unmaps them)
  // A phase ended (an epoch's steps, a validation pass, the run): the CPU returns its cached
  // blocks, whose sizes the next phase would not reuse; CUDA keeps its cache (emptying it waits
  // for the device).
  virtual void phase_ended() {}
  // Waits for the device's queued work. Only the estimator's probes call it, to time stages.
  virtual void synchronize() {}
  c10::Device device() const { return device_; }

 protected:
  explicit MemoryMonitor(c10::Device d) : device_(d) {}
  c10::Device device_;
};

}  // namespace headroom
