// The trainer binary end to end: exit codes, messages, JSON output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <vector>

#include "headroom/core/json.h"
#include "headroom/core/run_dir.h"
#include "headroom/data/letterbox.h"
#include "test_util.h"

using namespace headroom;
namespace fs = std::filesystem;

TEST(Cli, VersionPrintsLibTorchAndCudaAsJson) {
  const test::RunResult r = test::run_trainer("version --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(r.output, "stdout");
  EXPECT_FALSE(j.find("libtorch")->as_string().empty());
  EXPECT_TRUE(j.find("cuda")->find("available")->is_bool());
  EXPECT_TRUE(j.find("cuda")->find("devices")->is_array());
  // The BLAS the matrix products run on: the wheel's MKL, or the libblas.so.3 mapped (OpenBLAS
  // once install-deps ran)
  const std::string blas = j.find("blas")->as_string();
  EXPECT_TRUE(blas.rfind("MKL", 0) == 0 || blas.rfind("OpenBLAS, /", 0) == 0) << blas;
}

TEST(Cli, ConfigPrintsResolvedValuesWithOverrides) {
  const test::RunResult r = test::run_trainer("config train.batch=7 data.workers=4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(r.output, "stdout");
  EXPECT_EQ(j.find("train")->find("batch")->as_number(), 7);
  EXPECT_EQ(j.find("data")->find("workers")->as_number(), 4);
  EXPECT_EQ(j.find("data")->find("imgsz")->as_number(), 640);
}

TEST(Cli, BadConfigExitsWithCode2AndNamesTheLine) {
  const std::string path = test::temp_dir("cli") + "/bad.yaml";
  test::write_bytes(path, "train:\n  bach_size: 8\n");
  const test::RunResult r = test::run_trainer("config --config " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(path + ":2:3: train.bach_size: unknown key; did you mean train.batch?"), std::string::npos) << r.output;
  EXPECT_EQ(test::run_trainer("config train.batch=0").exit_code, 2);
  const test::RunResult folder = test::run_trainer("config --config " + test::temp_dir("cli"));  // a folder, not a file
  EXPECT_EQ(folder.exit_code, 2);
  EXPECT_NE(folder.output.find(": a folder, not the config"), std::string::npos) << folder.output;
  EXPECT_EQ(test::run_trainer("no-such-command").exit_code, 2);
  const test::RunResult typo = test::run_trainer("trian --config " + path);
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("unknown command 'trian'; did you mean train?"), std::string::npos) << typo.output;
  EXPECT_EQ(test::run_trainer("--help").exit_code, 0);
}

TEST(Cli, DataSynthThenCheck) {
  const std::string out = test::temp_dir("cli-synth") + "/set";
  test::RunResult r = test::run_trainer("data synth --out " + out + " --images 10 --size 64 --seed 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(r.output, "stdout");
  EXPECT_EQ(j.find("train_images")->as_number(), 8);
  r = test::run_trainer("data check --data " + out + "/data.yaml --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Json::parse(r.output, "stdout").find("ok")->as_bool());
  r = test::run_trainer("data check --data " + out + "/data_coco.yaml --split val");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[val] 2 images listed, 2 usable"), std::string::npos) << r.output;

  test::write_bytes(out + "/images/train/im000000.jpg", "");
  r = test::run_trainer("data check --data " + out + "/data.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("im000000.jpg: unreadable image: empty file (0 bytes)"), std::string::npos) << r.output;
  EXPECT_EQ(test::run_trainer("data check --data /nonexistent.yaml").exit_code, 2);
}

TEST(Cli, DataSynthRefusesToOverwriteForeignFolders) {
  const std::string out = test::temp_dir("cli-foreign");
  test::write_bytes(out + "/notes.txt", "mine");
  const test::RunResult r = test::run_trainer("data synth --out " + out + " --images 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("refusing to write into it"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_bytes(out + "/notes.txt"), "mine");
}

TEST(Cli, ModelPrintsTheLayerTableAndCounts) {
  const std::string models = std::string(HEADROOM_SOURCE_DIR) + "/models/";
  test::RunResult r = test::run_trainer("model --model " + models + "yolov8s.yaml --nc 80 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(r.output, "stdout");
  EXPECT_EQ(j.find("parameters")->as_number(), 11166560);
  EXPECT_EQ(j.find("scale")->as_string(), "s");
  EXPECT_NEAR(j.find("gflops")->as_number(), 28.8, 0.05);
  EXPECT_EQ(j.find("layers")->size(), 23u);
  r = test::run_trainer("model --model " + models + "yolov8.yaml --scale n --imgsz 320");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("C2f"), std::string::npos);
  EXPECT_NE(r.output.find("3157200 parameters"), std::string::npos) << r.output;
  EXPECT_EQ(test::run_trainer("model --model " + models + "yolov8n.yaml --imgsz 100").exit_code, 2);
  const std::string bad = test::temp_dir("cli-model") + "/bad.yaml";
  test::write_bytes(bad, "nc: 2\nbackbone:\n  - [-1, 1, Cnv, [8]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  r = test::run_trainer("model --model " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bad.yaml:3:5: row 0"), std::string::npos) << r.output;
}

TEST(Cli, DataPreviewDrawsAugmentedBatches) {
  const std::string dir = test::temp_dir("cli-preview");
  const std::string cfg = dir + "/aug.yaml";
  test::write_bytes(cfg, "device: cpu\ndata: {dataset: " + test::small_synth() + ", imgsz: 64, workers: 1}\n"
                         "train: {batch: 8}\naugment: {mosaic: 1.0, fliplr: 0.5, scale: 0.3, hsv_v: 0.4}\n");
  test::RunResult r = test::run_trainer("data preview --config " + cfg + " --out " + dir + "/p.png --batches 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json j = Json::parse(r.output, "stdout");
  ASSERT_EQ(j.find("files")->size(), 2u);
  EXPECT_TRUE(fs::file_size(dir + "/p_1.png") > 1000);
  EXPECT_TRUE(fs::file_size(dir + "/p_2.png") > 1000);
  EXPECT_EQ(j.find("images")->as_number(), 16);
  EXPECT_TRUE(j.find("augment")->as_bool());
  EXPECT_GT(j.find("boxes_after")->as_number(), j.find("boxes_before")->as_number());  // mosaics gather boxes
  EXPECT_TRUE(j.find("mosaic")->as_bool());
  // close_mosaic counts back from the run's last epoch, train.steps included: 8 steps of the 26
  // images in batches of 8 (4 a epoch) are 2 epochs, the second (--epoch 1) without mosaics.
  for (const auto& [epoch, mosaic] : std::vector<std::pair<int, bool>>{{0, true}, {1, false}}) {
    r = test::run_trainer("data preview --config " + cfg + " --out " + dir + "/c.png --json --epoch " + std::to_string(epoch) +
                          " train.steps=8 train.nominal_batch=8 augment.close_mosaic=1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Json::parse(r.output, "stdout").find("mosaic")->as_bool(), mosaic) << "epoch " << epoch;
  }
  // --out over an input: the config, the data YAML, a training image, or into an image folder
  // (the next scan would train on the grid). Each was written over; each is refused, untouched.
  const std::string data = test::copy_of_small_synth("cli-preview-data"), data_dir = fs::path(data).parent_path().string();
  const std::string image = (*fs::directory_iterator(data_dir + "/images/train")).path().string();
  const std::string config_text = test::read_bytes(cfg), image_bytes = test::read_bytes(image);
  for (const auto& [out, says] : std::vector<std::pair<std::string, std::string>>{
           {cfg, "is the config"}, {data, "is the data YAML"}, {image, "is the image"}, {data_dir + "/images/train/grid.jpg", "is inside"}}) {
    r = test::run_trainer("data preview --config " + cfg + " data.dataset=" + data + " --out " + out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--out " + out + " " + says), std::string::npos) << r.output;
  }
  EXPECT_EQ(test::read_bytes(cfg), config_text);
  EXPECT_EQ(test::read_bytes(image), image_bytes);
  EXPECT_FALSE(fs::exists(data_dir + "/images/train/grid.jpg"));
  test::write_bytes(cfg, "data: {dataset: " + test::small_synth() + "}\naugment: {random_crop_image: {min_area: 2}}\n");
  r = test::run_trainer("data preview --config " + cfg);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(cfg + ":2:11: augment.random_crop_image: min_area (line 2): value 2 is out of range"), std::string::npos) << r.output;
}

namespace {
std::string tiny_model_args() {
  std::string s;
  for (const auto& o : test::tiny_model("yolov8.yaml")) s += " " + o;
  return s;
}
std::string tiny_run_config(const std::string& dir) {
  const std::string cfg = dir + "/run.yaml";
  test::write_bytes(cfg, "device: cpu\nthreads: 1\ndata: {dataset: " + test::small_synth() +
                             ", imgsz: 64, workers: 1}\ntrain: {batch: 4, nominal_batch: 8, plots: false}\n");
  return cfg;
}
}  // namespace

TEST(Cli, MemoryPrintsTheEstimateTable) {
  const std::string dir = test::temp_dir("cli-memory");
  const std::string cfg = tiny_run_config(dir);
  test::RunResult r = test::run_trainer("memory --config " + cfg + " --budget 1GiB" + tiny_model_args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"parameters", "optimizer state", "EMA", "fp32  (this config)", "amp bf16 + recompute all",
                           "largest batch under 922 MiB", "loss and assigner workspace", "Host resident memory (RSS)",
                           "+ update workspace"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  r = test::run_trainer("memory --config " + cfg + " --budget 0.5 --json" + tiny_model_args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t open = r.output.find('{');  // LibTorch's warnings may precede the document
  ASSERT_NE(open, std::string::npos) << r.output;
  const std::string json = r.output.substr(open, r.output.rfind('}') - open + 1);
  const Json j = Json::parse(json, "stdout");
  EXPECT_EQ(j.find("modes")->size(), 3u);
  EXPECT_GT(j.find("budget")->as_number(), 0);
  // data.cache=ram on the CPU: the decoded training images come off the budget, as in `trainer train`.
  // A CUDA allocator key there is said to do nothing.
  r = test::run_trainer("memory --config " + cfg + " --budget 64MiB --json data.cache=ram memory.expandable_segments=true" +
                        tiny_model_args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("memory: expandable_segments:True are CUDA allocator settings; they do nothing on cpu"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("data.cache=ram: the decoded training images take"), std::string::npos) << r.output;
  const size_t cached = r.output.find('{', r.output.find("the tensors get the other"));
  ASSERT_NE(cached, std::string::npos) << r.output;
  const double left = Json::parse(r.output.substr(cached, r.output.rfind('}') - cached + 1), "stdout").find("budget")->as_number();
  EXPECT_EQ(int64_t(left), (int64_t(64) << 20) - 26 * data::canvas_bytes(64));  // small_synth's 26 training images
  r = test::run_trainer("memory --config " + cfg + " --budget 8apples" + tiny_model_args());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("memory.budget: '8apples' is not a budget"), std::string::npos) << r.output;
}

TEST(Cli, TrainWithAutoBatchRecordsTheBatchItChose) {
  const std::string dir = test::temp_dir("cli-auto-batch");
  const std::string cfg = tiny_run_config(dir);
  const test::RunResult r = test::run_trainer("train --config " + cfg + " train.batch=auto memory.budget=256MiB train.steps=2 "
                                              "train.val_every=0 project=" + dir + "/runs name=a" + tiny_model_args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.batch auto: micro-batch 8 under"), std::string::npos) << r.output;  // capped at nominal_batch
  EXPECT_NE(r.output.find("loader batches of 8 images, each one optimizer step of exactly train.nominal_batch 8"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("memory: budget 256 MiB on cpu"), std::string::npos) << r.output;
  const std::string saved = test::read_bytes(dir + "/runs/a/config.yaml");
  EXPECT_NE(saved.find("batch: 8\n"), std::string::npos) << saved;
}

// A second trainer in a run folder that one is still writing (exist_ok, or --resume of a run
// still going) is refused before it writes anything there.
TEST(Cli, ASecondTrainerInARunFolderIsRefusedAndChangesNothing) {
  const std::string dir = test::temp_dir("cli-run-lock");
  const std::string cfg = tiny_run_config(dir);
  const std::string args = " train.steps=2 train.val_every=0 project=" + dir + "/runs name=a" + tiny_model_args();
  test::RunResult r = test::run_trainer("train --config " + cfg + args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string run = dir + "/runs/a";
  const std::vector<std::string> files = {run + "/config.yaml", run + "/train.log", run + "/weights/last.pt"};
  std::vector<std::string> before;
  for (const auto& f : files) before.push_back(test::read_bytes(f));
  RunDirLock held(run);  // as the first trainer holds it while it runs
  r = test::run_trainer("train --config " + cfg + args + " exist_ok=true train.lr0=0.5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(run + ": another trainer is writing in this run folder (process " + std::to_string(::getpid())),
            std::string::npos) << r.output;
  r = test::run_trainer("train --resume " + run + "/weights/last.pt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("another trainer is writing in this run folder"), std::string::npos) << r.output;
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(test::read_bytes(files[i]), before[i]) << files[i];
}

// val scores the model's class k as the split's class k: the same names in another order would
// score each class as another, and are refused; other names are said, as weights from elsewhere.
TEST(Cli, ValRefusesTheModelsClassesInAnotherOrder) {
  const std::string dir = test::temp_dir("cli-val-classes");
  const std::string cfg = tiny_run_config(dir);
  test::RunResult r = test::run_trainer("train --config " + cfg + " train.steps=1 train.val_every=0 project=" + dir + "/runs name=a" +
                                        tiny_model_args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string weights = dir + "/runs/a/weights/last.pt";
  const std::string data = test::copy_of_small_synth("cli-val-classes-data");
  std::string yaml = test::read_bytes(data);
  const auto rename = [&](const std::string& from, const std::string& to) { yaml.replace(yaml.find(from), from.size(), to); };
  rename("0: circle", "0: @");
  rename("1: square", "1: circle");
  rename("0: @", "0: square");
  test::write_bytes(data, yaml);
  r = test::run_trainer("val --weights " + weights + " data.dataset=" + data + " data.imgsz=64 device=cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the model's classes are [circle, square, triangle, cross], split 'val'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lists the same ones as [square, circle, triangle, cross]: each class would be scored as another"),
            std::string::npos) << r.output;
  rename("0: square", "0: disc");
  test::write_bytes(data, yaml);
  r = test::run_trainer("val --weights " + weights + " data.dataset=" + data + " data.imgsz=64 device=cpu --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the model names its classes [circle, square, triangle, cross], split 'val' [disc, circle, triangle, cross]"),
            std::string::npos) << r.output;
}

namespace {
std::string interop_fixture(const std::string& name) { return std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/interop/" + name; }
}  // namespace

// `yolo train model=x.pt` as Headroom does it: the Ultralytics checkpoint brings its own model,
// the head is re-initialised for the data set's 4 classes; predict and export take it as it is.
TEST(Cli, UltralyticsWeightsTrainPredictAndExport) {
  const std::string dir = test::temp_dir("cli-interop");
  const std::string cfg = tiny_run_config(dir);
  const std::string pt = interop_fixture("ul_yolo11t.pt");
  test::RunResult r = test::run_trainer("train --config " + cfg + " model.init_from=" + pt + " train.steps=2 train.val_every=0 project=" +
                                        dir + "/runs name=ft");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the model is the file's own"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("re-initialised for 4 classes"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/ft/weights/last.pt"));
  // The run directory is made after the parts that can refuse the run: its train.log still holds
  // what they said.
  const std::string log = test::read_bytes(dir + "/runs/ft/train.log");
  EXPECT_NE(log.find("re-initialised for 4 classes"), std::string::npos) << log;
  EXPECT_LT(log.find("re-initialised for 4 classes"), log.find("run directory:")) << log;

  const std::string images = (fs::path(test::small_synth()).parent_path() / "images" / "val").string();
  r = test::run_trainer("predict --weights " + pt + " --source " + images + " --conf 0 --save-dir " + dir + "/pred device=cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("full-scale decoding"), std::string::npos) << r.output;  // eval.preprocess auto: Ultralytics' way

  // val on a 3-class set: the file's own 3 classes and names
  r = test::run_trainer("data synth --out " + dir + "/three --images 8 --size 64 --classes 3 --seed 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_trainer("val --weights " + pt + " data.dataset=" + dir + "/three/data.yaml data.imgsz=64 device=cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"AP50\""), std::string::npos) << r.output;

  r = test::run_trainer("export --weights " + pt + " --out " + dir + "/m.safetensors");  // the format from the name
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/m.safetensors").find("onnx"), std::string::npos);
  EXPECT_NE(test::read_bytes(dir + "/m.safetensors").find("\"dtype\""), std::string::npos);  // a safetensors header
  r = test::run_trainer("export --weights " + pt + " --format onnx --out " + dir + "/m2.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--out " + dir + "/m2.safetensors names a .safetensors file but --format is onnx"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/m2.safetensors"));
  r = test::run_trainer("export --weights " + pt + " --out " + dir + "/m3.safetensors --dynamic");  // accepted, then ignored
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--dynamic is an ONNX option"), std::string::npos) << r.output;
  r = test::run_trainer("export --weights " + pt + " --format safetensors --out " + dir + "/nodir/m.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // the folder is named, not the temporary file, before the import's work
  EXPECT_NE(r.output.find(dir + "/nodir/m.safetensors: cannot create it: its folder " + dir + "/nodir does not exist"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("tensors matched"), std::string::npos) << r.output;
  r = test::run_trainer("export --weights " + dir + "/m.safetensors --format safetensors");  // beside it, same name: refused
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is the input weights file"), std::string::npos) << r.output;
  r = test::run_trainer("export --weights " + dir + "/runs/ft/weights/last.pt --format safetensors");  // Headroom's own: beside it
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/ft/weights/last.safetensors"));
  r = test::run_trainer("export --weights " + dir + "/runs/ft/weights/last.pt --imgsz 64 --dynamic");  // ONNX by default
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(fs::file_size(dir + "/runs/ft/weights/last.onnx"), 100000u);
  r = test::run_trainer("export --weights " + dir + "/runs/ft/weights/last.pt --imgsz 100");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--imgsz 100 must be a positive multiple of 32"), std::string::npos) << r.output;
  r = test::run_trainer("export --weights " + dir + "/runs/ft/weights/last.pt --imgsz 100000");  // not an allocator's error
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("at most 8192"), std::string::npos) << r.output;

  // predict never writes over the images it reads: not into their folder, and images of one name
  // (s1/img.jpg, s2/img.jpg) are drawn as img.jpg and img_2.jpg.
  fs::create_directories(dir + "/same/s1");
  fs::create_directories(dir + "/same/s2");
  const std::string one = images + "/" + fs::directory_iterator(images)->path().filename().string();
  fs::copy_file(one, dir + "/same/s1/img.jpg");
  fs::copy_file(one, dir + "/same/s2/img.jpg");
  const std::string original = test::read_bytes(dir + "/same/s1/img.jpg");
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/same/s1 --save-dir " + dir + "/same/s1 device=cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is the folder of --source"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/same/s1/img.jpg"), original);
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/same --save-dir " + dir + "/drawn device=cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/drawn/img.jpg") && fs::exists(dir + "/drawn/img_2.jpg")) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/same/s1/img.jpg"), original);
  // An earlier predict's folder is written again; a folder of other files is refused, untouched.
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/same --save-dir " + dir + "/drawn device=cpu");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  fs::create_directories(dir + "/mine");
  test::write_bytes(dir + "/mine/img.jpg", "my own picture");
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/same --save-dir " + dir + "/mine device=cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds files of its own"), std::string::npos) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/mine/img.jpg"), "my own picture");
  // A folder inside a folder source: the next run would read the drawn images as input.
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/same --save-dir " + dir + "/same/s1/pred device=cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is inside --source " + dir + "/same, which is read with its subfolders"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/same/s1/pred"));
  // A list naming an image inside the output folder: it is read, not written over.
  fs::copy_file(one, dir + "/drawn/listed.jpg");
  const std::string listed = test::read_bytes(dir + "/drawn/listed.jpg");
  test::write_bytes(dir + "/list.txt", dir + "/drawn/listed.jpg\n" + dir + "/same/s1/img.jpg\n");
  fs::copy_file(one, dir + "/same/s1/listed.jpg");
  test::write_bytes(dir + "/list.txt", test::read_bytes(dir + "/list.txt") + dir + "/same/s1/listed.jpg\n");
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/list.txt --save-dir " + dir + "/drawn device=cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/drawn/listed.jpg"), listed);  // s1/listed.jpg drawn as listed_2.jpg, not over it
  EXPECT_TRUE(fs::exists(dir + "/drawn/listed_2.jpg") && fs::exists(dir + "/drawn/listed_3.jpg")) << r.output;
  r = test::run_trainer("predict --weights " + pt + " --source " + dir + "/no-such.jpg device=cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/no-such.jpg does not exist"), std::string::npos) << r.output;
  r = test::run_trainer("predict --weights " + dir + "/runs/ft/weights/last.safetensors --source " + images + " --save-dir " + dir +
                        "/pred2 device=cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("full-scale decoding"), std::string::npos) << "Headroom's own weights take its fast path\n" << r.output;
}

namespace {
// Ultralytics' detections not matched one to one by predict's (same class, IoU >= 0.9, scores
// within 0.02), and predict's not matched by Ultralytics', over every image.
int unmatched_detections(const Json& ours, const Json& theirs, int* total) {
  const auto iou = [](const std::array<double, 4>& a, const std::array<double, 4>& b) {
    const double w = std::max(0.0, std::min(a[2], b[2]) - std::max(a[0], b[0]));
    const double h = std::max(0.0, std::min(a[3], b[3]) - std::max(a[1], b[1]));
    const double inter = w * h;
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter);
  };
  int unmatched = 0;
  *total = 0;
  for (const Json& image : ours.items()) {
    struct Row {
      std::array<double, 4> box;
      double score;
      int cls;
    };
    std::vector<Row> mine, want;
    for (const Json& d : image.find("detections")->items()) {
      const auto& b = d.find("box")->items();
      mine.push_back({{b[0].as_number(), b[1].as_number(), b[2].as_number(), b[3].as_number()}, d.find("score")->as_number(),
                      int(d.find("class")->as_number())});
    }
    const std::string name = fs::path(image.find("image")->as_string()).filename().string();
    for (const Json& d : theirs.find(name)->find("detections")->items()) {
      const auto& v = d.items();
      want.push_back({{v[0].as_number(), v[1].as_number(), v[2].as_number(), v[3].as_number()}, v[4].as_number(), int(v[5].as_number())});
    }
    *total += int(want.size());
    std::vector<bool> used(mine.size(), false);
    for (const Row& w : want) {
      bool found = false;
      for (size_t i = 0; i < mine.size() && !found; ++i)
        if (!used[i] && mine[i].cls == w.cls && std::abs(mine[i].score - w.score) <= 0.02 && iou(mine[i].box, w.box) >= 0.9)
          used[i] = found = true;
      unmatched += !found;
    }
    unmatched += int(std::count(used.begin(), used.end(), false));
  }
  return unmatched;
}
}  // namespace

// `trainer predict` with weights Ultralytics trained, on JPEGs of 241-400 px at imgsz 320, gives
// the detections Ultralytics' predictor gives (scripts/make_jpeg_predict_fixture.py): for such
// weights eval.preprocess auto decodes at full scale and resizes bilinearly, as its predictor
// does. Headroom's fast path (a DCT-scaled decode, area interpolation) is measured beside it.
TEST(Cli, PredictOnJpegsGivesUltralyticsDetections) {
  const std::string fixtures = std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/predict/";
  const Json theirs = read_json_file(fixtures + "ultralytics_predictions.json");
  const std::string dir = test::temp_dir("cli-jpeg");
  int counts[2] = {0, 0}, total = 0;
  for (int fast = 0; fast < 2; ++fast) {
    const std::string out = dir + (fast ? "/fast" : "/auto");
    // In a subshell so that only stdout goes to the file; the log (stderr) comes back in r.output.
    test::RunResult r = test::run_command(std::string("(") + HEADROOM_TRAINER + " predict --weights " + fixtures +
                                          "ul_yolov8t_shapes.pt --source " + fixtures + "images --conf 0.25 --save-dir " +
                                          out + " data.imgsz=320 device=cpu" +
                                          (fast ? " eval.preprocess=fast" : " --json > " + dir + "/stdout.json") + ")");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("full-scale decoding") != std::string::npos, !fast) << r.output;
    // --json prints what predictions.json holds on stdout, and only that.
    if (!fast) {
      EXPECT_EQ(read_json_file(dir + "/stdout.json").dump(1), read_json_file(out + "/predictions.json").dump(1));
    }
    counts[fast] = unmatched_detections(read_json_file(out + "/predictions.json"), theirs, &total);
  }
  printf("predict on JPEGs against Ultralytics' %d detections: %d unmatched (eval.preprocess auto), %d (fast)\n", total,
         counts[0], counts[1]);
  EXPECT_GE(total, 30);
  EXPECT_EQ(counts[0], 0);
  EXPECT_GT(counts[1], counts[0]) << "the fixture no longer tells the two paths apart";

  // A YOLO26 that Ultralytics trained the same way, both ways Ultralytics predicts with it: its
  // end-to-end head, no NMS (predict(nms=False); eval.end2end true, the default: not given), and
  // the one-to-many branch with NMS (Ultralytics 8.4.190's default, nms=None; eval.end2end false).
  for (const bool end2end : {true, false}) {
    const Json want = read_json_file(fixtures + (end2end ? "ultralytics_predictions_yolo26.json" : "ultralytics_predictions_yolo26_nms.json"));
    const std::string out26 = dir + (end2end ? "/yolo26" : "/yolo26-nms");
    test::RunResult r = test::run_trainer("predict --weights " + fixtures + "ul_yolo26t_shapes.pt --source " + fixtures +
                                          "images --conf 0.25 --save-dir " + out26 + " data.imgsz=320 device=cpu" +
                                          (end2end ? "" : " eval.end2end=false"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    int total26 = 0;
    const int unmatched26 = unmatched_detections(read_json_file(out26 + "/predictions.json"), want, &total26);
    printf("YOLO26 predict on JPEGs (eval.end2end %d) against Ultralytics' %d detections: %d unmatched\n", int(end2end), total26,
           unmatched26);
    EXPECT_EQ(total26, end2end ? 24 : 31);  // the two ways differ here
    EXPECT_EQ(unmatched26, 0) << "eval.end2end " << end2end;
  }
}

// `make install PREFIX=...`: the installed trainer, run from an empty folder, finds the model
// files by name in <prefix>/share/headroom.
TEST(Cli, InstalledTreeRunsFromAnEmptyFolder) {
  const std::string dir = test::temp_dir("cli-install");
  const std::string build = fs::path(HEADROOM_TRAINER).parent_path().string();
  const std::string prefix = dir + "/prefix";
  ASSERT_EQ(std::system(("cmake --install " + build + " --prefix " + prefix + " > " + dir + "/install.log 2>&1").c_str()), 0)
      << test::read_bytes(dir + "/install.log");
  EXPECT_TRUE(fs::exists(prefix + "/share/headroom/models/yolo11.yaml"));
  EXPECT_TRUE(fs::exists(prefix + "/share/headroom/configs/demo.yaml"));
  fs::create_directories(dir + "/empty");
  const std::string out = dir + "/model.json";
  ASSERT_EQ(std::system(("cd " + dir + "/empty && " + prefix + "/bin/trainer model --model yolo11n.yaml --nc 80 --json > " + out +
                         " 2>&1").c_str()), 0)
      << test::read_bytes(out);
  const Json j = Json::parse(test::read_bytes(out), out);
  EXPECT_EQ(j.find("parameters")->as_number(), 2624080);
  EXPECT_EQ(j.find("file")->as_string(), fs::canonical(prefix).string() + "/share/headroom/models/yolo11.yaml");
}
