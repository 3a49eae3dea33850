// Error types and the exit codes the CLI maps them to.
#pragma once

#include <stdexcept>
#include <string>

namespace headroom {

// Exit codes of the `trainer` command.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,   // a run failed while working (I/O, a bug, an interrupted job)
  kExitBadInput = 2,  // the user's input is wrong: config, CLI, data, device request
  kExitInterrupted = 130,  // stopped by Ctrl-C after writing a checkpoint (128 + SIGINT)
};

// Base of every error Headroom raises on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input (config, command line, data files). The message names the file (and line
// where there is one) and says how to fix it.
class InputError : public Error {
 public:
  using Error::Error;
};

// A device was asked for that this machine or this LibTorch cannot provide.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// "file:line:column" (1-based; parts <= 0 are left out).
std::string format_location(const std::string& file, int line, int column = 0);

}  // namespace headroom
