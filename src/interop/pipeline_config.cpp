#include "headroom/interop/pipeline_config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/data/pipeline_data.h"
#include "headroom/interop/weights_import.h"
#include "headroom/proto/pipeline.pb.h"

namespace headroom::interop {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

namespace {

using At = data::PipelineField;

// What to use instead of a field Headroom does not read, by field name.
const std::map<std::string, std::string>& advice() {
  static const std::map<std::string, std::string> a = {
      {"ssd", "Headroom trains CenterNet from a pipeline.config; for SSD-like one-stage detectors use a YOLO config (configs/yolov8s.yaml)"},
      {"faster_rcnn", "Headroom trains CenterNet from a pipeline.config; two-stage detectors are not built"},
      {"keypoint_estimation_task", "Headroom's CenterNet detects boxes only"},
      {"mask_estimation_task", "Headroom's CenterNet detects boxes only"},
      {"densepose_estimation_task", "Headroom's CenterNet detects boxes only"},
      {"track_estimation_task", "Headroom's CenterNet detects boxes only"},
      {"temporal_offset_task", "Headroom's CenterNet detects boxes only"},
      {"graph_rewriter", "quantisation-aware training is not built; export to ONNX and quantise there"},
      {"external_input_reader", "give the data as TFRecord files (tf_record_input_reader)"},
  };
  return a;
}

// The augmentation options Headroom runs (docs/augmentation.md).
const char* kAugmentations = "random_horizontal_flip, random_vertical_flip, random_crop_image, random_adjust_hue, "
                             "random_adjust_contrast, random_adjust_saturation, random_adjust_brightness, "
                             "random_absolute_pad_image";

// The pipeline's numbers are float32: written in the fewest digits that read back as the same
// float (0.1, not 0.100000001).
std::string yaml_number(float v) {
  char b[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, double(v));
    if (std::strtof(b, nullptr) == v) break;
  }
  return b;
}

// A message's fields as given in the file (TF's defaults left to Headroom's TF defaults), as a
// YAML flow map: {min_aspect_ratio: 0.5, random_coef: 0.25}.
std::string flow_map(const pb::Message& m) {
  std::vector<const pb::FieldDescriptor*> set;
  m.GetReflection()->ListFields(m, &set);
  const pb::Reflection* r = m.GetReflection();
  std::string out = "{";
  for (const pb::FieldDescriptor* f : set) {
    if (out.size() > 1) out += ", ";
    out += f->name() + ": ";
    auto scalar = [&](int i) -> std::string {
      switch (f->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_FLOAT: return yaml_number(i < 0 ? r->GetFloat(m, f) : r->GetRepeatedFloat(m, f, i));
        case pb::FieldDescriptor::CPPTYPE_INT32: return std::to_string(i < 0 ? r->GetInt32(m, f) : r->GetRepeatedInt32(m, f, i));
        case pb::FieldDescriptor::CPPTYPE_INT64: return std::to_string(i < 0 ? r->GetInt64(m, f) : r->GetRepeatedInt64(m, f, i));
        case pb::FieldDescriptor::CPPTYPE_BOOL: return (i < 0 ? r->GetBool(m, f) : r->GetRepeatedBool(m, f, i)) ? "true" : "false";
        default: return "null";  // not in any augmentation message
      }
    };
    if (f->is_repeated()) {
      out += "[";
      for (int i = 0; i < r->FieldSize(m, f); ++i) out += (i ? ", " : "") + scalar(i);
      out += "]";
    } else {
      out += scalar(-1);
    }
  }
  return out + "}";
}

class Mapper {
 public:
  Mapper(const std::string& file, PipelineConfig& out) : file_(file), out_(out) {}

  void set(const std::string& key, const std::string& value, const std::string& where, const std::string& from) {
    out_.settings.push_back({key, value, where, from});
  }
  void problem(const std::string& where, const std::string& what) { problems_.push_back(where + ": " + what); }
  void note(const std::string& where, const std::string& what) { out_.notes.push_back(where + ": " + what); }

  // Every field written in `at` that is not in `handled` is refused: nothing is silently dropped.
  void only(const At& at, std::initializer_list<const char*> handled) {
    std::vector<const pb::FieldDescriptor*> set;
    at.msg->GetReflection()->ListFields(*at.msg, &set);
    for (const pb::FieldDescriptor* f : set) {
      if (std::find_if(handled.begin(), handled.end(), [&](const char* h) { return f->name() == h; }) != handled.end())
        continue;
      const auto a = advice().find(f->name());
      problem(at.line(f->name(), 0), at.name(f->name()) + " is not supported by Headroom" +
                                         (a != advice().end() ? ": " + a->second : "; remove it (docs/tfod.md lists what is read)"));
    }
  }

  std::vector<std::string> problems_;
  int unknown_augmentations = 0;  // options of PreprocessingStep the parser skipped

