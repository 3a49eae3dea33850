// Helpers for tests that train: a tiny YOLOv8 run on the small synthetic set, test losses,
// a hook that freezes BatchNorm, parameter snapshots.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/losses/loss.h"
#include "headroom/memory/monitor.h"
#include "headroom/train/trainer.h"
#include "test_util.h"

namespace headroom::test {

// Overrides of a tiny CPU run (64 px, batch 4 of nominal 8, one decode thread) plus `extra`.
inline std::vector<std::string> tiny_run(std::vector<std::string> extra, const std::string& model = "yolov8.yaml") {
  std::vector<std::string> o = tiny_model(model);
  for (const char* k : {"data.imgsz=64", "data.workers=1", "threads=1", "train.batch=4", "train.nominal_batch=8", "train.plots=false",
                        "train.log_every=1", "device=cpu"})
    o.push_back(k);
  o.push_back("data.dataset=" + small_synth());
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// A loss that is a sum over images of the predictions' squares: parts of a batch add up exactly.
class PerImageSumLoss : public losses::DetectionLoss {
 public:
  std::vector<std::string> term_names() const override { return {"sq"}; }
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&, const losses::StepNorm&) override {
    at::Tensor total = at::zeros({});
    for (const auto& level : outputs.at("pred")) total = total + level.pow(2).mean({1, 2, 3}).sum();
    return {total, total.detach().reshape({1}), {}};
  }
};

class NanLoss : public losses::DetectionLoss {
 public:
  std::vector<std::string> term_names() const override { return {"nan"}; }
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&, const losses::StepNorm&) override {
    const at::Tensor total = outputs.at("pred")[0].sum() * NAN;
    return {total, total.detach().reshape({1}), {}};
  }
};

// Keeps BatchNorm in eval mode, so batch statistics do not depend on how a step is cut.
class EvalModeBatchNorm : public train::Hook {
 public:
  void before_step(train::Trainer& t) override { t.model().eval(); }
};

inline std::vector<at::Tensor> params_of(models::DetectorImpl& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// The largest difference between two parameter lists, relative to the largest value of `b`.
// Infinite when either holds a non-finite value or `b` is all zeros (nothing to compare).
inline double relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::isfinite(a[i]).all().item<bool>() || !at::isfinite(b[i]).all().item<bool>()) return INFINITY;
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    largest = std::max(largest, b[i].abs().max().item<double>());
  }
  return largest > 0 ? worst / largest : INFINITY;
}

// The run's parts on the CPU, with the CPU memory monitor (the memory governor needs one).
inline train::TrainerParts parts_for(const Config& c, const std::string& dir) {
  at::manual_seed(0);
  train::TrainerParts p = train::make_trainer_parts(c, c10::Device(c10::kCPU), dir);
  p.monitor = memory::make_memory_monitor(c10::Device(c10::kCPU));
  return p;
}

}  // namespace headroom::test
