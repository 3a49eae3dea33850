// The training loop (detectron2's shape): Trainer::run_step moves one optimizer step's batches
// to the device, runs forward + loss under autocast and backward for each micro-batch, and
// hands over to the optimizer step (unscale, non-finite check, clip, step). Everything else —
// schedule, EMA, evaluation, checkpoints, logs, plots, Ctrl-C — is a Hook.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "headroom/augment/augment.h"
#include "headroom/core/config.h"
#include "headroom/data/dataset.h"
#include "headroom/data/loader.h"
#include "headroom/eval/coco_eval.h"
#include "headroom/losses/loss.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "headroom/train/ema.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/schedule.h"

namespace headroom::train {

class Trainer;

// Where an out-of-memory error struck.
enum class OomSite { train_step, validation };

class Hook {
 public:
  virtual ~Hook() = default;
  virtual void before_train(Trainer&) {}
  virtual void before_step(Trainer&) {}
  virtual void after_step(Trainer&) {}
  virtual void after_epoch(Trainer&) {}
  virtual void after_train(Trainer&) {}
  // An out-of-memory error in a training step (its graph, gradients and BatchNorm updates are
  // already undone) or a validation pass; return true when handled: the same step (or the
  // validation) runs again, with whatever the hook changed (micro-batch, checkpointing, AMP).
  virtual bool on_oom(Trainer&, const c10::Error&, OomSite) { return false; }
};

// A change the memory governor made, with its reason; saved in checkpoints.
struct MemoryDecision {
  int64_t step = 0;
  std::string action;  // "micro_batch 8 -> 4", "activation_checkpointing all", "amp bf16", ...
  std::string reason;
};

// Where the run stands; all of it goes into checkpoints.
struct TrainState {
  int64_t epoch = 0;          // current epoch, 0-based
  int64_t batch = 0;          // next loader batch of the epoch
  int64_t step = 0;           // optimizer steps done
  int64_t images = 0;         // images trained on
  double best_fitness = -1;   // best val AP .50:.95 so far
  int64_t best_step = -1;
  int64_t last_eval_step = -1;
  bool stop = false;          // a hook asks the loop to end after this step
  int exit_code = 0;          // what `trainer train` returns when a hook stopped the run
  std::string stop_reason;
  // Memory: images per forward/backward (0 = the whole loader batch) and per validation batch
  // (0 = the loader's), and what the governor decided.
  int64_t micro_batch = 0;
  int64_t val_batch = 0;
  std::vector<MemoryDecision> memory_decisions;
};

// Device-side counters, read back at most once per step when a hook asks (a host sync).
struct StepCounters {
  std::vector<std::pair<std::string, double>> losses;  // mean per micro-batch since the last read
  double skipped_steps = 0;     // non-finite steps skipped in the whole run
  double bad_run = 0;           // non-finite steps in a row, ending at the last step
  double loss_scale = 0;        // 0 without a scaler
  int64_t micro_batches = 0;    // since the last read
};

// Everything a run is made of, built from the config in one place (make_trainer_parts).
struct TrainerParts {
  Config config;
  c10::Device device = c10::Device(c10::kCPU);
  std::string run_dir;
  std::shared_ptr<const data::Split> train_split, val_split;  // val may be null
  models::Detector model{nullptr};
  models::Detector ema_copy{nullptr};  // a second model for the EMA (null = no EMA)
  std::unique_ptr<losses::DetectionLoss> loss;  // null = the model family's loss from the config
};
TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir);
// Loader batches summed per optimizer step: Ultralytics' max(round(nominal / batch), 1).
int64_t accumulation_steps(int64_t nominal_batch, int64_t batch);

// The config's val split, or null (with a warning) when the data set has none.
std::shared_ptr<const data::Split> load_val_split(const Config& c);
// The same with the splits already loaded (val may be null).
TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir,
                                std::shared_ptr<const data::Split> train, std::shared_ptr<const data::Split> val);

class Trainer {
 public:
  explicit Trainer(TrainerParts parts);
  ~Trainer();

  void register_hook(std::unique_ptr<Hook> hook) { hooks_.push_back(std::move(hook)); }
  // Runs until the step budget is spent or a hook stops it.
  void train();
  // One optimizer step: accumulate loader batches (at most `accumulate`, fewer at an epoch end).
  // An out-of-memory error undoes the attempt and asks the hooks (the governor), which may
  // re-split the same batches; the step then runs again on them.
  void run_step();
  // The step's body on given loader batches: each is moved to the device, augmented, split into
  // micro-batches (forward, loss, backward each), then one optimizer step. The memory estimator
  // probes with it.
  void step_on(const std::vector<data::HostBatch>& batches);
  // Phases of step_on, for the memory estimator: "input", "forward", "loss", "backward",
  // "optimizer" (called after each).
  void set_phase_observer(std::function<void(const char*)> f) { phase_observer_ = std::move(f); }
  // memory.activation_checkpointing: auto — which stages to checkpoint for an input size and
  // micro-batch (asked before each forward; the governor's `all` overrides it).
  using CheckpointPlanFn = std::function<std::vector<bool>(int64_t size, int64_t micro_batch)>;
  void set_checkpoint_planner(CheckpointPlanFn f) { planner_ = std::move(f); }

