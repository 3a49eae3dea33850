#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "commands.h"
#include "headroom/cli/run.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/dist/group.h"
#include "headroom/dist/launch.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/hooks.h"
#include "headroom/train/trainer.h"

namespace headroom::cli {

namespace fs = std::filesystem;

namespace {

// Keys a resumed run may change: where and how fast it runs, never what it computes.
const std::set<std::string> kResumableKeys = {"device", "threads", "data.workers", "data.prefetch", "log.level"};
// Keys that say which run to resume (--resume auto looks under project/name*); the run stays in
// its own directory.
const std::set<std::string> kRunLocation = {"project", "name"};

// The key of key=value, as the config loader reads it (spaces around it dropped).
std::string key_of(const std::string& override_text) { return std::string(trim(override_text.substr(0, override_text.find('=')))); }

// The checkpoint's own config (so the run continues as it started) in the run directory it
// lives in, plus the allowed overrides.
Config resume_config(const std::string& checkpoint, const std::string& run_dir, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    const std::string key = key_of(o);
    if (!kResumableKeys.count(key))
      throw InputError("command line '" + o + "': " + key + " cannot change when resuming (the run continues with the config "
                       "stored in " + checkpoint + "); only device, threads, data.workers, data.prefetch and log.level can. "
                       "Start a new run with model.init_from=" + checkpoint + " to change it.");
  }
  const fs::path dir(run_dir);
  std::vector<std::string> all = overrides;
  all.push_back("project=" + dir.parent_path().string());
  all.push_back("name=" + dir.filename().string());
  const std::string yaml = train::checkpoint_config_yaml(checkpoint);
  const std::string tmp = (fs::temp_directory_path() / ("headroom-resume-" + std::to_string(::getpid()) + ".yaml")).string();
  write_file_atomic(tmp, yaml);
  // Origins and errors name the checkpoint, not the temporary file that is gone when they are read.
  const std::string stored = checkpoint + " (its stored config)";
  try {
    Config c = load_run_config(tmp, all);
    fs::remove(tmp);
    c.source = checkpoint;
    for (auto& [key, origin] : c.origin) origin = replace_all(origin, tmp, stored);
    return c;
  } catch (const InputError& e) {
    fs::remove(tmp);
    throw InputError(replace_all(e.what(), tmp, stored));
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
}


// The command's options (static in add_train_command: CLI11 binds them by reference).
struct TrainArgs {
  std::string config_path, resume;
  std::vector<std::string> overrides;
  int nproc = 1;
};

// Returns --resume, whose count says whether it was given.
CLI::Option* add_train_options(CLI::App& cmd, TrainArgs& a) {
  cmd.add_option("--config,-c", a.config_path, "Run config (YAML)");
  cmd.add_option("--nproc", a.nproc,
                 "Local worker processes training together (one per GPU, or CPU processes on Gloo); torchrun's "
                 "environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is honoured without it")
      ->check(CLI::Range(1, 4096));
  cmd.add_option("overrides", a.overrides, "key=value config overrides");
  return cmd.add_option("--resume", a.resume,
                        "Continue a run: a checkpoint file, or auto (the newest loadable checkpoint of "
                        "project/name*; the default when the flag has no value)")
      ->expected(0, 1);
}

// --nproc N: runs this command line, without --nproc, in N local worker processes; their exit code.
int launch_local_workers(int nproc, const dist::WorldInfo& world) {
  if (world.distributed())
    throw InputError("--nproc " + std::to_string(nproc) + " inside a distributed launch (WORLD_SIZE=" + std::to_string(world.world) +
                     "): drop --nproc; torchrun already started the workers");
  std::vector<std::string> args;  // this command line, without --nproc
  const std::vector<std::string>& all = program_args();
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i] == "--nproc") {
      ++i;
      continue;
    }
    if (all[i].rfind("--nproc=", 0) == 0) continue;
    args.push_back(all[i]);
  }
  return dist::launch_local(all.front(), args, dist::LaunchOptions().nproc(nproc));
}

