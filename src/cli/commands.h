// Subcommands of `trainer`. Each add_* registers one on the app; its callback stores the
// process exit code in `exit_code`. Errors are thrown and mapped to exit codes by main().
#pragma once

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"

namespace headroom::data {
struct Split;
}

namespace headroom::cli {

void add_version_command(CLI::App& app, int& exit_code);
void add_config_command(CLI::App& app, int& exit_code);
void add_data_command(CLI::App& app, int& exit_code);
void add_model_command(CLI::App& app, int& exit_code);
void add_val_command(CLI::App& app, int& exit_code);
void add_predict_command(CLI::App& app, int& exit_code);
void add_train_command(CLI::App& app, int& exit_code);
void add_memory_command(CLI::App& app, int& exit_code);
void add_export_command(CLI::App& app, int& exit_code);

// Loads --config plus key=value overrides and applies the process-wide settings
// (log level, intra-op threads). Every subcommand that takes a config goes through here.
Config load_run_config(const std::string& path, const std::vector<std::string>& overrides);

// The device a run uses (device policy): a CUDA request that cannot be met throws DeviceError;
// `auto` falling back to the CPU logs a warning with the reason.
c10::Device run_device(const Config& c);

// The process's command line as main() received it (argv[0] first): `--nproc` starts it again.
const std::vector<std::string>& program_args();
void set_program_args(std::vector<std::string> args);

// Refuses an output path (given by `flag`) that is one of the command's inputs: the config, the
// data YAML, a split's annotations, list or record file, an image or label file of `split`, or a
// path inside a folder the split lists (the next scan would take the file for an image).
// InputError naming both and the fix. `split` may be null.
void check_output_path(const std::string& out, const std::string& flag, const std::string& config_path, const Config& c,
                       const data::Split* split);

// Prints a JSON document on stdout (one line when `compact`).
void print_json(const Json& j);

}  // namespace headroom::cli
