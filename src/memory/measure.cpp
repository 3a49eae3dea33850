#include "headroom/memory/measure.h"

#include <chrono>

#include "headroom/memory/cpu_allocator.h"

namespace headroom::memory {

StepMemory measure_cpu_step(const std::function<void()>& step) {
  auto& alloc = CachingCpuAllocator::install();
  StepMemory m;
  m.baseline = alloc.current();
  alloc.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  step();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.peak = alloc.peak();
  return m;
}

}  // namespace headroom::memory
