#include <cstdio>

#include "commands.h"
#include "headroom/core/errors.h"
#include "headroom/data/dataset.h"
#include "headroom/models/detector.h"
#include "headroom/interop/init_from.h"

namespace headroom::cli {

void add_model_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("model", "Layer table, parameters, strides and GFLOPs of a model file");
  static std::string file, scale, config_path;
  static std::vector<std::string> overrides;
  static int64_t nc = -1, imgsz = 640;
  static bool json = false;
  cmd->add_option("--model", file, "Model YAML (e.g. models/yolov8.yaml, models/yolov8s.yaml, models/centernet_hg104.yaml)");
  cmd->add_option("--scale", scale, "Scale of a file with a scales table (n, s, m, l, x)");
  cmd->add_option("--nc", nc, "Number of classes (default: the data set's with --config, else the file's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--imgsz", imgsz, "Image size for the GFLOPs")->capture_default_str();
  cmd->add_option("--config,-c", config_path, "Run config: its model section (and data set, for nc)");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    if (!file.empty()) overrides.insert(overrides.begin(), "model.file=" + file);
    if (!scale.empty()) overrides.insert(overrides.begin() + (file.empty() ? 0 : 1), "model.scale=" + scale);
    const Config c = load_run_config(config_path, overrides);
    if (config_path.empty() && file.empty()) throw InputError("model: give --model path/to/model.yaml (or --config)");
    int64_t classes = nc;
    if (classes < 0 && !c.data.dataset.empty()) {
      const data::DataSpec spec = data::read_data_yaml(c.data.dataset);
      if (!spec.names.empty()) classes = static_cast<int64_t>(spec.names.size());
    }
    models::Detector d = interop::run_model(c, classes);
    if (imgsz < 1 || imgsz % d->info().input_multiple != 0)
      throw InputError("--imgsz " + std::to_string(imgsz) + " must be a positive multiple of " +
                       std::to_string(d->info().input_multiple) + " for this model");
    if (json)
      print_json(models::model_summary_json(*d, imgsz));
    else
      std::printf("%s", models::format_model_summary(*d, imgsz).c_str());
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
