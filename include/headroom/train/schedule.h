// Learning-rate and momentum per optimizer step: linear or cosine from lr0 to lr0 * lrf over the
// run, or the TF OD API's manual steps, with Ultralytics' warmup (the rate rises linearly from 0,
// biases fall from warmup_bias_lr, momentum rises from warmup_momentum). A pure function of the
// step, so a resumed run continues on the same curve.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/train/optimizer.h"

namespace headroom::train {

// linear / cosine: from lr0 to lr0 * lrf over the run; manual: TF OD API manual_step_learning_rate.
enum class LrSchedule { linear, cosine, manual };
LrSchedule lr_schedule_from(const std::string& word);  // train.schedule
const char* to_string(LrSchedule s);

struct ScheduleOptions {
  TORCH_ARG(LrSchedule, kind) = LrSchedule::linear;
  TORCH_ARG(double, lr0) = 0.01;
  TORCH_ARG(double, lrf) = 0.01;
  TORCH_ARG(double, momentum) = 0.937;
  TORCH_ARG(std::vector<int64_t>, lr_steps) = {};
  TORCH_ARG(std::vector<double>, lr_values) = {};
  TORCH_ARG(int64_t, total_steps) = 1;    // optimizer steps of the whole run
  TORCH_ARG(int64_t, warmup_steps) = 0;   // optimizer steps of warmup; 0 = none
  TORCH_ARG(double, warmup_momentum) = 0.8;
  TORCH_ARG(double, warmup_bias_lr) = 0.1;
};

struct GroupRates {
  double lr = 0;
  double momentum = 0;
};

class Schedule {
 public:
  explicit Schedule(ScheduleOptions o) : o_(std::move(o)) {}
  // The rate without warmup at optimizer step `step` (0-based).
  double base_lr(int64_t step) const;
  GroupRates rates(int64_t step, bool is_bias) const;
  // Sets lr and momentum of every group for the step about to run.
  void apply(Optimizer& optimizer, int64_t step) const;
  const ScheduleOptions& options() const { return o_; }

 private:
  ScheduleOptions o_;
};

// Ultralytics' warmup length: max(round(warmup_epochs * batches_per_epoch), 100) iterations when
// warmup_epochs > 0, expressed in optimizer steps (iterations / accumulate, rounded up).
int64_t warmup_steps(double warmup_epochs, int64_t batches_per_epoch, int64_t accumulate);


}  // namespace headroom::train
