#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "headroom/augment/augment.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/threads.h"
#include "headroom/data/check.h"
#include "headroom/data/convert.h"
#include "headroom/data/loader.h"
#include "headroom/data/synth.h"
#include "headroom/models/detector.h"
#include "headroom/train/parts.h"
#include "headroom/train/plots.h"
#include "headroom/interop/init_from.h"

namespace headroom::cli {

namespace {

namespace fs = std::filesystem;

void add_synth(CLI::App& data, int& exit_code) {
  auto* cmd = data.add_subcommand("synth", "Write a synthetic shapes data set (JPEG + YOLO labels + COCO JSON)");
  static data::SynthOptions o;
  static bool json = false;
  cmd->add_option("--out", o.out, "Output folder (new, empty, or an earlier synthetic set)")->required();
  cmd->add_option("--images", o.images, "Images in all (train + val)")->capture_default_str();
  cmd->add_option("--size", o.size, "Long side of each image in pixels")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  cmd->add_option("--classes", o.classes, "Shape classes, 1..6")->capture_default_str();
  cmd->add_option("--val-fraction", o.val_fraction, "Share of images in the val split")->capture_default_str();
  cmd->add_option("--max-objects", o.max_objects, "Most objects in one image")->capture_default_str();
  cmd->add_option("--min-object", o.min_object, "Smallest object extent, as a fraction of the short side")->capture_default_str();
  cmd->add_option("--max-object", o.max_object, "Largest object extent, as a fraction of the short side")->capture_default_str();
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    o.threads = available_cores();
    const data::SynthSummary s = data::synthesize(o);
    if (json) {
      print_json(Json::object({{"data_yaml", s.data_yaml}, {"coco_yaml", s.coco_yaml}, {"train_images", s.train_images},
                               {"val_images", s.val_images}, {"boxes", s.boxes}, {"reused", s.reused}}));
    } else {
      std::printf("%s %lld train + %lld val images, %lld boxes\n  YOLO layout: %s\n  COCO JSON:   %s\n",
                  s.reused ? "up to date:" : "wrote", (long long)s.train_images, (long long)s.val_images,
                  (long long)s.boxes, s.data_yaml.c_str(), s.coco_yaml.c_str());
    }
    exit_code = kExitOk;
  });
}

void add_check(CLI::App& data, int& exit_code) {
  auto* cmd = data.add_subcommand("check", "Scan a data set: counts, size histograms and every problem found");
  static std::string data_yaml, config_path, split = "all";
  static std::vector<std::string> overrides;
  static bool json = false, quick = false;
  cmd->add_option("--data", data_yaml, "Data YAML (or give --config and use its data.dataset)");
  cmd->add_option("--config,-c", config_path, "Config YAML whose data section to use");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->add_option("--split", split, "train, val, test or all")->capture_default_str();
  cmd->add_flag("--quick", quick, "Read headers and end markers only instead of decoding every image");
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    if (!data_yaml.empty()) overrides.insert(overrides.begin(), "data.dataset=" + data_yaml);
    const Config c = load_run_config(config_path, overrides);
    if (c.data.dataset.empty())
      throw InputError("data check: give --data path/to/data.yaml (or --config with data.dataset set)");
    data::ScanOptions o;
    o.max_pixels = c.data.max_pixels;
    o.threads = available_cores();
    o.full_decode = !quick;
    o.report_only = true;
    std::vector<std::string> splits;
    if (split != "all") splits.push_back(split);
    const data::CheckReport r = data::check_data(c.data.dataset, splits, o);
    if (r.splits.empty()) throw InputError(c.data.dataset + ": no split named '" + split + "'");
    if (json)
      print_json(data::check_report_json(r));
    else
      std::printf("%s", data::format_check_report(r).c_str());
    bool empty = false;
    for (const auto& s : r.splits) empty = empty || s.split.samples.empty();
    exit_code = r.has_skips() || empty ? kExitBadInput : kExitOk;
  });
}

void add_convert(CLI::App& data, int& exit_code) {
  auto* cmd = data.add_subcommand("convert", "Rewrite a data set as YOLO labels, COCO JSON or TF OD API TFRecords");
  static data::ConvertOptions o;
  static std::string to;
  static bool json = false;
  cmd->add_option("--from", o.from, "Data YAML of the set to convert")->required();
  cmd->add_option("--to", to, "yolo, coco or tfrecord")->required();
  cmd->add_option("--out", o.out, "Output folder (new or empty)")->required();
  cmd->add_option("--shards", o.shards, "TFRecord files per split")->capture_default_str();
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    o.to = data::data_format_from(to);
    o.scan.threads = available_cores();
    const data::ConvertSummary s = data::convert_data(o);
    if (json) {
      Json j = Json::object(), splits = Json::object();
      for (const auto& [name, n] : s.images) splits[name] = n;
      j["data_yaml"] = s.data_yaml;
      j["images"] = splits;
      j["boxes"] = s.boxes;
      j["crowd_boxes_left_out"] = s.crowd_boxes_left_out;
      print_json(j);
    } else {
      for (const auto& [name, n] : s.images) std::printf("%s: %lld images\n", name.c_str(), (long long)n);
      std::printf("%lld boxes; data YAML: %s\n", (long long)s.boxes, s.data_yaml.c_str());
    }
    exit_code = kExitOk;
  });
}

