// `trainer train --nproc N`: N local workers of the same command with torchrun's environment,
// watched until they end. A worker that fails ends the others (SIGTERM, then SIGKILL after the
// timeout), and the launcher exits with its code, naming the rank and its error.
#pragma once

#include <torch/arg.h>

#include <string>
#include <vector>

namespace headroom::dist {

struct LaunchOptions {
  TORCH_ARG(int, nproc) = 1;
  TORCH_ARG(double, timeout) = 300;  // seconds the others get to end once one has failed
};

// Runs `program` with `args` (argv[1..], without --nproc) nproc times: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port) and
// HEADROOM_ERROR_FILE (where a worker leaves the message it failed with). Returns 0 when every
// worker succeeded, else the first failed worker's exit code (128 + signal when killed).
int launch_local(const std::string& program, const std::vector<std::string>& args, const LaunchOptions& o);

// A worker's last words for the launcher: written to $HEADROOM_ERROR_FILE when it is set.
void write_error_file(const std::string& message);

}  // namespace headroom::dist
