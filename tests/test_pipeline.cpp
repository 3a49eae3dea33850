// TF OD API pipeline.config files: the TF user's own (../shared/fixtures, copied to
// tests/fixtures/tfod) mapped onto Headroom's keys, refused fields named with their lines, the
// converted YAML meaning the same, and the pipeline trained on a converted synthetic set.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/data/dataset.h"
#include "headroom/data/pipeline_data.h"
#include "headroom/interop/pipeline_config.h"
#include "headroom/data/convert.h"
#include "headroom/data/synth.h"
#include "headroom/train/schedule.h"
#include "headroom/train/trainer.h"
#include "test_util.h"

using namespace headroom;
namespace fs = std::filesystem;

namespace {

std::string users_pipeline() { return test::read_bytes(std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/tfod/pipeline.config"); }

// The user's pipeline with some of its text replaced, in a folder of its own.
std::string pipeline_with(const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text = users_pipeline();
  for (const auto& [from, to] : edits) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  const std::string path = test::temp_dir(name) + "/pipeline.config";
  test::write_bytes(path, text);
  return path;
}

const std::pair<std::string, std::string> kNoCheckpoint = {
    "  fine_tune_checkpoint: \"pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/ckpt-0\"\n", ""};


}  // namespace

// The user's pipeline means what configs/centernet_hg104.yaml (its hand translation) says, key
// for key: model, input size, batch, steps, Adam with TF's epsilon, the manual steps, no moving
// average, the seven augmentations with their values, the loss weights.
TEST(Pipeline, TheUsersPipelineMeansTheHandTranslatedConfig) {
  const std::string path = pipeline_with("pipeline-map", {kNoCheckpoint});
  ASSERT_TRUE(data::is_pipeline_config(path));
  EXPECT_FALSE(data::is_pipeline_config(std::string(HEADROOM_SOURCE_DIR) + "/configs/centernet_hg104.yaml"));
  // A Headroom YAML may open with a flow map; a pipeline's model holds a message.
  const std::string dir = fs::path(path).parent_path().string();
  test::write_bytes(dir + "/flow.yaml", "# mine\nmodel: {file: mine.yaml}\n");
  EXPECT_FALSE(data::is_pipeline_config(dir + "/flow.yaml"));
  test::write_bytes(dir + "/colon.config", "# theirs\nmodel: {\n  center_net: {\n    num_classes: 1\n  }\n}\n");
  EXPECT_TRUE(data::is_pipeline_config(dir + "/colon.config"));
  // Saved by a Windows editor, with a UTF-8 byte-order mark: the same pipeline.
  test::write_bytes(dir + "/bom.config", "\xEF\xBB\xBF" + test::read_bytes(path));
  ASSERT_TRUE(data::is_pipeline_config(dir + "/bom.config"));
  const Json with_bom = config_to_json(interop::load_config_file(dir + "/bom.config")), plain = config_to_json(interop::load_config_file(path));
  for (const char* section : {"model", "train", "augment", "loss"})
    EXPECT_EQ(with_bom.find(section)->dump(), plain.find(section)->dump()) << section;
  const Config p = interop::load_config_file(path);
  const Config hand = interop::load_config_file(std::string(HEADROOM_SOURCE_DIR) + "/configs/centernet_hg104.yaml", {"data.dataset=" + path});
  const Json jp = config_to_json(p), jh = config_to_json(hand);
  EXPECT_EQ(jp.find("augment")->dump(), jh.find("augment")->dump());
  for (const char* key : {"batch", "nominal_batch", "steps", "optimizer", "lr0", "schedule", "lr_steps", "lr_values",
                          "weight_decay", "warmup_epochs", "ema", "momentum", "eps"})
    EXPECT_EQ(jp.find("train")->find(key)->dump(), jh.find("train")->find(key)->dump()) << key;
  for (const char* key : {"task_loss_weight", "scale_loss_weight", "offset_loss_weight"})
    EXPECT_EQ(jp.find("loss")->find(key)->dump(), jh.find("loss")->find(key)->dump()) << key;
  EXPECT_EQ(p.model.file, hand.model.file);
  EXPECT_EQ(jp.find("model")->dump(), jh.find("model")->dump());  // the input normalisation too
  EXPECT_EQ(p.data.imgsz, hand.data.imgsz);
  EXPECT_DOUBLE_EQ(p.train.eps, 1e-7);
  EXPECT_DOUBLE_EQ(p.loss.min_overlap, 0.6);
  EXPECT_EQ(p.eval.max_det, 50);
  EXPECT_EQ(p.data.dataset, fs::absolute(path).string());
  // A field written twice takes the last value, as TF's text_format.Merge reads the file.
  EXPECT_EQ(interop::load_config_file(pipeline_with("pipeline-twice", {kNoCheckpoint, {"  batch_size: 2\n", "  batch_size: 2\n  batch_size: 4\n"}}))
                .train.batch, 4);
  // Paths are the pipeline folder's where the working directory holds nothing of theirs.
  const interop::PipelineConfig pc = interop::read_pipeline_config(path);
  EXPECT_EQ(pc.data.train, std::vector<std::string>{fs::path(path).parent_path().string() + "/annotations/train.record"});
  EXPECT_EQ(pc.data.val, std::vector<std::string>{fs::path(path).parent_path().string() + "/annotations/test.record"});
  EXPECT_EQ(pc.data.label_map, fs::path(path).parent_path().string() + "/annotations/label_map.pbtxt");
  // Fields read without an effect are said, with their lines.
  std::string notes;
  for (const auto& n : pc.notes) notes += n + "\n";
  bool means = false;
  for (const auto& setting : pc.settings)
    means = means || (setting.key == "model.input_mean" && setting.where.find("pipeline.config:6") != std::string::npos);
  EXPECT_TRUE(means);
  EXPECT_NE(notes.find("max_number_of_boxes"), std::string::npos) << notes;
  // use_display_name is read: class/text is matched against name and display_name alike.
  const std::string shown = pipeline_with("pipeline-display", {kNoCheckpoint, {"  label_map_path:", "  use_display_name: true\n  label_map_path:"}});
  std::string shown_notes;
  for (const auto& n : interop::read_pipeline_config(shown).notes) shown_notes += n + "\n";
  EXPECT_NE(shown_notes.find("use_display_name: Headroom matches"), std::string::npos) << shown_notes;
}

// Everything Headroom cannot run is listed at once, each with its line and what to do.
TEST(Pipeline, FieldsHeadroomCannotRunAreListedWithTheirLines) {
  // fine_tune_checkpoint: the checkpoint, beside the pipeline; "detection" restores CenterNet's
  // feature extractor, "full" everything, as TF does.
  const std::string as_is = pipeline_with("pipeline-as-is", {});
  const Config tf = interop::load_config_file(as_is);
  EXPECT_EQ(tf.model.init_from,
            fs::path(as_is).parent_path().string() + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/ckpt-0");
  EXPECT_TRUE(tf.model.init_backbone_only);
  EXPECT_FALSE(interop::load_config_file(pipeline_with("pipeline-full", {{"fine_tune_checkpoint_type: \"detection\"", "fine_tune_checkpoint_type: \"full\""}}))
                   .model.init_backbone_only);
  std::string e = test::input_error_of([&] {
    interop::load_config_file(pipeline_with("pipeline-v1", {{"fine_tune_checkpoint_version: V2", "fine_tune_checkpoint_version: V1"},
                                              {"fine_tune_checkpoint_type: \"detection\"", "fine_tune_checkpoint_type: \"classification\""}}));
  });
  EXPECT_NE(e.find("fine_tune_checkpoint_type 'classification': CenterNet restores 'detection'"), std::string::npos) << e;
  EXPECT_NE(e.find("fine_tune_checkpoint_version V1"), std::string::npos) << e;
  // 2020 configs' 'fine_tune' is TF's 'detection' now: the refusal says so.
  e = test::input_error_of([&] {
    interop::load_config_file(pipeline_with("pipeline-fine-tune", {{"fine_tune_checkpoint_type: \"detection\"", "fine_tune_checkpoint_type: \"fine_tune\""}}));
  });
  EXPECT_NE(e.find("'fine_tune' is what TF now calls 'detection'"), std::string::npos) << e;
  EXPECT_NE(e.find("pipeline.config:"), std::string::npos) << e;
  // An Ultralytics .pt there brings its YOLO (model.init_from's rule): a center_net pipeline refuses it.
  const std::string yolo = std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/interop/ul_yolo11t.pt";
  const std::string with_yolo = pipeline_with("pipeline-yolo-ckpt", {{"pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/ckpt-0", yolo}});
  e = test::input_error_of([&] { interop::load_config_file(with_yolo); });
  EXPECT_NE(e.find(with_yolo + ":100: fine_tune_checkpoint " + yolo + " holds a YOLO ("), std::string::npos) << e;
  EXPECT_NE(e.find("model.init_from=" + yolo), std::string::npos) << e;

  const std::string edited = pipeline_with(
      "pipeline-refused", {kNoCheckpoint,
                           {"min_box_overlap_iou: 0.6", "min_box_overlap_iuo: 0.6"},
                           {"type: \"hourglass_104\"", "type: \"resnet_v2_101\""},
                           {"random_adjust_hue {\n    }", "ssd_random_crop {\n    }"},
                           {"    input_path: \"annotations/test.record\"\n  }\n}", "    input_path: \"annotations/test.record\"\n  }\n}\n"
                                                                                    "graph_rewriter {\n  quantization {\n    delay: 48000\n  }\n}\n"},
                           {"metrics_set: \"coco_detection_metrics\"", "metrics_set: \"pascal_voc_detection_metrics\""}});
  e = test::input_error_of([&] { interop::load_config_file(edited); });
  EXPECT_NE(e.find("5 fields of this pipeline.config Headroom cannot run"), std::string::npos) << e;
  EXPECT_NE(e.find(":38:26: min_box_overlap_iuo is not read by Headroom; did you mean 'min_box_overlap_iou'?\n"), std::string::npos) << e;
  EXPECT_NE(e.find(":5: feature_extractor type 'resnet_v2_101' is not built by Headroom"), std::string::npos) << e;
  EXPECT_NE(e.find("ssd_random_crop is not read by Headroom; the augmentation options Headroom runs are random_horizontal_flip"),
            std::string::npos) << e;
  EXPECT_NE(e.find(":125:16: graph_rewriter is not read by Headroom: quantisation-aware training is not built"), std::string::npos) << e;
  EXPECT_NE(e.find("metrics_set 'pascal_voc_detection_metrics'"), std::string::npos) << e;

  const std::string broken = pipeline_with("pipeline-syntax", {{"batch_size: 2", "batch_size: two"}});
  e = test::input_error_of([&] { interop::load_config_file(broken); });
  EXPECT_NE(e.find("pipeline.config:44:"), std::string::npos) << e;
}

// The OD API's schedules and optimizers, each in place of the user's: the rates Headroom's
// trainer applies at each step are the OD API's (learning_schedules.py; the expected rates are
// its own tests' cases), and the optimizer and moving average keys are theirs.
TEST(Pipeline, TheOdApisSchedulesAndOptimizersRunAsTfRunsThem) {
  const std::string manual_block = users_pipeline().substr(users_pipeline().find("        manual_step_learning_rate {"),
                                                          users_pipeline().find("      epsilon:") - users_pipeline().find("        manual_step_learning_rate {"));
  struct Case {
    std::string name, rate;  // the learning_rate block's contents
    std::vector<int64_t> steps;
    std::vector<double> expected;
  };
  const std::vector<Case> cases = {
      {"cosine", "cosine_decay_learning_rate {\n learning_rate_base: 1.0\n total_steps: 100\n warmup_learning_rate: 0.1\n warmup_steps: 9\n }\n }\n",
       {0, 4, 8, 9, 100, 4999}, {0.1, 0.5, 0.9, 1.0, 0.0, 0.0}},
      {"cosine-hold", "cosine_decay_learning_rate {\n learning_rate_base: 1.0\n total_steps: 120\n warmup_learning_rate: 0.1\n warmup_steps: 9\n hold_base_rate_steps: 20\n }\n }\n",
       {0, 4, 8, 9, 10, 29, 30, 50, 70, 120}, {0.1, 0.5, 0.9, 1.0, 1.0, 1.0, 0.999702, 0.874255, 0.577365, 0.0}},
      // Warmup to total_steps (TF's rate at total_steps itself is 0 / 0, NaN; left out), and a hold
      // past total_steps: TF's rate is 0 after total_steps whatever the phase.
      {"cosine-all-warmup", "cosine_decay_learning_rate {\n learning_rate_base: 1.0\n total_steps: 10\n warmup_learning_rate: 0.1\n warmup_steps: 10\n }\n }\n",
       {0, 5, 9, 11}, {0.1, 0.55, 0.91, 0.0}},
      {"cosine-long-hold", "cosine_decay_learning_rate {\n learning_rate_base: 1.0\n total_steps: 20\n warmup_learning_rate: 0.1\n warmup_steps: 10\n hold_base_rate_steps: 15\n }\n }\n",
       {0, 5, 9, 10, 19, 20, 21, 100}, {0.1, 0.55, 0.91, 1.0, 1.0, 1.0, 0.0, 0.0}},
      {"exponential", "exponential_decay_learning_rate {\n initial_learning_rate: 1.0\n decay_steps: 3\n decay_factor: 0.1\n burnin_learning_rate: 0.5\n burnin_steps: 2\n min_learning_rate: 0.05\n }\n }\n",
       {0, 1, 2, 3, 4, 5, 6, 7, 8}, {.5, .5, 1, 1, 1, .1, .1, .1, .05}},
      {"exponential-smooth", "exponential_decay_learning_rate {\n initial_learning_rate: 1.0\n decay_steps: 2\n decay_factor: 0.25\n staircase: false\n }\n }\n",
       {0, 1, 2}, {1.0, 0.5, 0.25}},
      {"manual-warmup", "manual_step_learning_rate {\n initial_learning_rate: 0.02\n schedule { step: 4 learning_rate: 0.1 }\n schedule { step: 6 learning_rate: 0.01 }\n schedule { step: 8 learning_rate: 0.001 }\n warmup: true\n }\n }\n",
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {.02, .04, .06, .08, .10, .10, .01, .01, .001, .001}},
      {"constant", "constant_learning_rate {\n learning_rate: 0.003\n }\n }\n", {0, 2500, 4999}, {0.003, 0.003, 0.003}},
  };
  for (const Case& k : cases) {
    const Config c = interop::load_config_file(pipeline_with("pipeline-lr-" + k.name, {kNoCheckpoint, {manual_block, k.rate}}));
    const train::Schedule schedule(train::trainer_options(c, c10::Device(c10::kCPU)).schedule().total_steps(c.train.steps));
    for (size_t i = 0; i < k.steps.size(); ++i) {
      EXPECT_NEAR(schedule.rates(k.steps[i], false).lr, k.expected[i], 1e-6) << k.name << " step " << k.steps[i];
      EXPECT_NEAR(schedule.rates(k.steps[i], true).lr, k.expected[i], 1e-6) << k.name << " step " << k.steps[i];  // biases alike
    }
  }
  // momentum_optimizer is SGD with TF's momentum, without Nesterov or weight decay; the moving
  // average, bfloat16 and gradient clipping come along.
  const Config sgd = interop::load_config_file(pipeline_with(
      "pipeline-sgd", {kNoCheckpoint,
                       {"adam_optimizer {", "momentum_optimizer {\n momentum_optimizer_value: 0.8"},
                       {"      epsilon: 1.0000000116860974e-07\n", ""},
                       {"use_moving_average: false", "use_moving_average: true\n    moving_average_decay: 0.999"},
                       {"  num_steps: 5000\n", "  num_steps: 5000\n  use_bfloat16: true\n  gradient_clipping_by_norm: 5.0\n"}}));
  EXPECT_EQ(sgd.train.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(sgd.train.momentum, 0.8);  // the float written in its shortest form
  EXPECT_FALSE(sgd.train.nesterov);
  EXPECT_DOUBLE_EQ(sgd.train.weight_decay, 0.0);
  EXPECT_TRUE(sgd.train.ema);
  EXPECT_DOUBLE_EQ(sgd.train.ema_decay, 0.999);
  EXPECT_EQ(sgd.train.ema_ramp, "tf");  // TF's ExponentialMovingAverage ramps up as (1 + t) / (10 + t)
  EXPECT_EQ(sgd.train.amp, "bf16");
  EXPECT_DOUBLE_EQ(sgd.train.clip_grad, 5.0);
  // The optimizer keeps an average that eval does not use: noted with eval's line, or with the
  // optimizer's where eval's is TF's default, false (the user's pipeline, without an average,
  // agrees with it).
  const auto average_notes = [](const std::string& path) {
    std::vector<std::string> found;
    for (const std::string& n : interop::read_pipeline_config(path).notes)
      if (n.find("use_moving_averages") != std::string::npos) found.push_back(n);
    return found;
  };
  const std::string why = " and the optimizer's use_moving_average true: Headroom validates the moving average exactly when it keeps one";
  const std::string written = pipeline_with("pipeline-average", {kNoCheckpoint, {"use_moving_average: false", "use_moving_average: true"}});
  const std::string by_default = pipeline_with("pipeline-average-default", {kNoCheckpoint, {"use_moving_average: false", "use_moving_average: true"},
                                                                           {"  use_moving_averages: false\n", ""}});
  EXPECT_EQ(average_notes(written), std::vector<std::string>{written + ":114: use_moving_averages false" + why});
  const std::vector<std::string> defaulted = average_notes(by_default);
  ASSERT_EQ(defaulted.size(), 1u);
  EXPECT_NE(defaulted[0].find(": use_moving_averages false (TF's default)" + why), std::string::npos) << defaulted[0];
  EXPECT_EQ(defaulted[0].find(by_default + ":114:"), std::string::npos) << defaulted[0];  // the optimizer's line
  EXPECT_TRUE(average_notes(pipeline_with("pipeline-plain", {kNoCheckpoint})).empty());
  // TF's own refusals, with their lines.
  const std::string e = test::input_error_of([&] {
    interop::load_config_file(pipeline_with("pipeline-lr-bad", {kNoCheckpoint, {manual_block, "cosine_decay_learning_rate {\n learning_rate_base: 0.1\n total_steps: 10\n warmup_learning_rate: 0.5\n warmup_steps: 11\n }\n }\n"}}));
  });
  EXPECT_NE(e.find("total_steps 10 is less than warmup_steps 11"), std::string::npos) << e;
  EXPECT_NE(e.find("warmup_learning_rate exceeds learning_rate_base"), std::string::npos) << e;
  // The focal loss's exponents: one left out (0 in the OD API), or another value, is refused.
  for (const char* focal : {"          beta: 4.0\n", "          alpha: 2.0\n          beta: 3.0\n"}) {
    const std::string f = test::input_error_of([&] {
      interop::load_config_file(pipeline_with("pipeline-focal", {kNoCheckpoint, {"          alpha: 2.0\n          beta: 4.0\n", focal}}));
    });
    EXPECT_NE(f.find("set alpha: 2.0 and beta: 4.0"), std::string::npos) << focal << f;
  }
}

// More fields Headroom cannot run as TF would, each refused alone with its line and what to
// change: the resizer's two sides, a training split left in order, a first manual step at 0,
// training forever, a second eval reader.
TEST(Pipeline, FieldsHeadroomCannotRunAsTfAreRefusedWithTheirLine) {
  struct Case {
    std::pair<std::string, std::string> edit;
    std::string line, says;
  };
  const std::vector<Case> cases = {
      {{"        min_dimension: 512\n", "        min_dimension: 384\n"}, ":16:", "min_dimension 384 and max_dimension 512"},
      {{"train_input_reader {\n", "train_input_reader {\n  shuffle: false\n"}, ":107:", "shuffle false for training"},
      {{"            step: 1000\n", "            step: 0\n"}, ":86:", "the first schedule step cannot be 0"},
      {{"  num_steps: 5000\n", "  num_steps: 0\n"}, ":100:", "num_steps 0 means training forever in TF"},
      {{"eval_input_reader {\n", "eval_input_reader {\n  label_map_path: \"x.pbtxt\"\n}\neval_input_reader {\n"}, ":120:",
       "keep one eval_input_reader"},
  };
  for (const Case& k : cases) {
    const std::string path = pipeline_with("pipeline-refused", {kNoCheckpoint, k.edit});
    const std::string e = test::input_error_of([&] { interop::load_config_file(path); });
    EXPECT_NE(e.find(k.says), std::string::npos) << k.says << "\n" << e;
    EXPECT_NE(e.find(path + k.line), std::string::npos) << k.says << "\n" << e;
  }
}

// rms_prop_optimizer as TF2's OD API runs it (tf.keras' legacy RMSprop, its `decay` an inverse-time
// decay of the rate): the parameter trajectories are TensorFlow's own, computed by
// scripts/make_tf_optimizer_reference.py through the OD API's optimizer_builder; the pipeline goes
// through Headroom's mapping, schedule and optimizer as a run does.
TEST(Pipeline, TheOdApisRmsPropRunsAsTfRunsIt) {
  struct Case {
    std::string name, optimizer;  // what replaces the user's adam_optimizer block
    std::vector<std::vector<float>> grads, expected;
  };
  const std::vector<float> start = {1.0f, -2.0f, 0.5f, 3.0f};
  const std::vector<std::vector<float>> grads = {{0.5f, -1.0f, 2.0f, 0.01f}, {0.4f, 1.0f, -2.0f, 0.02f},  {-0.3f, -1.0f, 1.5f, 0.0f},
                                                 {0.2f, 0.5f, -1.0f, 0.03f}, {0.1f, -0.5f, 0.5f, -0.04f}, {-0.1f, 0.25f, 0.0f, 0.05f}};
  const std::vector<Case> cases = {
      // ApplyRMSProp (momentum): eps inside the root; decay 0.9 divides the rate by 1 + 0.9 step.
      {"momentum",
       "rms_prop_optimizer {\n learning_rate { manual_step_learning_rate { initial_learning_rate: 0.1\n"
       " schedule { step: 3 learning_rate: 0.01 } } }\n momentum_optimizer_value: 0.9 decay: 0.9 epsilon: 1.0 }\n",
       grads,
       {{0.950613499f, -1.90465379f, 0.330969155f, 2.99900007f},
        {0.885506988f, -1.86708939f, 0.258186489f, 2.99704742f},
        {0.837398946f, -1.8016026f, 0.153909013f, 2.99529004f},
        {0.793572485f, -1.74386418f, 0.0620107576f, 2.99362731f},
        {0.753915489f, -1.69093394f, -0.0214965343f, 2.99221778f},
        {0.718402743f, -1.64370382f, -0.0966530964f, 2.99085832f}}},
      // Without momentum, Keras' own update: eps outside the root.
      {"plain",
       "rms_prop_optimizer {\n learning_rate { constant_learning_rate { learning_rate: 0.05 } }\n"
       " momentum_optimizer_value: 0.0 decay: 0.0 epsilon: 0.1 }\n",
       {grads.begin(), grads.begin() + 4},
       {{0.903143525f, -1.87987351f, 0.363472939f, 2.99515319f},
        {0.835624814f, -1.97317624f, 0.466376901f, 2.98580742f},
        {0.884180129f, -1.89260602f, 0.395179868f, 2.98580742f},
        {0.851717949f, -1.93302274f, 0.442431003f, 2.97234106f}}},
  };
  const std::string adam_block = users_pipeline().substr(users_pipeline().find("adam_optimizer {"),
                                                         users_pipeline().find("    use_moving_average") - users_pipeline().find("adam_optimizer {"));
  for (const Case& k : cases) {
    const Config c = interop::load_config_file(pipeline_with("pipeline-rms-" + k.name, {kNoCheckpoint, {adam_block, k.optimizer}}));
    ASSERT_EQ(c.train.optimizer, "rmsprop");
    train::TrainerOptions o = train::trainer_options(c, c10::Device(c10::kCPU));
    const train::Schedule schedule(o.schedule().total_steps(c.train.steps));
    at::Tensor p = at::tensor(start).requires_grad_(true);
    train::Optimizer optimizer({{"weights", {p}, 0, 0, c.train.weight_decay, false}}, o.optimizer());
    for (size_t step = 0; step < k.grads.size(); ++step) {
      schedule.apply(optimizer, int64_t(step));
      p.mutable_grad() = at::tensor(k.grads[step]);
      optimizer.step();
      for (size_t i = 0; i < start.size(); ++i)
        EXPECT_NEAR(p[int64_t(i)].item<float>(), k.expected[step][i], 2e-6 * std::max(1.0f, std::abs(k.expected[step][i])))
            << k.name << " step " << step << " element " << i;
    }
  }
}

// TF opens a relative path against the working directory: the tutorial's layout runs
// model_main_tf2.py from the project folder with its pipeline in models/m/. Where nothing is
// there, the pipeline's folder is tried (a pipeline kept beside its data).
TEST(Pipeline, RelativePathsAreTfsFromTheWorkingDirectory) {
  const std::string project = test::temp_dir("pipeline-cwd");
  fs::create_directories(project + "/models/m");
  fs::create_directories(project + "/annotations");
  test::write_bytes(project + "/models/m/pipeline.config", users_pipeline());
  test::write_bytes(project + "/annotations/label_map.pbtxt", "item { id: 1 name: \"thing\" }\n");
  for (const char* f : {"train.record", "test.record"}) test::write_bytes(project + "/annotations/" + f, "");
  fs::create_directories(project + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint");
  test::write_bytes(project + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/ckpt-0.index", "");
  struct Cwd {  // the working directory back however the test ends: later tests of this binary need it
    fs::path before = fs::current_path();
    ~Cwd() { fs::current_path(before); }
  } cwd;
  fs::current_path(project);
  const data::DataSpec from_project = data::read_data_yaml("models/m/pipeline.config");
  const Config c = interop::load_config_file("models/m/pipeline.config");
  test::write_bytes(project + "/beside.config", users_pipeline());  // beside annotations/, run from models/
  fs::current_path(project + "/models");
  const data::DataSpec beside = data::read_data_yaml(project + "/beside.config");
  fs::current_path(cwd.before);
  ASSERT_EQ(from_project.splits.size(), 2u);
  EXPECT_EQ(from_project.splits[0].second.images, std::vector<std::string>{project + "/annotations/train.record"});
  EXPECT_EQ(from_project.splits[1].second.images, std::vector<std::string>{project + "/annotations/test.record"});
  EXPECT_EQ(from_project.label_map, project + "/annotations/label_map.pbtxt");
  EXPECT_EQ(c.model.init_from, project + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/ckpt-0");
  EXPECT_EQ(beside.splits[0].second.images, std::vector<std::string>{project + "/annotations/train.record"});
  EXPECT_EQ(beside.label_map, project + "/annotations/label_map.pbtxt");
  // TF's gfile reads gs://; Headroom says so at the line rather than look for a local "gs:" folder.
  std::string remote = users_pipeline();
  remote.replace(remote.find("annotations/train.record"), 24, "gs://bucket/train.record");
  test::write_bytes(project + "/remote.config", remote);
  const std::string e = test::input_error_of([&] { data::read_data_yaml(project + "/remote.config"); });
  EXPECT_NE(e.find(project + "/remote.config:110: gs://bucket/train.record is on a remote file system; Headroom reads local files"),
            std::string::npos) << e;
  std::string remote_map = users_pipeline();  // both readers name it: one problem each, nothing else
  for (size_t at = remote_map.find("annotations/label_map.pbtxt"); at != std::string::npos; at = remote_map.find("annotations/label_map.pbtxt"))
    remote_map.replace(at, 27, "gs://b/label_map.pbtxt");
  test::write_bytes(project + "/remote-map.config", remote_map);
  const std::string m = test::input_error_of([&] { data::read_data_yaml(project + "/remote-map.config"); });
  EXPECT_NE(m.find("gs://b/label_map.pbtxt is on a remote file system"), std::string::npos) << m;
  EXPECT_EQ(m.find("no label_map_path"), std::string::npos) << m;
  // file:// is gfile's local scheme.
  std::string local = users_pipeline();
  local.replace(local.find("annotations/train.record"), 24, "file://" + project + "/annotations/train.record");
  test::write_bytes(project + "/local.config", local);
  EXPECT_EQ(data::read_data_yaml(project + "/local.config").splits[0].second.images, std::vector<std::string>{project + "/annotations/train.record"});
}

// `config convert` writes YAML that loads to the same configuration as the pipeline itself.
TEST(Pipeline, ConfigConvertWritesTheConfigItMeans) {
  const std::string path = pipeline_with("pipeline-convert", {kNoCheckpoint});
  const std::string yaml = fs::path(path).parent_path().string() + "/run.yaml";
  test::RunResult r = test::run_trainer("config convert " + path + " -o " + yaml);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = test::read_bytes(yaml);
  EXPECT_NE(text.find("lr_steps: [1000, 5000]  # manual_step_learning_rate schedule step (" + path + ":"), std::string::npos) << text;
  EXPECT_EQ(config_to_json(interop::load_config_file(yaml)).dump(), config_to_json(interop::load_config_file(path)).dump());
  // Onto the pipeline itself, through a link too: refused, the pipeline as it was.
  const std::string before = test::read_bytes(path), link = fs::path(path).parent_path().string() + "/link.config";
  fs::create_symlink(path, link);
  r = test::run_trainer("config convert " + path + " -o " + link);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is the pipeline.config itself"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_bytes(path), before);
  r = test::run_trainer("config convert " + path + ".missing");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(path + ".missing: not found"), std::string::npos) << r.output;
}

// The user's pipeline, pointed at a one-class synthetic set converted to TFRecords, at 64 px and
// 2 steps, fine-tuning from a TF2 checkpoint, trains and validates as `trainer --config` is given it.
TEST(Pipeline, TheUsersPipelineTrainsOnTfRecordsAndValidates) {
  const std::string dir = test::temp_dir("pipeline-train");
  data::SynthOptions s;
  s.out = dir + "/synth";
  s.images = 16;
  s.size = 64;
  s.classes = 1;
  s.threads = 2;
  data::ConvertOptions c;
  c.from = data::synthesize(s).data_yaml;
  c.to = data::DataFormat::tfrecord;
  c.out = dir + "/annotations";
  data::convert_data(c);
  fs::rename(dir + "/annotations/val.record", dir + "/annotations/test.record");
  std::string text = users_pipeline();
  // fine_tune_checkpoint: a TF2 checkpoint of the OD API's own two-stack CenterNet, relative to the
  // pipeline's folder; type "detection": its feature extractor, the heads keep their initialisation.
  fs::create_directories(dir + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint");
  for (const char* f : {"ckpt-0.index", "ckpt-0.data-00000-of-00001"})
    fs::copy_file(std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/tfod/ckpt/" + f,
                  dir + "/pre-trained-models/centernet_hg104_512x512_coco17_tpu-8/checkpoint/" + f);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"hourglass_104", "hourglass_10"}, {"min_dimension: 512", "min_dimension: 64"},
           {"max_dimension: 512", "max_dimension: 64"}, {"num_steps: 5000", "num_steps: 2"}})
    text.replace(text.find(from), from.size(), to);
  test::write_bytes(dir + "/pipeline.config", text);
  const test::RunResult r = test::run_trainer("--config " + dir + "/pipeline.config device=cpu threads=1 data.workers=1 "
                                              "project=" + dir + "/runs name=p model.file=" + HEADROOM_SOURCE_DIR +
                                              "/models/centernet_hg10.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("AP50-95"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the model is the file's own"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the backbone only; the head's 24 tensors keep their initialisation"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/p/results.csv"));
  EXPECT_TRUE(fs::exists(dir + "/runs/p/weights/last.pt"));

  // num_classes is TF's largest id: more than the map lists is TF's padding (the zoo's COCO map
  // lists 80 of 90 ids) and loads; fewer than its largest id is refused with the pipeline's line,
  // before anything is written.
  text.replace(text.find("num_classes: 1"), 14, "num_classes: 2");
  test::write_bytes(dir + "/two.config", text);
  EXPECT_EQ(data::read_data_yaml(dir + "/two.config").splits.size(), 2u);
  test::write_bytes(dir + "/annotations/gap.pbtxt", "item { id: 1 name: \"a\" }\nitem { id: 3 name: \"c\" }\n");
  std::string gap = text;
  for (size_t at = gap.find("annotations/label_map.pbtxt"); at != std::string::npos; at = gap.find("annotations/label_map.pbtxt"))
    gap.replace(at, 27, "annotations/gap.pbtxt");
  test::write_bytes(dir + "/gap.config", gap);
  const test::RunResult two = test::run_trainer("--config " + dir + "/gap.config device=cpu threads=1 project=" + dir + "/runs name=two");
  EXPECT_EQ(two.exit_code, 2) << two.output;
  EXPECT_NE(two.output.find(dir + "/gap.config:3: num_classes 2 but the label map " + dir + "/annotations/gap.pbtxt has id 3 (" + dir +
                            "/annotations/gap.pbtxt:2); TF's num_classes is the largest id: make it at least 3"),
            std::string::npos) << two.output;
  EXPECT_FALSE(fs::exists(dir + "/runs/two"));
  text.replace(text.find("num_classes: 2"), 14, "num_classes: 0");
  test::write_bytes(dir + "/zero.config", text);
  const test::RunResult zero = test::run_trainer("--config " + dir + "/zero.config device=cpu threads=1 project=" + dir + "/runs name=zero");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find(dir + "/zero.config:3: num_classes 0: give the label map's largest id"), std::string::npos)
      << zero.output;
  EXPECT_FALSE(fs::exists(dir + "/runs/zero"));
}
