// The training loop (detectron2's shape): Trainer::run_step fetches one optimizer step's loader
// batches and hands them to a StepExecutor (train/step.h), which runs forward and backward over
// them and the update. Everything else — schedule, EMA, evaluation, checkpoints, logs, plots,
// Ctrl-C, the memory governor — is a Hook, and every stateful part saves its own entry in the
// StateRegistry (train/state.h) that checkpoints are written from.
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

#include "headroom/core/json.h"
#include "headroom/core/stream.h"
#include "headroom/data/cache.h"
#include "headroom/train/checkpoint_writer.h"
#include "headroom/train/counters.h"
#include "headroom/train/ema.h"
#include "headroom/train/exchange.h"
#include "headroom/train/parts.h"
#include "headroom/train/state.h"
#include "headroom/train/step.h"
#include "headroom/train/step_graph.h"

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
  // The step's loader batches are in hand (the loader's wait is over); nothing of the step is
  // queued on the device yet.
  virtual void after_data(Trainer&) {}
  // A step replayed from a CUDA graph (train.cuda_graphs) comes here with `input` only: its other
  // phases ran at its capture, when nothing was computed.
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


// Where the run stands. The loader cursor (epoch, batch) also says whether an epoch's end is
// done: batch == batches per epoch means its steps are done and its end (validation, results
// row, last.pt) is not; the end moves the cursor to (epoch + 1, 0).
struct TrainState {
  int64_t epoch = 0;          // current epoch, 0-based
  int64_t batch = 0;          // next loader batch of the epoch
  int64_t step = 0;           // optimizer steps done
  int64_t images = 0;         // images trained on
  double best_fitness = -1;   // best val fitness so far (Ultralytics': 0.1 AP50 + 0.9 AP50-95)
  bool best_is_ap = false;    // resumed from a checkpoint that kept AP50-95 as its best: compared as such until beaten
  int64_t best_step = -1;
  int64_t last_eval_step = -1;
  int64_t val_batch = 0;      // validation batch; 0 = the loader's (the memory governor lowers it)
  bool stop = false;          // a hook asks the loop to end after this step
  int exit_code = 0;          // what `trainer train` returns when a hook stopped the run
  std::string stop_reason;
};

class Trainer {
 public:
  explicit Trainer(TrainerParts parts);
  ~Trainer();

  // Hooks run in registration order; a hook with state gets a registry entry.
  void register_hook(std::unique_ptr<Hook> hook);
  // Who runs the steps: null = the direct executor. Not owned (the governor hook owns its own).
  void set_executor(StepExecutor* executor) { executor_ = executor; }
  const StepExecutor* executor() const { return executor_; }

  // Runs until the step budget is spent or a hook stops it.
  void train();
  // One optimizer step: the step's loader batches (at most `accumulate`, fewer at an epoch
  // end), the executor, then the cursor and, at a read point, the counters.
  void run_step();

  // The step primitives executors compose. prepare_step copies the batches to the device
  // (non-blocking, from the loader's pinned memory) and augments them, on CUDA on a side stream
  // the compute stream then waits for (TrainerOptions::side_stream), and counts the step's loss
  // normalisers; forward_backward runs images [start, start + len) of loader batch `batch`
  // under autocast and adds their (scaled) gradients; update unscales, checks for non-finite
  // values, clips, steps the optimizer and commits the counters.
  StepInput prepare_step(const std::vector<data::HostBatch>& batches);
  void forward_backward(const StepInput& in, size_t batch, int64_t start, int64_t length);
  void update();
  // With train.cuda_graphs (StepGraph), inside run_step forward_backward only records its part
  // and update runs the step's parts and the update: replayed from the graph captured for their
  // shapes, captured, or eagerly. Errors (out of memory included) then reach the executor from
  // update, and the step is undone as any failed attempt is.
  //
  // Drops what a failed attempt left: gradients (and the step's running sums, reset by the next
  // prepare_step). BatchNorm statistics are the executor's to restore.
  void discard_gradients();
  // The defined gradients of the optimizer's parameters, by the loss normaliser that divides them.
  std::vector<std::vector<at::Tensor>> grads_by_normaliser() const;

  // Several processes: the step's exchanges are the same on every rank and in each attempt —
  // the loss normalisers in prepare_step (device), the agreement before the update (host), the
  // gradients in update (device). A rank whose attempt failed calls abandon_step (the device
  // exchange it skipped, with zeros), then agree_step(true): every rank learns of it there, and
  // no rank waits on a collective another abandoned. One process: agree_step returns its own.
  StepAgreement agree_step(bool failed, bool pressed);
  void abandon_step();
  // Ctrl-C as the ranks agreed at the last step (one process: the signal itself), so every
  // rank stops after the same step even when the signal reaches them at different moments.
  bool interrupt_agreed() const { return exchange_ ? exchange_->interrupt_agreed() : interrupt_requested(); }
  int rank() const { return exchange_ ? exchange_->rank() : 0; }
  int64_t world() const { return options_.world(); }

