// What a run is made of, built from its config in one place: the trainer's options (the train
// section) and its parts (splits, loader, model and its EMA copy, loss, augmenter, monitor,
// process group). cli/run.h assembles a whole run (trainer, governor, hooks) from them.
#pragma once

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <memory>
#include <string>

#include "headroom/augment/augment.h"
#include "headroom/core/config.h"
#include "headroom/data/dataset.h"
#include "headroom/data/loader.h"
#include "headroom/dist/group.h"
#include "headroom/eval/validate.h"
#include "headroom/losses/loss.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "headroom/train/ema.h"
#include "headroom/train/memory_monitor.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/schedule.h"
#include "headroom/train/step_graph.h"

namespace headroom::train {

struct TrainerOptions {
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
  TORCH_ARG(EmaRamp, ema_ramp) = EmaRamp::ultralytics;
  TORCH_ARG(int64_t, read_every) = 10;      // steps between reads of the device counters (a host sync each)
  TORCH_ARG(bool, keep_first_batch) = true; // a host copy of the first augmented batch, for plots (a sync, once)
  TORCH_ARG(std::string, config_yaml) = ""; // the run's resolved config, stored in checkpoints for resume
  TORCH_ARG(int64_t, world) = 1;            // processes training together; each loads the loader's batch
  TORCH_ARG(bool, sync_bn) = false;         // BatchNorm statistics over every rank's images
  TORCH_ARG(bool, async_checkpoints) = true;  // CheckpointWriter: a snapshot written by a thread
  TORCH_ARG(int64_t, memory_usable) = 0;    // bytes the run may hold (budget - headroom); 0 = unbounded
  TORCH_ARG(double, memory_headroom) = 0;   // of the monitor's limit, which the governor may lower (CPU: other memory's growth)
  TORCH_ARG(bool, cudnn_benchmark) = false; // CUDA: cuDNN autotuning (process-wide, set by the trainer)
  TORCH_ARG(bool, side_stream) = true;      // CUDA: the step's input prepared on a side stream (core/stream.h)
  TORCH_ARG(GraphMode, cuda_graphs) = GraphMode::off;  // resolved (train/step_graph.h): off where steps cannot be captured
};
// The train section (and the device's precision) as trainer options. train.optimizer must not be
// auto (with_chosen_optimizer resolves it). cuda_graphs stays off: make_trainer_parts, which knows
// the processes, resolves it.
TrainerOptions trainer_options(const Config& c, c10::Device device);

// train.cudnn_benchmark on this device: auto = on for CUDA runs whose image size is fixed (no
// multi-scale: every new size is tuned again, a pause each time).
bool cudnn_benchmark(const Config& c, c10::Device device);

// `train.optimizer: auto` as Ultralytics' build_optimizer chooses: over 10,000 iterations
// (ceil(images / max(batch x ranks, nominal_batch)) x epochs, or train.steps) musgd with lr0 0.01,
// else adamw with lr0 round(0.002 x 5 / (4 + nc), 6) and momentum (beta1) 0.9; warmup_bias_lr 0
// either way. musgd's momentum is 0.9 without warmup, else warmed up to train.momentum as
// Ultralytics' warmup leaves it. The config as given for any other optimizer.
Config with_chosen_optimizer(const Config& c, int64_t images, int64_t nc, int64_t world);

// The parameters Ultralytics' MuSGD trains at 3x lr: a Detect head's class branch (cv3 and
// one2one_cv3: YOLOv8, YOLO11, YOLO26); none for other heads.
ParamFilter musgd_boosted(const models::DetectorInfo& info);

// How long a run is, from its options and the loader's batches per epoch.
struct RunLength {
  int64_t accumulate = 1;       // loader batches per optimizer step
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 1;
  int64_t epochs = 1;
};
// batch: images per loader batch on each rank.
RunLength run_length(const TrainerOptions& o, int64_t batch, int64_t batches_per_epoch);
// The epochs a run of this config lasts with these loader options over `images` training images
// (train.steps rounded up to whole epochs): what close_mosaic counts back from.
int64_t run_epochs(const Config& c, const data::LoaderOptions& loader, int64_t images);
// Loader batches summed per optimizer step: Ultralytics' max(round(nominal / batch), 1), where
// batch is the images of one loader batch over all ranks.
int64_t accumulation_steps(int64_t nominal_batch, int64_t batch);

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

}  // namespace headroom::train
