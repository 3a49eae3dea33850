#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "headroom/core/files.h"
#include "headroom/data/pipeline_data.h"
#include "headroom/interop/pipeline_config.h"

namespace headroom::cli {

namespace {

// `config convert pipeline.config -o run.yaml`: the Headroom config a TF OD API pipeline means.
CLI::App* add_convert(CLI::App& config, int& exit_code) {
  auto* cmd = config.add_subcommand("convert", "Write the Headroom config a TF OD API pipeline.config means, a comment per key");
  static std::string pipeline, out;
  cmd->add_option("pipeline", pipeline, "The pipeline.config")->required();
  cmd->add_option("-o,--out", out, "YAML to write (omitted: print it)");
  cmd->callback([&exit_code] {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(pipeline, ec)) throw InputError(pipeline + ": not found, or not a file");
    if (!data::is_pipeline_config(pipeline))
      throw InputError(pipeline + ": not a TF OD API pipeline config (protobuf text starting with model { ... })");
    if (!out.empty() && std::filesystem::equivalent(pipeline, out, ec))  // through links too
      throw InputError("--out " + out + " is the pipeline.config itself; the YAML would replace it: choose another --out");
    const interop::PipelineConfig p = interop::read_pipeline_config(pipeline);
    const std::string yaml = interop::pipeline_to_yaml(p, pipeline);
    load_run_config(pipeline, {});  // what `trainer train --config` would refuse is refused here too
    if (out.empty()) {
      std::printf("%s", yaml.c_str());
    } else {
      write_file_atomic(out, yaml);
      std::printf("wrote %s (%zu keys; %zu fields read without an effect, listed at its top)\n", out.c_str(),
                  p.settings.size(), p.notes.size());
    }
    exit_code = kExitOk;
  });
  return cmd;
}

}  // namespace

void add_config_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("config", "Print the resolved configuration, every key with its value or default");
  static std::string path;
  static std::vector<std::string> overrides;
  static bool json = false;
  cmd->add_option("--config,-c", path, "Config YAML or TF OD API pipeline.config (omitted: defaults only)");
  cmd->add_option("overrides", overrides, "key=value overrides, e.g. train.batch=16 data.workers=4");
  cmd->add_flag("--json", json, "Print JSON");
  CLI::App* convert = add_convert(*cmd, exit_code);
  cmd->callback([&exit_code, convert] {
    if (convert->parsed()) return;
    const Config c = load_run_config(path, overrides);
    if (json)
      print_json(config_to_json(c));
    else
      std::printf("%s", config_to_yaml(c).c_str());
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
