// The run configuration: typed structs per section, loaded from YAML plus `key=value`
// overrides, validated once (all problems reported together, with file:line), printable.
// Defaults live here, in the member initialisers, and nowhere else.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "headroom/core/json.h"

namespace headroom {

enum class CacheMode { none, ram, disk };
enum class OnError { skip, fail };
// memory.activation_checkpointing: which segments are recomputed in backward.
//   stages: coarse (YOLO: backbone and neck stages; Hourglass: one segment per stack)
//   all:    fine (YOLO: every layer with parameters; Hourglass: every block sequence of every level)
enum class CheckpointMode { off, stages, all };

// An integer setting that may be "auto", resolved where the run knows the machine.
struct AutoInt {
  bool is_auto = true;
  int64_t value = 0;
  int64_t resolve(int64_t automatic) const { return is_auto ? automatic : value; }
};

struct DataConfig {
  std::string dataset;              // data YAML (Ultralytics layout); resolved from the CWD
  int imgsz = 640;                  // square canvas the loader letterboxes into
  AutoInt workers;                  // decode threads; auto = min(cores, 8); 0 = caller's thread
  int prefetch = 4;                 // decoded batches kept ready ahead of the consumer
  CacheMode cache = CacheMode::none;
  OnError on_error = OnError::skip;
  int64_t max_pixels = 89478485;    // decompression-bomb limit (PIL's default)
};

struct ModelConfig {
  std::string file = "models/yolov8n.yaml";  // Ultralytics-format model YAML
  std::string scale;                         // "" = from the file name or the file
  bool channels_last = false;
};

struct MemoryConfig {
  CheckpointMode activation_checkpointing = CheckpointMode::off;
};

// Loss gains and assignment settings (Ultralytics names for YOLO, TF OD API names for CenterNet).
struct LossConfig {
  double box = -1;                  // -1 (auto): 7.5 for YOLOv8, 0.05 for YOLOv5
  double cls = 0.5;
  double dfl = 1.5;                 // YOLOv8
  int64_t tal_topk = 10;            // YOLOv8 task-aligned assigner
  double tal_alpha = 0.5;
  double tal_beta = 6.0;
  int64_t assigner_chunk = 1 << 23; // elements of one [batch, boxes, anchors] block
  double obj = 1.0;                 // YOLOv5
  double anchor_t = 4.0;
  double task_loss_weight = 1.0;    // CenterNet heatmap
  double scale_loss_weight = 0.1;   // CenterNet size
  double offset_loss_weight = 1.0;  // CenterNet offset
  double min_overlap = 0.7;         // CenterNet Gaussian radius
};

// Validation and prediction post-processing.
struct EvalConfig {
  double conf = 0.001;              // score threshold for mAP (predict has its own --conf)
  double iou = 0.7;                 // NMS IoU threshold
  int64_t max_det = 300;            // detections kept per image
  bool agnostic = false;            // one NMS across classes
  int64_t topk = 100;               // CenterNet peaks per image
};

struct TrainConfig {
  int batch = 16;                   // micro-batch the loader collates
};

struct LogConfig {
  std::string level = "info";
};

struct Config {
  std::string name = "exp";         // run directory name under `project`
  std::string project = "runs";
  bool exist_ok = false;            // reuse runs/<name> instead of picking a new name
  std::string device = "auto";      // auto | cpu | cuda | cuda:N
  AutoInt threads;                  // intra-op threads; auto = all cores
  int64_t seed = 0;

  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  MemoryConfig memory;
  LossConfig loss;
  EvalConfig eval;
  LogConfig log;

  // Where each key's value came from ("configs/x.yaml:4:3", "command line", or absent when
  // it is the default), so later errors about a value can point at it.
  std::map<std::string, std::string> origin;
  std::string source;               // the config file, "" when built from defaults only

  std::string where(const std::string& key) const;
};

// Description of one key, for `trainer config --keys`, docs and tests.
struct ConfigKeyInfo {
  std::string path;      // "train.batch"
  std::string type;      // "int", "int | auto", "enum", ...
  std::string allowed;   // "1 .. 65536", "none | ram | disk"
  std::string default_text;
  std::string doc;
};
const std::vector<ConfigKeyInfo>& config_keys();

// Loads `path` (empty: defaults only) then applies `overrides` ("train.batch=16"). Throws
// InputError listing every problem, each with its file:line:column or argument.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The resolved configuration, every key, as YAML that load_config reads back unchanged.
std::string config_to_yaml(const Config& c);
Json config_to_json(const Config& c);

const char* to_string(CacheMode m);
const char* to_string(OnError e);
const char* to_string(CheckpointMode m);

}  // namespace headroom
