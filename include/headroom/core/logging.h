// Console + run-directory log file, through spdlog. Call sites use spdlog::info/warn directly.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace headroom {

// Console sink on stderr at `level` (trace | debug | info | warn | error). LibTorch's warnings
// raised on the calling thread (the main thread: models, losses, the step) come through it too,
// each message once, as "LibTorch: ..." (they would otherwise reach stderr through glog, outside
// the run's log file), except the ones Headroom expects. c10 keeps its warning handler per
// thread: the loader's and the checkpoint writer's threads keep LibTorch's own.
void init_logging(const std::string& level);
// Also writes everything at `level` to `path` (appends: a resumed run keeps its history). The
// first file of a process starts with the lines said since init_logging (the last 2000).
void add_log_file(const std::string& path);

}  // namespace headroom
