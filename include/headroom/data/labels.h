// Label parsers: YOLO txt files and COCO instances JSON, each validating every record.
#pragma once

#include <string>
#include <vector>

#include "headroom/core/json.h"
#include "headroom/data/dataset.h"

namespace headroom::data {

// Coordinates may exceed [0, 1] by this much (rounding in exporters) before it is an error.
constexpr float kCoordTolerance = 1e-3f;

struct LabelFile {
  std::vector<Box> boxes;
  std::vector<Problem> problems;
  bool corrupt = false;  // a bad_label problem: the image is not trained on
};

// Lines are "class cx cy w h" (normalised) or a polygon "class x1 y1 x2 y2 ..." (Ultralytics
// segment labels; the box is its extent). Duplicates and zero-area boxes are dropped with a
// problem each; anything malformed marks the file corrupt, naming path:line.
LabelFile parse_yolo_labels(const std::string& text, const std::string& path, int num_classes);

// images/.../x.jpg -> labels/.../x.txt (the last "images" folder becomes "labels"); an image
// outside an images/ folder has its labels beside it.
std::string yolo_label_path(const std::string& image_path);

struct CocoData {
  std::vector<std::string> names;
  std::vector<int> category_ids;
  std::vector<Sample> samples;       // width/height from the JSON; boxes normalised
  std::vector<bool> corrupt;         // per sample: a bad annotation
  std::vector<Problem> problems;
  int64_t listed_images = 0;         // entries in "images", usable or not
};

// An annotation's iscrowd as pycocotools reads it: a number other than 0, or true.
bool coco_crowd(const Json& annotation);

// Reads an instances JSON. Categories map to contiguous classes in id order; when `names`
// (from the data YAML) is given, by name instead: every category must be one of them, and every
// name a category. Zero-area and duplicate boxes are dropped with a problem each.
CocoData read_coco(const std::string& json_path, const std::string& image_dir,
                   const std::vector<std::string>& names);

}  // namespace headroom::data
