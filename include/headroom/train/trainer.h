// The training loop (detectron2's shape): Trainer::run_step fetches one optimizer step's loader
// batches and hands them to a StepExecutor (train/step.h), which runs forward and backward over
// them and the update. Everything else — schedule, EMA, evaluation, checkpoints, logs, plots,
// Ctrl-C, the memory governor — is a Hook, and every stateful part saves its own entry in the
// StateRegistry (train/state.h) that checkpoints are written from.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "headroom/augment/augment.h"
#include "headroom/core/config.h"
#include "headroom/core/json.h"
#include "headroom/core/memory.h"
#include "headroom/data/cache.h"
#include "headroom/data/dataset.h"
#include "headroom/data/loader.h"
#include "headroom/dist/group.h"
#include "headroom/eval/coco_eval.h"
#include "headroom/eval/validate.h"
#include "headroom/losses/loss.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "headroom/train/ema.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/schedule.h"
#include "headroom/train/state.h"
#include "headroom/train/step.h"

namespace headroom::train {

class Trainer;

bool interrupt_requested();  // Ctrl-C was pressed (train/hooks.h)

// Points inside a step where hooks may look (the memory estimator reads the allocator there):
// after the step's batches are on the device and augmented, and for every part after its
// forward, its loss and its backward; then after the update.
enum class StepPhase { input, forward, loss, backward, update };

// Where an out-of-memory error struck outside the step executor.
enum class OomSite { validation, data };

class Hook {
 public:
  virtual ~Hook() = default;
  virtual void before_train(Trainer&) {}
  virtual void before_epoch(Trainer&) {}
  virtual void before_step(Trainer&) {}
  virtual void after_phase(Trainer&, StepPhase) {}
  virtual void after_step(Trainer&) {}
  virtual void after_epoch(Trainer&) {}
  virtual void after_train(Trainer&) {}
  // An out-of-memory error in a validation pass or in the loader; return true when handled
  // (something was freed or made smaller): the pass, or the fetch, runs again.
  virtual bool on_oom(Trainer&, const c10::Error&, OomSite) { return false; }
  // State carried in checkpoints under this name ("" = none), as JSON.
  virtual std::string state_name() const { return ""; }
  virtual Json save_state() const { return Json(); }
  virtual void load_state(const Json&) {}
};

struct TrainerOptions {
  TORCH_ARG(int64_t, batch) = 16;           // images per loader batch
  TORCH_ARG(int64_t, nominal_batch) = 64;   // images per optimizer step: round(nominal / batch) loader batches
  TORCH_ARG(int64_t, epochs) = 100;
  TORCH_ARG(int64_t, steps) = 0;            // optimizer steps; > 0 overrides epochs
  TORCH_ARG(double, weight_decay) = 5e-4;   // scaled by the images per step relative to nominal_batch
  TORCH_ARG(OptimizerOptions, optimizer) = {};
  TORCH_ARG(ScheduleOptions, schedule) = {};  // the trainer fills in total_steps, and warmup_steps when 0
  TORCH_ARG(double, warmup_epochs) = 3.0;
  TORCH_ARG(AmpMode, amp) = AmpMode::off;   // resolved for the device (never auto)
  TORCH_ARG(double, clip_grad) = 10.0;      // 0 = off
  TORCH_ARG(double, ema_decay) = 0.9999;
  TORCH_ARG(double, ema_tau) = 2000;
  TORCH_ARG(int64_t, read_every) = 10;      // steps between reads of the device counters (a host sync each)
  TORCH_ARG(bool, keep_first_batch) = true; // a host copy of the first augmented batch, for plots (a sync, once)
  TORCH_ARG(std::string, config_yaml) = ""; // the run's resolved config, stored in checkpoints for resume
  TORCH_ARG(int64_t, world) = 1;            // processes training together; each loads `batch` images per loader batch
  TORCH_ARG(bool, sync_bn) = false;         // BatchNorm statistics over every rank's images
};
// The train section (and the device's precision) as trainer options.
TrainerOptions trainer_options(const Config& c, c10::Device device);

// How long a run is, from its options and the loader's batches per epoch.
struct RunLength {
  int64_t accumulate = 1;       // loader batches per optimizer step
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 1;
  int64_t epochs = 1;
};
RunLength run_length(const TrainerOptions& o, int64_t batches_per_epoch);
// Loader batches summed per optimizer step: Ultralytics' max(round(nominal / batch), 1), where
// batch is the images of one loader batch over all ranks.
int64_t accumulation_steps(int64_t nominal_batch, int64_t batch);

// Where the run stands. The loader cursor (epoch, batch) also says whether an epoch's end is
// done: batch == batches per epoch means its steps are done and its end (validation, results
// row, last.pt) is not; the end moves the cursor to (epoch + 1, 0).
struct TrainState {
  int64_t epoch = 0;          // current epoch, 0-based
  int64_t batch = 0;          // next loader batch of the epoch
  int64_t step = 0;           // optimizer steps done
  int64_t images = 0;         // images trained on
  double best_fitness = -1;   // best val AP .50:.95 so far
  int64_t best_step = -1;
  int64_t last_eval_step = -1;
  int64_t val_batch = 0;      // validation batch; 0 = the loader's (the memory governor lowers it)
  bool stop = false;          // a hook asks the loop to end after this step
  int exit_code = 0;          // what `trainer train` returns when a hook stopped the run
  std::string stop_reason;
};

// The device counters of a window of steps, read back in one host sync every read_every steps,
// at an epoch's last step and at the run's last step; a hook sees a fresh read when
// counters().step equals the current step.
struct StepCounters {
  int64_t step = -1;            // the step after which they were read
  int64_t steps = 0;            // optimizer steps in the window
  int64_t finite_steps = 0;     // ... with finite loss and gradients (the means cover these)
  std::vector<std::pair<std::string, double>> loss_sums;  // each term summed over the finite steps
  double skipped_steps = 0;     // non-finite steps skipped in the whole run
  double bad_run = 0;           // non-finite steps in a row, ending at the read
  double worst_bad_run = 0;     // the longest such run within the window
  double loss_scale = 0;        // 0 without a scaler
  // Why the window's first skipped step was skipped ("a non-finite loss term 'box'",
  // "non-finite gradients in parameter group 'norm'"); empty when no step was skipped.
  std::string skip_cause;
  // Each term's mean per finite step (NaN when none was finite).
  std::vector<std::pair<std::string, double>> losses() const;
};

// Everything a run is made of, built from the config in one place (make_trainer_parts).
struct TrainerParts {
  TrainerOptions options;
  c10::Device device = c10::Device(c10::kCPU);
  std::string run_dir;
  std::shared_ptr<const data::Split> train_split, val_split;  // val may be null
  data::LoaderOptions loader;
  eval::ValidateOptions validation;         // used when val_split is set
  models::Detector model{nullptr};
  models::Detector ema_copy{nullptr};       // a second model for the EMA (null = no EMA)
  std::unique_ptr<losses::DetectionLoss> loss;
  std::unique_ptr<augment::Augmenter> augmenter;  // null = no augmentation
  std::shared_ptr<MemoryMonitor> monitor;   // null = memory is not measured
  std::shared_ptr<dist::Group> group;       // null = one process
};
TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir);
// The config's val split, or null (with a warning) when the data set has none.
std::shared_ptr<const data::Split> load_val_split(const Config& c);
// The same with the splits already loaded (val may be null).
// `group`: the run's processes (null = one); each loads its share of every batch.
TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir,
                                std::shared_ptr<const data::Split> train, std::shared_ptr<const data::Split> val,
                                std::shared_ptr<dist::Group> group = nullptr);

