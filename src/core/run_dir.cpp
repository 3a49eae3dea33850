#include "headroom/core/run_dir.h"

#include <filesystem>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"

namespace headroom {

namespace fs = std::filesystem;

std::string create_run_dir(const std::string& project, const std::string& name, bool exist_ok) {
  std::error_code ec;
  fs::create_directories(project, ec);
  if (ec) throw Error(project + ": cannot create the project folder: " + ec.message());
  fs::path dir = fs::path(project) / name;
  if (exist_ok) {
    fs::create_directories(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot create the run folder: " + ec.message());
    return dir.string();
  }
  // create_directory is atomic: two runs started together never share a folder.
  for (int n = 1; n < 100000; ++n) {
    dir = fs::path(project) / (n == 1 ? name : name + std::to_string(n));
    if (fs::create_directory(dir, ec)) return dir.string();
    if (ec) throw Error(dir.string() + ": cannot create the run folder: " + ec.message());
  }
  throw Error(project + ": no free run name for '" + name + "'");
}

std::string open_run_dir(const Config& c) {
  const std::string dir = create_run_dir(c.project, c.name, c.exist_ok);
  write_file_atomic((fs::path(dir) / "config.yaml").string(), config_to_yaml(c));
  add_log_file((fs::path(dir) / "train.log").string());
  spdlog::info("run directory: {}", dir);
  return dir;
}

}  // namespace headroom
