// The memory monitors (the interface is train/memory_monitor.h) and the budget: what the run's device has
// in use, read without a device sync, and the limit the run must stay under. CUDA reads the
// caching allocator's statistics and enforces the budget with its memory fraction; the CPU reads
// Headroom's caching CPU allocator and enforces the budget by throwing c10::OutOfMemoryError, so
// both share one recovery path.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <string>

#include "headroom/core/config.h"
#include "headroom/core/json.h"
#include "headroom/core/memory_errors.h"
#include "headroom/train/memory_monitor.h"

namespace headroom::memory {

Json memory_stats_json(const MemoryStats& s);

// The monitor of a run's device. For the CPU this installs the CPU allocator: call it
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

}  // namespace headroom::memory
