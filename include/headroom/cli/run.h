// A training run assembled from its config, in one place: the memory monitor (before the model,
// so the CPU allocator counts it), the budget, train.batch auto and the recompute planner, the
// run directory, the trainer's parts, the memory governor as the step executor, the starvation
// monitor, the default hooks, and a resumed checkpoint. `trainer train`, the benchmarks and the
// tests build their runs here.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

#include "headroom/core/config.h"
#include "headroom/core/run_dir.h"
#include "headroom/train/memory_monitor.h"
#include "headroom/data/dataset.h"
#include "headroom/dist/group.h"
#include "headroom/memory/governor.h"
#include "headroom/train/trainer.h"

namespace headroom::cli {

struct RunOptions {
  std::string run_dir;                               // "" = a new one under project/name (rank 0)
  std::shared_ptr<RunDirLock> run_dir_lock;          // run_dir's, taken by the caller (a resume); a new folder's is taken here
  std::string checkpoint;                            // a checkpoint to resume from
  std::shared_ptr<dist::Group> group;                // null = one process
  std::shared_ptr<const data::Split> train, val;     // train null = the config's splits (val: when it has one); val null beside a train = none
  bool default_hooks = true;                         // schedule, EMA, guards, evaluation, logs, plots, checkpoints
  std::function<void(train::TrainerParts&)> adjust;  // changes the parts before the trainer is built (tests: their loss)
};

struct Run {
  Config config;                            // as the run trains: train.batch auto resolved
  c10::Device device = c10::Device(c10::kCPU);
  int64_t budget = 0;                       // memory.budget in bytes, less a data.cache=ram's images on the CPU
  std::shared_ptr<MemoryMonitor> monitor;
  std::shared_ptr<RunDirLock> run_dir_lock;  // before the trainer: released after its last checkpoint is written
  std::unique_ptr<train::Trainer> trainer;  // its first hook is the governor, which runs its steps
  memory::Governor* governor = nullptr;     // owned by the trainer
};

Run build_run(Config c, c10::Device device, RunOptions options = {});

// The budget the tensors get beside data.cache=ram's decoded training images on the CPU (the
// budget itself elsewhere); a cache over half the budget is not made: c.data.cache becomes none.
int64_t budget_beside_ram_cache(Config& c, int64_t budget, const data::Split& train, const data::Split* val, c10::Device device);

}  // namespace headroom::cli
