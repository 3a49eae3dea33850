// Detection losses for the three families, on whole batches with padded targets. The family
// comes from the model (DetectorInfo); make_loss picks the implementation from a registry.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/models/detector.h"


namespace headroom::losses {

// Padded ground truth in the pixels of the model's input images.
struct Targets {
  at::Tensor boxes;    // [B, N, 4] float xyxy
  at::Tensor classes;  // [B, N] int64
  at::Tensor mask;     // [B, N] bool: rows that are trained on (not padding, not crowd)
};

// From the loader's batch tensors (on any device): padding rows (class -1) and crowd boxes masked.
Targets make_targets(const at::Tensor& boxes, const at::Tensor& classes, const at::Tensor& crowd);

struct LossTerms {
  at::Tensor total;  // what backward() runs on (Ultralytics scale: the term sum times the batch size)
  std::vector<std::pair<std::string, at::Tensor>> items;  // detached scalars per term, for logs
};

using LossOptions = LossConfig;  // defaults in core/config.h
LossOptions loss_options(const Config& c);



class DetectionLoss {
 public:
  virtual ~DetectionLoss() = default;
  virtual LossTerms operator()(const models::HeadOutputs& outputs, const Targets& targets) = 0;
  // true: `total` sums over the batch's images (Ultralytics scale), so the totals of a batch's
  // parts add up to the whole; false: it is a mean (TF OD API), and a part weighs by its share.
  virtual bool sums_over_images() const { return true; }
};

std::unique_ptr<DetectionLoss> make_loss(const models::DetectorInfo& info, const LossOptions& options);

}  // namespace headroom::losses
