// Run directories: runs/<name>, a fresh name (name2, name3, ...) when it exists, as
// Ultralytics' increment_path does, unless reuse is asked for.
#pragma once

#include <string>

namespace headroom {

struct Config;

// Creates and returns project/name, or the first free project/nameN (N = 2, 3, ...).
std::string create_run_dir(const std::string& project, const std::string& name, bool exist_ok);

// Creates the run directory for `c`, writes its resolved config (config.yaml) and starts the
// log file (train.log) in it. Returns the directory.
std::string open_run_dir(const Config& c);

}  // namespace headroom
