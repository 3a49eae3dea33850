// Measuring what a training step costs on the CPU, with Headroom's CPU allocator.
#pragma once

#include <cstdint>
#include <functional>

namespace headroom::memory {

struct StepMemory {
  int64_t baseline = 0;  // bytes in use before the step (parameters, gradients, optimizer state, inputs)
  int64_t peak = 0;      // highest use during the step
  double seconds = 0;
  int64_t above_baseline() const { return peak - baseline; }  // activations and temporaries
};

// Runs `step` once and reports its peak above the memory in use before it. Installs the
// CPU allocator if needed (tensors allocated before that are not counted).
StepMemory measure_cpu_step(const std::function<void()>& step);

}  // namespace headroom::memory