// What the ranks agreed before a step's update (Trainer::agree_step).
struct StepAgreement {
  std::vector<int> failed;   // ranks whose part of the step failed (an out-of-memory error)
  std::vector<int> pressed;  // ranks whose memory asks for a smaller micro-batch
  bool interrupt = false;    // a rank was asked to stop (Ctrl-C): every rank stops after this step
};

class Trainer {
 public:
  explicit Trainer(TrainerParts parts);
  ~Trainer();

  // Hooks run in registration order; a hook with state gets a registry entry.
  void register_hook(std::unique_ptr<Hook> hook);
  // Who runs the steps: null = the direct executor. Not owned (the governor hook owns its own).
  void set_executor(StepExecutor* executor) { executor_ = executor; }

  // Runs until the step budget is spent or a hook stops it.
  void train();
  // One optimizer step: the step's loader batches (at most `accumulate`, fewer at an epoch
  // end), the executor, then the cursor and, at a read point, the counters.
  void run_step();

  // The step primitives executors compose. prepare_step copies the batches to the device
  // (non-blocking, from the loader's pinned memory), augments them, and counts the step's loss
  // normalisers; forward_backward runs images [start, start + len) of loader batch `batch`
  // under autocast and adds their (scaled) gradients; update unscales, checks for non-finite
  // values, clips, steps the optimizer and commits the counters.
  StepInput prepare_step(const std::vector<data::HostBatch>& batches);
  void forward_backward(const StepInput& in, size_t batch, int64_t start, int64_t length);
  void update();
  // Drops what a failed attempt left: gradients (and the step's running sums, reset by the next
  // prepare_step). BatchNorm statistics are the executor's to restore.
  void discard_gradients();

