// Helpers for tests that train: a tiny YOLOv8 run on the small synthetic set, losses and hooks
// that make micro-batches add up exactly, parameter snapshots.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/losses/loss.h"
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


// A loss that is a sum over images, so micro-batches add up exactly to the whole batch.
class PerImageSumLoss : public losses::DetectionLoss {
 public:
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&) override {
    at::Tensor total = at::zeros({});
    for (const auto& level : outputs.at("pred")) total = total + level.pow(2).mean({1, 2, 3}).sum();
    return {total, {{"sq", total.detach()}}};
  }
};

class NanLoss : public losses::DetectionLoss {
 public:
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&) override {
    const at::Tensor total = outputs.at("pred")[0].sum() * NAN;
    return {total, {{"nan", total.detach()}}};
  }
};

// Keeps BatchNorm in eval mode, so batch statistics do not depend on the micro-batch.
class EvalModeBatchNorm : public train::Hook {
 public:
  void before_step(train::Trainer& t) override { t.model().eval(); }
};

inline std::vector<at::Tensor> params_of(models::DetectorImpl& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}


inline train::TrainerParts parts_for(const Config& c, const std::string& dir) {
  at::manual_seed(0);
  return train::make_trainer_parts(c, c10::Device(c10::kCPU), dir);
}

}  // namespace headroom::test
