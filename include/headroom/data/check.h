// `trainer data check`: what a data set holds and everything wrong with it, as a table or JSON.
#pragma once

#include <string>
#include <vector>

#include "headroom/core/json.h"
#include "headroom/data/dataset.h"

namespace headroom::data {

struct Histogram {
  std::vector<std::string> labels;  // bucket names, e.g. "<32 px"
  std::vector<int64_t> counts;
};

struct SplitReport {
  Split split;
  std::vector<int64_t> boxes_per_class;
  std::vector<int64_t> images_per_class;
  int64_t crowd_boxes = 0;
  int64_t max_boxes_per_image = 0;
  Histogram image_sizes;     // by long side
  Histogram box_sizes;       // by sqrt(area) in original pixels (COCO small/medium/large inside)
  Histogram boxes_per_image;
};

struct CheckReport {
  std::string data_yaml;
  std::vector<SplitReport> splits;
  // Problems that skip an image or a label file: `data check` then exits with code 2.
  bool has_skips() const;
};

CheckReport check_data(const std::string& data_yaml, const std::vector<std::string>& splits, const ScanOptions& o);

std::string format_check_report(const CheckReport& r);
Json check_report_json(const CheckReport& r);

}  // namespace headroom::data