  // Several processes: the step's exchanges are the same on every rank and in each attempt —
  // the loss normalisers in prepare_step (device), the agreement before the update (host), the
  // gradients in update (device). A rank whose attempt failed calls abandon_step (the device
  // exchange it skipped, with zeros), then agree_step(true): every rank learns of it there, and
  // no rank waits on a collective another abandoned. One process: agree_step returns its own.
  StepAgreement agree_step(bool failed, bool pressed);
  void abandon_step();
  dist::Group* group() const { return group_.get(); }
  // Ctrl-C as the ranks agreed at the last step (one process: the signal itself), so every
  // rank stops after the same step even when the signal reaches them at different moments.
  bool interrupt_agreed() const { return group_ ? interrupt_agreed_ : interrupt_requested(); }
  int rank() const { return group_ ? group_->rank() : 0; }
  int64_t world() const { return options_.world(); }

  // Checkpoints: a weights file (the EMA, or the model without EMA) with the registry's entries
  // beside it. load restores everything; the loader restarts at the saved position.
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);
  StateRegistry& registry() { return registry_; }

  // Validation of the EMA (or the model) on the val split; nullopt when there is none. Records
  // the result as last_metrics() at this step. An out-of-memory error asks the hooks.
  std::optional<eval::CocoStats> validate();

  const StepCounters& counters() const { return counters_; }
  // This step's memory, sampled from the monitor after the update (peak since the step began);
  // nullopt without a monitor.
  const std::optional<MemoryStats>& step_memory() const { return step_memory_; }
  MemoryMonitor* monitor() { return monitor_.get(); }

  const TrainerOptions& options() const { return options_; }
  c10::Device device() const { return device_; }
  const std::string& run_dir() const { return run_dir_; }
  TrainState& state() { return state_; }
  models::DetectorImpl& model() { return *model_; }
  models::DetectorImpl& eval_model() { return ema_ ? *ema_->model() : *model_; }
  ModelEma* ema() { return ema_.get(); }
  Optimizer& optimizer() { return *optimizer_; }
  const Schedule& schedule() const { return *schedule_; }
  data::Loader& loader() { return *loader_; }
  const data::Loader& loader() const { return *loader_; }
  const data::Split& train_split() const { return *train_split_; }
  const data::Split* val_split() const { return val_split_.get(); }
  AmpMode amp() const { return amp_; }
  // Switches mixed precision on (bf16 on the CPU; on CUDA fp16 with a loss scaler); false when
  // it was on. Part of the run's state: a resume keeps it whatever its device would pick.
  bool enable_amp();
  const losses::DetectionLoss& loss() const { return *loss_; }
  int64_t accumulate() const { return length_.accumulate; }
  int64_t steps_per_epoch() const { return length_.steps_per_epoch; }
  int64_t total_steps() const { return length_.total_steps; }
  int64_t epochs() const { return length_.epochs; }
  // The first batch this process trained on, as the model saw it (augmented), for plots; null
  // until then, or when options().keep_first_batch() is off.
  const data::HostBatch* first_batch() const { return first_batch_ ? &*first_batch_ : nullptr; }
  double data_wait_seconds() const { return data_wait_; }  // this epoch's
  double step_seconds() const { return step_seconds_; }
  std::chrono::steady_clock::time_point start_time() const { return start_; }
  // The latest validation and the step it ran at (state().last_eval_step).
  const std::optional<eval::CocoStats>& last_metrics() const { return last_metrics_; }

 private:
  std::vector<data::HostBatch> next_batches();
  void begin_epoch();
  void end_epoch();
  bool counters_due() const;
  void read_counters();
  std::string skip_cause(double rank) const;
  void notify(StepPhase phase);
  void register_state();
  void set_amp(AmpMode m);
  void reduce_gradients();
  // Sums `tensors` in place over the ranks through grad_bucket_, each bucket times scale_in
  // before and scale_out after (undefined = 1).
  void sum_in_buckets(const std::vector<at::Tensor>& tensors, const at::Tensor& scale_in, const at::Tensor& scale_out,
                      const std::string& what);
  eval::CocoStats gather_validation(const eval::ValidationResult& mine);
  template <class F>
  void each_hook(F&& f) {
    for (auto& h : hooks_) f(*h);
  }

  TrainerOptions options_;
  c10::Device device_;
  std::string run_dir_;
  AmpMode amp_ = AmpMode::off;
  std::shared_ptr<const data::Split> train_split_, val_split_;
  eval::ValidateOptions validation_;
  std::shared_ptr<const data::DecodedCache> val_cache_;  // opened at the first validation, kept for the run
  models::Detector model_;
  std::unique_ptr<ModelEma> ema_;
  std::unique_ptr<losses::DetectionLoss> loss_;
  std::unique_ptr<augment::Augmenter> augmenter_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<data::Loader> loader_;
  std::shared_ptr<MemoryMonitor> monitor_;
  std::shared_ptr<dist::Group> group_;
  std::shared_ptr<const data::Split> val_shard_;  // this rank's share of the val split (several ranks)
  bool counts_exchanged_ = false;           // this attempt's normalisers went through the group
  bool interrupt_agreed_ = false;
  int64_t count_terms_ = 0;                 // K of the loss's counts
  at::Tensor grad_bucket_;                  // [<= 4M] float: gradients all-reduced through it, made once
  std::vector<std::unique_ptr<Hook>> hooks_;
  DirectExecutor direct_;
  StepExecutor* executor_ = nullptr;
  StateRegistry registry_;
  TrainState state_;
  RunLength length_;

  // Device accumulators: the step's running sums (reset by prepare_step), then the window's.
  at::Tensor step_items_, step_deferred_;  // [T] this step's terms so far; [] its deferred normaliser
  at::Tensor window_loss_, window_finite_; // [T] terms summed over the window's finite steps; [] their count
  at::Tensor skipped_, bad_run_, worst_run_;
  at::Tensor window_cause_;                // [] the rank of the window's first skip cause (0 = none)
  at::Tensor cause_rank_;                  // [T + G] K..1, made once
  std::vector<std::string> cause_names_;   // [T + G] loss terms, then parameter groups
  at::Tensor readback_;                    // [6 + T] what read_counters copies to the host
  int64_t window_steps_ = 0;
  std::vector<std::string> loss_names_;
  StepCounters counters_;
  std::optional<MemoryStats> step_memory_;

  std::optional<data::HostBatch> first_batch_;
  double data_wait_ = 0, step_seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::optional<eval::CocoStats> last_metrics_;
};

// `model.init_from`: copies every parameter and buffer whose name and shape match (the head's
// none with `backbone_only`); returns the names it skipped, with the reason.
std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path, bool backbone_only = false);

}  // namespace headroom::train
