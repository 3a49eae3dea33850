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

// Enumerated keys hold their word ("ram", "adamw", "bf16"): the schema checks it against the
// allowed words, and the subsystem that owns the vocabulary turns it into its own enum in its
// options adapter (data::CacheMode in loader_options, train::AmpMode in trainer_options, ...).

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
  bool side_stream = true;          // CUDA: batches copied and augmented on a stream of their own
  std::string cache = "none";       // none | ram | disk (data::CacheMode)
  std::string on_error = "skip";    // skip | fail (data::OnError)
  int64_t max_pixels = 89478485;    // decompression-bomb limit (PIL's default)
};

struct ModelConfig {
  std::string file = "models/yolov8n.yaml";  // Ultralytics-format model YAML
  std::string scale;                         // "" = from the file name or the file
  bool channels_last = false;
  std::string init_from;                     // weights or checkpoint to start from (matching names and shapes)
  std::vector<double> input_mean, input_std;  // TF's channel_means / channel_stds (0..255); empty = the model file's
  bool input_bgr = false;                     // TF's bgr_ordering, with input_mean
  bool init_backbone_only = false;            // init_from gives the backbone; the head keeps its initialisation
};

// augment: on-device augmentation (src/augment). Two vocabularies side by side: Ultralytics'
// flat keys and the TF OD API's data_augmentation_options. Everything defaults to off: a config
// names the augmentations it trains with (configs/*.yaml carry their family's recipe).
struct TfFlip {
  bool enabled = false;
  double probability = 0.5;
};
struct TfCrop {                     // random_crop_image (TF defaults)
  bool enabled = false;
  double min_object_covered = 1.0;  // the crop holds at least this share of some box
  double min_aspect_ratio = 0.75;
  double max_aspect_ratio = 1.33;
  double min_area = 0.1;            // of the image
  double max_area = 1.0;
  double overlap_thresh = 0.3;      // boxes keeping less of their area are dropped
  bool clip_boxes = true;
  double random_coef = 0.0;         // probability of keeping the whole image
};
struct TfPad {                      // random_absolute_pad_image
  bool enabled = false;
  double max_height_padding = 0;    // pixels of the image (TF pads before resizing)
  double max_width_padding = 0;
  std::vector<double> pad_color;    // RGB 0..255; empty = the image's mean colour (TF)
  double probability = 1.0;
};
struct TfDelta {                    // random_adjust_hue / _brightness: uniform in +-max_delta
  bool enabled = false;
  double max_delta = 0;
  double probability = 1.0;
};
struct TfFactor {                   // random_adjust_contrast / _saturation: uniform factor
  bool enabled = false;
  double min_delta = 0.8;
  double max_delta = 1.25;
  double probability = 1.0;
};
struct AugmentConfig {
  // Ultralytics names and meanings (0 = off)
  double hsv_h = 0, hsv_s = 0, hsv_v = 0;  // hue shift (turns), saturation and value gains
  double hsv_p = 1.0;
  double degrees = 0, translate = 0, scale = 0, shear = 0, perspective = 0;
  double affine_p = 1.0;
  double flipud = 0, fliplr = 0;    // probabilities
  double mosaic = 0, mixup = 0;     // probabilities
  int close_mosaic = 0;             // last N epochs without mosaic and mixup
  double multi_scale = 0;           // batch sizes within imgsz * (1 +- multi_scale)
  double fill = 114;                // grey outside the image
  // box bookkeeping after the geometric transform (Ultralytics' box_candidates)
  double box_min_size = 2;          // pixels, width and height
  double box_min_visible = 0.1;     // share of the transformed box left inside the image
  double box_max_aspect = 100;
  // TF OD API names
  TfFlip random_horizontal_flip, random_vertical_flip;
  TfCrop random_crop_image;
  TfPad random_absolute_pad_image;
  TfDelta random_adjust_hue{false, 0.02}, random_adjust_brightness{false, 0.2};
  TfFactor random_adjust_contrast, random_adjust_saturation;
};

// The memory budget a run must stay under: `auto` (the device's free memory), bytes, or a
// fraction of the device's total memory.
struct MemoryBudgetSpec {
  enum class Kind { automatic, bytes, fraction } kind = Kind::automatic;
  double value = 0;  // bytes, or the fraction (0, 1]
};

struct MemoryConfig {
  std::string activation_checkpointing = "off";  // off | stages | all | auto (recompute in backward)
  std::string prefer = "throughput";  // train.batch auto with recompute auto: throughput | batch
  MemoryBudgetSpec budget;
  double headroom = 0.10;            // share of the budget kept free (fragmentation, crowded batches)
  bool governor = true;              // recover from out-of-memory errors by splitting the batch further
  bool allow_amp = true;             // the governor's last resort may switch mixed precision on
  int64_t grow_after = 0;            // optimizer steps without pressure before the micro-batch doubles back; 0 = never
  // CUDA caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF), applied before the first CUDA allocation.
  int64_t max_split_size_mb = 0;     // 0 = the allocator's default (no limit)
  double garbage_collection_threshold = 0;  // 0 = off
  bool expandable_segments = false;  // LibTorch 2.1+
};

