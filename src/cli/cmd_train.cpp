#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "commands.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/run_dir.h"
#include "headroom/core/text.h"
#include "headroom/memory/estimate.h"
#include "headroom/memory/starvation.h"
#include "headroom/train/trainer.h"

namespace headroom::cli {

namespace fs = std::filesystem;

namespace {

// Keys a resumed run may change: where and how fast it runs, never what it computes.
const std::set<std::string> kResumableKeys = {"device", "threads", "data.workers", "data.prefetch", "log.level"};

// The checkpoint's own config (so the run continues as it started), plus the allowed overrides.
Config resume_config(const std::string& checkpoint, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (!kResumableKeys.count(key))
      throw InputError("command line '" + o + "': " + key + " cannot change when resuming (the run continues with the config "
                       "stored in " + checkpoint + "); only device, threads, data.workers, data.prefetch and log.level can. "
                       "Start a new run with model.init_from=" + checkpoint + " to change it.");
  }
  const std::string yaml = train::checkpoint_config_yaml(checkpoint);
  const std::string tmp = (fs::temp_directory_path() / ("headroom-resume-" + std::to_string(::getpid()) + ".yaml")).string();
  write_file_atomic(tmp, yaml);
  try {
    Config c = load_run_config(tmp, overrides);
    fs::remove(tmp);
    c.source = checkpoint;
    return c;
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("train", "Train a detector (the default: `trainer --config C` means `trainer train --config C`)");
  static std::string config_path, resume;
  static std::vector<std::string> overrides;
  cmd->add_option("--config,-c", config_path, "Run config (YAML)");
  cmd->add_option("overrides", overrides, "key=value config overrides");
  auto* resume_opt = cmd->add_option("--resume", resume,
                                     "Continue a run: a checkpoint file, or auto (the newest loadable checkpoint of "
                                     "project/name*; the default when the flag has no value)")
                         ->expected(0, 1);
  cmd->callback([&exit_code, resume_opt] {
    Config c;
    std::string checkpoint, run_dir;
    if (resume_opt->count() > 0) {
      if (resume.empty() || resume == "auto") {
        const Config base = load_run_config(config_path, {});
        checkpoint = train::find_resume_checkpoint(base.project, base.name);
        if (checkpoint.empty())
          throw InputError("--resume auto: no loadable checkpoint under " + (fs::path(base.project) / (base.name + "*")).string() +
                           "/weights; start the run without --resume");
      } else {
        checkpoint = resume;
      }
      const fs::path weights_dir = fs::absolute(checkpoint).parent_path();
      if (weights_dir.filename() != "weights")
        throw InputError(checkpoint + ": --resume continues a run in its own directory, so it takes a checkpoint in "
                         "<project>/<name>/weights/; to start a new run from these weights, use model.init_from=" + checkpoint);
      c = resume_config(checkpoint, overrides);
      run_dir = weights_dir.parent_path().string();
      add_log_file((fs::path(run_dir) / "train.log").string());
    } else {
      if (config_path.empty()) throw InputError("train: give --config C (configs/ has examples), or --resume");
      c = load_run_config(config_path, overrides);
    }
    const c10::Device device = run_device(c);
    memory::apply_allocator_settings(c.memory, device);  // before the first CUDA allocation
    std::shared_ptr<memory::MemoryMonitor> monitor = memory::make_memory_monitor(device);  // before the model: counts it
    const int64_t budget = memory::resolve_budget(c.memory.budget, *monitor);
    auto train_split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    if (c.train.batch_auto) {
      const memory::AutoBatch a = memory::choose_batch(c, train_split, *monitor, budget);
      std::string tried;
      for (const auto& [b, peak] : a.tried)
        tried += fmt::format("{}{}: {}", tried.empty() ? "" : ", ", b, peak < 0 ? std::string("out of memory") : format_bytes(double(peak)));
      spdlog::info("train.batch auto: {} (the largest step under {} of the {} budget; steps tried: {}); accumulation {} keeps "
                   "train.nominal_batch {}",
                   a.batch, format_bytes(double(a.estimate.usable)), format_bytes(double(budget)), tried,
                   train::accumulation_steps(c.train.nominal_batch, a.batch), c.train.nominal_batch);
      c.train.batch = int(a.batch);
      c.train.batch_auto = false;  // the run's config and checkpoints record the size chosen, so resume keeps it
    }
    std::shared_ptr<memory::CheckpointPlanner> planner;
    if (c.memory.activation_checkpointing == CheckpointMode::auto_) planner = memory::make_checkpoint_planner(c, train_split, *monitor, budget);
    if (run_dir.empty()) run_dir = open_run_dir(c);
    train::Trainer trainer(train::make_trainer_parts(c, device, run_dir, train_split, train::load_val_split(c)));
    monitor->set_limit(budget);  // enforced with or without the governor
    // The governor first: its after_step reads the step's own peak before evaluation adds to it.
    if (c.memory.governor) trainer.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::governor_options(c, budget)));
    trainer.register_hook(std::make_unique<memory::StarvationHook>(memory::starvation_options(c)));
    train::register_default_hooks(trainer);
    if (planner)
      trainer.set_checkpoint_planner([planner, logged = std::make_shared<std::set<std::pair<int64_t, int64_t>>>()](int64_t size, int64_t micro) {
        const memory::StagePlan& p = planner->plan(size, micro);
        if (logged->insert({size, micro}).second) spdlog::info("{}", planner->describe(p, size, micro));
        return p.checkpointed;
      });
    if (!checkpoint.empty()) trainer.load_checkpoint(checkpoint);
    train::install_interrupt_handler();
    trainer.train();
    exit_code = trainer.state().exit_code;
  });
}

}  // namespace headroom::cli
