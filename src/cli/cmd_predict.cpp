#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

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
#include "headroom/interop/weights_import.h"

namespace headroom::cli {

namespace fs = std::filesystem;

namespace {

// The source as a label-free split: the scan checks every image (and skips broken ones).
std::shared_ptr<const data::Split> source_split(const Config& c, const std::string& source, std::vector<std::string> names) {
  data::DataSpec spec;
  spec.file = source;
  spec.names = std::move(names);
  data::SplitSource src;
  src.images = {source};
  src.where = "--source";
  spec.splits.emplace_back("predict", src);
  data::ScanOptions so;
  so.max_pixels = c.data.max_pixels;
  so.threads = std::max(1, resolve_workers(c.data.workers));
  so.labels_expected = false;  // images to predict on carry no labels
  return std::make_shared<const data::Split>(data::scan_split(spec, "predict", so));
}

// One image's detections ([N, 6] rows: x1 y1 x2 y2 score class, original pixels) drawn into a
// JPEG in out_dir, and as an entry of predictions.json.
// `used`: the names written so far. Images of one name (a.jpg and a.png, s1/a.jpg and s2/a.jpg)
// get a suffix rather than one replacing the other, and no source image (`sources`, canonical:
// a .txt list may name images in the output folder) is written over.
Json write_prediction(const Config& c, const data::Sample& s, const std::vector<std::array<float, 6>>& rows,
                      const std::vector<std::string>& names, const std::string& out_dir, std::set<std::string>& used,
                      const std::set<std::string>& sources) {
  const std::string bytes = read_file(s.image);
  data::Image img = data::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), c.data.max_pixels);
  eval::draw_detections(img, rows, names);
  const std::string stem = fs::path(s.image).stem().string();
  std::string out;
  std::error_code ec;
  for (int n = 1; out.empty() || used.count(out) || sources.count(fs::weakly_canonical(out, ec).string()); ++n)
    out = (fs::path(out_dir) / (n == 1 ? stem + ".jpg" : stem + "_" + std::to_string(n) + ".jpg")).string();
  used.insert(out);
  const auto jpeg = data::encode_jpeg(img, 95);
  write_file_atomic(out, std::string(jpeg.begin(), jpeg.end()));
  Json dets = Json::array();
  for (const auto& r : rows) {
    Json box = Json::array();
    for (int k = 0; k < 4; ++k) box.push_back(std::round(double(r[size_t(k)]) * 10) / 10);
    dets.push_back(Json::object({{"box", std::move(box)}, {"class", int(r[5])}, {"name", names[size_t(r[5])]},
                                 {"score", std::round(double(r[4]) * 1e4) / 1e4}}));
  }
  return Json::object({{"image", s.image}, {"drawn", fs::path(out).filename().string()}, {"width", s.width}, {"height", s.height},
                       {"detections", std::move(dets)}});
}

}  // namespace

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
    if (!(conf >= 0 && conf <= 1)) throw InputError("predict: --conf must be in [0, 1]");  // NaN too
    if (!save_dir.empty()) {
      std::error_code ec;
      if (fs::exists(save_dir, ec) && !fs::is_directory(save_dir, ec))
        throw InputError("--save-dir " + save_dir + " is a file; give a folder");
      const bool folder = fs::is_directory(source, ec);
      const fs::path source_dir = folder ? fs::path(source) : fs::path(source).parent_path();
      if (fs::equivalent(save_dir, source_dir.empty() ? fs::path(".") : source_dir, ec))
        throw InputError("--save-dir " + save_dir + " is the folder of --source " + source +
                         ": the drawn images would sit among your images; give another folder");
      // A folder source is read with its subfolders: a later run would take the drawn images in.
      std::error_code src_ec, dst_ec;
      const fs::path src = fs::weakly_canonical(source_dir, src_ec), dst = fs::weakly_canonical(save_dir, dst_ec);
      if (folder && !src_ec && !dst_ec && !src.empty() && std::mismatch(src.begin(), src.end(), dst.begin(), dst.end()).first == src.end())
        throw InputError("--save-dir " + save_dir + " is inside --source " + source + ", which is read with its subfolders: a "
                         "later run would take the drawn images for input; give a folder outside it");
      // Into a folder of the user's own files, drawn images and predictions.json would replace
      // theirs by name; an earlier predict's folder (its predictions.json there) is written again.
      if (fs::is_directory(save_dir, ec) && !fs::is_empty(save_dir, ec) && !fs::exists(fs::path(save_dir) / "predictions.json", ec))
        throw InputError("--save-dir " + save_dir + " holds files of its own, which drawn images of the same names would replace; give "
                         "a new or empty folder (or leave --save-dir out: runs/predict, predict2, ...)");
    }
    const Config c = load_run_config(config_path, overrides);
    const c10::Device device = run_device(c);
    models::LoadedWeights w = interop::load_any_weights(weights, device);
    models::DetectorImpl& model = *w.model;
    model.eval();
    const std::vector<std::string> names =
        w.info.names.empty() ? std::vector<std::string>(size_t(model.info().nc), "") : w.info.names;
    const auto split = source_split(c, source, names);

    const std::string out_dir = save_dir.empty() ? create_run_dir(c.project, "predict", false) : save_dir;
    std::error_code made;
    fs::create_directories(out_dir, made);
    if (made) throw InputError("--save-dir " + out_dir + ": cannot create the folder: " + made.message());
    data::Loader loader(split, data::loader_options(c, *split, /*training=*/false, device.is_cuda(), eval::input_preprocess(c, w.info.framework)));
    const eval::DecodeOptions d = eval::decode_options(c, conf);
    Json results = Json::array();
    std::set<std::string> drawn, sources;
    for (const auto& sample : split->samples) {
      std::error_code ec;
      sources.insert(fs::weakly_canonical(sample.image, ec).string());
    }
    int64_t detections = 0, left_out = 0;
    at::NoGradGuard no_grad;
    loader.start(0);
    while (auto batch = loader.next()) {
      const auto rows = eval::to_original_pixels(eval::detect(model, eval::model_input(batch->images, device), d), batch->meta);
      for (size_t b = 0; b < rows.size(); ++b) {
        if (!batch->meta[b].decoded) {  // named in the loader's warning
          ++left_out;
          continue;
        }
        results.push_back(write_prediction(c, split->samples[size_t(batch->meta[b].index)], rows[b], names, out_dir, drawn, sources));
        detections += int64_t(rows[b].size());
      }
    }
    const std::string json_path = (fs::path(out_dir) / "predictions.json").string();
    write_file_atomic(json_path, results.dump(1));
    spdlog::info("{} images{}, {} detections: images with boxes and {} in {}", results.size(),
                 left_out ? fmt::format(" ({} left out: they could not be decoded)", left_out) : std::string(), detections, json_path,
                 out_dir);
    if (json) print_json(results);
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
