// Data sets: the Ultralytics data YAML (YOLO txt labels or COCO instances JSON per split),
// scanned into samples with every problem recorded (file or file:line) instead of crashing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/core/config.h"

namespace headroom::data {

// One object. Coordinates are normalised xyxy in [0, 1] of the upright original image.
struct Box {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  int cls = 0;
  bool crowd = false;  // COCO iscrowd: matched but not counted in evaluation, not trained on
  float area = 0;      // COCO annotation area in original pixels (segment area); 0 = the box's
  bool operator==(const Box& o) const {
    return x1 == o.x1 && y1 == o.y1 && x2 == o.x2 && y2 == o.y2 && cls == o.cls && crowd == o.crowd;
  }
};

struct Sample {
  std::string image;      // path of the image file, or of the TFRecord shard holding it
  int64_t record = -1;    // TFRecord data: byte offset of its record in `image`; -1 for image files
  std::string file_name;  // TFRecord data: the example's image/filename ("" for image files)
  std::string labels;     // path of its YOLO label file ("" for COCO and TFRecord)
  int width = 0;          // upright size from the image header
  int height = 0;
  std::vector<Box> boxes;
  int64_t image_id = -1;  // COCO image id (-1 for YOLO data), for results JSON
};

enum class ProblemKind {
  missing_image,      // listed but not there
  unreadable_image,   // empty, not an image, unsupported format, corrupt header or data
  truncated_image,    // ends before its end marker
  oversized_image,    // header claims more than data.max_pixels
  bad_label,          // wrong field count, not a number, NaN, class or coordinates out of range
  size_mismatch,      // COCO width/height differ from the image file
  duplicate_box,      // dropped, the image is kept
  zero_area_box,      // dropped, the image is kept
  unlisted_class,     // TFRecords: an object whose class/text the label map does not list; dropped, the image is kept
  missing_labels,     // YOLO layout: not one image of the split has a label file (every image would be background)
};
const char* to_string(ProblemKind k);

struct Problem {
  ProblemKind kind;
  std::string where;       // "file" or "file:line"
  std::string message;
  bool image_skipped = false;
};

// How one split's files are found.
struct SplitSource {
  enum class Format { yolo, coco, tfrecord };
  Format format = Format::yolo;
  // YOLO: folders and/or .txt lists; COCO: the image folder; TFRecord: files, globs and sharded
  // names (train.record-?????-of-00010), expanded when the split is scanned
  std::vector<std::string> images;
  std::string annotations;          // COCO instances JSON
  std::string where;                // location of the entry in the data YAML
};

struct DataSpec {
  std::string file;                 // the data YAML
  std::string root;                 // its `path`, resolved
  std::vector<std::string> names;   // may be empty for COCO-only data (taken from categories)
  std::string label_map;            // TF OD API label_map.pbtxt (TFRecord data), resolved
  int64_t nc = 0;                   // `nc` when given (checked against the classes each split has)
  std::string nc_where;
  std::vector<std::pair<std::string, SplitSource>> splits;  // "train", "val", "test"
  const SplitSource* split(const std::string& name) const;
};

// Parses the data YAML; InputError with file:line for anything malformed.
DataSpec read_data_yaml(const std::string& path);

// data.on_error: a file that cannot be used is skipped with a warning, or stops the run.
enum class OnError { skip, fail };
OnError on_error_from(const std::string& word);
// data.cache: decoded canvases kept in RAM, in a disk shard, or not at all.
enum class CacheMode { none, ram, disk };
CacheMode cache_mode_from(const std::string& word);
const char* to_string(CacheMode m);

struct ScanOptions {
  int64_t max_pixels = 89478485;
  OnError on_error = OnError::skip;
  int threads = 1;
  bool full_decode = false;  // decode every image (data check) instead of header + end marker
  // For reports (data check): record every problem without logging it, never throw for it,
  // and return an empty split instead of failing when nothing is usable.
  bool report_only = false;
  // A YOLO split none of whose images has a label file is a problem (missing_labels); images to
  // predict on (trainer predict --source) carry none.
  bool labels_expected = true;
};

struct Split {
  std::string name;
  SplitSource source;
  std::vector<std::string> names;   // class names
  std::vector<int> category_ids;    // COCO category id of each class (empty for YOLO data)
  std::vector<Sample> samples;      // usable images only
  std::vector<Problem> problems;
  int64_t listed_images = 0;        // images found before skipping
  int64_t skipped_images() const;
  int64_t background_images() const;  // usable images without boxes
};

// Lists, validates and labels one split. With on_error = fail the first problem that would
// skip an image throws InputError; with skip it is recorded and logged. Throws InputError
// when no usable image remains.
Split scan_split(const DataSpec& spec, const std::string& split, const ScanOptions& options);

// The checks every image gets when a split is scanned: header, data.max_pixels, end marker
// (looked for in `tail`, the last bytes), and a full decode when asked. `data` is the file's
// start or all of it. Each problem found skips the image; `header` receives what was read.
struct ImageHeader;
std::vector<Problem> check_image_bytes(const uint8_t* data, size_t size, const uint8_t* tail, size_t tail_size,
                                       const std::string& where, const ScanOptions& o, ImageHeader* header);

// The encoded image of a sample: its file, or its TFRecord example's image/encoded. InputError
// naming the file (and record) when it can no longer be read.
std::string read_image_bytes(const Sample& s);

// Whether a file name has an extension a YOLO folder scan takes for an image.
bool is_image_name(const std::string& path);

// A name for the image in reports and results: the example's image/filename for TFRecord data,
// the file's name otherwise.
std::string image_name(const Sample& s);

// The split a config asks for, scanned with its data options.
Split load_split(const Config& c, const std::string& split, bool full_decode = false);

}  // namespace headroom::data
