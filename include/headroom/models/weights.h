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
  std::string framework;           // what made imported weights ("Ultralytics 8.4.190 DetectionModel"); empty: Headroom
};

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path);
// The same contents into an archive that may hold more (training checkpoints are weights files too).
void write_weights(DetectorImpl& model, const WeightsInfo& info, torch::serialize::OutputArchive& archive);
// Saves an archive whole or not at all, streamed into a temporary file in the same folder while
// it is hashed (no copy of the archive in memory: a checkpoint of Hourglass-104 with Adam is
// ~3 GB), then a trailer: `meta` (a JSON text that can be read without loading any tensor),
// the lengths and a 64-bit hash of everything before it; fsync, rename.
void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path, const std::string& meta = "");

// What a file's trailer says, after a streamed check of its hash (memory: one read buffer).
// InputError naming the file when it is missing, truncated or changed after writing (`what`
// names the kind of file in the message).
struct ArchiveFile {
  uint64_t archive_bytes = 0;  // the zip archive at the start of the file
  std::string meta;            // "" for files without one
};
ArchiveFile verify_archive(const std::string& path, const std::string& what);
// Verifies, then loads the archive reading the file as it goes (no copy of the file in memory).
ArchiveFile load_archive_verified(torch::serialize::InputArchive& archive, const std::string& path, c10::Device device,
                                 const std::string& what);

// True when the file ends with a Headroom weights or checkpoint trailer (no hash check).
bool has_headroom_trailer(const std::string& path);

// The model description write_weights stored in `archive` (file, YAML text, scale, class count);
// InputError naming `path` when it holds none.
ModelSpec stored_model(torch::serialize::InputArchive& archive, const std::string& path);
// Whether `model` is built as `spec` describes: the same scale and the same YAML, read (comments
// and formatting aside).
bool same_model(const ModelSpec& spec, const DetectorImpl& model);

struct LoadedWeights {
  Detector model{nullptr};
  WeightsInfo info;
};
// Throws InputError naming the file when it is missing, damaged or not a Headroom weights file.
LoadedWeights load_weights(const std::string& path, c10::Device device);

}  // namespace headroom::models