 private:
  const std::string& file_;
  PipelineConfig& out_;
};

// feature_extractor: the Hourglass model file and the input normalisation.
void map_feature_extractor(const At& cn, const tf::CenterNet& c, Mapper& m) {
  const At fe = cn.nested("feature_extractor");
  m.only(fe, {"type", "channel_means", "channel_stds", "bgr_ordering"});
  static const std::map<std::string, std::string> kBackbones = {
      {"hourglass_104", "centernet_hg104"}, {"hourglass_52", "centernet_hg52"}, {"hourglass_32", "centernet_hg32"},
      {"hourglass_20", "centernet_hg20"}, {"hourglass_10", "centernet_hg10"}};
  const std::string type = c.feature_extractor().type();
  if (const auto it = kBackbones.find(type); it != kBackbones.end())
    m.set("model.file", "models/" + it->second + ".yaml", fe.line("type"), "feature_extractor.type " + type);
  else
    m.problem(fe.line("type"), "feature_extractor type '" + type + "' is not built by Headroom: hourglass_10, _20, _32, _52 "
              "and _104 are (for a lighter backbone, a Headroom config with models/centernet_csp.yaml)");
  // TF normalises raw pixels: (x - mean) / std, mean 0 and std 1 when not given.
  const auto three = [&](const pb::RepeatedField<float>& v, const char* field, const char* fallback) -> std::string {
    if (v.empty()) return fallback;
    if (v.size() != 3) m.problem(fe.line(field, 0), std::string(field) + " needs 3 values, one per channel");
    std::string out = "[";
    for (int i = 0; i < v.size(); ++i) out += (i ? ", " : "") + yaml_number(v.Get(i));
    return out + "]";
  };
  const auto& fx = c.feature_extractor();
  m.set("model.input_mean", three(fx.channel_means(), "channel_means", "[0, 0, 0]"), fe.line("channel_means", 0), "channel_means");
  m.set("model.input_std", three(fx.channel_stds(), "channel_stds", "[1, 1, 1]"), fe.line("channel_stds", 0), "channel_stds");
  m.set("model.input_bgr", fx.bgr_ordering() ? "true" : "false", fe.line("bgr_ordering"), "bgr_ordering");
}

// image_resizer: the training size; Headroom letterboxes to a square.
void map_image_resizer(const At& cn, const tf::CenterNet& c, Mapper& m) {
  const At resizer = cn.nested("image_resizer");
  m.only(resizer, {"keep_aspect_ratio_resizer", "fixed_shape_resizer"});
  const auto& ir = c.image_resizer();
  if (ir.has_keep_aspect_ratio_resizer()) {
    const At k = resizer.nested("keep_aspect_ratio_resizer");
    m.only(k, {"min_dimension", "max_dimension", "pad_to_max_dimension", "resize_method"});
    const auto& r = ir.keep_aspect_ratio_resizer();
    if (r.min_dimension() != r.max_dimension())
      m.problem(k.line("min_dimension"), "keep_aspect_ratio_resizer with min_dimension " + std::to_string(r.min_dimension()) +
                " and max_dimension " + std::to_string(r.max_dimension()) + ": Headroom scales the long side to one size "
                "(data.imgsz) and pads to a square; give both the same value");
    if (!r.pad_to_max_dimension())
      m.note(k.line("pad_to_max_dimension"), "pad_to_max_dimension false: Headroom pads every image to a square (the batch needs one size)");
    if (r.resize_method() != tf::ResizeType::BILINEAR)
      m.problem(k.line("resize_method"), "resize_method: Headroom resizes bilinearly; remove the field");
    m.set("data.imgsz", std::to_string(r.max_dimension()), k.line("max_dimension"), "keep_aspect_ratio_resizer max_dimension");
  } else if (ir.has_fixed_shape_resizer()) {
    const At f = resizer.nested("fixed_shape_resizer");
    m.only(f, {"height", "width", "resize_method"});
    const auto& r = ir.fixed_shape_resizer();
    if (r.height() != r.width())
      m.problem(f.line("height"), "fixed_shape_resizer " + std::to_string(r.height()) + "x" + std::to_string(r.width()) +
                ": Headroom trains on squares; give height = width");
    if (r.resize_method() != tf::ResizeType::BILINEAR)
      m.problem(f.line("resize_method"), "resize_method: Headroom resizes bilinearly; remove the field");
    m.note(f.line("height"), "fixed_shape_resizer: Headroom keeps the aspect ratio and pads (letterbox) where TF stretches");
    m.set("data.imgsz", std::to_string(r.height()), f.line("height"), "fixed_shape_resizer height");
  } else {
    m.problem(cn.line("image_resizer"), "center_net needs an image_resizer (keep_aspect_ratio_resizer or fixed_shape_resizer)");
  }
}

// object_detection_task and object_center_params: the loss weights, min_overlap and max_det.
void map_center_net_losses(const At& cn, const tf::CenterNet& c, Mapper& m) {
  // TF: center * object_center_loss_weight + task_loss_weight * (scale * S + offset * O).
  const At task = cn.nested("object_detection_task");
  m.only(task, {"task_loss_weight", "offset_loss_weight", "scale_loss_weight", "localization_loss"});
  const auto& od = c.object_detection_task();
  if (od.has_localization_loss()) m.only(task.nested("localization_loss"), {"l1_localization_loss"});
  m.set("loss.scale_loss_weight", yaml_number(od.task_loss_weight() * od.scale_loss_weight()), task.line("scale_loss_weight"),
        "object_detection_task task_loss_weight x scale_loss_weight");
  m.set("loss.offset_loss_weight", yaml_number(od.task_loss_weight() * od.offset_loss_weight()), task.line("offset_loss_weight"),
        "object_detection_task task_loss_weight x offset_loss_weight");
  const At center = cn.nested("object_center_params");
  m.only(center, {"object_center_loss_weight", "classification_loss", "min_box_overlap_iou", "max_box_predictions"});
  const auto& oc = c.object_center_params();
  if (oc.has_classification_loss()) {
    const At loss = center.nested("classification_loss");
    m.only(loss, {"penalty_reduced_logistic_focal_loss"});
    const auto& focal = oc.classification_loss().penalty_reduced_logistic_focal_loss();
    // The OD API has no defaults for them: an absent one is 0 there, another loss than CenterNet's.
    if (!focal.has_alpha() || !focal.has_beta() || focal.alpha() != 2.0f || focal.beta() != 4.0f)
      m.problem(loss.line("penalty_reduced_logistic_focal_loss"),
                "the focal loss's alpha and beta are CenterNet's 2 and 4 in Headroom: set alpha: 2.0 and beta: 4.0 (the TF OD API "
                "takes an absent one as 0)");
  }
  m.set("loss.task_loss_weight", yaml_number(oc.object_center_loss_weight()), center.line("object_center_loss_weight"),
        "object_center_params object_center_loss_weight");
  m.set("loss.min_overlap", yaml_number(oc.min_box_overlap_iou()), center.line("min_box_overlap_iou"), "min_box_overlap_iou");
  m.set("eval.max_det", std::to_string(oc.max_box_predictions()), center.line("max_box_predictions"), "max_box_predictions");
}

void map_model(const At& model, Mapper& m) {
  m.only(model, {"center_net"});
  if (!model.msg->GetReflection()->HasField(*model.msg, model.field("center_net"))) {
    m.problem(model.line("center_net"), "the model is not center_net: Headroom trains CenterNet from a pipeline.config");
    return;
  }
  const At cn = model.nested("center_net");
  m.only(cn, {"num_classes", "feature_extractor", "image_resizer", "object_detection_task", "object_center_params"});
  const auto& c = static_cast<const tf::CenterNet&>(*cn.msg);
  map_feature_extractor(cn, c, m);
  map_image_resizer(cn, c, m);
  map_center_net_losses(cn, c, m);
}

void map_learning_rate(const At& lr, Mapper& m) {
  m.only(lr, {"constant_learning_rate", "manual_step_learning_rate", "cosine_decay_learning_rate",
              "exponential_decay_learning_rate"});
  const auto& l = static_cast<const tf::LearningRate&>(*lr.msg);
  if (l.has_constant_learning_rate()) {
    const At c = lr.nested("constant_learning_rate");
    m.only(c, {"learning_rate"});
    m.set("train.lr0", yaml_number(l.constant_learning_rate().learning_rate()), c.line("learning_rate"), "constant_learning_rate");
    m.set("train.schedule", "linear", c.line("learning_rate"), "constant_learning_rate");
    m.set("train.lrf", "1", c.line("learning_rate"), "constant_learning_rate");
  } else if (l.has_manual_step_learning_rate()) {
    const At s = lr.nested("manual_step_learning_rate");
    m.only(s, {"initial_learning_rate", "schedule", "warmup"});
    const auto& ms = l.manual_step_learning_rate();
    std::string steps = "[", values = "[";
    for (int i = 0; i < ms.schedule_size(); ++i) {
      steps += (i ? ", " : "") + std::to_string(ms.schedule(i).step());
      values += (i ? ", " : "") + yaml_number(ms.schedule(i).learning_rate());
    }
    m.set("train.lr0", yaml_number(ms.initial_learning_rate()), s.line("initial_learning_rate"), "manual_step_learning_rate");
    if (ms.schedule_size() == 0) {
      m.set("train.schedule", "linear", s.line("initial_learning_rate"), "manual_step_learning_rate without steps");
      m.set("train.lrf", "1", s.line("initial_learning_rate"), "manual_step_learning_rate without steps");
    } else {
      if (ms.schedule(0).step() == 0) m.problem(s.line("schedule", 0), "the first schedule step cannot be 0 (TF refuses it too)");
      m.set("train.schedule", "manual", s.line("schedule", 0), "manual_step_learning_rate");
      m.set("train.lr_steps", steps + "]", s.line("schedule", 0), "manual_step_learning_rate schedule step");
      m.set("train.lr_values", values + "]", s.line("schedule", 0), "manual_step_learning_rate schedule learning_rate");
      if (ms.warmup()) {  // from the initial rate to the first step's, linearly
        m.set("train.warmup", "linear", s.line("warmup"), "manual_step_learning_rate warmup");
        m.set("train.warmup_steps", std::to_string(ms.schedule(0).step()), s.line("warmup"), "manual_step_learning_rate warmup (to the first step)");
        m.set("train.warmup_lr", yaml_number(ms.initial_learning_rate()), s.line("warmup"), "manual_step_learning_rate warmup (from initial_learning_rate)");
      }
    }
  } else if (l.has_cosine_decay_learning_rate()) {
    const At s = lr.nested("cosine_decay_learning_rate");
    m.only(s, {"learning_rate_base", "total_steps", "warmup_learning_rate", "warmup_steps", "hold_base_rate_steps"});
    const auto& cd = l.cosine_decay_learning_rate();
    if (cd.learning_rate_base() < cd.warmup_learning_rate())
      m.problem(s.line("warmup_learning_rate"), "warmup_learning_rate exceeds learning_rate_base (TF refuses it too)");
    if (cd.total_steps() < uint64_t(cd.warmup_steps()))
      m.problem(s.line("total_steps"), "total_steps " + std::to_string(cd.total_steps()) + " is less than warmup_steps " +
                std::to_string(cd.warmup_steps()) + " (TF refuses it too: total_steps must be larger or equal to warmup_steps)");
    // TF's rate is 0 after total_steps, a hold reaching past it included: the hold ends there.
    const uint64_t hold = std::min<uint64_t>(cd.hold_base_rate_steps(), cd.total_steps() >= uint64_t(cd.warmup_steps())
                                                                            ? cd.total_steps() - uint64_t(cd.warmup_steps()) : 0);
    m.set("train.lr0", yaml_number(cd.learning_rate_base()), s.line("learning_rate_base"), "cosine_decay_learning_rate");
    m.set("train.schedule", "cosine", s.line("learning_rate_base"), "cosine_decay_learning_rate");
    m.set("train.lrf", "0", s.line("learning_rate_base"), "cosine_decay_learning_rate (down to 0)");
    m.set("train.schedule_steps", std::to_string(cd.total_steps()), s.line("total_steps"), "cosine_decay_learning_rate total_steps");
    m.set("train.hold_steps", std::to_string(hold), s.line("hold_base_rate_steps"),
          hold < uint64_t(cd.hold_base_rate_steps()) ? "cosine_decay_learning_rate hold_base_rate_steps (to total_steps, after which TF's rate is 0)"
                                                     : "cosine_decay_learning_rate hold_base_rate_steps");
    m.set("train.warmup", "linear", s.line("warmup_steps"), "cosine_decay_learning_rate warmup");
    m.set("train.warmup_steps", std::to_string(cd.warmup_steps()), s.line("warmup_steps"), "cosine_decay_learning_rate warmup_steps");
    m.set("train.warmup_lr", yaml_number(cd.warmup_learning_rate()), s.line("warmup_learning_rate"), "cosine_decay_learning_rate warmup_learning_rate");
  } else if (l.has_exponential_decay_learning_rate()) {
    const At s = lr.nested("exponential_decay_learning_rate");
    m.only(s, {"initial_learning_rate", "decay_steps", "decay_factor", "staircase", "burnin_learning_rate", "burnin_steps",
               "min_learning_rate"});
    const auto& ed = l.exponential_decay_learning_rate();
    if (ed.decay_steps() == 0) m.problem(s.line("decay_steps"), "decay_steps must be at least 1");
    m.set("train.lr0", yaml_number(ed.initial_learning_rate()), s.line("initial_learning_rate"), "exponential_decay_learning_rate");
    m.set("train.schedule", "exponential", s.line("initial_learning_rate"), "exponential_decay_learning_rate");
    m.set("train.decay_every", std::to_string(ed.decay_steps()), s.line("decay_steps"), "exponential_decay_learning_rate decay_steps");
    m.set("train.decay_factor", yaml_number(ed.decay_factor()), s.line("decay_factor"), "exponential_decay_learning_rate decay_factor");
    m.set("train.staircase", ed.staircase() ? "true" : "false", s.line("staircase"), "exponential_decay_learning_rate staircase");
    m.set("train.min_lr", yaml_number(ed.min_learning_rate()), s.line("min_learning_rate"), "exponential_decay_learning_rate min_learning_rate");
    if (ed.burnin_steps() > 0) {  // a constant rate first (the base rate when 0), the decay counted from its end
      const float burnin = ed.burnin_learning_rate() == 0 ? ed.initial_learning_rate() : ed.burnin_learning_rate();
      m.set("train.warmup", "constant", s.line("burnin_steps"), "exponential_decay_learning_rate burn-in");
      m.set("train.warmup_steps", std::to_string(ed.burnin_steps()), s.line("burnin_steps"), "exponential_decay_learning_rate burnin_steps");
      m.set("train.warmup_lr", yaml_number(burnin), s.line("burnin_learning_rate"), "exponential_decay_learning_rate burnin_learning_rate");
    }
  } else {
    m.problem(lr.line(""), "the optimizer needs a learning_rate (constant, manual_step, cosine_decay or exponential_decay)");
  }
}

// data_augmentation_options: each step's options as written, under augment.<step name>.
void map_augmentations(const At& train, const tf::TrainConfig& t, Mapper& m) {
  for (int i = 0; i < t.data_augmentation_options_size(); ++i) {
    const At step = train.nested("data_augmentation_options", i);
    std::vector<const pb::FieldDescriptor*> set;
    step.msg->GetReflection()->ListFields(*step.msg, &set);
    if (set.empty()) {  // an option the parser skipped was reported with its line already
      if (m.unknown_augmentations == 0)
        m.problem(train.line("data_augmentation_options", i), std::string("an augmentation option Headroom does not run; it runs ") + kAugmentations);
      continue;
    }
    const std::string name = set[0]->name();
    const pb::Message& op = step.msg->GetReflection()->GetMessage(*step.msg, set[0]);
    if (name == "random_horizontal_flip" || name == "random_vertical_flip") m.only(step.nested(name), {"probability"});
    m.set("augment." + name, flow_map(op), train.line("data_augmentation_options", i), "data_augmentation_options " + name);
  }
}

// The optimizer, its learning rate schedule and the moving average of the weights.
void map_optimizer(const At& train, const tf::TrainConfig& t, Mapper& m) {
  const At opt = train.nested("optimizer");
  m.only(opt, {"adam_optimizer", "momentum_optimizer", "rms_prop_optimizer", "use_moving_average", "moving_average_decay"});
  const auto& o = t.optimizer();
  if (o.has_adam_optimizer()) {
    const At a = opt.nested("adam_optimizer");
    m.only(a, {"learning_rate", "epsilon"});
    m.set("train.optimizer", "adam", opt.line("adam_optimizer"), "adam_optimizer");
    m.set("train.momentum", "0.9", opt.line("adam_optimizer"), "adam_optimizer (Keras beta_1 0.9, beta_2 0.999)");
    m.set("train.eps", yaml_number(o.adam_optimizer().epsilon()), a.line("epsilon"), "adam_optimizer epsilon");
    m.set("train.weight_decay", "0", opt.line("adam_optimizer"), "adam_optimizer (no weight decay)");
    map_learning_rate(a.nested("learning_rate"), m);
  } else if (o.has_momentum_optimizer()) {
    const At a = opt.nested("momentum_optimizer");
    m.only(a, {"learning_rate", "momentum_optimizer_value"});
    m.set("train.optimizer", "sgd", opt.line("momentum_optimizer"), "momentum_optimizer");
    m.set("train.momentum", yaml_number(o.momentum_optimizer().momentum_optimizer_value()), a.line("momentum_optimizer_value"),
          "momentum_optimizer momentum_optimizer_value");
    m.set("train.nesterov", "false", opt.line("momentum_optimizer"), "momentum_optimizer (not Nesterov)");
    m.set("train.weight_decay", "0", opt.line("momentum_optimizer"), "momentum_optimizer (no weight decay)");
    map_learning_rate(a.nested("learning_rate"), m);
  } else if (o.has_rms_prop_optimizer()) {
    // TF2's OD API builds tf.keras' (legacy) RMSprop(lr, decay=decay, momentum=..., epsilon=...):
    // Keras takes `decay` as the rate's inverse-time decay, and rho keeps its default 0.9.
    const At a = opt.nested("rms_prop_optimizer");
    const auto& r = o.rms_prop_optimizer();
    m.only(a, {"learning_rate", "momentum_optimizer_value", "decay", "epsilon"});
    m.set("train.optimizer", "rmsprop", opt.line("rms_prop_optimizer"), "rms_prop_optimizer (TensorFlow's RMSprop)");
    m.set("train.momentum", yaml_number(r.momentum_optimizer_value()), a.line("momentum_optimizer_value"),
          "rms_prop_optimizer momentum_optimizer_value");
    m.set("train.eps", yaml_number(r.epsilon()), a.line("epsilon"), "rms_prop_optimizer epsilon");
    m.set("train.rho", "0.9", opt.line("rms_prop_optimizer"), "rms_prop_optimizer (Keras' rho 0.9)");
    m.set("train.inverse_time_decay", yaml_number(r.decay()), a.line("decay"),
          "rms_prop_optimizer decay (Keras: rate / (1 + decay * step))");
    if (r.decay() > 0)
      m.note(a.line("decay"), "rms_prop_optimizer decay " + yaml_number(r.decay()) + ": TF2's OD API hands it to Keras' RMSprop, "
             "which divides the rate by 1 + decay * step (not rho, which stays 0.9); Headroom does the same");
    m.set("train.weight_decay", "0", opt.line("rms_prop_optimizer"), "rms_prop_optimizer (no weight decay)");
    map_learning_rate(a.nested("learning_rate"), m);
  } else {
    m.problem(train.line("optimizer"), "train_config needs an optimizer: adam_optimizer, momentum_optimizer (SGD) or rms_prop_optimizer");
  }
  m.set("train.ema", o.use_moving_average() ? "true" : "false", opt.line("use_moving_average"), "use_moving_average");
  if (o.use_moving_average()) {
    m.set("train.ema_decay", yaml_number(o.moving_average_decay()), opt.line("moving_average_decay"), "moving_average_decay");
    m.set("train.ema_ramp", "tf", opt.line("use_moving_average"), "use_moving_average (TF's average ramps its decay up as min(decay, (1 + step) / (10 + step)))");
  }
}

// fine_tune_checkpoint: the TF2 checkpoint to start from and how much of it to restore.
void map_fine_tune_checkpoint(const At& train, const tf::TrainConfig& t, Mapper& m) {
  if (data::remote_path(t.fine_tune_checkpoint())) {
    m.problem(train.line("fine_tune_checkpoint"), t.fine_tune_checkpoint() + " is on a remote file system; Headroom reads local files: "
              "copy the checkpoint's .index and .data files here (gsutil cp) and name the copy");
  } else if (!t.fine_tune_checkpoint().empty()) {
    const std::string path = data::resolve_pipeline_path(*train.file, t.fine_tune_checkpoint());
    m.set("model.init_from", Json(path).dump(), train.line("fine_tune_checkpoint"),
          "fine_tune_checkpoint (a TF2 checkpoint prefix; the model is the checkpoint's Hourglass)");
    // Another trainer's weights file brings its own model (as model.init_from does): a YOLO's
    // would train that YOLO from a center_net pipeline. A CenterNet's, Headroom's own (built as
    // model.file says) or a checkpoint not on this machine yet (config convert) is left to the run.
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) {
      std::optional<models::ModelSpec> carried;
      try {
        carried = carried_model(path);
      } catch (const InputError& e) {
        m.problem(train.line("fine_tune_checkpoint"), std::string("fine_tune_checkpoint: ") + e.what());
      }
      if (carried && carried->text.find("CenterNetHead") == std::string::npos)
        m.problem(train.line("fine_tune_checkpoint"),
                  "fine_tune_checkpoint " + path + " holds a YOLO (" + carried->file + "), not a CenterNet: this pipeline "
                  "would train that YOLO. Give a TF2 CenterNet checkpoint prefix (.../checkpoint/ckpt-0), or train the YOLO "
                  "from a YAML config (configs/yolov8s.yaml) with model.init_from=" + path);
    }
    // CenterNet restores its feature extractor for "detection" and everything for "full"; TF takes
    // an empty type as "classification", which the hourglass extractors refuse.
    const std::string& type = t.fine_tune_checkpoint_type();
    if (type == "detection" || type == "full")
      m.set("model.init_backbone_only", type == "detection" ? "true" : "false", train.line("fine_tune_checkpoint_type"),
            "fine_tune_checkpoint_type " + type + (type == "detection" ? " (the feature extractor; the heads keep their initialisation)" : " (the whole model)"));
    else
      m.problem(train.line(t.has_fine_tune_checkpoint_type() ? "fine_tune_checkpoint_type" : "fine_tune_checkpoint"),
                "fine_tune_checkpoint_type '" + type + "': CenterNet restores 'detection' (the feature extractor) or 'full' "
                "(the whole model)" + (type == "fine_tune" ? std::string("; 'fine_tune' is what TF now calls 'detection' (it refuses "
                "'fine_tune' too): write fine_tune_checkpoint_type: \"detection\"") : type.empty() ? "; TF takes an empty type as "
                "'classification', which the hourglass refuses" : ""));
    if (t.fine_tune_checkpoint_version() != tf::V2)
      m.problem(train.line("fine_tune_checkpoint_version"), "fine_tune_checkpoint_version V1 (a TF1 name-based checkpoint): "
                "Headroom reads TF2 object-based checkpoints; give fine_tune_checkpoint_version: V2 with a TF2 checkpoint");
  } else if (t.has_fine_tune_checkpoint_type() || t.has_fine_tune_checkpoint_version())
    m.note(train.line(t.has_fine_tune_checkpoint_type() ? "fine_tune_checkpoint_type" : "fine_tune_checkpoint_version"),
           "fine_tune_checkpoint_type/version: no fine_tune_checkpoint is given");
}

