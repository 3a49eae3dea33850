#include <cstdio>

#include "commands.h"
#include "headroom/cli/run.h"
#include "headroom/core/logging.h"
#include "headroom/data/dataset.h"
#include "headroom/memory/estimate.h"
#include "headroom/train/parts.h"

namespace headroom::cli {

void add_memory_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("memory", "Estimate a run's training memory by probing real steps: the table per part and "
                                           "per model stage, totals for fp32 / AMP / AMP + recompute, the largest batch "
                                           "under the budget");
  static std::string config_path, budget;
  static std::vector<std::string> overrides;
  static bool json = false;
  cmd->add_option("--config,-c", config_path, "Run config (YAML)")->required();
  cmd->add_option("--budget", budget, "Memory budget (memory.budget): 8GiB, 512MiB, a fraction of the device, or auto");
  cmd->add_flag("--json", json, "Print JSON");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  cmd->callback([&exit_code] {
    std::vector<std::string> o = overrides;
    if (!budget.empty()) o.push_back("memory.budget=" + budget);
    Config c = load_run_config(config_path, o);
    const c10::Device device = run_device(c);
    memory::apply_allocator_settings(c.memory, device);
    const std::unique_ptr<MemoryMonitor> monitor = memory::make_memory_monitor(device);
    const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    // As `trainer train` has it: on the CPU a RAM cache's images come off the tensors' share.
    const int64_t bytes = budget_beside_ram_cache(c, memory::resolve_budget(c.memory.budget, *monitor), *split,
                                                  train::load_val_split(c).get(), device);
    const memory::MemoryEstimate e = memory::estimate_memory(c, split, *monitor, bytes);
    if (json)
      print_json(memory::memory_estimate_json(e));
    else
      std::fputs(memory::format_memory_estimate(e).c_str(), stdout);
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
