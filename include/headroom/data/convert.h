// `trainer data convert`: a data set's splits rewritten in another format (YOLO txt labels, COCO
// instances JSON, TF OD API TFRecords), images copied byte for byte, boxes and class names kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/data/dataset.h"

namespace headroom::data {

enum class DataFormat { yolo, coco, tfrecord };
DataFormat data_format_from(const std::string& word);  // InputError naming the choices

struct ConvertOptions {
  std::string from;             // data YAML
  DataFormat to = DataFormat::yolo;
  std::string out;              // folder: new, or empty
  int shards = 1;               // TFRecord files per split
  ScanOptions scan;
};

struct ConvertSummary {
  std::string data_yaml;        // the converted set's data YAML
  std::vector<std::pair<std::string, int64_t>> images;  // per split
  int64_t boxes = 0;
  int64_t crowd_boxes_left_out = 0;  // YOLO labels have no crowd flag
};

// Reads every split of `from` (problems skip images as data.on_error=skip does, and are logged)
// and writes them under `out` with a data YAML beside them. The folder must be new or empty, so
// nothing there is overwritten.
ConvertSummary convert_data(const ConvertOptions& o);

}  // namespace headroom::data