void map_train(const At& train, Mapper& m) {
  m.only(train, {"batch_size", "data_augmentation_options", "optimizer", "fine_tune_checkpoint", "fine_tune_checkpoint_type",
                 "fine_tune_checkpoint_version", "num_steps", "max_number_of_boxes", "unpad_groundtruth_tensors",
                 "use_bfloat16", "gradient_clipping_by_norm", "add_regularization_loss"});
  const auto& t = static_cast<const tf::TrainConfig&>(*train.msg);
  m.set("train.batch", std::to_string(t.batch_size()), train.line("batch_size"), "batch_size");
  m.set("train.nominal_batch", std::to_string(t.batch_size()), train.line("batch_size"), "batch_size (one optimizer step per batch)");
  if (t.num_steps() <= 0)
    m.problem(train.line("num_steps"), "num_steps 0 means training forever in TF; give the number of steps");
  else
    m.set("train.steps", std::to_string(t.num_steps()), train.line("num_steps"), "num_steps");
  m.set("train.warmup_epochs", "0", train.line("optimizer"), "no warmup unless the schedule has one");

  map_augmentations(train, t, m);
  map_optimizer(train, t, m);
  map_fine_tune_checkpoint(train, t, m);
  if (t.has_max_number_of_boxes())
    m.note(train.line("max_number_of_boxes"), "max_number_of_boxes: Headroom trains on every box of an image (TF pads or cuts to this many)");
  if (t.has_unpad_groundtruth_tensors())
    m.note(train.line("unpad_groundtruth_tensors"), "unpad_groundtruth_tensors: Headroom's batches carry box counts, not padding");
  if (t.use_bfloat16()) m.set("train.amp", "bf16", train.line("use_bfloat16"), "use_bfloat16");
  if (t.gradient_clipping_by_norm() > 0)
    m.set("train.clip_grad", yaml_number(t.gradient_clipping_by_norm()), train.line("gradient_clipping_by_norm"),
          "gradient_clipping_by_norm");
  if (t.has_add_regularization_loss())
    m.note(train.line("add_regularization_loss"), "add_regularization_loss: CenterNet's layers carry no regularisation loss");
}

