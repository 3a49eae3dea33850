// Internal: the family factories behind make_loss.
#pragma once

#include <memory>

#include "headroom/losses/loss.h"

namespace headroom::losses {

std::unique_ptr<DetectionLoss> make_yolov8_loss(const models::DetectorInfo& info, const LossOptions& o);
std::unique_ptr<DetectionLoss> make_yolov5_loss(const models::DetectorInfo& info, const LossOptions& o);
std::unique_ptr<DetectionLoss> make_centernet_loss(const models::DetectorInfo& info, const LossOptions& o);

}  // namespace headroom::losses