  // Checkpoints: a weights file (the EMA, or the model without EMA) that also carries the
  // training state. load restores everything; the loader restarts at the saved position.
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

  // Validation of the EMA (or the model) on the val split; nullopt when there is no val split.
  // Records the result as last_metrics() at this step.
  std::optional<eval::CocoStats> validate();

  StepCounters& read_counters();  // cached per step

  const Config& config() const { return config_; }
  c10::Device device() const { return device_; }
  const std::string& run_dir() const { return run_dir_; }
  TrainState& state() { return state_; }
  models::DetectorImpl& model() { return *model_; }
  models::DetectorImpl& eval_model() { return ema_ ? *ema_->model() : *model_; }
  ModelEma* ema() { return ema_.get(); }
  Optimizer& optimizer() { return *optimizer_; }
  const Schedule& schedule() const { return *schedule_; }
  data::Loader& loader() { return *loader_; }
  const data::Split& train_split() const { return *train_split_; }
  const data::Split* val_split() const { return val_split_.get(); }
  AmpMode amp() const { return amp_; }
  const losses::DetectionLoss& loss() const { return *loss_; }
  // Images per forward/backward; at most the loader batch (the governor lowers it).
  int64_t micro_batch() const;
  void set_micro_batch(int64_t images) { state_.micro_batch = images; }
  void set_activation_checkpointing(CheckpointMode mode);
  // Switches mixed precision on (bf16 on the CPU; on CUDA what train.amp: auto picks, fp16 with
  // a loss scaler); false when it was on.
  bool enable_amp();
  void record_memory_decision(std::string action, std::string reason);
  int64_t accumulate() const { return accumulate_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t epochs() const { return epochs_; }
  // The first batch this process trained on, as the model saw it (augmented), for plots.
  const data::HostBatch* first_batch() const { return first_batch_ ? &*first_batch_ : nullptr; }
  const augment::Augmenter* augmenter() const { return augmenter_.get(); }
  double data_wait_seconds() const { return data_wait_; }
  double step_seconds() const { return step_seconds_; }
  std::chrono::steady_clock::time_point start_time() const { return start_; }
  // The latest validation and the step it ran at (state().last_eval_step).
  const std::optional<eval::CocoStats>& last_metrics() const { return last_metrics_; }

 private:
  void forward_backward(const at::Tensor& images, const losses::Targets& targets, double weight);
  void phase(const char* name) {
    if (phase_observer_) phase_observer_(name);
  }
  // Restores what a failed step attempt changed: gradients, BatchNorm statistics, loss sums.
  void restore_memory_state(const Json& memory);
  void undo_attempt(const std::vector<at::Tensor>& buffers, const at::Tensor& loss_sum, int64_t micro_since_read);
  void optimizer_step();
  void end_epoch();
  template <class F>
  void each_hook(F&& f) {
    for (auto& h : hooks_) f(*h);
  }

  Config config_;
  c10::Device device_;
  std::string run_dir_;
  AmpMode amp_ = AmpMode::off;
  std::shared_ptr<const data::Split> train_split_, val_split_;
  models::Detector model_;
  std::unique_ptr<ModelEma> ema_;
  std::unique_ptr<losses::DetectionLoss> loss_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<data::Loader> loader_;
  std::vector<std::unique_ptr<Hook>> hooks_;
  TrainState state_;
  int64_t accumulate_ = 1, steps_per_epoch_ = 1, total_steps_ = 1, epochs_ = 1;

  // Device accumulators (no host sync in the step).
  at::Tensor loss_sum_;      // [terms] since the last read
  at::Tensor skipped_, bad_run_;
  std::vector<std::string> loss_names_;
  int64_t micro_since_read_ = 0;
  StepCounters counters_;
  int64_t counters_step_ = -1;

  std::optional<data::HostBatch> first_batch_;
  std::unique_ptr<augment::Augmenter> augmenter_;  // null when config.augment changes nothing
  double data_wait_ = 0, step_seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::optional<eval::CocoStats> last_metrics_;
  std::function<void(const char*)> phase_observer_;
  CheckpointPlanFn planner_;
  std::vector<bool> plan_;  // the stages checkpointed now, by the planner
};

// The hooks `trainer train` runs, in order: schedule, EMA, non-finite guard, evaluation,
// checkpoints, logging (progress, results.csv, TensorBoard), plots, Ctrl-C.
void register_default_hooks(Trainer& t);

// Ctrl-C handling: the first SIGINT asks the loop to stop after the current step.
void install_interrupt_handler();
bool interrupt_requested();
void request_interrupt();  // what the handler does (tests call it)

// `model.init_from`: copies every parameter and buffer whose name and shape match; returns the
// names it skipped, with the reason.
std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path);

// `--resume auto`: the newest loadable checkpoint of project/name and project/nameN (refused
// ones are logged); "" when there is none.
std::string find_resume_checkpoint(const std::string& project, const std::string& name);
// The resolved config stored in a checkpoint (InputError naming the file when it is unreadable).
std::string checkpoint_config_yaml(const std::string& path);

}  // namespace headroom::train