// What --resume continues: the checkpoint and the run directory it lives in.
struct ResumePoint {
  std::string checkpoint, run_dir;
  std::vector<std::string> overrides;  // all but project= and name= (those only find the run)
  std::optional<Config> given;         // --config, where one was given: it only says where the run is
};

// The settings of `c` as "section.key" -> JSON text.
std::map<std::string, std::string> flat_values(const Json& j, const std::string& prefix = "") {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.members()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      for (auto& [k, v] : flat_values(value, path)) out[k] = std::move(v);
    } else {
      out[path] = value.dump();
    }
  }
  return out;
}

// A resumed run continues with the config its checkpoint stored, as Ultralytics' resume does: a
// --config given beside --resume that sets other values is said to be ignored, key by key (an
// `auto` the run resolved when it started is not a difference, nor what train.optimizer: auto set).
void warn_ignored_settings(const Config& given, const Config& resumed, const std::string& checkpoint) {
  const auto mine = flat_values(config_to_json(given)), run = flat_values(config_to_json(resumed));
  const std::set<std::string> chosen_by_auto =
      given.train.optimizer == "auto" ? std::set<std::string>{"train.optimizer", "train.lr0", "train.momentum", "train.warmup_bias_lr"}
                                      : std::set<std::string>{};
  for (const auto& [key, origin] : given.origin) {
    if (kResumableKeys.count(key) || kRunLocation.count(key) || key == "exist_ok" || chosen_by_auto.count(key)) continue;
    const auto a = mine.find(key), b = run.find(key);
    if (a == mine.end() || b == run.end() || a->second == b->second || a->second == "\"auto\"") continue;
    spdlog::warn("{}: {} {} is ignored: the resumed run keeps its own {} (stored in {}); start a new run with model.init_from={} "
                 "to change it",
                 origin, key, a->second, b->second, checkpoint, checkpoint);
  }
}

ResumePoint find_resume_point(TrainArgs& a) {
  // `--resume name=x` : the flag takes no path there, the word is an override.
  if (a.resume.find('=') != std::string::npos && !fs::exists(a.resume)) {
    a.overrides.push_back(a.resume);
    a.resume.clear();
  }
  ResumePoint r;
  std::vector<std::string> location;
  for (const auto& o : a.overrides) (kRunLocation.count(key_of(o)) ? location : r.overrides).push_back(o);
  const Config base = load_run_config(a.config_path, location);  // project and name as given, else the config's
  if (!a.config_path.empty()) r.given = base;
  if (a.resume.empty() || a.resume == "auto") {
    r.checkpoint = train::find_resume_checkpoint(base.project, base.name);
    if (r.checkpoint.empty())
      throw InputError("--resume auto: no loadable checkpoint under " + (fs::path(base.project) / (base.name + "*")).string() +
                       "/weights; start the run without --resume");
  } else {
    r.checkpoint = a.resume;
  }
  const fs::path weights_dir = fs::absolute(r.checkpoint).parent_path();
  if (weights_dir.filename() != "weights")
    throw InputError(r.checkpoint + ": --resume continues a run in its own directory, so it takes a checkpoint in "
                     "<project>/<name>/weights/; to start a new run from these weights, use model.init_from=" + r.checkpoint);
  r.run_dir = weights_dir.parent_path().string();
  if (!a.resume.empty() && a.resume != "auto" && !location.empty() &&
      fs::weakly_canonical(fs::path(base.project) / base.name) != fs::weakly_canonical(r.run_dir))
    throw InputError("--resume " + r.checkpoint + " continues the run in " + r.run_dir + ", not in " +
                     (fs::path(base.project) / base.name).string() + "; drop project=/name=, or resume with --resume auto "
                     "to pick that run's newest checkpoint");
  return r;
}