// One input reader's settings: its files and label map are the data set's (data/pipeline_data.h).
void check_reader(const At& reader, bool training, Mapper& m) {
  m.only(reader, {"label_map_path", "tf_record_input_reader", "shuffle", "num_readers", "num_epochs", "use_display_name"});
  const auto& r = static_cast<const tf::InputReader&>(*reader.msg);
  if (r.has_tf_record_input_reader()) m.only(reader.nested("tf_record_input_reader"), {"input_path"});
  if (training && r.has_shuffle() && !r.shuffle())
    m.problem(reader.line("shuffle"), "shuffle false for training: Headroom shuffles the training split every epoch; remove it");
  if (!training && r.shuffle() && r.has_shuffle())
    m.note(reader.line("shuffle"), "shuffle: Headroom validates in file order");
  if (r.has_use_display_name())
    m.note(reader.line("use_display_name"), "use_display_name: Headroom matches image/object/class/text against both the "
           "label map's name and display_name, and names classes by display_name where given");
  if (r.has_num_readers())
    m.note(reader.line("num_readers"), "num_readers: Headroom reads with data.workers threads (auto: every core)");
  if (r.has_num_epochs() && !(r.num_epochs() == 1 && !training))
    m.note(reader.line("num_epochs"), "num_epochs: Headroom's length is train_config num_steps; validation reads the split once");
}

}  // namespace

