// The memory governor: a training hook that keeps a run inside its memory budget.
//  - before training: enforces the budget on the device, checks that the model, EMA and
//    optimizer state live on the run's device;
//  - on an out-of-memory error (the trainer has undone the attempt): releases cached blocks and
//    climbs a ladder — halve the micro-batch, checkpoint every stage, switch AMP on (when
//    memory.allow_amp) — then the same batch runs again; at micro-batch 1 with everything on it
//    stops the run with the memory table and what to change;
//  - after each step (host-side allocator counters, no device sync): shrinks pre-emptively when
//    the peak crosses budget - headroom or allocation retries grow on consecutive steps (the
//    allocator thrashing), and optionally grows back after a stable stretch.
// Every decision is logged with its reason and kept in TrainState (so in checkpoints).
// Register it before the other hooks: its after_step then reads the step's own peak, before
// validation or checkpoint writing add theirs.
#pragma once

#include <torch/arg.h>

#include <memory>

#include "headroom/memory/monitor.h"
#include "headroom/train/trainer.h"

namespace headroom::memory {

struct GovernorOptions {
  TORCH_ARG(int64_t, budget) = 0;        // bytes; 0 = no limit enforced
  TORCH_ARG(double, headroom) = 0.10;
  TORCH_ARG(bool, allow_amp) = true;
  TORCH_ARG(int64_t, grow_after) = 0;    // steps without pressure before doubling back; 0 = never
  TORCH_ARG(int64_t, retry_steps) = 2;   // consecutive steps with new allocator retries that count as thrashing
};
GovernorOptions governor_options(const Config& c, int64_t budget);

class GovernorHook : public train::Hook {
 public:
  GovernorHook(std::shared_ptr<MemoryMonitor> monitor, GovernorOptions options);
  void before_train(train::Trainer& t) override;
  void before_step(train::Trainer& t) override;
  void after_step(train::Trainer& t) override;
  void after_epoch(train::Trainer& t) override;
  bool on_oom(train::Trainer& t, const c10::Error& e, train::OomSite site) override;

 private:
  void shrink(train::Trainer& t, const std::string& reason);
  std::shared_ptr<MemoryMonitor> monitor_;
  GovernorOptions o_;
  int64_t last_retries_ = 0, retry_run_ = 0, calm_steps_ = 0, epoch_peak_ = 0, retries_at_start_ = 0, ooms_at_start_ = 0,
          epoch_peak_reserved_ = 0;
};

// Refuses (DeviceError naming the tensor) a model, EMA or optimizer state that is not on the
// trainer's device: training never runs on the CPU by accident.
void check_on_device(train::Trainer& t);
void check_tensors_on(c10::Device device, const char* what, const std::vector<at::Tensor>& tensors);

// The memory a step needs whatever the batch: parameters, gradients, optimizer state, EMA.
struct StaticMemory {
  int64_t parameters = 0, gradients = 0, optimizer = 0, ema = 0;
  int64_t total() const { return parameters + gradients + optimizer + ema; }
};
StaticMemory static_memory(train::Trainer& t);

}  // namespace headroom::memory
