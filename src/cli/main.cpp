// trainer: the Headroom command line.
#include <algorithm>
#include <cstdio>
#include <functional>

#include "commands.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/threads.h"
#include "headroom/dist/launch.h"
#include "headroom/interop/pipeline_config.h"

namespace headroom::cli {

Config load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = interop::load_config_file(path, overrides);
  spdlog::default_logger()->set_level(spdlog::level::from_str(c.log.level));
  set_intra_op_threads(c.threads);
  return c;
}

c10::Device run_device(const Config& c) {
  const DeviceChoice choice = resolve_device(c.device, query_cuda());
  if (!choice.warning.empty()) spdlog::warn("{}", choice.warning);
  return choice.device;
}

namespace {
std::vector<std::string> g_program_args;
}
const std::vector<std::string>& program_args() { return g_program_args; }
void set_program_args(std::vector<std::string> args) { g_program_args = std::move(args); }

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

}  // namespace headroom::cli

int main(int argc, char** argv) {
  using namespace headroom;
  init_logging("info");
  set_intra_op_threads(AutoInt{});  // Debian's LibTorch would otherwise run on one thread

  CLI::App app{"Headroom: a LibTorch trainer for YOLO and CenterNet detectors that keeps the GPU fed\n"
               "and memory under a budget."};
  app.require_subcommand(1);
  int exit_code = kExitOk;
  cli::add_train_command(app, exit_code);
  cli::add_version_command(app, exit_code);
  cli::add_config_command(app, exit_code);
  cli::add_data_command(app, exit_code);
  cli::add_model_command(app, exit_code);
  cli::add_memory_command(app, exit_code);
  cli::add_val_command(app, exit_code);
  cli::add_predict_command(app, exit_code);
  cli::add_export_command(app, exit_code);
  // `trainer --config C ...` means `trainer train --config C ...`.
  std::vector<std::string> args(argv + 1, argv + argc);
  cli::set_program_args(std::vector<std::string>(argv, argv + argc));
  if (!args.empty() && (args[0] == "--config" || args[0] == "-c" || args[0].rfind("--config=", 0) == 0 || args[0] == "--resume" || args[0].rfind("--resume=", 0) == 0))
    args.insert(args.begin(), "train");
  std::vector<std::string> names;  // the commands, for a word that is none of them
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>([](CLI::App*) { return true; })))
    names.push_back(sub->get_name());
  if (!args.empty() && args[0].rfind('-', 0) != 0 && std::find(names.begin(), names.end(), args[0]) == names.end()) {
    const std::string near = nearest_match(args[0], names);
    spdlog::error("unknown command '{}'{}; `trainer --help` lists the commands", args[0],
                  near.empty() ? std::string() : "; did you mean " + near + "?");
    return kExitBadInput;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitBadInput;
  } catch (const InputError& e) {
    spdlog::error("{}", e.what());
    dist::write_error_file(e.what());
    return kExitBadInput;
  } catch (const DeviceError& e) {
    spdlog::error("{}", e.what());
    dist::write_error_file(e.what());
    return kExitBadInput;
  } catch (const c10::Error& e) {  // LibTorch's own: its message without the C++ stack frames
    spdlog::error("{}", e.what_without_backtrace());
    dist::write_error_file(e.what_without_backtrace());
    return kExitFailure;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    dist::write_error_file(e.what());
    return kExitFailure;
  }
  return exit_code;
}
