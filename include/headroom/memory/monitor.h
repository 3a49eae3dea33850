// Memory monitor and budget: what the run's device has in use, read without a device sync,
// and the limit the run must stay under. CUDA reads the caching allocator's statistics and
// enforces the budget with its memory fraction; the CPU reads Headroom's counting allocator and
// enforces the budget by throwing c10::OutOfMemoryError, so both share one recovery path.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <string>

#include "headroom/core/config.h"
#include "headroom/core/json.h"

namespace headroom::memory {

struct MemoryStats {
  int64_t allocated = 0;       // bytes held by live tensors
  int64_t reserved = 0;        // bytes the allocator holds (CUDA: cached segments; CPU: = allocated)
  int64_t active = 0;          // bytes in blocks in use (CUDA: includes the unused tail of split blocks)
  int64_t peak_allocated = 0;  // since the last reset_peak
  int64_t peak_reserved = 0;
  int64_t alloc_retries = 0;   // CUDA: allocations that freed the cache and retried (thrashing)
  int64_t ooms = 0;            // out-of-memory errors raised by the allocator
  int64_t limit = 0;           // the enforced budget; 0 = none
  double fragmentation() const { return reserved > 0 ? 1.0 - double(allocated) / double(reserved) : 0.0; }
};
Json memory_stats_json(const MemoryStats& s);

class MemoryMonitor {
 public:
  virtual ~MemoryMonitor() = default;
  virtual MemoryStats sample() const = 0;  // host-side counters only: never syncs the device
  virtual void reset_peak() = 0;
  virtual int64_t capacity() const = 0;   // the device's total memory
  virtual int64_t available() const = 0;  // free now, plus what this process's allocator holds
  // Enforces a budget (0 lifts it). Allocations above it raise c10::OutOfMemoryError.
  virtual void set_limit(int64_t bytes) = 0;
  virtual void release_cache() = 0;       // returns cached blocks (CUDA emptyCache; CPU: nothing cached)
  // Waits for the device's queued work. Only the estimator's probes call it, to time stages.
  virtual void synchronize() {}
  c10::Device device() const { return device_; }

 protected:
  explicit MemoryMonitor(c10::Device d) : device_(d) {}
  c10::Device device_;
};

// The monitor of a run's device. For the CPU this installs the counting allocator: call it
// before the model is built, or the parameters are not counted.
std::unique_ptr<MemoryMonitor> make_memory_monitor(c10::Device device);

// memory.budget in bytes on this device: auto = what is available now, a fraction of capacity,
// or the size given (refused with the fix when it exceeds the device's capacity).
int64_t resolve_budget(const MemoryBudgetSpec& spec, const MemoryMonitor& monitor);
// What training aims to stay under: budget * (1 - headroom).
inline int64_t usable_budget(int64_t budget, double headroom) { return int64_t(double(budget) * (1.0 - headroom)); }

// memory.max_split_size_mb, garbage_collection_threshold, expandable_segments as the CUDA
// allocator's settings string ("" when all are at their defaults).
std::string allocator_settings(const MemoryConfig& m);
// Applies them; call before the first CUDA allocation. Without CUDA it only checks that none is
// set (they would silently do nothing) and warns.
void apply_allocator_settings(const MemoryConfig& m, c10::Device device);

// An out-of-memory error from either allocator, or a CUDA library failure that means one
// (cuBLAS/cuDNN workspaces arrive as plain c10::Error).
bool is_out_of_memory(const c10::Error& e);

}  // namespace headroom::memory
