// Learning-rate and momentum per optimizer step: linear or cosine from lr0 to lr0 * lrf, the TF OD
// API's manual steps or exponential decay; with Ultralytics' warmup (the rate rises linearly from
// 0, biases fall from warmup_bias_lr, momentum rises from warmup_momentum) or the OD API's (every
// group's rate from warmup_lr: a linear ramp or a constant burn-in, the decay starting after it).
// Optionally divided by 1 + inverse_time_decay * step (Keras' legacy optimizers' `decay`). A pure
// function of the step, so a resumed run continues on the same curve.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/train/optimizer.h"

namespace headroom::train {

// linear / cosine: from lr0 to lr0 * lrf; manual: TF OD API manual_step_learning_rate;
// exponential: lr0 * decay_factor^(steps / decay_every), TF OD API exponential_decay_learning_rate.
enum class LrSchedule { linear, cosine, manual, exponential };
LrSchedule lr_schedule_from(const std::string& word);  // train.schedule
const char* to_string(LrSchedule s);

// ultralytics: rates from 0 (biases from warmup_bias_lr) and momentum from warmup_momentum
// towards a curve that starts at step 0. linear: every rate from warmup_lr to the curve's rate at
// the warmup's end (the OD API's cosine and manual-step warmup). constant: warmup_lr throughout
// (the OD API's burn-in). linear and constant start the decay after the warmup, as the OD API does.
enum class WarmupKind { ultralytics, linear, constant };
WarmupKind warmup_kind_from(const std::string& word);  // train.warmup
const char* to_string(WarmupKind w);

struct ScheduleOptions {
  TORCH_ARG(LrSchedule, kind) = LrSchedule::linear;
  TORCH_ARG(double, lr0) = 0.01;
  TORCH_ARG(double, lrf) = 0.01;
  TORCH_ARG(double, momentum) = 0.937;
  TORCH_ARG(std::vector<int64_t>, lr_steps) = {};
  TORCH_ARG(std::vector<double>, lr_values) = {};
  TORCH_ARG(int64_t, decay_every) = 1;     // exponential: steps per decay_factor
  TORCH_ARG(double, decay_factor) = 1.0;
  TORCH_ARG(bool, staircase) = true;       // exponential: whole powers only
  TORCH_ARG(double, min_lr) = 0.0;         // exponential: the floor
  TORCH_ARG(int64_t, total_steps) = 1;     // optimizer steps of the whole run
  TORCH_ARG(int64_t, schedule_steps) = 0;  // linear / cosine reach lr0 * lrf here; 0 = total_steps
  TORCH_ARG(int64_t, hold_steps) = 0;      // lr0 held this long before the decay starts
  TORCH_ARG(WarmupKind, warmup) = WarmupKind::ultralytics;
  TORCH_ARG(int64_t, warmup_steps) = 0;    // optimizer steps of warmup; 0 = none
  TORCH_ARG(double, warmup_lr) = 0.0;      // linear / constant warmup
  TORCH_ARG(double, warmup_momentum) = 0.8;
  TORCH_ARG(double, warmup_bias_lr) = 0.1;
  // Every rate divided by 1 + this * step: what tf.keras' legacy optimizers do with `decay`, and
  // so what TF2's OD API does with rms_prop_optimizer's decay.
  TORCH_ARG(double, inverse_time_decay) = 0.0;
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
  // The step the decay starts from: lr0 until then (hold_steps, after an OD API warmup).
  int64_t decay_start() const;
  // With warmup and inverse_time_decay; `scale`: the group's lr_scale (its warmup rises to scale x lr).
  GroupRates rates(int64_t step, bool is_bias, double scale = 1) const;
  // Sets lr and momentum of every group for the step about to run.
  void apply(Optimizer& optimizer, int64_t step) const;
  const ScheduleOptions& options() const { return o_; }

 private:
  GroupRates warmed_up(int64_t step, bool is_bias, double scale) const;  // base_lr with the warmup
  ScheduleOptions o_;
};

// Ultralytics' warmup length: max(round(warmup_epochs * batches_per_epoch), 100) iterations when
// warmup_epochs > 0, expressed in optimizer steps (iterations / accumulate, rounded up).
int64_t warmup_steps(double warmup_epochs, int64_t batches_per_epoch, int64_t accumulate);


}  // namespace headroom::train