// Several processes on c10d (dist/group.h): launched by `trainer train --nproc N` or torchrun.
struct DistributedConfig {
  std::string backend = "auto";     // auto (NCCL for CUDA tensors, Gloo on the CPU) | nccl | gloo
  double timeout = 300;             // seconds a rank waits on the others (rendezvous, collectives) before it stops
  bool sync_bn = false;             // BatchNorm statistics over the whole step's images on every rank
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
  std::string preprocess = "auto";  // val / predict input: auto | fast | source (data/letterbox.h)
  bool end2end = true;              // an end-to-end head (YOLO26): its one-to-one branch, no NMS; false: one-to-many + NMS
};

// Defaults are Ultralytics' (SGD, lr0 0.01, lrf 0.01, momentum 0.937, warmup 3 epochs).
struct TrainConfig {
  int batch = 16;                   // images the loader collates per batch
  bool batch_auto = false;          // `train.batch: auto`: the largest batch that fits memory.budget
  int nominal_batch = 64;           // images summed per optimizer step (accumulation)
  int epochs = 100;
  int64_t steps = 0;                // optimizer steps; > 0 overrides epochs (TF OD API num_steps)
  std::string optimizer = "sgd";    // sgd | adam | adamw | rmsprop (TensorFlow's) | musgd (Ultralytics') | auto
  double lr0 = 0.01;
  double lrf = 0.01;
  double momentum = 0.937;          // SGD and RMSprop momentum, Adam beta1
  double eps = 1e-8;                // Adam / AdamW / RMSprop epsilon (the TF OD API's Keras Adam: 1e-7)
  double rho = 0.9;                 // RMSprop's squared-gradient average (Keras rho)
  bool nesterov = true;
  double weight_decay = 5e-4;       // scaled by batch * accumulate / nominal_batch, as Ultralytics
  std::string schedule = "linear";  // linear | cosine | manual | exponential
  std::vector<int64_t> lr_steps;    // manual: optimizer steps where the rate changes
  std::vector<double> lr_values;    // manual: the rate from each of those steps on
  int64_t schedule_steps = 0;       // linear / cosine: where lr0 * lrf is reached; 0 = the run's end
  int64_t hold_steps = 0;           // lr0 held before the decay starts
  int64_t decay_every = 0;          // exponential: steps per decay_factor
  double decay_factor = 0.95;       // exponential
  bool staircase = true;            // exponential: whole powers only
  double min_lr = 0;                // exponential: the floor
  double inverse_time_decay = 0;    // every rate / (1 + this * step): Keras' legacy `decay`
  std::string warmup = "ultralytics";  // ultralytics | linear | constant
  int64_t warmup_steps = 0;         // > 0: warmup length in optimizer steps instead of warmup_epochs
  double warmup_lr = 0;             // linear / constant warmup: where the rate starts (constant: stays)
  double warmup_epochs = 3.0;       // at least 100 iterations when > 0
  double warmup_momentum = 0.8;
  double warmup_bias_lr = 0.1;
  std::string amp = "auto";         // auto | off | fp16 | bf16
  std::string cudnn_benchmark = "auto";  // auto | on | off
  std::string cuda_graphs = "auto";      // auto | on | off
  bool ema = true;
  double ema_decay = 0.9999;
  double ema_tau = 2000;
  std::string ema_ramp = "ultralytics";  // ultralytics | tf
  double clip_grad = 10.0;          // max gradient norm; 0 = off
  int max_bad_steps = 20;           // non-finite steps in a row before the run stops
  int val_every = 1;                // epochs between validations; 0 = at the end only
  int64_t val_every_steps = 0;      // also every N optimizer steps; 0 = off
  int64_t save_every_steps = 0;     // keep a checkpoint every N optimizer steps; 0 = off
  bool async_checkpoints = true;    // snapshot, then write on a thread
  int keep = 3;                     // step checkpoints kept
  int log_every = 10;               // optimizer steps between progress updates (one host sync each)
  bool plots = true;
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
  AugmentConfig augment;
  MemoryConfig memory;
  DistributedConfig distributed;
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

// Loads the YAML `path` (empty: defaults only) then applies `overrides` ("train.batch=16"). Throws
// InputError listing every problem, each with its file:line:column or argument. (A TF OD API
// pipeline.config is read by interop::load_config_file, which comes here with its settings.)
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// One key set by another format's file: `value` is YAML, `where` the file:line it came from.
struct ConfigSetting {
  std::string key, value, where;
};
// The config those settings make (`source`: their file), then the overrides; the same checks.
Config load_config(const std::string& source, const std::vector<ConfigSetting>& settings, const std::vector<std::string>& overrides);

// The resolved configuration, every key, as YAML that load_config reads back unchanged.
std::string config_to_yaml(const Config& c);
Json config_to_json(const Config& c);

}  // namespace headroom
