// Detection losses for the three families, on whole batches with padded targets. The family
// comes from the model (DetectorInfo); make_loss picks the implementation from a registry.
//
// A loss is defined over a whole optimizer step, however the step is cut: into loader batches
// (accumulation) and those into micro-batches (the memory governor). Every term is a sum over the
// step's images divided by a normaliser of the step:
//   - a count that the targets alone decide (YOLOv5's matched anchors and grid cells, CenterNet's
//     objects): counts() of each loader batch, summed over the step before any forward, so each
//     part divides by the step's total and the parts add up to the step's loss exactly;
//   - a quantity that needs the predictions (YOLOv8's target-score sum, from the assigner): each
//     part reports its share as `deferred`, and the trainer keeps the accumulated gradients
//     divided by the running total, rescaling them as each part adds to it; also exact.
//     A loss may have several such normalisers (YOLO26's two branches), each dividing the
//     gradients of its own parameters (normaliser_of): the branches share none.
// With one part (the step is one batch) both reduce to the reference implementations.
#pragma once

#include <ATen/Tensor.h>
#include <torch/arg.h>

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
  Targets narrow(int64_t start, int64_t length) const;  // images [start, start + length)
  // The same ground truth in n >= N rows (padding: class -1, masked), the loss unchanged: a fixed
  // N keeps a CUDA graph's shapes (train/step_graph.h).
  Targets padded(int64_t n) const;
  std::vector<at::Tensor> tensors() const { return {boxes, classes, mask}; }
};

// From the loader's batch tensors (on any device): padding rows (class -1) and crowd boxes masked.
Targets make_targets(const at::Tensor& boxes, const at::Tensor& classes, const at::Tensor& crowd);

// What a part of a step needs to know about the whole step.
struct StepNorm {
  at::Tensor counts;   // [K] float on the device: counts() summed over the step's loader batches
  int64_t images = 0;  // images in the step (YOLO losses are per-image means times the images)
};

struct LossTerms {
  at::Tensor total;     // what backward runs on: this part's share of the step's loss; [D] with
                        // D deferred normalisers, one share per normaliser
  at::Tensor items;     // [T] float, detached: this part's share of each term (term_names())
  at::Tensor deferred;  // [] or [D] float, detached: this part's share of each prediction-
                        // dependent normaliser; `total` is still to be divided by the step's sums
                        // of them (at least 1 each), `items` by the first. Undefined when every
                        // normaliser is a count.
};

// The loss to backward: each share of `t.total` divided by its normaliser's step sum (`sums`,
// [] or [D], clamped to at least 1 here), added up.
at::Tensor normalised_total(const LossTerms& t, const at::Tensor& sums);

// Gains and assignment settings (Ultralytics' names for YOLO, the TF OD API's for CenterNet).
struct LossOptions {
  TORCH_ARG(double, box) = -1;             // -1: the family's gain (7.5 YOLOv8 CIoU, 0.05 YOLOv5)
  TORCH_ARG(double, cls) = 0.5;
  TORCH_ARG(double, dfl) = 1.5;            // YOLOv8
  TORCH_ARG(int64_t, tal_topk) = 10;       // YOLOv8 task-aligned assigner
  TORCH_ARG(double, tal_alpha) = 0.5;
  TORCH_ARG(double, tal_beta) = 6.0;
  TORCH_ARG(int64_t, assigner_chunk) = int64_t(1) << 23;  // elements of one [batch, boxes, anchors] block
  TORCH_ARG(double, obj) = 1.0;            // YOLOv5
  TORCH_ARG(int64_t, imgsz) = 0;           // data.imgsz, which YOLOv5's objectness gain scales with (0: each batch's own size)
  TORCH_ARG(double, anchor_t) = 4.0;
  TORCH_ARG(double, heatmap_weight) = 1.0; // CenterNet (TF task_loss_weight)
  TORCH_ARG(double, size_weight) = 0.1;    // (scale_loss_weight)
  TORCH_ARG(double, offset_weight) = 1.0;  // (offset_loss_weight)
  TORCH_ARG(double, min_overlap) = 0.7;    // CenterNet Gaussian radius
};
// The loss section as loss options.
LossOptions loss_options(const Config& c);

class DetectionLoss {
 public:
  virtual ~DetectionLoss() = default;
  virtual std::vector<std::string> term_names() const = 0;
  // Count normalisers of one loader batch of `height` x `width` images, from its targets only
  // ([K] float on their device); empty when the loss has none.
  virtual at::Tensor counts(const Targets& targets, int64_t height, int64_t width) const;
  // K, the length of counts() (0 = none): ranks exchange them before any backward.
  virtual int64_t count_terms() const { return 0; }
  virtual LossTerms operator()(const models::HeadOutputs& outputs, const Targets& targets, const StepNorm& step) = 0;
  // D, the deferred normalisers, and the one whose sum divides a parameter's gradient (by the
  // parameter's name in the model).
  virtual int64_t normalisers() const { return 1; }
  virtual int64_t normaliser_of(const std::string& /*parameter*/) const { return 0; }
  // Where the run is (epochs done, of `epochs`), training on `device`: losses whose weights follow
  // the schedule (YOLO26's branch weight) keep them in tensors on `device`, filled here on the
  // current stream, so that a CUDA graph of the step (train/step_graph.h) reads each epoch's
  // weights rather than baking in the first.
  virtual void set_progress(int64_t /*epoch*/, int64_t /*epochs*/, c10::Device /*device*/) {}
};

std::unique_ptr<DetectionLoss> make_loss(const models::DetectorInfo& info, const LossOptions& options);

// The functional form for one batch that is a whole step: its counts, the loss, the deferred
// normaliser applied. What the reference implementations compute for a batch.
struct BatchLoss {
  at::Tensor total;
  std::vector<std::pair<std::string, at::Tensor>> items;
};
BatchLoss batch_loss(DetectionLoss& loss, const models::HeadOutputs& outputs, const Targets& targets, int64_t height,
                     int64_t width);

}  // namespace headroom::losses
