// Run directories: runs/<name>, a fresh name (name2, name3, ...) when it exists, as
// Ultralytics' increment_path does, unless reuse is asked for. A run holds its directory's
// lock while it writes there.
#pragma once

#include <memory>
#include <string>

#include "headroom/core/files.h"

namespace headroom {

struct Config;

// Creates and returns project/name, or the first free project/nameN (N = 2, 3, ...).
std::string create_run_dir(const std::string& project, const std::string& name, bool exist_ok);

// An exclusive lock on a run directory (flock on <dir>/.lock, holding the holder's pid and
// host): a second trainer there (exist_ok, or --resume of a run still training) would write
// over the first one's checkpoints and log. The kernel drops it when the process ends, killed
// too, so no stale lock outlives a run.
class RunDirLock {
 public:
  // Throws InputError naming the holder and the fix when another process holds it.
  explicit RunDirLock(const std::string& dir);

 private:
  std::unique_ptr<FileLock> lock_;
};

// Creates the run directory for `c`, takes its lock (into `lock`, before anything is written),
// writes its resolved config (config.yaml) and starts the log file (train.log) in it. Returns
// the directory.
std::string open_run_dir(const Config& c, std::unique_ptr<RunDirLock>& lock);

}  // namespace headroom