  // Checkpoints: a weights file (the EMA, or the model without EMA) with the registry's entries
  // beside it. load restores everything; the loader restarts at the saved position. With
  // async_checkpoints, save returns once the state is snapshotted and a thread writes the file
  // (CheckpointWriter), then runs `then`; on the CPU only where the snapshot fits beside the
  // step's peak in memory_usable, else the step waits for the file as it always did. On CUDA
  // the snapshot is staged on the device (the copy to the host off the step's stream) where
  // that copy fits beside the largest step's peak in memory_usable.
  // wait_for_checkpoints waits for the write in flight and throws its failure.
  void save_checkpoint(const std::string& path, std::function<void()> then = {});
  void wait_for_checkpoints() { checkpoint_writer_.wait(); }
  void load_checkpoint(const std::string& path);

  // Validation of the EMA (or the model) on the val split; nullopt when there is none. Records
  // the result as last_metrics() at this step. An out-of-memory error asks the hooks.
  std::optional<eval::CocoStats> validate();

  const StepCounters& counters() const { return counters_->last(); }
  const StepGraph* step_graph() const { return graph_.get(); }  // null: train.cuda_graphs off
  // This step's memory, sampled from the monitor after the update (peak since the step began);
  // nullopt without a monitor.
  const std::optional<MemoryStats>& step_memory() const { return step_memory_; }
  // The governor changed what a step holds (micro-batch, recompute, precision): the peaks of the
  // steps before no longer say what a checkpoint's snapshot must fit beside, nor does the peak of
  // a step the change was made in. Until a step after it is measured, snapshots are not taken.
  void forget_step_peaks() { ++peaks_forgotten_; step_peak_ = 0; }
  MemoryMonitor* monitor() { return monitor_.get(); }

  const TrainerOptions& options() const { return options_; }
  // SyncBatchNorm exchanges in this step's forward and backward: distributed.sync_bn on several
  // ranks with BatchNorm training.
  bool syncs_batchnorm() const;
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
  int64_t batch() const { return loader_->options().batch(); }  // images per loader batch, on each rank
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
  // The checkpoint's "progress" entry: the cursor, the best fitness, the last validation, the
  // precision. Loading it renumbers steps written under another steps-per-epoch.
  Json save_progress() const;
  void load_progress(const Json& j);

 private:
  std::vector<data::HostBatch> next_batches();
  void begin_epoch();
  void end_epoch();
  bool counters_due() const;
  void notify(StepPhase phase);
  void apply_update();  // update's work, with the learning rates already on the device
  void run_graphed();   // the recorded parts and the update, through the StepGraph
  void register_state();
  void set_amp(AmpMode m);
  // One validation pass at state().val_batch; nullopt when it ran out of memory and a hook
  // freed something (the pass runs again).
  std::optional<eval::ValidationResult> validation_pass(const std::shared_ptr<const data::Split>& split);
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
  std::unique_ptr<SideStream> side_stream_;  // CUDA: the step's input (copy, augmentation) beside the step before
  std::optional<bool> cudnn_benchmark_before_;  // CUDA: the process's cuDNN autotuning before this trainer set it
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<data::Loader> loader_;
  std::shared_ptr<MemoryMonitor> monitor_;
  std::unique_ptr<RankExchange> exchange_;  // null: one process
  std::vector<std::unique_ptr<Hook>> hooks_;
  DirectExecutor direct_;
  StepExecutor* executor_ = nullptr;
  StateRegistry registry_;
  TrainState state_;
  RunLength length_;

  // The step's running sums on the device (reset by prepare_step), then the window's.
  at::Tensor step_items_, step_deferred_;  // [T] this step's terms so far; [D] its deferred normalisers
  // Per parameter of the optimizer's groups, in their order: the loss normaliser that divides
  // its gradient (all 0 for a loss with one).
  std::vector<int64_t> param_normaliser_;
  std::unique_ptr<DeviceCounters> counters_;
  // train.cuda_graphs: the step's parts recorded by forward_backward, run by update.
  struct RecordedPart {
    size_t batch;
    int64_t start, length;
    models::DetectorImpl::RecomputeSetting recompute;  // as the executor set it for this part
  };
  std::unique_ptr<StepGraph> graph_;
  bool graph_armed_ = false;  // inside run_step
  bool recording_ = false;    // this step's parts are recorded
  StepInput recorded_input_;
  std::vector<RecordedPart> recorded_parts_;
  StepGraph::Ran graph_ran_ = StepGraph::Ran::eager;
  int64_t shape_peak_ = 0;  // the last eager or captured step's peak: a replay allocates nothing, its graph's pool holds as much
  std::optional<MemoryStats> step_memory_;
  int64_t step_peak_ = 0;  // the largest peak of a step run with no snapshot alive: what a CPU or staged snapshot must fit beside
  int64_t peaks_forgotten_ = 0;  // forget_step_peaks calls: one inside a step leaves its peak out
  bool said_sync_ = false;

  std::optional<data::HostBatch> first_batch_;
  double data_wait_ = 0, step_seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::optional<eval::CocoStats> last_metrics_;
  // Last: destroyed first, so a write in flight ends before the hooks its follow-up uses.
  CheckpointWriter checkpoint_writer_;
};

}  // namespace headroom::train
