// Exponential moving average of a model's parameters and buffers (Ultralytics' ModelEMA): the
// decay ramps up over the first updates, so early averages follow the model.
#pragma once

#include <ATen/Tensor.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <vector>

#include "headroom/models/detector.h"

namespace headroom::train {

// The decay at update u = 1, 2, ...: Ultralytics' ModelEMA, decay * (1 - exp(-u / tau)); or
// TF's ExponentialMovingAverage with dynamic decay (what the TF OD API's use_moving_average
// wraps its optimizer in), min(decay, (1 + u) / (10 + u)).
enum class EmaRamp { ultralytics, tf };

class ModelEma {
 public:
  // `copy` is a second model of the same architecture; it becomes the average (eval mode, no grads).
  ModelEma(models::DetectorImpl& model, models::Detector copy, double decay, double tau, EmaRamp ramp = EmaRamp::ultralytics);
  void update(models::DetectorImpl& model);  // once per optimizer step
  double decay_now() const;                  // for the next update
  models::Detector& model() { return ema_; }
  int64_t updates() const { return updates_; }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  models::Detector ema_;
  double decay_, tau_;
  EmaRamp ramp_;
  int64_t updates_ = 0;
  std::vector<at::Tensor> ema_float_, ema_other_;  // float tensors averaged; others (counters) copied
};

// Every parameter and buffer of `m`, in a fixed order.
std::vector<at::Tensor> model_state(torch::nn::Module& m);

}  // namespace headroom::train
