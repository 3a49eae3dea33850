#include "headroom/losses/loss.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>

#include "headroom/core/errors.h"
#include "losses_internal.h"

namespace headroom::losses {

Targets make_targets(const at::Tensor& boxes, const at::Tensor& classes, const at::Tensor& crowd) {
  Targets t;
  t.boxes = boxes.to(at::kFloat);
  t.classes = classes.to(at::kLong);
  t.mask = classes.ge(0).logical_and(crowd.logical_not());
  return t;
}

Targets Targets::narrow(int64_t start, int64_t length) const {
  return {boxes.narrow(0, start, length), classes.narrow(0, start, length), mask.narrow(0, start, length)};
}

Targets Targets::padded(int64_t n) const {
  const int64_t extra = n - boxes.size(1);
  TORCH_CHECK(extra >= 0, "Targets::padded to ", n, " rows; they have ", boxes.size(1));
  if (extra == 0) return *this;
  return {at::constant_pad_nd(boxes, {0, 0, 0, extra}, 0), at::constant_pad_nd(classes, {0, extra}, -1),
          at::constant_pad_nd(mask, {0, extra}, 0)};
}

LossOptions loss_options(const Config& c) {
  const LossConfig& l = c.loss;
  return LossOptions()
      .box(l.box)
      .cls(l.cls)
      .dfl(l.dfl)
      .tal_topk(l.tal_topk)
      .tal_alpha(l.tal_alpha)
      .tal_beta(l.tal_beta)
      .assigner_chunk(l.assigner_chunk)
      .obj(l.obj)
      .imgsz(c.data.imgsz)
      .anchor_t(l.anchor_t)
      .heatmap_weight(l.task_loss_weight)
      .size_weight(l.scale_loss_weight)
      .offset_weight(l.offset_loss_weight)
      .min_overlap(l.min_overlap);
}

at::Tensor normalised_total(const LossTerms& t, const at::Tensor& sums) {
  if (!sums.defined()) return t.total;
  return (t.total.reshape({-1}) / sums.clamp_min(1).reshape({-1})).sum();
}

at::Tensor DetectionLoss::counts(const Targets&, int64_t, int64_t) const { return {}; }

std::unique_ptr<DetectionLoss> make_loss(const models::DetectorInfo& info, const LossOptions& options) {
  using Factory = std::function<std::unique_ptr<DetectionLoss>(const models::DetectorInfo&, const LossOptions&)>;
  static const std::map<std::string, Factory> registry = {
      {"yolov8", make_yolov8_loss}, {"yolov5", make_yolov5_loss}, {"centernet", make_centernet_loss}};
  const auto it = registry.find(info.family);
  if (it == registry.end()) throw Error("no loss for model family '" + info.family + "'");
  return it->second(info, options);
}

BatchLoss batch_loss(DetectionLoss& loss, const models::HeadOutputs& outputs, const Targets& targets, int64_t height,
                     int64_t width) {
  const StepNorm step{loss.counts(targets, height, width), targets.boxes.size(0)};
  const LossTerms t = loss(outputs, targets, step);
  const at::Tensor divisor = t.deferred.defined() ? t.deferred.reshape({-1})[0].clamp_min(1) : at::ones({}, t.total.options());
  BatchLoss out;
  out.total = normalised_total(t, t.deferred);
  const std::vector<std::string> names = loss.term_names();
  for (size_t i = 0; i < names.size(); ++i) out.items.emplace_back(names[i], t.items[int64_t(i)] / divisor);
  return out;
}

}  // namespace headroom::losses
