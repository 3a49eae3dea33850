#include <cstdio>

#include "commands.h"

namespace headroom::cli {

void add_config_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("config", "Print the resolved configuration, every key with its value or default");
  static std::string path;
  static std::vector<std::string> overrides;
  static bool json = false;
  cmd->add_option("--config,-c", path, "Config YAML (omitted: defaults only)");
  cmd->add_option("overrides", overrides, "key=value overrides, e.g. train.batch=16 data.workers=4");
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    const Config c = load_run_config(path, overrides);
    if (json)
      print_json(config_to_json(c));
    else
      std::printf("%s", config_to_yaml(c).c_str());
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
