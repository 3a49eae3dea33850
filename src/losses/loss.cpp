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

LossOptions loss_options(const Config& c) { return c.loss; }

std::unique_ptr<DetectionLoss> make_loss(const models::DetectorInfo& info, const LossOptions& options) {
  using Factory = std::function<std::unique_ptr<DetectionLoss>(const models::DetectorInfo&, const LossOptions&)>;
  static const std::map<std::string, Factory> registry = {
      {"yolov8", make_yolov8_loss}, {"yolov5", make_yolov5_loss}, {"centernet", make_centernet_loss}};
  const auto it = registry.find(info.family);
  if (it == registry.end()) throw Error("no loss for model family '" + info.family + "'");
  return it->second(info, options);
}

}  // namespace headroom::losses
