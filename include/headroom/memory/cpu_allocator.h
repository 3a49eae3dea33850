// A byte-counting CPU allocator: current and peak bytes of every CPU tensor allocated after it
// is installed, and an optional budget enforced by throwing c10::OutOfMemoryError, so the CPU
// shares the CUDA out-of-memory path (and CI can test it).
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "headroom/core/torch_compat.h"

namespace headroom::memory {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the allocator as LibTorch's CPU allocator (once per process; later calls return the
  // same instance). Tensors allocated before keep their own deleter and are not counted, so
  // install before building the model.
  static CountingCpuAllocator& install();

  c10::DataPtr allocate(size_t n) HEADROOM_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
  HEADROOM_ALLOCATOR_COPY_DATA

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  int64_t ooms() const { return ooms_.load(); }
  // 0 = no limit. An allocation that would take `current` above the limit throws.
  void set_limit(int64_t bytes) { limit_.store(bytes); }
  int64_t limit() const { return limit_.load(); }
  // Fault injection: the n-th allocation from now made by the calling thread (or, with
  // `other_threads`, by any thread but the caller: a loader's decode threads) throws
  // c10::OutOfMemoryError, once (0 disarms). Tests and benchmarks use it to strike an OOM at
  // an exact point of a step.
  void inject_oom_after(int64_t n, bool other_threads = false);

 private:
  CountingCpuAllocator() = default;
  static void release(void* ptr);

  mutable std::atomic<int64_t> current_{0}, peak_{0}, ooms_{0};
  std::atomic<int64_t> limit_{0};
  mutable std::atomic<int64_t> inject_countdown_{0};
  std::atomic<std::thread::id> inject_thread_{};
  std::atomic<bool> inject_other_{false};
};

}  // namespace headroom::memory
