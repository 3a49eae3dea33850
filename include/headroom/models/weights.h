// Weights files: the model's parameters and buffers plus what is needed to rebuild it
// (the model YAML text, scale, class names), so `trainer val --weights W` needs nothing else.
// Written whole or not at all (temporary file, fsync, rename).
#pragma once

#include <c10/core/Device.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

#include "headroom/models/detector.h"

namespace headroom::models {

struct WeightsInfo {
  std::vector<std::string> names;  // class names, index = class id
  std::vector<int> category_ids;   // COCO category id per class (empty for YOLO data)
};

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path);
// The same contents into an archive that may hold more (training checkpoints are weights files too).
void write_weights(DetectorImpl& model, const WeightsInfo& info, torch::serialize::OutputArchive& archive);
// Saves an archive whole or not at all (temporary file in the same folder, fsync, rename), with
// a trailer holding its length and a 64-bit hash.
void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path);
// Loads what save_archive_atomic wrote; InputError naming the file when it is missing,
// truncated or changed after writing (`what` names the kind of file in the message).
void load_archive_verified(torch::serialize::InputArchive& archive, const std::string& path, c10::Device device,
                           const std::string& what);

struct LoadedWeights {
  Detector model{nullptr};
  WeightsInfo info;
};
// Throws InputError naming the file when it is missing, damaged or not a Headroom weights file.
LoadedWeights load_weights(const std::string& path, c10::Device device);

}  // namespace headroom::models
