// A tiny YOLOv8, YOLOv5 and CenterNet each learn a handful of synthetic images on the CPU, trained
// by the Trainer: its optimizer, accumulation and loss normalisation, with the losses,
// assignment, decoding, NMS and the COCO evaluator working together. An untrained model scores
// 0.000; a broken step cannot reach AP50 0.9.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "headroom/data/loader.h"
#include "headroom/data/synth.h"
#include "headroom/eval/validate.h"
#include "headroom/losses/loss.h"
#include "headroom/models/weights.h"
#include "headroom/train/trainer.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/interop/init_from.h"
#include "test_util.h"

using namespace headroom;

namespace {

// Eight 128-px images of two shape classes, few objects each: the set the models memorise.
const std::string& handful() {
  static const std::string yaml = [] {
    data::SynthOptions o;
    o.out = test::temp_dir("handful");
    o.images = 8;
    o.size = 128;
    o.seed = 21;
    o.classes = 2;
    o.max_objects = 3;
    o.min_object = 0.2;  // 15+ px at 128: every object covers YOLOv8 anchor centres
    o.max_object = 0.5;
    o.val_fraction = 0;
    o.threads = 2;
    return data::synthesize(o).data_yaml;
  }();
  return yaml;
}

struct Overfit {
  double ap50 = 0;
  double first_loss = 0, last_loss = 0;
  std::string weights;  // the trained model, saved
  Config config;
};

// The summed loss terms at each read of the counters (here every step: one step per epoch).
class LossRecord : public train::Hook {
 public:
  void after_step(train::Trainer& t) override {
    if (t.counters().step != t.state().step) return;
    double total = 0;
    for (const auto& [name, v] : t.counters().losses()) total += v;
    if (std::isnan(first)) first = total;
    last = total;
  }
  double first = NAN, last = NAN;
};

// Trainer::train with Headroom's optimizer (AdamW at a constant rate), accumulation (two loader
// batches of 4 per step of 8) and loss normalisation, without augmentation; then validated on
// the training images.
Overfit overfit(const std::vector<std::string>& model_keys, int steps, double lr, const std::string& amp = "off") {
  std::vector<std::string> overrides = {"data.dataset=" + handful(), "data.imgsz=128", "train.batch=4", "train.nominal_batch=8",
                                        "data.workers=1", "data.cache=ram", "train.optimizer=adamw", "train.lr0=" + std::to_string(lr),
                                        "train.warmup_epochs=0", "train.weight_decay=0", "train.ema=false",
                                        "train.steps=" + std::to_string(steps), "train.amp=" + amp, "device=cpu"};
  overrides.insert(overrides.end(), model_keys.begin(), model_keys.end());
  const Config c = load_config("", overrides);
  train::TrainerParts parts = train::make_trainer_parts(c, c10::Device(c10::kCPU), test::temp_dir("overfit"));
  const auto split = parts.train_split;
  train::Trainer t(std::move(parts));
  auto record = std::make_unique<LossRecord>();
  LossRecord* losses = record.get();
  t.register_hook(std::move(record));
  t.train();  // no schedule hook: the rate stays at lr0
  EXPECT_EQ(t.state().step, steps);
  EXPECT_EQ(t.counters().skipped_steps, 0);
  Overfit r;
  r.first_loss = losses->first;
  r.last_loss = losses->last;
  const eval::ValidationResult v = eval::validate(t.model(), split, eval::validate_options(c, *split, t.model().info(), c10::Device(c10::kCPU)));
  r.ap50 = v.stats.stats[1];
  r.weights = test::temp_dir("weights") + "/last.pt";
  models::save_weights(t.model(), models::WeightsInfo{split->names, split->category_ids}, r.weights);
  r.config = c;
  std::printf("%s (amp %s): loss %.3f -> %.3f, AP50 %.3f, AP %.3f\n", c.model.file.c_str(), amp.c_str(), r.first_loss, r.last_loss,
              r.ap50, v.stats.stats[0]);
  return r;
}

}  // namespace

TEST(Overfit, TinyYolov8) {
  const Overfit r = overfit(test::tiny_model("yolov8.yaml"), 200, 2e-3);  // 5e-3 ends between two states (AP50 0.84..1.0 by BLAS)
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.ap50, 0.9);
}

TEST(Overfit, TinyYolo11) {
  const Overfit r = overfit(test::tiny_model("yolo11.yaml"), 200, 5e-3);
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.ap50, 0.9);
}

TEST(Overfit, TinyYolov5) {
  const Overfit r = overfit(test::tiny_model("yolov5n.yaml"), 400, 5e-3);
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.ap50, 0.9);
}