PipelineConfig read_pipeline_config(const std::string& path) {
  const std::unique_ptr<data::PipelineText> text = data::parse_pipeline(path);
  const tf::TrainEvalPipelineConfig& p = text->config;
  PipelineConfig out;
  Mapper m(path, out);
  // Fields the parser skipped: a field of the OD API Headroom does not read, or a misspelling.
  static const std::regex kUnknown(R"re(Message type "headroom\.tf\.([A-Za-z_.]+)" has no field named "([^"]+)")re");
  for (const auto& [where, message] : text->unknown) {
    std::smatch w;
    if (!std::regex_search(message, w, kUnknown)) {
      m.problem(where, message);
      continue;
    }
    const std::string field = w[2].str();
    const auto a = advice().find(field);
    std::string what = field + " is not read by Headroom";
    if (a != advice().end()) {
      what += ": " + a->second;
    } else if (const pb::Descriptor* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName("headroom.tf." + w[1].str())) {
      std::vector<std::string> names;
      for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
      const std::string near = nearest_match(field, names);
      if (!near.empty())
        what += "; did you mean '" + near + "'?";
      else if (w[1].str() == "PreprocessingStep")
        what += std::string("; the augmentation options Headroom runs are ") + kAugmentations;
      else
        what += " (docs/tfod.md lists what is read)";
    }
    if (w[1].str() == "PreprocessingStep") ++m.unknown_augmentations;
    m.problem(where, what);
  }

  const At root = At::root(*text);
  m.only(root, {"model", "train_config", "train_input_reader", "eval_config", "eval_input_reader"});
  map_model(root.nested("model"), m);
  map_train(root.nested("train_config"), m);
  check_reader(root.nested("train_input_reader"), true, m);
  if (p.eval_input_reader_size() > 1)
    m.problem(root.line("eval_input_reader", 1), "Headroom validates one split: keep one eval_input_reader");
  if (p.eval_input_reader_size() > 0) check_reader(root.nested("eval_input_reader", 0), false, m);
  out.data = data::pipeline_data(*text, m.problems_);
  m.set("data.dataset", Json(fs::absolute(path).lexically_normal().string()).dump(), root.line("train_input_reader"),
        "train_input_reader and eval_input_reader (TFRecord files and label map)");

  const At eval = root.nested("eval_config");
  m.only(eval, {"metrics_set", "batch_size", "use_moving_averages", "num_examples", "num_visualizations"});
  const auto& e = p.eval_config();
  for (int i = 0; i < e.metrics_set_size(); ++i)
    if (e.metrics_set(i) != "coco_detection_metrics")
      m.problem(eval.line("metrics_set", i), "metrics_set '" + e.metrics_set(i) + "': Headroom computes coco_detection_metrics");
  if (e.has_batch_size()) m.note(eval.line("batch_size"), "batch_size: Headroom validates in batches of train_config batch_size");
  // Their defaults differ (the optimizer keeps an average, eval does not use it): compared as TF reads them.
  const bool average = p.train_config().optimizer().use_moving_average();
  if ((p.has_eval_config() || p.eval_input_reader_size() > 0) && e.use_moving_averages() != average)
    m.note(e.has_use_moving_averages() ? eval.line("use_moving_averages") : root.nested("train_config").nested("optimizer").line("use_moving_average"),
           std::string("use_moving_averages ") + (e.use_moving_averages() ? "true" : "false") +
               (e.has_use_moving_averages() ? "" : " (TF's default)") + " and the optimizer's use_moving_average " + (average ? "true" : "false") +
               ": Headroom validates the moving average exactly when it keeps one");
  if (e.has_num_examples()) m.note(eval.line("num_examples"), "num_examples: Headroom validates the whole eval split");
  if (e.has_num_visualizations()) m.note(eval.line("num_visualizations"), "num_visualizations: Headroom draws its own plots");
  if (!p.has_eval_config() && p.eval_input_reader_size() == 0)
    m.set("train.val_every", "0", path, "no eval_input_reader");

  if (!m.problems_.empty()) {
    std::string msg = path + ": " + std::to_string(m.problems_.size()) + " field" + (m.problems_.size() > 1 ? "s" : "") +
                      " of this pipeline.config Headroom cannot run as written:";
    for (const auto& s : m.problems_) msg += "\n  " + s;
    throw InputError(msg);
  }
  return out;
}

std::string pipeline_to_yaml(const PipelineConfig& p, const std::string& path) {
  std::string out = "# The Headroom run config that " + path + " means (trainer config convert).\n"
                    "# Each key says the pipeline field it comes from; paths were resolved against the\n"
                    "# pipeline's folder. Fields read without an effect here:\n";
  for (const auto& n : p.notes) out += "#   " + n + "\n";
  std::map<std::string, std::vector<const PipelineSetting*>> sections;
  std::vector<std::string> order;
  for (const auto& s : p.settings) {
    const std::string section = s.key.substr(0, s.key.find('.'));
    if (!sections.count(section)) order.push_back(section);
    sections[section].push_back(&s);
  }
  // The last setting of a key wins, as in the loader.
  for (const auto& section : order) {
    out += section + ":\n";
    std::map<std::string, const PipelineSetting*> last;
    for (const PipelineSetting* s : sections[section]) last[s->key] = s;
    std::set<std::string> written;
    for (const PipelineSetting* s : sections[section]) {
      if (last[s->key] != s || !written.insert(s->key).second) continue;
      out += "  " + s->key.substr(section.size() + 1) + ": " + s->value + "  # " + s->from + " (" + s->where + ")\n";
    }
  }
  return out;
}

Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty() || !data::is_pipeline_config(path)) return load_config(path, overrides);
  const PipelineConfig pipeline = read_pipeline_config(path);
  static std::set<std::string> said;  // a run loads its config more than once: each note once
  for (const std::string& n : pipeline.notes)
    if (said.insert(n).second) spdlog::info("{}", n);
  std::vector<ConfigSetting> settings;
  for (const PipelineSetting& s : pipeline.settings) settings.push_back({s.key, s.value, s.where});
  return load_config(path, settings, overrides);
}

}  // namespace headroom::interop
