#include "config_schema.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <regex>

#include "config_key_kinds.h"
#include "headroom/core/text.h"

namespace headroom {
namespace {
using namespace key_kinds;

// train.batch: images per loader batch, or auto (the largest that fits memory.budget).
ConfigKey batch_key() {
  const std::string allowed = "auto or 1 .. 65536";
  ConfigKey k{{"train.batch", "int | auto", allowed, "",
               "Images the loader collates per batch; auto = the largest batch whose training step fits "
               "memory.budget minus memory.headroom (probed, then verified with a real step)."},
              nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (n.IsScalar() && n.Scalar() == "auto") {
      c.train.batch_auto = true;
      return "";
    }
    const auto v = n.IsScalar() ? parse_int(n.Scalar()) : std::nullopt;
    if (!v) return "expected 'auto' or an integer (1 .. 65536), got " + node_kind(n);
    if (*v < 1 || *v > 65536) return "value " + std::to_string(*v) + " is out of range; allowed: " + allowed;
    c.train.batch = int(*v);
    c.train.batch_auto = false;
    return "";
  };
  k.get = [](const Config& c) { return c.train.batch_auto ? Json("auto") : Json(int64_t(c.train.batch)); };
  return k;
}

// memory.budget: auto, a size with units, or a fraction of the device's memory.
ConfigKey budget_key() {
  const std::string allowed = "auto | bytes (8GiB, 512MiB, 8e9) | a fraction 0 < f <= 1";
  ConfigKey k{{"memory.budget", "string", allowed, "",
               "Memory the run may use on its device: auto = what is free at start, a size, or a share of the "
               "device's total. Enforced: on CUDA with the allocator's memory fraction (a big card behaves like a "
               "small one), on the CPU by Headroom's caching CPU allocator; both raise the same out-of-memory error."},
              nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (!n.IsScalar()) return "expected " + allowed + ", got " + node_kind(n);
    const std::string s = n.Scalar();
    if (s == "auto") {
      c.memory.budget = MemoryBudgetSpec{};
      return "";
    }
    const auto plain = parse_double(s);
    if (plain && *plain > 0 && *plain <= 1) {
      c.memory.budget = MemoryBudgetSpec{MemoryBudgetSpec::Kind::fraction, *plain};
      return "";
    }
    const auto bytes = parse_bytes(s);
    if (!bytes || *bytes < 1048576.0)
      return "'" + s + "' is not a budget; use " + allowed + (bytes ? " (at least 1MiB)" : "");
    c.memory.budget = MemoryBudgetSpec{MemoryBudgetSpec::Kind::bytes, *bytes};
    return "";
  };
  k.get = [](const Config& c) {
    const MemoryBudgetSpec& b = c.memory.budget;
    if (b.kind == MemoryBudgetSpec::Kind::automatic) return Json("auto");
    if (b.kind == MemoryBudgetSpec::Kind::fraction) return Json(b.value);
    return Json(int64_t(b.value));
  };
  return k;
}

std::vector<ConfigKey> augment_keys() {
  using D = std::function<double&(Config&)>;
  const auto num = [](const char* path, D field, double lo, double hi, const char* doc) {
    return double_key(path, field, lo, hi, doc);
  };
  const auto flip = [&](const char* path, TfFlip& (*op)(Config&), const char* doc) {
    return op_key(path, [op](Config& c) -> bool& { return op(c).enabled; },
                  {num((std::string(path) + ".probability").c_str(), [op](Config& c) -> double& { return op(c).probability; }, 0, 1,
                       "probability per image")},
                  doc);
  };
  const auto delta = [&](const char* path, TfDelta& (*op)(Config&), double hi, const char* doc) {
    const std::string p = path;
    return op_key(path, [op](Config& c) -> bool& { return op(c).enabled; },
                  {num((p + ".max_delta").c_str(), [op](Config& c) -> double& { return op(c).max_delta; }, 0, hi, "range +-"),
                   num((p + ".probability").c_str(), [op](Config& c) -> double& { return op(c).probability; }, 0, 1, "per image")},
                  doc);
  };
  const auto factor = [&](const char* path, TfFactor& (*op)(Config&), const char* doc) {
    const std::string p = path;
    return op_key(path, [op](Config& c) -> bool& { return op(c).enabled; },
                  {num((p + ".min_delta").c_str(), [op](Config& c) -> double& { return op(c).min_delta; }, 0, 100, "lowest factor"),
                   num((p + ".max_delta").c_str(), [op](Config& c) -> double& { return op(c).max_delta; }, 0, 100, "highest factor"),
                   num((p + ".probability").c_str(), [op](Config& c) -> double& { return op(c).probability; }, 0, 1, "per image")},
                  doc);
  };
  const auto crop_num = [&](const char* field, double TfCrop::*m, double lo, double hi) {
    return num((std::string("augment.random_crop_image.") + field).c_str(),
               [m](Config& c) -> double& { return c.augment.random_crop_image.*m; }, lo, hi, "");
  };
  const auto pad_num = [&](const char* field, double TfPad::*m, double lo, double hi) {
    return num((std::string("augment.random_absolute_pad_image.") + field).c_str(),
               [m](Config& c) -> double& { return c.augment.random_absolute_pad_image.*m; }, lo, hi, "");
  };
  // multi_scale: Ultralytics writes a boolean (true = +-50%).
  ConfigKey multi_scale = num("augment.multi_scale", [](Config& c) -> double& { return c.augment.multi_scale; }, 0, 0.9,
                              "Multi-scale training: each batch gets a random square size within imgsz * (1 +- this), a "
                              "multiple of the model's input stride (Ultralytics' multi_scale; true = 0.5).");
  const auto number_set = multi_scale.set;
  multi_scale.info.allowed = "0 .. 0.9 | true | false";
  multi_scale.set = [number_set](Config& c, const YAML::Node& n) -> std::string {
    const std::string s = n.IsScalar() ? to_lower(n.Scalar()) : "";
    if (s != "true" && s != "false") return number_set(c, n);
    c.augment.multi_scale = s == "true" ? 0.5 : 0;
    return "";
  };
  std::vector<ConfigKey> keys = {
      num("augment.hsv_h", [](Config& c) -> double& { return c.augment.hsv_h; }, 0, 1,
          "Hue shift, uniform in +- this many turns of the colour wheel (Ultralytics 0.015)."),
      num("augment.hsv_s", [](Config& c) -> double& { return c.augment.hsv_s; }, 0, 1,
          "Saturation gain, uniform in 1 +- this (Ultralytics 0.7)."),
      num("augment.hsv_v", [](Config& c) -> double& { return c.augment.hsv_v; }, 0, 1,
          "Value (brightness) gain, uniform in 1 +- this (Ultralytics 0.4)."),
      num("augment.hsv_p", [](Config& c) -> double& { return c.augment.hsv_p; }, 0, 1, "Probability per image of the HSV gains."),
      num("augment.degrees", [](Config& c) -> double& { return c.augment.degrees; }, 0, 180, "Rotation, uniform in +- degrees."),
      num("augment.translate", [](Config& c) -> double& { return c.augment.translate; }, 0, 0.9,
          "Translation, uniform in +- this share of the image side (Ultralytics 0.1)."),
      num("augment.scale", [](Config& c) -> double& { return c.augment.scale; }, 0, 0.99,
          "Zoom, uniform in 1 +- this (Ultralytics 0.5)."),
      num("augment.shear", [](Config& c) -> double& { return c.augment.shear; }, 0, 45, "Shear, uniform in +- degrees."),
      num("augment.perspective", [](Config& c) -> double& { return c.augment.perspective; }, 0, 0.001,
          "Perspective, uniform in +- this (Ultralytics' range 0 .. 0.001)."),
      num("augment.affine_p", [](Config& c) -> double& { return c.augment.affine_p; }, 0, 1,
          "Probability per image of the random affine (degrees, translate, scale, shear, perspective)."),
      num("augment.flipud", [](Config& c) -> double& { return c.augment.flipud; }, 0, 1, "Probability of a vertical flip."),
      num("augment.fliplr", [](Config& c) -> double& { return c.augment.fliplr; }, 0, 1,
          "Probability of a horizontal flip (Ultralytics 0.5)."),
      num("augment.mosaic", [](Config& c) -> double& { return c.augment.mosaic; }, 0, 1,
          "Probability that an image becomes a 4-image mosaic of it and three others of its batch (Ultralytics 1.0)."),
      num("augment.mixup", [](Config& c) -> double& { return c.augment.mixup; }, 0, 1,
          "Probability of blending an image with another of its batch (ratio ~ Beta(32, 32)), boxes of both kept."),
      int_key<int>("augment.close_mosaic", [](Config& c) -> int& { return c.augment.close_mosaic; }, 0, 1 << 20,
                   "Epochs at the end trained without mosaic and mixup (Ultralytics 10)."),
      multi_scale,
      num("augment.fill", [](Config& c) -> double& { return c.augment.fill; }, 0, 255,
          "Grey level (0..255) of the area a transform brings in from outside the image."),
      num("augment.box_min_size", [](Config& c) -> double& { return c.augment.box_min_size; }, 0, 1000,
          "Boxes narrower or lower than this many pixels after the transform are dropped (Ultralytics' box_candidates: "
          "not in a pipeline of TF options alone, which keeps every box with an area, as TF does)."),
      num("augment.box_min_visible", [](Config& c) -> double& { return c.augment.box_min_visible; }, 0, 1,
          "Boxes keeping less than this share of their transformed area inside the image are dropped "
          "(random_crop_image uses its overlap_thresh)."),
      num("augment.box_max_aspect", [](Config& c) -> double& { return c.augment.box_max_aspect; }, 1, 1e6,
          "Boxes longer than this many times their width (or the reverse) are dropped (as box_min_size, not in a "
          "pipeline of TF options alone)."),
      flip("augment.random_horizontal_flip", [](Config& c) -> TfFlip& { return c.augment.random_horizontal_flip; },
           "TF OD API: horizontal flip with `probability` (0.5)."),
      flip("augment.random_vertical_flip", [](Config& c) -> TfFlip& { return c.augment.random_vertical_flip; },
           "TF OD API: vertical flip with `probability` (0.5)."),
      op_key("augment.random_crop_image", [](Config& c) -> bool& { return c.augment.random_crop_image.enabled; },
             {crop_num("min_object_covered", &TfCrop::min_object_covered, 0, 1),
              crop_num("min_aspect_ratio", &TfCrop::min_aspect_ratio, 0.01, 100),
              crop_num("max_aspect_ratio", &TfCrop::max_aspect_ratio, 0.01, 100),
              crop_num("min_area", &TfCrop::min_area, 0.001, 1), crop_num("max_area", &TfCrop::max_area, 0.001, 1),
              crop_num("overlap_thresh", &TfCrop::overlap_thresh, 0, 1),
              bool_key("augment.random_crop_image.clip_boxes", [](Config& c) -> bool& { return c.augment.random_crop_image.clip_boxes; }, ""),
              crop_num("random_coef", &TfCrop::random_coef, 0, 1)},
             "TF OD API: crop a random window (aspect and area ranges, up to 100 tries for one that holds "
             "min_object_covered of some box; else the whole image), resized to the canvas; boxes keeping less "
             "than overlap_thresh of their area are dropped; random_coef = probability of no crop. Defaults: "
             "min_object_covered 1, aspect 0.75 .. 1.33, area 0.1 .. 1, overlap_thresh 0.3, clip_boxes true, random_coef 0."),
      op_key("augment.random_absolute_pad_image", [](Config& c) -> bool& { return c.augment.random_absolute_pad_image.enabled; },
             {pad_num("max_height_padding", &TfPad::max_height_padding, 0, 1e5),
              pad_num("max_width_padding", &TfPad::max_width_padding, 0, 1e5),
              list_key<double>("augment.random_absolute_pad_image.pad_color",
                               [](Config& c) -> std::vector<double>& { return c.augment.random_absolute_pad_image.pad_color; }, 0, 255, ""),
              pad_num("probability", &TfPad::probability, 0, 1)},
             "TF OD API: pad by less than max_height_padding / max_width_padding pixels of the image at a random offset with "
             "pad_color (RGB 0..255; empty = the image's mean colour), then fit to the canvas."),
      delta("augment.random_adjust_hue", [](Config& c) -> TfDelta& { return c.augment.random_adjust_hue; }, 0.5,
            "TF OD API: hue shift uniform in +- max_delta turns (0.02)."),
      factor("augment.random_adjust_contrast", [](Config& c) -> TfFactor& { return c.augment.random_adjust_contrast; },
             "TF OD API: contrast factor uniform in min_delta .. max_delta (0.8 .. 1.25) about each channel's mean."),
      factor("augment.random_adjust_saturation", [](Config& c) -> TfFactor& { return c.augment.random_adjust_saturation; },
             "TF OD API: saturation factor uniform in min_delta .. max_delta (0.8 .. 1.25)."),
      delta("augment.random_adjust_brightness", [](Config& c) -> TfDelta& { return c.augment.random_adjust_brightness; }, 1,
            "TF OD API: brightness shift uniform in +- max_delta on the 0..1 scale (0.2)."),
  };
  return keys;
}

std::string check_device(const std::string& s) {
  static const std::regex re("auto|cpu|cuda|cuda:[0-9]+");
  if (std::regex_match(s, re)) return "";
  return "'" + s + "' is not a device; use auto, cpu, cuda or cuda:N (N = device index)";
}

std::string check_name(const std::string& s) {
  if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos)
    return "'" + s + "' is not a run name; use a plain folder name without '/'";
  return "";
}

std::string check_nonempty(const std::string& s) {
  return s.empty() ? "must not be empty" : "";
}

std::vector<ConfigKey> build_schema() {
  std::vector<ConfigKey> keys = {
      // Run
      string_key("name", [](Config& c) -> std::string& { return c.name; }, "a folder name",
                 "Run directory name under `project`; a free name (exp2, exp3...) is picked "
                 "when it exists and `exist_ok` is false.", check_name),
      string_key("project", [](Config& c) -> std::string& { return c.project; }, "a path",
                 "Folder that holds run directories.", check_nonempty),
      bool_key("exist_ok", [](Config& c) -> bool& { return c.exist_ok; },
               "Reuse `project/name` when it exists instead of picking a new name."),
      string_key("device", [](Config& c) -> std::string& { return c.device; },
                 "auto | cpu | cuda | cuda:N",
                 "Training device. `auto` takes cuda:0 when CUDA works and otherwise warns, "
                 "naming the reason, before using the CPU; an explicit CUDA request that "
                 "cannot be met exits with code 2.", check_device),
      auto_int_key("threads", [](Config& c) -> AutoInt& { return c.threads; }, 1, 1024,
                   "Intra-op CPU threads for LibTorch; auto = all cores."),
      // 2^53 - 1 at most: the run's config.yaml and checkpoints hold numbers as doubles.
      int_key<int64_t>("seed", [](Config& c) -> int64_t& { return c.seed; }, 0,
                       (int64_t{1} << 53) - 1, "Seed for shuffling and every random choice."),
      // model
      string_key("model.file", [](Config& c) -> std::string& { return c.model.file; }, "a model YAML",
                 "Architecture in the Ultralytics model-YAML format; models/ holds yolov5n..x.yaml, "
                 "yolov8.yaml, yolo11.yaml, yolo12.yaml, yolo26.yaml (scales n..x) and centernet_*.yaml. A "
                 "missing yolov8s.yaml means scale s of yolov8.yaml.", check_nonempty),
      string_key("model.scale", [](Config& c) -> std::string& { return c.model.scale; }, "n | s | m | l | x or empty",
                 "Scale of a file with a scales table; empty = from the file name, else the file's first."),
      bool_key("model.channels_last", [](Config& c) -> bool& { return c.model.channels_last; },
               "Keep 4-D weights and inputs in channels_last memory format (faster convolutions on "
               "tensor cores)."),
      string_key("model.init_from", [](Config& c) -> std::string& { return c.model.init_from; }, "a weights or checkpoint file",
                 "Start from another run's weights: parameters whose name and shape match are loaded, the rest "
                 "(a head for another class count) keep their initialisation and are listed."),
      list_key<double>("model.input_mean", [](Config& c) -> std::vector<double>& { return c.model.input_mean; }, -1e4, 1e4,
                       "Input normalisation (the TF OD API's channel_means): the network sees (255 x - mean) / std per "
                       "channel; 3 pixel values, in the order the network sees; [] = the model file's (none)."),
      list_key<double>("model.input_std", [](Config& c) -> std::vector<double>& { return c.model.input_std; }, 1e-6, 1e4,
                       "Input normalisation (channel_stds), with model.input_mean."),
      bool_key("model.input_bgr", [](Config& c) -> bool& { return c.model.input_bgr; },
               "Reverse the channels to BGR before normalising (bgr_ordering), with model.input_mean."),
      bool_key("model.init_backbone_only", [](Config& c) -> bool& { return c.model.init_backbone_only; },
               "Take only the backbone from model.init_from; the head keeps its initialisation (TF's "
               "fine_tune_checkpoint_type: detection)."),
      // data
      string_key("data.dataset", [](Config& c) -> std::string& { return c.data.dataset; },
                 "path to a data YAML",
                 "Data set description in the Ultralytics data-YAML layout (path, train, val, "
                 "names); see docs/data.md. Relative paths are resolved from the working "
                 "directory."),
      int_key<int>("data.imgsz", [](Config& c) -> int& { return c.data.imgsz; }, 32, 8192,
                   "Square canvas (pixels) every image is letterboxed into.", 32),
      auto_int_key("data.workers", [](Config& c) -> AutoInt& { return c.data.workers; }, 0, 256,
                   "Decode threads; auto = min(cores, 8); 0 decodes on the consumer's thread."),
      int_key<int>("data.prefetch", [](Config& c) -> int& { return c.data.prefetch; }, 1, 64,
                   "Decoded batches kept ready ahead of the consumer."),
      bool_key("data.side_stream", [](Config& c) -> bool& { return c.data.side_stream; },
               "CUDA: copy each step's batches to the device and augment them on a stream of their own, "
               "beside the step before still running there (the compute stream waits for them by an event); "
               "false: on the compute stream, behind that step."),
      choice_key("data.cache", [](Config& c) -> std::string& { return c.data.cache; }, {"none", "ram", "disk"},
                          "Decoded-image cache: ram holds letterboxed images in memory (checked "
                          "against free memory first; on the CPU inside memory.budget, at most half "
                          "of it); disk writes a memory-mapped shard beside "
                          "the data, rebuilt when the images or the canvas change. Ultralytics' "
                          "`true`/`false` mean ram/none.",
                          {{"true", "ram"}, {"false", "none"}, {"True", "ram"}, {"False", "none"}}),
      choice_key("data.on_error", [](Config& c) -> std::string& { return c.data.on_error; }, {"skip", "fail"},
                        "A corrupt image or label: skip it with a warning naming the file "
                        "(counted in the summary), or stop."),
      int_key<int64_t>("data.max_pixels", [](Config& c) -> int64_t& { return c.data.max_pixels; },
                       1, int64_t{1} << 40,
                       "Images whose header claims more pixels are refused before decoding "
                       "(decompression bombs)."),
      // train
      batch_key(),
      int_key<int>("train.nominal_batch", [](Config& c) -> int& { return c.train.nominal_batch; }, 1, 1 << 20,
                   "Images summed per optimizer step: gradients of round(nominal_batch / batch) micro-batches "
                   "are accumulated (Ultralytics' nbs)."),
      int_key<int>("train.epochs", [](Config& c) -> int& { return c.train.epochs; }, 1, 1 << 20, "Epochs to train."),
      int_key<int64_t>("train.steps", [](Config& c) -> int64_t& { return c.train.steps; }, 0, int64_t{1} << 40,
                       "Optimizer steps to train (TF OD API num_steps); 0 = train.epochs decides."),
      choice_key("train.optimizer", [](Config& c) -> std::string& { return c.train.optimizer; },
                 {"sgd", "adam", "adamw", "rmsprop", "musgd", "auto"},
                 "Optimizer; parameter groups keep weight decay off BatchNorm weights and biases. rmsprop is "
                 "TensorFlow's (the TF OD API's rms_prop_optimizer): ms = rho ms + (1 - rho) g^2; with momentum "
                 "buf = momentum buf + lr g / sqrt(ms + eps), p -= buf; without, p -= lr g / (sqrt(ms) + eps); "
                 "weight decay decoupled. musgd is Ultralytics' MuSGD (YOLO26's): 2-D and 4-D tensors take Muon's "
                 "orthogonalised update at 0.2 lr plus SGD's, the rest SGD's, a Detect head's class branch at 3x lr. "
                 "auto chooses as Ultralytics: musgd with lr0 0.01 over 10,000 iterations, else adamw with lr0 "
                 "0.002 * 5 / (4 + nc) and beta1 0.9; warmup_bias_lr 0.",
                 {{"SGD", "sgd"}, {"Adam", "adam"}, {"AdamW", "adamw"}, {"MuSGD", "musgd"}}),
      double_key("train.lr0", [](Config& c) -> double& { return c.train.lr0; }, 0, 10, "Initial learning rate."),
      double_key("train.lrf", [](Config& c) -> double& { return c.train.lrf; }, 0, 1,
                 "linear / cosine schedules end at lr0 * lrf."),
      double_key("train.eps", [](Config& c) -> double& { return c.train.eps; }, 0, 1,
                 "Adam / AdamW epsilon, added to the root of the second moment (PyTorch 1e-8, Keras 1e-7); "
                 "rmsprop: as TF adds it (see train.optimizer)."),
      double_key("train.rho", [](Config& c) -> double& { return c.train.rho; }, 0, 0.999999,
                 "rmsprop: the moving-average factor of squared gradients (Keras rho)."),
      double_key("train.momentum", [](Config& c) -> double& { return c.train.momentum; }, 0, 0.999999,
                 "SGD and rmsprop momentum; Adam and AdamW beta1."),
      bool_key("train.nesterov", [](Config& c) -> bool& { return c.train.nesterov; }, "Nesterov momentum (SGD)."),
      double_key("train.weight_decay", [](Config& c) -> double& { return c.train.weight_decay; }, 0, 1,
                 "Weight decay of convolution and linear weights, scaled by batch * accumulate / nominal_batch."),
      choice_key("train.schedule", [](Config& c) -> std::string& { return c.train.schedule; },
                 {"linear", "cosine", "manual", "exponential"},
                           "Learning-rate schedule over the run's optimizer steps: linear or cosine from lr0 to "
                           "lr0 * lrf, manual steps (lr0 until lr_steps[0], then lr_values[0], ...), or exponential "
                           "(lr0 * decay_factor^(steps / decay_every), not below min_lr)."),
      int_key<int64_t>("train.schedule_steps", [](Config& c) -> int64_t& { return c.train.schedule_steps; }, 0,
                       int64_t{1} << 40,
                       "linear / cosine: the optimizer step where the rate reaches lr0 * lrf and stays (TF "
                       "cosine total_steps); 0 = the run's last step."),
      int_key<int64_t>("train.hold_steps", [](Config& c) -> int64_t& { return c.train.hold_steps; }, 0, int64_t{1} << 40,
                       "Optimizer steps lr0 is held before the decay starts (after a linear or constant warmup; "
                       "TF cosine hold_base_rate_steps)."),
      int_key<int64_t>("train.decay_every", [](Config& c) -> int64_t& { return c.train.decay_every; }, 0, int64_t{1} << 40,
                       "exponential schedule: optimizer steps per decay_factor (TF decay_steps)."),
      double_key("train.decay_factor", [](Config& c) -> double& { return c.train.decay_factor; }, 0, 1,
                 "exponential schedule: the factor applied every decay_every steps."),
      bool_key("train.staircase", [](Config& c) -> bool& { return c.train.staircase; },
               "exponential schedule: decay in whole steps of decay_every (false: smoothly)."),
      double_key("train.min_lr", [](Config& c) -> double& { return c.train.min_lr; }, 0, 10,
                 "exponential schedule: the rate never falls below this."),
      double_key("train.inverse_time_decay", [](Config& c) -> double& { return c.train.inverse_time_decay; }, 0, 1e6,
                 "Every rate divided by 1 + this * optimizer step, after the schedule and warmup (Keras' legacy "
                 "optimizers' `decay`, which TF2's OD API passes rms_prop_optimizer's decay to)."),
      choice_key("train.warmup", [](Config& c) -> std::string& { return c.train.warmup; },
                 {"ultralytics", "linear", "constant"},
                 "ultralytics: rates from 0 (biases from warmup_bias_lr), SGD momentum from warmup_momentum, "
                 "towards a schedule that starts at step 0. linear: every rate from warmup_lr to the schedule's "
                 "rate at the warmup's end; constant: warmup_lr throughout (TF burn-in); with both the decay "
                 "starts after the warmup, as in the TF OD API."),
      int_key<int64_t>("train.warmup_steps", [](Config& c) -> int64_t& { return c.train.warmup_steps; }, 0,
                       int64_t{1} << 40, "Warmup length in optimizer steps; > 0 replaces warmup_epochs."),
      double_key("train.warmup_lr", [](Config& c) -> double& { return c.train.warmup_lr; }, 0, 10,
                 "linear / constant warmup: the rate it starts from (constant: holds)."),
      list_key<int64_t>("train.lr_steps", [](Config& c) -> std::vector<int64_t>& { return c.train.lr_steps; }, 1, 1e15,
                        "manual schedule: optimizer steps where the rate changes (increasing)."),
      list_key<double>("train.lr_values", [](Config& c) -> std::vector<double>& { return c.train.lr_values; }, 0, 10,
                       "manual schedule: the rate from the matching lr_steps entry on."),
      double_key("train.warmup_epochs", [](Config& c) -> double& { return c.train.warmup_epochs; }, 0, 1000,
                 "Warmup length in epochs (at least 100 iterations when > 0; 0 = none), unless "
                 "warmup_steps is set; its shape is train.warmup."),
      double_key("train.warmup_momentum", [](Config& c) -> double& { return c.train.warmup_momentum; }, 0, 0.999999,
                 "Momentum at the start of warmup."),
      double_key("train.warmup_bias_lr", [](Config& c) -> double& { return c.train.warmup_bias_lr; }, 0, 10,
                 "Bias learning rate at the start of warmup."),
      choice_key("train.amp", [](Config& c) -> std::string& { return c.train.amp; }, {"auto", "off", "fp16", "bf16"},
                        "Mixed precision: fp16 (CUDA; with a dynamic loss scaler), bf16 (CUDA or CPU, no scaler), "
                        "off; auto = fp16 on CUDA, off on the CPU.",
                        {{"true", "fp16"}, {"false", "off"}, {"True", "fp16"}, {"False", "off"}}),
      choice_key("train.cudnn_benchmark", [](Config& c) -> std::string& { return c.train.cudnn_benchmark; },
                 {"auto", "on", "off"},
                 "cuDNN autotuning: each convolution's algorithm is timed at the first step of each shape and the "
                 "fastest kept (PyTorch's cudnn.benchmark); auto = on for CUDA runs with a fixed image size, off "
                 "with augment.multi_scale (every new size would be tuned again) and on the CPU.",
                 {{"true", "on"}, {"false", "off"}, {"True", "on"}, {"False", "off"}}),
      choice_key("train.cuda_graphs", [](Config& c) -> std::string& { return c.train.cuda_graphs; }, {"auto", "on", "off"},
                 "Capture each training step (forward, loss, backward, update) as one CUDA graph once its shapes "
                 "repeat, and replay it: one launch instead of thousands. auto = where the steps can be captured "
                 "(CUDA, a fixed image size, one process) and the replay is measured faster than "
                 "the eager step; on = wherever they can be (an error where they cannot); off = never.",
                 {{"true", "on"}, {"false", "off"}, {"True", "on"}, {"False", "off"}}),
      bool_key("train.ema", [](Config& c) -> bool& { return c.train.ema; },
               "Keep an exponential moving average of the weights; it is what validation and best.pt use."),
      double_key("train.ema_decay", [](Config& c) -> double& { return c.train.ema_decay; }, 0, 1, "EMA decay."),
      double_key("train.ema_tau", [](Config& c) -> double& { return c.train.ema_tau; }, 1, 1e9,
                 "EMA warm-up: the decay is ema_decay * (1 - exp(-updates / ema_tau)) (with ema_ramp: ultralytics)."),
      choice_key("train.ema_ramp", [](Config& c) -> std::string& { return c.train.ema_ramp; }, {"ultralytics", "tf"},
                 "How the EMA decay ramps up at update u = 1, 2, ...: ultralytics = ema_decay * (1 - exp(-u / ema_tau)) "
                 "(Ultralytics' ModelEMA); tf = min(ema_decay, (1 + u) / (10 + u)) (TF's ExponentialMovingAverage, as the "
                 "TF2 OD API's use_moving_average keeps it; ema_tau unused)."),
      double_key("train.clip_grad", [](Config& c) -> double& { return c.train.clip_grad; }, 0, 1e9,
                 "Largest gradient norm (after unscaling); 0 = no clipping."),
      int_key<int>("train.max_bad_steps", [](Config& c) -> int& { return c.train.max_bad_steps; }, 1, 1 << 20,
                   "Steps with non-finite loss or gradients are skipped; this many in a row stop the run."),
      int_key<int>("train.val_every", [](Config& c) -> int& { return c.train.val_every; }, 0, 1 << 20,
                   "Validate every N epochs (and after the last); 0 = after the last only."),
      int_key<int64_t>("train.val_every_steps", [](Config& c) -> int64_t& { return c.train.val_every_steps; }, 0,
                       int64_t{1} << 40, "Also validate every N optimizer steps; 0 = off."),
      int_key<int64_t>("train.save_every_steps", [](Config& c) -> int64_t& { return c.train.save_every_steps; }, 0,
                       int64_t{1} << 40, "Write weights/step_N.pt every N optimizer steps; 0 = off (last.pt and best.pt are always written)."),
      bool_key("train.async_checkpoints", [](Config& c) -> bool& { return c.train.async_checkpoints; },
               "Write checkpoints behind the training: a snapshot of the state (CUDA: copied into reused pinned host buffers "
               "on the step's stream, no host sync; CPU: a copy, taken only where it fits beside the step's peak under "
               "memory.budget minus memory.headroom) is written by a thread, atomically as always, while the next steps "
               "run. A failed write stops the run after the step during which it failed. false: the step waits for the file."),
      int_key<int>("train.keep", [](Config& c) -> int& { return c.train.keep; }, 1, 1 << 20, "Step checkpoints kept: the newest up to the step written (later ones, of a run resumed before its end, stay)."),
      int_key<int>("train.log_every", [](Config& c) -> int& { return c.train.log_every; }, 1, 1 << 20,
                   "Optimizer steps between reads of the device counters (and at every epoch's end): one host sync each, none "
                   "else in a step; the progress line and the non-finite guard use each read."),
      bool_key("train.plots", [](Config& c) -> bool& { return c.train.plots; },
               "Draw results.png, train_batch0.jpg and labels.jpg in the run directory."),
      // memory
      choice_key("memory.activation_checkpointing",
                 [](Config& c) -> std::string& { return c.memory.activation_checkpointing; }, {"off", "stages", "all", "auto"},
                               "Recompute activations in backward instead of keeping them: stages = coarse "
                               "segments (YOLO backbone/neck stages, one per Hourglass stack), all = fine "
                               "segments (every YOLO layer, every Hourglass block sequence); auto = per input size, the fewest "
                               "stages, cheapest to recompute, that let the micro-batch fit memory.budget."),
      choice_key("memory.prefer", [](Config& c) -> std::string& { return c.memory.prefer; }, {"throughput", "batch"},
                 "train.batch=auto with activation_checkpointing=auto: throughput = the (micro-batch, recompute plan) "
                 "with the most images per second, timed on real steps (the largest that fits among them); batch = the "
                 "largest micro-batch that fits, recomputing what it takes (BatchNorm statistics over more images)."),
      budget_key(),
      double_key("memory.headroom", [](Config& c) -> double& { return c.memory.headroom; }, 0, 0.9,
                 "Share of the budget kept free: train.batch=auto and the governor aim for budget * (1 - headroom)."),
      bool_key("memory.governor", [](Config& c) -> bool& { return c.memory.governor; },
               "On an out-of-memory error, drop the step, halve the micro-batch and re-run the same batch "
               "(then recompute every stage, then AMP); off = stop with the memory table."),
      bool_key("memory.allow_amp", [](Config& c) -> bool& { return c.memory.allow_amp; },
               "Let the governor switch mixed precision on when a micro-batch of 1 with every stage "
               "recomputed still does not fit."),
      int_key<int64_t>("memory.grow_after", [](Config& c) -> int64_t& { return c.memory.grow_after; }, 0, int64_t{1} << 40,
                       "Optimizer steps without memory pressure after which a micro-batch the governor shrank "
                       "doubles back (up to the loader batch); 0 = never."),
      int_key<int64_t>("memory.max_split_size_mb", [](Config& c) -> int64_t& { return c.memory.max_split_size_mb; }, 0,
                       int64_t{1} << 30,
                       "CUDA allocator: blocks above this size are not split (less fragmentation); 0 = default."),
      double_key("memory.garbage_collection_threshold",
                 [](Config& c) -> double& { return c.memory.garbage_collection_threshold; }, 0, 0.999,
                 "CUDA allocator: reclaim unused cached blocks once this share of the budget is reserved; 0 = off."),
      bool_key("memory.expandable_segments", [](Config& c) -> bool& { return c.memory.expandable_segments; },
               "CUDA allocator: segments that grow in place instead of new blocks (LibTorch 2.1+; less "
               "fragmentation with changing shapes such as multi-scale)."),
      // distributed
      choice_key("distributed.backend", [](Config& c) -> std::string& { return c.distributed.backend; }, {"auto", "nccl", "gloo"},
                 "c10d backend of a run on several processes (--nproc N or torchrun): auto = NCCL on CUDA, Gloo on the CPU."),
      double_key("distributed.timeout", [](Config& c) -> double& { return c.distributed.timeout; }, 1, 86400,
                 "Seconds a rank waits for the others (rendezvous, each collective) before it stops naming what it waited on."),
      bool_key("distributed.sync_bn", [](Config& c) -> bool& { return c.distributed.sync_bn; },
               "BatchNorm statistics computed over the images of every rank (SyncBatchNorm), not each rank's own."),
      // loss
      double_key("loss.box", [](Config& c) -> double& { return c.loss.box; }, 0, 1000,
                 "Box loss gain; auto = 7.5 for YOLOv8 (CIoU), 0.05 for YOLOv5.", true),
      double_key("loss.cls", [](Config& c) -> double& { return c.loss.cls; }, 0, 1000, "Class loss gain (YOLO)."),
      double_key("loss.dfl", [](Config& c) -> double& { return c.loss.dfl; }, 0, 1000, "Box distance loss gain: DFL (YOLOv8, YOLO11) or L1 (YOLO26)."),
      int_key<int64_t>("loss.tal_topk", [](Config& c) -> int64_t& { return c.loss.tal_topk; }, 1, 1000,
                       "Task-aligned assigner: candidate anchors per box (YOLOv8; YOLO26 one-to-many)."),
      double_key("loss.tal_alpha", [](Config& c) -> double& { return c.loss.tal_alpha; }, 0, 100,
                 "Task-aligned assigner: exponent of the class score."),
      double_key("loss.tal_beta", [](Config& c) -> double& { return c.loss.tal_beta; }, 0, 100,
                 "Task-aligned assigner: exponent of the IoU."),
      int_key<int64_t>("loss.assigner_chunk", [](Config& c) -> int64_t& { return c.loss.assigner_chunk; }, 1024,
                       int64_t{1} << 40,
                       "Elements (images x boxes x anchors) the assigner handles at once: bounds its "
                       "memory on crowded images without changing the result."),
      double_key("loss.obj", [](Config& c) -> double& { return c.loss.obj; }, 0, 1000, "Objectness loss gain (YOLOv5)."),
      double_key("loss.anchor_t", [](Config& c) -> double& { return c.loss.anchor_t; }, 1, 100,
                 "YOLOv5: a box matches an anchor when their width and height ratios are below this."),
      double_key("loss.task_loss_weight", [](Config& c) -> double& { return c.loss.task_loss_weight; }, 0, 1000,
                 "CenterNet heatmap (focal) loss weight (TF OD API name)."),
      double_key("loss.scale_loss_weight", [](Config& c) -> double& { return c.loss.scale_loss_weight; }, 0, 1000,
                 "CenterNet size (L1) loss weight (TF OD API name)."),
      double_key("loss.offset_loss_weight", [](Config& c) -> double& { return c.loss.offset_loss_weight; }, 0, 1000,
                 "CenterNet offset (L1) loss weight (TF OD API name)."),
      double_key("loss.min_overlap", [](Config& c) -> double& { return c.loss.min_overlap; }, 0.01, 0.99,
                 "CenterNet: the Gaussian radius keeps this IoU between a box and one shifted by it."),
      // eval
      double_key("eval.conf", [](Config& c) -> double& { return c.eval.conf; }, 0, 1,
                 "Score threshold of validation detections (low, for mAP)."),
      double_key("eval.iou", [](Config& c) -> double& { return c.eval.iou; }, 0, 1, "NMS IoU threshold."),
      int_key<int64_t>("eval.max_det", [](Config& c) -> int64_t& { return c.eval.max_det; }, 1, 100000,
                       "Detections kept per image after NMS."),
      bool_key("eval.agnostic", [](Config& c) -> bool& { return c.eval.agnostic; }, "Class-agnostic NMS."),
      int_key<int64_t>("eval.topk", [](Config& c) -> int64_t& { return c.eval.topk; }, 1, 10000,
                       "CenterNet: heatmap peaks kept per image."),
      choice_key("eval.preprocess", [](Config& c) -> std::string& { return c.eval.preprocess; }, {"auto", "fast", "source"},
                 "How `val` and `predict` turn images into the model's input. fast: JPEGs decoded at the smallest "
                 "libjpeg-turbo scale still as large as the canvas, area interpolation when shrinking (the training "
                 "path). source: full-scale decoding and a bilinear resize, as Ultralytics' predictor and validator, "
                 "YOLOv5's detect.py and the TF OD API prepare inputs. auto: source for weights made by another "
                 "framework (an Ultralytics or YOLOv5 .pt, a CenterNet .pth), fast for Headroom's own. Validation during "
                 "training takes the fast path."),
      bool_key("eval.end2end", [](Config& c) -> bool& { return c.eval.end2end; },
               "An end-to-end head (YOLO26): true, its one-to-one branch, whose top-k scores are the detections "
               "(no NMS; Ultralytics' nms=False, and what export writes); false, its one-to-many branch with NMS "
               "(Ultralytics 8.4.190's default for predict and val, nms=None). Validation during training follows it."),
      // log
      string_key("log.level", [](Config& c) -> std::string& { return c.log.level; },
                 "trace | debug | info | warn | error",
                 "Console and log-file verbosity.",
                 [](const std::string& s) -> std::string {
                   for (const char* l : {"trace", "debug", "info", "warn", "error"})
                     if (s == l) return "";
                   return "'" + s + "' is not a log level; use trace, debug, info, warn or error";
                 }),
  };
  std::vector<ConfigKey> augment = augment_keys();
  const auto memory_at = std::find_if(keys.begin(), keys.end(), [](const ConfigKey& k) { return k.info.path.rfind("memory.", 0) == 0; });
  keys.insert(memory_at, augment.begin(), augment.end());
  const Config defaults;
  for (auto& k : keys) {
    const Json v = k.get(defaults);
    k.info.default_text = v.is_string() ? v.as_string() : v.dump();
  }
  return keys;
}

}  // namespace

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> schema = build_schema();
  return schema;
}

const std::vector<ConfigKeyInfo>& config_keys() {
  static const std::vector<ConfigKeyInfo> infos = [] {
    std::vector<ConfigKeyInfo> v;
    for (const auto& k : config_schema()) v.push_back(k.info);
    return v;
  }();
  return infos;
}

}  // namespace headroom
