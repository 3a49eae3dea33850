#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/run_dir.h"
#include "headroom/core/threads.h"
#include "headroom/data/dataset.h"
#include "headroom/data/image.h"
#include "headroom/data/loader.h"
#include "headroom/eval/draw.h"
#include "headroom/eval/postprocess.h"
#include "headroom/eval/validate.h"
#include "headroom/models/weights_import.h"

namespace headroom::cli {

namespace fs = std::filesystem;

void add_predict_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("predict", "Detect objects in images; write them with boxes drawn, and a JSON of the detections");
  static std::string config_path, weights, source, save_dir;
  static std::vector<std::string> overrides;
  static double conf = 0.25;
  static bool json = false;
  cmd->add_option("--weights,-w", weights, "Weights file")->required();
  cmd->add_option("--source,-s", source, "An image, a folder of images or a .txt list")->required();
  cmd->add_option("--config,-c", config_path, "Run config (image size, device, eval.iou, eval.max_det)");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->add_option("--conf", conf, "Score threshold")->capture_default_str();
  cmd->add_option("--save-dir", save_dir, "Output folder (default: <project>/predict, a new one per run)");
  cmd->add_flag("--json", json, "Print the detections JSON on stdout too");
  cmd->callback([&exit_code] {
    if (conf < 0 || conf > 1) throw InputError("predict: --conf must be in [0, 1]");
    const Config c = load_run_config(config_path, overrides);
    const c10::Device device = run_device(c);
    models::LoadedWeights w = models::load_any_weights(weights, device);
    models::DetectorImpl& model = *w.model;
    model.eval();

    // The source as a label-free split: the scan checks every image (and skips broken ones).
    data::DataSpec spec;
    spec.file = source;
    spec.names = w.info.names.empty() ? std::vector<std::string>(size_t(model.info().nc), "") : w.info.names;
    data::SplitSource src;
    src.images = {source};
    src.where = "--source";
    spec.splits.emplace_back("predict", src);
    data::ScanOptions so;
    so.max_pixels = c.data.max_pixels;
    so.threads = std::max(1, resolve_workers(c.data.workers));
    auto split = std::make_shared<const data::Split>(data::scan_split(spec, "predict", so));

    const std::string out_dir = save_dir.empty() ? create_run_dir(c.project, "predict", false) : save_dir;
    fs::create_directories(out_dir);
    data::Loader loader(split, data::loader_options(c, *split, /*training=*/false, device.is_cuda()));
    eval::DecodeOptions d;
    d.nms.conf = conf;
    d.nms.iou = c.eval.iou;
    d.nms.max_det = c.eval.max_det;
    d.nms.agnostic = c.eval.agnostic;
    d.topk = c.eval.topk;
    Json results = Json::array();
    int64_t detections = 0;
    at::NoGradGuard no_grad;
    loader.start(0);
    while (auto batch = loader.next()) {
      const auto rows = eval::to_original_pixels(eval::decode(model.info(), model.forward(eval::model_input(batch->images, device)), d), batch->meta);
      for (size_t b = 0; b < rows.size(); ++b) {
        const data::Sample& s = split->samples[size_t(batch->meta[b].index)];
        const std::string bytes = read_file(s.image);
        data::Image img = data::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), c.data.max_pixels);
        eval::draw_detections(img, rows[b], spec.names);
        const std::string out = (fs::path(out_dir) / (fs::path(s.image).stem().string() + ".jpg")).string();
        const auto jpeg = data::encode_jpeg(img, 95);
        write_file_atomic(out, std::string(jpeg.begin(), jpeg.end()));
        Json entry = Json::object(), dets = Json::array();
        entry["image"] = s.image;
        entry["width"] = s.width;
        entry["height"] = s.height;
        for (const auto& r : rows[b]) {
          Json det = Json::object(), box = Json::array();
          for (int k = 0; k < 4; ++k) box.push_back(std::round(double(r[size_t(k)]) * 10) / 10);
          det["box"] = box;
          det["class"] = int(r[5]);
          det["name"] = spec.names[size_t(r[5])];
          det["score"] = std::round(double(r[4]) * 1e4) / 1e4;
          dets.push_back(std::move(det));
        }
        detections += int64_t(rows[b].size());
        entry["detections"] = dets;
        results.push_back(std::move(entry));
      }
    }
    const std::string json_path = (fs::path(out_dir) / "predictions.json").string();
    write_file_atomic(json_path, results.dump(1));
    spdlog::info("{} images, {} detections: images with boxes and {} in {}", split->samples.size(), detections, json_path, out_dir);
    if (json) print_json(results);
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
