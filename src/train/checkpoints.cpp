#include "headroom/train/checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <vector>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/models/weights.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {

Json parse_meta(const std::string& path, const models::ArchiveFile& f) {
  if (f.meta.empty())
    throw InputError(path + ": a weights file without training state (or a checkpoint of an earlier Headroom); start a new "
                     "run from it with model.init_from=" + path);
  const Json meta = Json::parse(f.meta, path + " (checkpoint meta)");
  const Json* format = meta.find("format");
  if (!format || format->as_number() != kCheckpointFormat)
    throw InputError(path + ": checkpoint format " + (format ? format->dump() : std::string("?")) + " is not this Headroom's (" +
                     std::to_string(kCheckpointFormat) + "); start a new run from its weights with model.init_from=" + path);
  return meta;
}

}  // namespace

Json checkpoint_meta(const std::string& path) { return parse_meta(path, models::verify_archive(path, "checkpoint")); }

std::string checkpoint_config_yaml(const std::string& path) { return checkpoint_meta(path).find("config")->as_string(); }

Json load_checkpoint_archive(const std::string& path, c10::Device device, torch::serialize::InputArchive& root) {
  return parse_meta(path, models::load_archive_verified(root, path, device, "checkpoint"));
}

std::string find_resume_checkpoint(const std::string& project, const std::string& name) {
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec;
  const std::regex run_name(std::regex_replace(name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") + "[0-9]*");
  for (const auto& dir : fs::directory_iterator(project, ec)) {
    if (!dir.is_directory() || !std::regex_match(dir.path().filename().string(), run_name)) continue;
    for (const auto& f : fs::directory_iterator(dir.path() / "weights", ec)) {
      const std::string file = f.path().filename().string();
      if (file == "last.pt" || (file.rfind("step_", 0) == 0 && f.path().extension() == ".pt"))
        found.emplace_back(fs::last_write_time(f.path()), f.path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [time, path] : found) {
    try {
      checkpoint_meta(path);
      return path;
    } catch (const InputError& e) {
      spdlog::warn("resume: refusing {}", e.what());
    }
  }
  return "";
}

}  // namespace headroom::train
