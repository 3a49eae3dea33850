// Headroom's CPU allocator: it counts every CPU tensor allocated after it is installed, enforces
// an optional budget by throwing c10::OutOfMemoryError (so the CPU shares the CUDA out-of-memory
// path, and CI can test it), and caches large blocks as CUDA's caching allocator does, so that a
// training step reuses the pages of the last one instead of mapping, faulting in and zeroing
// fresh ones for every tensor.
//
// Blocks of kCachedFrom bytes or more are anonymous mappings of their own, kept in a cache when
// freed and handed to the next request they fit (best fit, at most an eighth over); smaller ones
// come from malloc. What the cache holds counts as reserved memory, inside the budget: an
// allocation that would take reserved memory over the limit first returns cached blocks, oldest
// first, and only then fails. The cache never holds more than twice the largest working set seen
// since it was last emptied, and release_cache() empties it. The process's resident memory so
// follows what the budget counts, with no process-wide malloc tuning.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include "headroom/core/torch_compat.h"

namespace headroom::memory {

struct CpuAllocatorStats {
  int64_t allocated = 0;       // bytes the live tensors asked for
  int64_t active = 0;          // bytes of the blocks they hold (page-rounded mappings, malloc'd blocks)
  int64_t cached = 0;          // bytes of freed blocks kept for reuse
  int64_t peak_allocated = 0;  // since the last reset_peak
  int64_t peak_active = 0;
  int64_t peak_reserved = 0;   // of active + cached
  int64_t evictions = 0;       // allocations that returned cached blocks to stay under the limit
  int64_t mappings = 0;        // fresh mappings made, each faulted in page by page when first touched
  int64_t ooms = 0;
  int64_t limit = 0;
  int64_t reserved() const { return active + cached; }
};

class CachingCpuAllocator final : public c10::Allocator {
 public:
  // Requests of this many bytes or more are mapped and cached; smaller ones go to malloc, whose
  // own heap serves them well.
  static constexpr size_t kCachedFrom = size_t(128) << 10;

  // Installs the allocator as LibTorch's CPU allocator (once per process; later calls return the
  // same instance). Tensors allocated before keep their own deleter and are not counted, so
  // install before building the model.
  static CachingCpuAllocator& install();

  c10::DataPtr allocate(size_t n) HEADROOM_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
  HEADROOM_ALLOCATOR_COPY_DATA

  CpuAllocatorStats stats() const;
  int64_t current() const { return allocated_.load(); }  // = stats().allocated
  int64_t peak() const { return peak_allocated_.load(); }
  void reset_peak();
  int64_t ooms() const { return ooms_.load(); }
  // 0 = no limit. An allocation that would take reserved memory above the limit returns cached
  // blocks first, then throws.
  void set_limit(int64_t bytes);
  int64_t limit() const { return limit_.load(); }
  // Unmaps every cached block; returns the bytes given back.
  int64_t release_cache();
  // Fault injection: the n-th allocation from now made by the calling thread (or, with
  // `other_threads`, by any thread but the caller: a loader's decode threads) throws
  // c10::OutOfMemoryError, once (0 disarms). Tests and benchmarks use it to strike an OOM at
  // an exact point of a step.
  void inject_oom_after(int64_t n, bool other_threads = false);

 private:
  CachingCpuAllocator() = default;
  static void release(void* ptr);
  // A block of at least `bytes` (whole pages) for a request of n, cached or fresh; its size in *block.
  void* allocate_block(size_t bytes, size_t n, size_t* block) const;
  void free_block(void* base, size_t bytes) const;
  // Counts `bytes` more reserved memory; over the limit, returns cached blocks first (taking the
  // mutex unless the caller holds it: `locked`), and throws c10::OutOfMemoryError when they are
  // not enough.
  void reserve(size_t bytes, size_t n, bool locked) const;
  void evict_oldest() const;  // mutex held
  void raise_peaks() const;
  [[noreturn]] void out_of_memory(size_t n, const char* why) const;

  struct Cached {
    void* base;
    uint64_t age;  // when it was freed: the oldest goes first
  };
  mutable std::mutex mutex_;
  mutable std::multimap<size_t, Cached> by_size_;  // free blocks by their size
  mutable std::map<uint64_t, std::multimap<size_t, Cached>::iterator> by_age_;
  mutable uint64_t clock_ = 0;
  mutable int64_t working_set_ = 0;  // the largest active seen since the cache was last emptied (mutex)

  mutable std::atomic<int64_t> allocated_{0}, active_{0}, cached_{0}, peak_allocated_{0}, peak_active_{0}, peak_reserved_{0}, ooms_{0}, evictions_{0},
      mappings_{0};
  std::atomic<int64_t> limit_{0};
  mutable std::atomic<int64_t> inject_countdown_{0};
  std::atomic<std::thread::id> inject_thread_{};
  std::atomic<bool> inject_other_{false};
};

}  // namespace headroom::memory
