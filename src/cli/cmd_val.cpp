#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "commands.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/data/dataset.h"
#include "headroom/eval/coco_eval.h"
#include "headroom/eval/validate.h"
#include "headroom/interop/weights_import.h"

namespace headroom::cli {

namespace {

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t k = 0; k < names.size() && k < 12; ++k) out += (k ? ", " : "") + names[k];
  return "[" + out + (names.size() > 12 ? ", ..." : "") + "]";
}

// The model's class k is scored as the split's class k. The same names in another order would
// score each class as another: refused. Other names (weights trained elsewhere) are said once.
void check_classes(const std::string& weights, const std::vector<std::string>& model, const data::Split& split) {
  if (model.empty() || model == split.names) return;
  std::vector<std::string> a = model, b = split.names;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a == b)
    throw InputError(weights + ": the model's classes are " + name_list(model) + ", split '" + split.name + "' (" + split.source.where +
                     ") lists the same ones as " + name_list(split.names) + ": each class would be scored as another. List "
                     "the data set's names in the model's order");
  spdlog::warn("{}: the model names its classes {}, split '{}' {}: the model's class k is scored as the split's class k",
               weights, name_list(model), split.name, name_list(split.names));
}

}  // namespace

void add_val_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("val", "COCO mAP of a model on the val split, or of a results JSON against a ground-truth JSON");
  static std::string config_path, weights, save_json, gt_json, results_json, split_name = "val";
  static std::vector<std::string> overrides;
  static bool json = false;
  cmd->add_option("--config,-c", config_path, "Run config (data set, image size, eval section)");
  cmd->add_option("--weights,-w", weights, "Weights file");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->add_option("--split", split_name, "Split to evaluate")->capture_default_str();
  cmd->add_option("--save-json", save_json, "Write the detections as a COCO results JSON (and, for YOLO data, the ground truth beside it)");
  cmd->add_option("--gt", gt_json, "COCO ground-truth JSON: score --results against it, no model");
  cmd->add_option("--results", results_json, "COCO results JSON to score against --gt");
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    if (!gt_json.empty() || !results_json.empty()) {
      if (gt_json.empty() || results_json.empty()) throw InputError("val: --gt and --results go together");
      const eval::CocoGroundTruth gt = eval::read_coco_ground_truth(gt_json);
      const std::vector<eval::CocoBox> results = eval::read_coco_results(results_json);
      const std::set<int64_t> images(gt.image_ids.begin(), gt.image_ids.end());
      for (size_t i = 0; i < results.size(); ++i)  // as pycocotools' loadRes: results of other images are another set's
        if (!images.count(results[i].image_id))
          throw InputError(results_json + ": result " + std::to_string(i) + " (image_id " + std::to_string(results[i].image_id) +
                           ") is for an image " + gt_json + " does not list; score results against the ground truth they were "
                           "made for");
      const eval::CocoStats s = eval::coco_evaluate(gt.boxes, results, gt.image_ids, gt.category_ids);
      if (json)
        print_json(eval::coco_stats_json(s, gt.category_names));
      else
        std::printf("%s", eval::format_coco_stats(s, gt.category_names).c_str());
      exit_code = kExitOk;
      return;
    }
    if (weights.empty()) throw InputError("val: give --weights W (and --config C), or --gt G.json --results R.json");
    const Config c = load_run_config(config_path, overrides);
    const c10::Device device = run_device(c);
    models::LoadedWeights w = interop::load_any_weights(weights, device);
    auto split = std::make_shared<const data::Split>(data::load_split(c, split_name));
    if (split->names.size() != size_t(w.model->info().nc))
      throw InputError(weights + ": the model has " + std::to_string(w.model->info().nc) + " classes but " + c.data.dataset +
                       " has " + std::to_string(split->names.size()) + "; validate on the data set it was trained for");
    check_classes(weights, w.info.names, *split);
    if (!save_json.empty()) {  // before the pass: a path that would replace an input is refused at once
      check_output_path(save_json, "--save-json", config_path, c, split.get());
      if (split->source.format != data::SplitSource::Format::coco)
        check_output_path(std::filesystem::path(save_json).replace_extension("").string() + "_gt.json", "--save-json's ground truth",
                          config_path, c, split.get());
    }
    const eval::ValidationResult r = eval::validate(
        *w.model, split, eval::validate_options(c, *split, w.model->info(), device, eval::input_preprocess(c, w.info.framework)));
    eval::check_some_decoded(r, *split);
    if (!save_json.empty()) {
      write_file_atomic(save_json, eval::coco_results_json(r.detections).dump());
      std::string note = save_json;
      // COCO data has its instances file; YOLO and TFRecord data need a ground-truth file for COCO tools.
      if (split->source.format != data::SplitSource::Format::coco) {
        const std::string gt = std::filesystem::path(save_json).replace_extension("").string() + "_gt.json";
        write_file_atomic(gt, eval::ground_truth_json(*split, r.left_out).dump());
        note += " (ground truth: " + gt + ")";
      }
      spdlog::info("wrote {} detections to {}", r.detections.size(), note);
    }
    if (json) {
      Json j = eval::coco_stats_json(r.stats, split->names);
      j["images"] = r.images;
      j["left_out"] = int64_t(r.left_out.size());
      j["seconds"] = r.seconds;
      print_json(j);
    } else {
      const std::string left = r.left_out.empty() ? "" : " (" + std::to_string(r.left_out.size()) + " left out: they could not be decoded)";
      std::printf("%lld images of split '%s'%s in %.1f s\n%s", (long long)r.images, split->name.c_str(), left.c_str(), r.seconds,
                  eval::format_coco_stats(r.stats, split->names).c_str());
    }
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
