// Helpers of the memory tests: the CPU monitor, a hook called after every step, and a governor
// installed on a hand-built trainer as its step executor.
#pragma once

#include <functional>
#include <memory>

#include "headroom/memory/governor.h"
#include "headroom/memory/monitor.h"
#include "headroom/train/trainer.h"

namespace headroom::test {

inline std::shared_ptr<MemoryMonitor> cpu_monitor() { return memory::make_memory_monitor(c10::Device(c10::kCPU)); }

// Calls `fire` after every step.
class AfterStep : public train::Hook {
 public:
  explicit AfterStep(std::function<void(train::Trainer&)> fire) : fire_(std::move(fire)) {}
  void after_step(train::Trainer& t) override { fire_(t); }

 private:
  std::function<void(train::Trainer&)> fire_;
};

// The governor registered on `t`, kept for its decisions.
inline memory::Governor* govern(train::Trainer& t, memory::GovernorOptions o = {}, std::shared_ptr<memory::RecomputePlanner> planner = nullptr) {
  auto g = std::make_unique<memory::Governor>(o, std::move(planner));
  memory::Governor* raw = g.get();
  t.set_executor(raw);
  t.register_hook(std::move(g));
  return raw;
}

}  // namespace headroom::test
