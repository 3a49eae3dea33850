// Weights files: the model's parameters and buffers plus what is needed to rebuild it
// (the model YAML text, scale, class names), so `trainer val --weights W` needs nothing else.
// Written whole or not at all (temporary file, fsync, rename).
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "headroom/models/detector.h"

namespace headroom::models {

struct WeightsInfo {
  std::vector<std::string> names;  // class names, index = class id
  std::vector<int> category_ids;   // COCO category id per class (empty for YOLO data)
};

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path);

struct LoadedWeights {
  Detector model{nullptr};
  WeightsInfo info;
};
// Throws InputError naming the file when it is missing, damaged or not a Headroom weights file.
LoadedWeights load_weights(const std::string& path, c10::Device device);

}  // namespace headroom::models
