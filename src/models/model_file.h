// Reading a model file (models/*.yaml, Ultralytics' layout): the pieces DetectorImpl's
// constructor is built from. Private to models/.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "headroom/models/detector.h"
#include "headroom/models/layers.h"

namespace headroom::models {

// A model file as Ultralytics users name it, looked for as given (the working directory), beside
// the config file, in the installed models, then in the source tree; in each place "yolov8s.yaml"
// that does not exist means scale s of yolov8.yaml. Returns the file and the scale.
std::pair<std::string, std::string> resolve_file(const std::string& file, const std::string& scale, const std::string& config_dir);
std::string node_text(const YAML::Node& n);  // flow style, for messages
// A positive number of the model file (a scale entry, a multiple, nc): InputError naming its
// file:line otherwise.
double positive_number(const std::string& file, const YAML::Node& n, const std::string& what, bool integer);
bool read_flag(const std::string& file, const YAML::Node& n, const std::string& what);  // True/False; absent: false
InputNorm read_input_norm(const std::string& file, const YAML::Node& n);
int64_t round_half_even(double x);  // Python's round(), as Ultralytics' depth scaling uses
// The model YAML; a spec's input normalisation is written into it, and `text` rewritten to match.
YAML::Node load_model_yaml(const std::string& file, const ModelSpec& spec, std::string& text);

struct Scaling {
  std::string scale;  // the scale picked; "" without a scales table
  double depth = 1.0, width = 1.0;
  int64_t max_channels = INT64_MAX;
};
Scaling read_scaling(const std::string& file, const YAML::Node& root, const std::string& wanted_scale);
int64_t read_class_count(const std::string& file, const YAML::Node& root, int64_t nc);  // the caller's (nc >= 0), else the file's
std::vector<YAML::Node> read_rows(const std::string& file, const YAML::Node& root);       // the backbone's rows, then the head's

// A model-file row checked: what it reads, how often it repeats and what builds it.
struct ParsedRow {
  RowContext c;           // only `where` set: the rest is the caller's
  std::vector<int> from;  // absolute row indices; -1 = the input image
  int64_t repeats = 1;    // as written, before depth scaling
  std::string module;
  const RowBuilder* build = nullptr;
};
ParsedRow parse_row(const std::string& file, const YAML::Node& r, size_t i);
// After a row's builder ran: an argument it never looked at would be silently dropped and build
// another model than the file describes (SPPF's shortcut flag, C3k2's attention flag of YOLO26).
void check_arguments_read(const RowContext& c, const std::string& module);
// The file's top-level keys: an unknown one (a typo, another framework's option) is an error
// naming file:line and the nearest known key.
void check_top_level_keys(const std::string& file, const YAML::Node& root);

// What the rows built so far output, per row, for the rows that read them.
struct RowOutputs {
  std::vector<int64_t> channels;  // of each output
  std::vector<int64_t> counts;    // tensors output
  std::vector<int64_t> strides;
};
// The channels and stride of each tensor a row reads (the image: `image_channels`, stride 1).
void add_row_inputs(RowContext& c, const std::vector<int>& from, const RowOutputs& outs, int64_t image_channels);

}  // namespace headroom::models
