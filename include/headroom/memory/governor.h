// The memory governor keeps a run inside its memory budget. It is the run's step executor
// (train/step.h) and a hook:
//  - as the executor it runs each step's loader batches in micro-batches of its size, with the
//    recompute plan for their input size (memory.activation_checkpointing: auto), and owns the
//    recovery: an out-of-memory error anywhere in the step (forward, loss, backward, update) is
//    undone — gradients dropped, BatchNorm statistics restored from a snapshot taken when the
//    step began — then the ladder is climbed (halve the micro-batch, never below the smallest the
//    model trains at; there recompute every stage; then AMP when memory.allow_amp) and the same
//    batches run again; with nothing
//    left to give up, or with memory.governor off, the run stops with the memory table and what
//    to change;
//  - before training it enforces the budget and checks that the model, EMA and optimizer state
//    are on the run's device; after each step (from the trainer's step memory: host-side
//    allocator counters, no sync) it shrinks pre-emptively when the peak crosses budget -
//    headroom or allocator retries grow on consecutive steps (thrashing), and optionally grows
//    back after a stable stretch; an out-of-memory error in validation halves the validation
//    batch, one in the loader climbs the same ladder;
//  - at each epoch's end it reads the process's resident memory (host RSS: on the CPU the tensors
//    and everything else; on CUDA the host side the seed user's RAM filled) and logs it. On the
//    CPU the budget bounds the process: what the process holds beyond its tensors and beyond
//    what it held when training began (validation, the decoded cache, checkpoint writing) is
//    taken off the tensors' limit, so growth there is counted, not added on top.
//  - on several ranks it decides with the others (Trainer::agree_step before each update): an
//    out-of-memory error on any rank makes every rank undo the attempt and climb the same rung;
//    a pre-emptive shrink is voted and applies to all from the next step; no grow-back.
// Every decision is logged with its reason and saved in checkpoints (its registry entry).
// Register it first among the hooks: its after_step judges the step's own peak.
#pragma once

#include <torch/arg.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/memory/monitor.h"
#include "headroom/train/trainer.h"

namespace headroom::memory {

class RecomputePlanner;

struct GovernorOptions {
  TORCH_ARG(int64_t, budget) = 0;        // bytes; 0 = no limit enforced
  TORCH_ARG(double, headroom) = 0.10;
  TORCH_ARG(bool, recover) = true;       // memory.governor: false = an OOM stops the run (with the table)
  TORCH_ARG(bool, allow_amp) = true;
  TORCH_ARG(int64_t, grow_after) = 0;    // steps without pressure before doubling back; 0 = never
  TORCH_ARG(int64_t, retry_steps) = 2;   // consecutive steps with new allocator retries that count as thrashing
  TORCH_ARG(int64_t, imgsz) = 640;       // the run's canvas, for the advice when nothing is left
};
GovernorOptions governor_options(const Config& c, int64_t budget);

// A change the governor made, with its reason.
struct MemoryDecision {
  int64_t step = 0;     // the optimizer step it applies from (1-based)
  std::string action;   // "micro_batch 8 -> 4", "activation_checkpointing all", "amp bf16", ...
  std::string reason;
};

class Governor final : public train::Hook, public train::StepExecutor {
 public:
  // `planner`: memory.activation_checkpointing: auto (null = the model's own recompute mode).
  explicit Governor(GovernorOptions options, std::shared_ptr<RecomputePlanner> planner = nullptr);

  void run(train::Trainer& t, const std::vector<data::HostBatch>& batches) override;

  void before_train(train::Trainer& t) override;
  void after_step(train::Trainer& t) override;
  void before_epoch(train::Trainer& t) override;
  void before_step(train::Trainer& t) override;
  void after_epoch(train::Trainer& t) override;
  bool on_oom(train::Trainer& t, const c10::Error& e, train::OomSite site) override;
  std::string state_name() const override { return "governor"; }
  Json save_state() const override;
  void load_state(const Json& j) override;

  // Images per forward and backward: at most the loader batch.
  int64_t micro_batch(const train::Trainer& t) const;
  // The smallest micro-batch the model trains at (the loader's min_batch).
  static int64_t least(const train::Trainer& t);
  // A loader batch of n images in parts of at most `micro` images, balanced so that none is
  // below `smallest` where n allows it (7 by 2 with least 2: 3, 2, 2 — not 2, 2, 2, 1).
  static std::vector<int64_t> split(int64_t n, int64_t micro, int64_t smallest);
  static int64_t parts(int64_t n, int64_t micro, int64_t smallest);  // how many split makes
  // n images in exactly `parts` parts (n >= parts), the larger first: every rank cuts its share
  // of a batch into as many parts, SyncBatchNorm exchanging once each.
  static std::vector<int64_t> distribute(int64_t n, int64_t parts);
  void set_micro_batch(int64_t images) { micro_ = images; }
  const std::vector<MemoryDecision>& decisions() const { return decisions_; }

 private:
  // `from`: the first step the decision applies to (0: the step in progress, or the next one
  // once it has ended).
  void record(train::Trainer& t, std::string action, std::string reason, int64_t from = 0);
  void shrink(train::Trainer& t, const std::string& reason, int64_t from = 0);
  // One rung of the ladder for an error in a step or the loader; throws when none is left.
  void climb(train::Trainer& t, const std::string& what, MemoryFailure kind);
  void after_validation(train::Trainer& t);
  void forget_retries(train::Trainer& t);
  void take_growth_off(train::Trainer& t, int64_t growth, const MemoryStats& s);
  [[noreturn]] void give_up(train::Trainer& t, const std::string& what, const std::string& why);
  void apply_plan(train::Trainer& t, int64_t size, int64_t micro);
  MemoryMonitor& monitor(train::Trainer& t) const;

  GovernorOptions o_;
  std::shared_ptr<RecomputePlanner> planner_;
  int64_t micro_ = 0;            // 0 = the loader batch
  bool recompute_all_ = false;   // the ladder's rung, over the plan
  std::vector<MemoryDecision> decisions_;
  std::vector<bool> plan_;       // the stages recomputed now
  std::string pressure_;         // several ranks: why this rank asks to shrink at the next agreement
  bool loader_oom_waiting_ = false;  // several ranks: a loader OOM waits for that agreement
  std::set<std::pair<int64_t, int64_t>> plans_logged_;
  int64_t other_at_start_ = 0;  // host RSS beyond the tensors when training began
  int64_t other_growth_ = 0;    // CPU: its growth since, taken off the tensors' budget
  int64_t eval_step_seen_ = -1;  // the validation whose memory growth was last taken off
  int64_t last_retries_ = 0, retry_run_ = 0, calm_steps_ = 0, epoch_peak_ = 0, epoch_peak_reserved_ = 0,
          retries_at_start_ = 0, ooms_at_start_ = 0, peak_so_far_ = 0;
};

// Refuses (DeviceError naming the tensor) a model, EMA or optimizer state that is not on the
// trainer's device: training never runs on the CPU by accident.
void check_on_device(train::Trainer& t);
void check_tensors_on(c10::Device device, const char* what, const std::vector<at::Tensor>& tensors);

// The memory a step needs whatever the batch: parameters, gradients, optimizer state, EMA.
struct StaticMemory {
  int64_t parameters = 0, gradients = 0, optimizer = 0, ema = 0;
  int64_t total() const { return parameters + gradients + optimizer + ema; }
};
StaticMemory static_memory(train::Trainer& t);

}  // namespace headroom::memory