// What the model is fed: the first batches of an epoch through the configured augmentation.
void add_preview(CLI::App& data, int& exit_code) {
  auto* cmd = data.add_subcommand("preview", "Write a grid of augmented training images with their boxes");
  static std::string config_path, out = "augment_preview.jpg";
  static std::vector<std::string> overrides;
  static int64_t epoch = 0, batches = 1;
  static bool json = false;
  cmd->add_option("--config,-c", config_path, "Training config (its data and augment sections)")->required();
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->add_option("--out,-o", out, "Image to write; with --batches N > 1, _1, _2... are inserted before the extension")->capture_default_str();
  cmd->add_option("--epoch", epoch, "Epoch whose batches to draw (close_mosaic epochs are the last ones)")->capture_default_str();
  cmd->add_option("--batches", batches, "Batches to draw, one grid each (16 images at most per grid)")->capture_default_str();
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    const Config c = load_run_config(config_path, overrides);
    if (c.data.dataset.empty()) throw InputError(config_path + ": data.dataset is not set; the preview draws its train split");
    if (batches < 1) throw InputError("--batches must be at least 1");
    if (epoch < 0) throw InputError("--epoch must be 0 or more (the first epoch is 0)");
    check_output_file(out);  // before the scan and the batches (each grid's path is held to the inputs below)
    const DeviceChoice device = resolve_device(c.device, query_cuda());
    if (!device.warning.empty()) spdlog::warn("{}", device.warning);
    const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    // The input multiple (for multi-scale sizes) is the model's; building it is only needed then.
    const int64_t multiple = c.augment.multi_scale > 0 ? interop::run_model(c, int64_t(split->names.size()))->info().input_multiple : 32;
    const data::LoaderOptions lo = data::loader_options(c, *split, /*training=*/true, device.device.is_cuda());
    // close_mosaic counts back from the run's last epoch, as training counts it (train.steps included).
    const augment::Augmenter aug(augment::augmenter_options(c, multiple, train::run_epochs(c, lo, int64_t(split->samples.size()))));
    data::Loader loader(split, lo);
    loader.start(epoch, 0);
    Json files = Json::array();
    int64_t boxes_in = 0, boxes_out = 0, images = 0;
    for (int64_t i = 0; i < batches; ++i) {
      const std::optional<data::HostBatch> batch = loader.next();
      if (!batch) break;
      const data::HostBatch seen = augment::enabled(c.augment) ? augment::to_host_batch(aug(*batch, device.device), *batch) : *batch;
      std::string path = out;
      if (batches > 1) {
        const fs::path p(out);
        path = (p.parent_path() / (p.stem().string() + "_" + std::to_string(i + 1) + p.extension().string())).string();
      }
      check_output_path(path, "--out", config_path, c, split.get());
      train::plot_batch(seen, split->names, path);
      boxes_in += batch->counts.sum().item<int64_t>();
      boxes_out += seen.counts.sum().item<int64_t>();
      images += batch->size();
      files.push_back(Json(path));
      if (!json)
        std::printf("wrote %s: %lld images at %lld px, %lld boxes (%lld before augmentation)\n", path.c_str(),
                    (long long)seen.size(), (long long)seen.images.size(2), (long long)seen.counts.sum().item<int64_t>(),
                    (long long)batch->counts.sum().item<int64_t>());
    }
    if (json) {
      Json j = Json::object();
      j["files"] = files;
      j["images"] = images;
      j["boxes_before"] = boxes_in;
      j["boxes_after"] = boxes_out;
      j["augment"] = augment::enabled(c.augment);
      j["mosaic"] = augment::enabled(c.augment) && c.augment.mosaic > 0 && aug.mosaic_in_epoch(epoch);
      j["device"] = device.device.str();
      print_json(j);
    }
    if (!augment::enabled(c.augment)) spdlog::warn("{}: the augment section changes nothing; the grid shows the letterboxed images", config_path);
    exit_code = kExitOk;
  });
}

}  // namespace

void add_data_command(CLI::App& app, int& exit_code) {
  auto* data = app.add_subcommand("data", "Data sets: synth, check, convert, preview");
  data->require_subcommand(1);
  add_synth(*data, exit_code);
  add_check(*data, exit_code);
  add_convert(*data, exit_code);
  add_preview(*data, exit_code);
}

}  // namespace headroom::cli
