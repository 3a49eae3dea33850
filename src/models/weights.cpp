#include "headroom/models/weights.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <filesystem>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"

namespace headroom::models {

namespace {
constexpr const char* kMetaKey = "headroom_weights";
constexpr int kFormat = 1;
}  // namespace

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path) {
  Json meta = Json::object();
  meta["format"] = kFormat;
  meta["model_file"] = model.yaml_file();
  meta["model_yaml"] = model.yaml_text();
  meta["scale"] = model.scale();
  meta["nc"] = model.info().nc;
  Json names = Json::array(), ids = Json::array();
  for (const auto& n : info.names) names.push_back(n);
  for (int id : info.category_ids) ids.push_back(id);
  meta["names"] = names;
  meta["category_ids"] = ids;
  torch::serialize::OutputArchive archive;
  model.save(archive);
  archive.write(kMetaKey, c10::IValue(meta.dump()));
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  try {
    archive.save_to(tmp);
    fsync_path(tmp, false);
  } catch (const c10::Error& e) {
    std::filesystem::remove(tmp);
    throw Error(path + ": writing the weights failed: " + e.what_without_backtrace());
  }
  std::filesystem::rename(tmp, path);
  const auto dir = std::filesystem::path(path).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
}

LoadedWeights load_weights(const std::string& path, c10::Device device) {
  if (!std::filesystem::is_regular_file(path)) throw InputError(path + ": weights file not found");
  torch::serialize::InputArchive archive;
  c10::IValue meta_value;
  try {
    archive.load_from(path, c10::Device(c10::kCPU));
    if (!archive.try_read(kMetaKey, meta_value) || !meta_value.isString())
      throw InputError(path + ": not a Headroom weights file (no model description inside)");
  } catch (const c10::Error& e) {
    throw InputError(path + ": cannot read the weights (truncated or not a weights file): " + e.what_without_backtrace());
  }
  const Json meta = Json::parse(meta_value.toStringRef(), path);
  const Json* format = meta.find("format");
  if (!format || format->as_number() != kFormat) throw InputError(path + ": weights format not supported by this Headroom");
  ModelSpec spec;
  spec.file = meta.find("model_file")->as_string();
  spec.text = meta.find("model_yaml")->as_string();
  spec.scale = meta.find("scale")->as_string();
  spec.nc = static_cast<int64_t>(meta.find("nc")->as_number());
  LoadedWeights out;
  out.model = Detector(spec);
  try {
    out.model->load(archive);
  } catch (const c10::Error& e) {
    throw InputError(path + ": the weights do not fit their own model description: " + e.what_without_backtrace());
  }
  out.model->to(device);
  for (const auto& n : meta.find("names")->items()) out.info.names.push_back(n.as_string());
  for (const auto& id : meta.find("category_ids")->items()) out.info.category_ids.push_back(static_cast<int>(id.as_number()));
  return out;
}

}  // namespace headroom::models
