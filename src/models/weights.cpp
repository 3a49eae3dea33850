#include "headroom/models/weights.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"

namespace headroom::models {

namespace {
constexpr const char* kMetaKey = "headroom_weights";
constexpr int kFormat = 1;
}  // namespace

void write_weights(DetectorImpl& model, const WeightsInfo& info, torch::serialize::OutputArchive& archive) {
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
  model.save(archive);
  archive.write(kMetaKey, c10::IValue(meta.dump()));
}

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path) {
  torch::serialize::OutputArchive archive;
  write_weights(model, info, archive);
  save_archive_atomic(archive, path);
}

namespace {

// Trailer after the zip archive: magic, archive length, hash of the archive. LibTorch's reader
// does not check the zip CRCs, so without it a flipped bit would load silently.
constexpr char kTrailerMagic[8] = {'H', 'R', 'S', 'U', 'M', '0', '0', '1'};
constexpr size_t kTrailerSize = 24;

uint64_t archive_hash(const char* data, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    h = (h ^ (w * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  for (; i < n; ++i) h = (h ^ uint8_t(data[i])) * 0x100000001B3ull;
  return h;
}

}  // namespace

void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path) {
  std::ostringstream out;
  try {
    archive.save_to(out);
  } catch (const std::exception& e) {
    throw Error(path + ": writing failed (the previous file, if any, is untouched): " + e.what());
  }
  std::string bytes = std::move(out).str();
  const uint64_t n = bytes.size(), h = archive_hash(bytes.data(), bytes.size());
  bytes.append(kTrailerMagic, 8);
  bytes.append(reinterpret_cast<const char*>(&n), 8);
  bytes.append(reinterpret_cast<const char*>(&h), 8);
  write_file_atomic(path, bytes);  // temporary file, fsync, rename, fsync of the folder
}

void load_archive_verified(torch::serialize::InputArchive& archive, const std::string& path, c10::Device device,
                           const std::string& what) {
  if (!std::filesystem::is_regular_file(path)) throw InputError(path + ": " + what + " not found");
  const std::string bytes = read_file(path);
  uint64_t n = 0, h = 0;
  if (bytes.size() < kTrailerSize || std::memcmp(bytes.data() + bytes.size() - kTrailerSize, kTrailerMagic, 8) != 0)
    throw InputError(path + ": not a Headroom " + what + ", or truncated (no end marker)");
  std::memcpy(&n, bytes.data() + bytes.size() - 16, 8);
  std::memcpy(&h, bytes.data() + bytes.size() - 8, 8);
  if (n != bytes.size() - kTrailerSize) throw InputError(path + ": damaged " + what + " (its length does not match its end marker)");
  if (archive_hash(bytes.data(), n) != h)
    throw InputError(path + ": damaged " + what + " (checksum mismatch: the file changed after it was written)");
  try {
    archive.load_from(bytes.data(), n, device);
  } catch (const c10::Error& e) {
    throw InputError(path + ": cannot read the " + what + ": " + e.what_without_backtrace());
  }
}

LoadedWeights load_weights(const std::string& path, c10::Device device) {
  torch::serialize::InputArchive archive;
  load_archive_verified(archive, path, c10::Device(c10::kCPU), "weights file");
  c10::IValue meta_value;
  if (!archive.try_read(kMetaKey, meta_value) || !meta_value.isString())
    throw InputError(path + ": not a Headroom weights file (no model description inside)");
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