TEST(Overfit, TinyCenterNet) {
  const Overfit r = overfit(test::tiny_model("centernet_csp.yaml"), 200, 5e-3);
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_GE(r.ap50, 0.9);

  // The saved weights give the same detections through the command line: val with
  // --save-json, scoring that file with --gt/--results, and predict.
  const std::string dir = test::temp_dir("cli-trained");
  test::write_bytes(dir + "/run.yaml", config_to_yaml(r.config));
  // One thread, as this process scores: CPU kernels may round otherwise at other thread counts.
  test::RunResult v = test::run_trainer("val --config " + dir + "/run.yaml --split train --weights " + r.weights +
                                        " --save-json " + dir + "/results.json --json threads=1");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const Json stats = Json::parse(v.output.substr(v.output.find('{')), "stdout");
  EXPECT_NEAR(stats.find("AP50")->as_number(), r.ap50, 1e-6);
  // --save-json over the config it read is refused before the pass, the config untouched.
  const std::string run_yaml = test::read_bytes(dir + "/run.yaml");
  v = test::run_trainer("val --config " + dir + "/run.yaml --split train --weights " + r.weights + " --save-json " + dir + "/run.yaml threads=1");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("--save-json " + dir + "/run.yaml is the config"), std::string::npos) << v.output;
  EXPECT_EQ(test::read_bytes(dir + "/run.yaml"), run_yaml);
  v = test::run_trainer("val --gt " + dir + "/results_gt.json --results " + dir + "/results.json --json");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NEAR(Json::parse(v.output, "stdout").find("AP50")->as_number(), r.ap50, 1e-6);
  // Results for an image the ground truth does not list are another set's (pycocotools refuses them too).
  test::write_bytes(dir + "/other.json", R"([{"image_id": 99999, "category_id": 0, "bbox": [0, 0, 1, 1], "score": 0.5}])");
  v = test::run_trainer("val --gt " + dir + "/results_gt.json --results " + dir + "/other.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find(dir + "/other.json: result 0 (image_id 99999) is for an image"), std::string::npos) << v.output;

  const std::string images = std::filesystem::path(handful()).parent_path() / "images" / "train";
  v = test::run_trainer("predict --config " + dir + "/run.yaml --weights " + r.weights + " --source " + images +
                        " --save-dir " + dir + "/pred --conf 0.3");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const Json pred = read_json_file(dir + "/pred/predictions.json");
  ASSERT_EQ(pred.size(), 8u);
  int64_t boxes = 0;
  for (const auto& e : pred.items()) {
    boxes += static_cast<int64_t>(e.find("detections")->size());
    EXPECT_TRUE(std::filesystem::exists(dir + "/pred/" + std::filesystem::path(e.find("image")->as_string()).stem().string() + ".jpg"));
  }
  EXPECT_GE(boxes, 8);  // every image holds at least one object the model learned

  // The device policy: CUDA asked for where there is none stops with exit code 2 and the reason.
  if (!query_cuda().available) {
    v = test::run_trainer("val --config " + dir + "/run.yaml --weights " + r.weights + " device=cuda");
    EXPECT_EQ(v.exit_code, 2);
    EXPECT_NE(v.output.find("CUDA is not usable"), std::string::npos) << v.output;
  }

  // A damaged weights file is refused with its name; the original is untouched.
  const std::string bytes = test::read_bytes(r.weights);
  test::write_bytes(dir + "/cut.pt", bytes.substr(0, bytes.size() / 2));
  v = test::run_trainer("val --config " + dir + "/run.yaml --weights " + dir + "/cut.pt");
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_NE(v.output.find("cut.pt: not a Headroom weights file, or truncated"), std::string::npos) << v.output;
}

TEST(Weights, RoundTripKeepsTheOutputs) {
  const Config c = load_config("", {"model.file=" + std::string(HEADROOM_SOURCE_DIR) + "/models/yolov8n.yaml"});
  models::Detector a = interop::run_model(c, 3);
  a->forward(at::rand({2, 3, 64, 64}));  // BatchNorm statistics away from their init
  a->eval();
  const std::string path = test::temp_dir("weights") + "/w.pt";
  models::save_weights(*a, models::WeightsInfo{{"a", "b", "c"}, {}}, path);
  models::LoadedWeights b = models::load_weights(path, c10::Device(c10::kCPU));
  b.model->eval();
  EXPECT_EQ(b.info.names, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(b.model->parameter_count(), a->parameter_count());
  EXPECT_EQ(b.model->scale(), "n");
  at::NoGradGuard no_grad;
  const at::Tensor x = at::rand({1, 3, 64, 64});
  EXPECT_TRUE(at::equal(a->forward(x).at("pred")[1], b.model->forward(x).at("pred")[1]));
  EXPECT_THROW(models::load_weights(path + ".missing", c10::Device(c10::kCPU)), InputError);
  test::write_bytes(path + ".txt", "not weights");
  EXPECT_THROW(models::load_weights(path + ".txt", c10::Device(c10::kCPU)), InputError);
}