// The run's device; in a distributed run on CUDA, this rank's GPU (cuda:LOCAL_RANK).
c10::Device rank_device(const Config& c, const dist::WorldInfo& world) {
  c10::Device device = run_device(c);
  if (world.distributed() && device.is_cuda()) {
    if (c.device != "auto" && c.device != "cuda")
      throw InputError(c.where("device") + ": device " + c.device + " on " + std::to_string(world.world) + " processes: each rank "
                       "takes cuda:LOCAL_RANK; set device=cuda (or auto)");
    const size_t gpus = query_cuda().devices.size();
    if (size_t(world.local_rank) >= gpus)  // NCCL cannot put two ranks on one GPU
      throw InputError("rank " + std::to_string(world.rank) + " takes cuda:" + std::to_string(world.local_rank) + ", but this machine has " +
                       std::to_string(gpus) + " CUDA device" + (gpus == 1 ? "" : "s") + ": start at most " + std::to_string(gpus) +
                       (gpus == 1 ? " process" : " processes") + " per machine (--nproc), or train on the CPU with device=cpu");
    device = c10::Device(c10::kCUDA, c10::DeviceIndex(world.local_rank));
  }
  return device;
}

// The train command's work once parsed; returns the process exit code.
int run_train(TrainArgs& a, bool resuming) {
  const dist::WorldInfo world = dist::world_from_env();
  if (a.nproc > 1) return launch_local_workers(a.nproc, world);
  if (world.distributed() && world.rank > 0) {
    // Rank 0 speaks for the run; the others report warnings and errors only, with their rank.
    spdlog::default_logger()->set_pattern("%^%L%$ %H:%M:%S [rank " + std::to_string(world.rank) + "] %v");
  }
  Config c;
  std::string checkpoint, run_dir;
  std::shared_ptr<RunDirLock> run_dir_lock;
  if (resuming) {
    const ResumePoint r = find_resume_point(a);
    checkpoint = r.checkpoint;
    run_dir = r.run_dir;
    c = resume_config(checkpoint, run_dir, r.overrides);
    if (world.rank == 0) {
      run_dir_lock = std::make_shared<RunDirLock>(run_dir);  // a run still training there is not resumed beside itself
      add_log_file((fs::path(run_dir) / "train.log").string());
    }
    if (r.given && world.rank == 0) warn_ignored_settings(*r.given, c, checkpoint);
  } else {
    if (a.config_path.empty()) throw InputError("train: give --config C (configs/ has examples), or --resume");
    c = load_run_config(a.config_path, a.overrides);
  }
  if (world.rank > 0 && spdlog::default_logger()->level() < spdlog::level::warn) spdlog::default_logger()->set_level(spdlog::level::warn);
  const c10::Device device = rank_device(c, world);
  set_current_device(device);  // before any CUDA call: no rank opens a context on GPU 0
  memory::apply_allocator_settings(c.memory, device);  // before the first CUDA allocation
  std::shared_ptr<dist::Group> group;
  if (world.distributed())
    group = std::make_shared<dist::Group>(world, dist::GroupOptions().backend(c.distributed.backend).timeout(c.distributed.timeout),
                                          device);
  cli::RunOptions options;
  options.run_dir = run_dir;
  options.run_dir_lock = std::move(run_dir_lock);
  options.checkpoint = checkpoint;
  options.group = group;
  Run run = build_run(std::move(c), device, std::move(options));
  train::install_interrupt_handler(world.rank == 0);
  run.trainer->train();
  return run.trainer->state().exit_code;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("train", "Train a detector (the default: `trainer --config C` means `trainer train --config C`)");
  static TrainArgs args;
  CLI::Option* resume_opt = add_train_options(*cmd, args);
  cmd->callback([&exit_code, resume_opt] { exit_code = run_train(args, resume_opt->count() > 0); });
}

}  // namespace headroom::cli
