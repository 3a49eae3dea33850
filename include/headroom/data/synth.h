// The synthetic data set: shapes of several classes on textured backgrounds, in varied sizes,
// counts and aspect ratios, written as JPEGs with YOLO labels, COCO JSON and data YAMLs.
// Deterministic in the seed (whatever the thread count). It feeds `make demo` and the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace headroom::data {

struct SynthOptions {
  std::string out;
  int images = 200;           // in all; the last val_fraction of them form the val split
  int size = 320;             // long side in pixels; the short side varies from 0.6x to 1x
  int64_t seed = 0;
  int classes = 4;            // shape classes used, 1..6 (circle, square, triangle, cross, ring, star)
  double val_fraction = 0.2;
  int max_objects = 6;        // per image; about 5% of images are background (no objects)
  double min_object = 0.10;   // object size (extent) as a fraction of the image's short side
  double max_object = 0.44;
  int quality = 90;           // JPEG quality
  int threads = 1;
};

struct SynthSummary {
  std::string data_yaml;      // YOLO-layout data YAML
  std::string coco_yaml;      // the same data through its COCO JSON files
  int64_t train_images = 0, val_images = 0, boxes = 0;
  bool reused = false;        // the folder already held this exact data set
};

const std::vector<std::string>& synth_shape_names();

// Writes the data set under options.out. A folder that exists must be empty or an earlier
// synthetic set (which is replaced, or reused when made with the same options); anything
// else is refused rather than overwritten.
SynthSummary synthesize(const SynthOptions& options);

}  // namespace headroom::data
