// The memory estimator and the automatic batch size. Both probe real training steps (forward,
// loss at the data set's densest label count, backward, optimizer step with its state, EMA) of a
// throwaway copy of the run on its device, at the largest input size the run will use, and fit
// the peak linearly in the batch: peak(b) = fixed + b * per_image.
#pragma once

#include <torch/arg.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/core/json.h"
#include "headroom/data/dataset.h"
#include "headroom/memory/governor.h"
#include "headroom/memory/monitor.h"

namespace headroom::memory {

struct StageBytes {
  std::string name;          // "rows 2-3 C2f.. (stride 4)"
  double per_image = 0;      // activation bytes it keeps for backward, per image
  double seconds_per_image = 0;  // its forward time (what recomputing it costs again in backward)
};

// One precision / recompute setting, probed at two batch sizes.
struct ModeEstimate {
  std::string name;          // "fp32", "amp bf16", "amp bf16 + recompute all"
  train::AmpMode amp = train::AmpMode::off;
  models::RecomputeMode recompute = models::RecomputeMode::off;
  bool configured = false;   // the setting the config asks for
  std::vector<std::pair<int64_t, int64_t>> probes;  // (batch, measured step peak)
  // The step's peak is the larger of two phases: forward + loss + backward, linear in the batch
  // (fixed + per_image * b), and the optimizer step + EMA update, which does not depend on it.
  double fixed = 0;          // bytes at batch 0: StaticMemory + per-step constants
  double per_image = 0;      // bytes per image (activations, input, loss workspace)
  double update_peak = 0;
  double workspace_per_image = 0, workspace_fixed = 0;  // the loss and assigner, above the forward's memory
  // The forward's end plus the loss workspace, fitted on its own: where the peak sits at large
  // batches (predicted_peak takes the larger line).
  double forward_fixed = 0, forward_per_image = 0;
  // What a later micro-batch of an accumulating step, which starts with every gradient
  // allocated, peaks above the first (measured at the larger probe; at most the gradients).
  double held_gradients = 0;
  int64_t allocator_overhead = 0;  // held beyond the tensors at the larger probe's peak (CUDA: reserved; CPU: blocks in use)
  std::vector<StageBytes> stages;
  double seconds_per_image = 0;    // step time at the larger probe, per image
  // A micro-batch's forward and backward time fitted on the two probes, fixed + per image (the
  // fixed part is what a small batch leaves unused: kernel launches, idle cores), and the
  // optimizer step + EMA update's, once per optimizer step.
  double seconds_fixed = 0, seconds_per_batch_image = 0, update_seconds = 0;
  double micro_batch_seconds(int64_t b) const { return seconds_fixed + seconds_per_batch_image * double(b); }
};

struct MemoryEstimate {
  std::string device;
  int64_t budget = 0, usable = 0;
  int64_t imgsz = 0;          // the largest input side the run uses (multi-scale): the probes' size
  int64_t min_imgsz = 0, canvas = 0;  // the smallest (multi-scale) and the loader's canvas
  int64_t max_boxes = 0;      // label rows per image in the probe (densest image, x4 mosaic, x2 mixup)
  int64_t min_batch = 1;      // the smallest micro-batch the model trains at (models::smallest_trainable_batch)
  int64_t batch = 0;          // the configured batch
  StaticMemory fixed;
  // The optimizer step's own extra memory: one workspace the size of the largest parameter on the
  // in-place path, none with the fused kernels (train/optimizer.h).
  int64_t update_workspace = 0;
  size_t stages = 0;         // the model's stages (DetectorImpl::stages())
  int64_t nominal_batch = 0, prefetch = 0;
  // Images per loader batch when it differs from the micro-batch (train.batch: auto loads the
  // whole step, nominal_batch images, each rank its share, and the governor cuts it into
  // micro-batches); 0 = the loader batch is the micro-batch and a step accumulates
  // round(nominal / batch) of them.
  int64_t step_batch = 0;
  // Host-side batches the loader keeps (prefetch, plus the step's own): counted against the
  // budget on the CPU, whose memory they share; on CUDA they are host memory.
  bool input_buffers_on_device = false;
  double canvas_bytes = 0;   // one loader image
  // CUDA with data.side_stream: the next step's input is prepared on the side stream while this
  // step runs, and each step's input is held until the compute stream is done with it.
  bool input_beside = false;
  // The augmentation's working memory per loader image beyond the images it hands over (measured
  // in the probes' input phase): with input_beside it runs on the side stream, whose cached blocks
  // the step's allocations cannot take, so it comes on top of the step's peak.
  double augment_per_image = 0;
  // CUDA with train.cuda_graphs on or auto (not refused): a captured step's graph holds the
  // inputs its capture read, one more set of the step's images, beside each new step's own. Its
  // pool holds what the eager step allocated, which the probes measure. Steps that recompute
  // activations are not captured.
  bool step_graphed = false;
  // The process's resident memory after the probes, and its peak: on the CPU the tensors and
  // everything else (code, libraries, buffers), which the budget bounds; on CUDA the host side.
  int64_t host_rss = 0, host_peak_rss = 0;
  std::vector<ModeEstimate> modes;

  int64_t accumulate(int64_t batch) const;
  int64_t step_images(int64_t batch) const;  // images per optimizer step at micro-batch `batch`
  // A mode at another input side: activations scale with the area.
  ModeEstimate at_size(const ModeEstimate& m, int64_t size) const;
  int64_t input_buffers(int64_t batch) const;
  int64_t augmented_bytes(int64_t images) const;  // images as the model takes them: float [3, imgsz, imgsz]
  // The step's other loader batches, augmented on the device and held while one runs: a step
  // counts its loss normalisers over all of them before the first backward.
  int64_t step_inputs(int64_t batch) const;
  // The next step's input, augmented beside this step (input_beside): one more set of its images,
  // and the augmentation's working memory for one loader batch.
  int64_t next_input(int64_t batch) const;
  // The inputs a captured step's graph holds (step_graphed; a mode that recomputes nothing).
  int64_t graph_inputs(int64_t batch) const;
  // The peak of a training step at `batch`: the larger phase (in an accumulating step, also a
  // later micro-batch's forward on top of the earlier ones' gradients), plus the step's other
  // batches' inputs, the next step's input (input_beside), the graph's inputs (step_graphed, where
  // nothing is recomputed), the input buffers and the allocator's overhead.
  // `savings`: activation bytes a checkpoint plan frees from the forward/backward phase.
  int64_t predicted_peak(const ModeEstimate& m, int64_t batch, double savings = 0) const;
  int64_t predicted_peak(int64_t batch) const { return predicted_peak(configured(), batch); }
  // The largest batch predicted to stay under `usable` (0 when not even 1).
  int64_t largest_batch(const ModeEstimate& m) const;
  const ModeEstimate& configured() const;
};

struct EstimateOptions {
  // Two batch sizes; empty = half the configured batch and the configured batch (1 and 2 for a
  // batch of 1), where the line is fitted closest to the batch that matters.
  TORCH_ARG(std::vector<int64_t>, probe_batches) = std::vector<int64_t>{};
  TORCH_ARG(bool, all_modes) = true;   // fp32, AMP, AMP + recompute; false = the configured one only
};

// Probes on `device` (the monitor's). The budget is enforced during the probes.
MemoryEstimate estimate_memory(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor,
                               int64_t budget, const EstimateOptions& o = {});
std::string format_memory_estimate(const MemoryEstimate& e);
Json memory_estimate_json(const MemoryEstimate& e);

class RecomputePlanner;

// One (micro-batch, recompute plan) the automatic batch size weighed.
struct BatchOption {
  int64_t batch = 0;
  std::string plan;             // "no stage", "every stage", "rows 2-3 C2f.. (stride 4), ..."
  int64_t predicted_peak = 0;
  // Of a whole step in micro-batches of `batch`: measured where `timed`, else the probes' model
  // scaled by what the nearest timed size measured against it.
  double images_per_second = 0;
  bool timed = false;
};

// A real step the automatic batch took, run as a later micro-batch of the step runs.
struct BatchProbe {
  int64_t batch = 0;
  int64_t peak = -1;             // step peak incl. the step's other inputs and loader buffers; -1 = out of memory
  int64_t predicted = 0;         // what the fitted line said before the step
  double images_per_second = 0;  // of a whole step at this micro-batch, timed on a warm second step (0 = not timed)
  bool every_stage = false;      // stepped again with every stage recomputed after its plan did not fit
};

struct AutoBatch {
  int64_t batch = 0;             // the micro-batch
  int64_t step_batch = 0;        // the loader batch: a rank's share of one optimizer step's images
  std::vector<BatchProbe> tried;     // in the order taken
  std::vector<BatchOption> options;  // the fitting choices, best first (the first is the one taken)
  std::shared_ptr<RecomputePlanner> planner;  // memory.activation_checkpointing: auto
  MemoryEstimate estimate;
};
// train.batch=auto. The loader batch is the step: train.nominal_batch images (at most the
// training images), so every optimizer step sums exactly that many; the governor cuts it into
// balanced micro-batches, so the sizes weighed are the largest parts of those cuts (32 images:
// 32, 16, 11, 8, 7, ...). The micro-batch (at least the smallest the model trains at) is the
// largest whose real step stays under budget * (1 - headroom): the fit's guess, then real steps
// at the sizes around it, each only where the fit (corrected by the last step's measured peak)
// predicts it under the enforced limit with a margin, so a probe is not expected to die; one
// that does is a measured point. With activation checkpointing `auto` the micro-batch and the
// recompute plan are chosen together: memory.prefer: batch takes the largest micro-batch any
// plan fits, throughput the highest images per second among sizes timed on real steps (the
// largest that fits always among them). InputError with the table when the smallest
// micro-batch does not fit.
// `world`: the run's processes (each rank chooses for itself; several capture no CUDA graph).
AutoBatch choose_batch(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor, int64_t budget,
                       int64_t world = 1);
std::string format_batch_options(const AutoBatch& a);

// memory.activation_checkpointing: auto. From the per-stage activation bytes with and without
// recompute and each stage's forward time, the plan for an input size and micro-batch is the
// set of stages — best bytes saved per second of recompute first — that brings the predicted peak
// under budget - headroom, and no more. Activations scale with the input area, so one probe at the
// largest size serves every multi-scale size; plans are cached per (size, micro-batch).
struct StagePlan {
  std::vector<bool> recomputed;    // per stage
  int64_t predicted_peak = 0;
  bool fits = true;                // false: even every stage recomputed is predicted over budget
  double recompute_seconds = 0;      // extra forward time per step of this plan
  double recompute_all_seconds = 0;  // ... of recomputing every stage
  double step_seconds = 0;           // the micro-batch's step time without recompute
};

class RecomputePlanner {
 public:
  RecomputePlanner(MemoryEstimate estimate, ModeEstimate plain, ModeEstimate recomputed);
  const StagePlan& plan(int64_t size, int64_t micro_batch);
  // A real step refuted the plan there: every stage is recomputed at that size from now on.
  const StagePlan& recompute_all(int64_t size, int64_t micro_batch);
  std::string stages_of(const StagePlan& p) const;  // "no stage", or the recomputed stages' names
  std::string describe(const StagePlan& p, int64_t size, int64_t micro_batch) const;
  const MemoryEstimate& estimate() const { return e_; }

 private:
  MemoryEstimate e_;
  ModeEstimate plain_, recomputed_;
  std::map<std::pair<int64_t, int64_t>, StagePlan> cache_;
};
// Probes the configured run without recompute and with every stage recomputed (`world`: as
// choose_batch's).
std::shared_ptr<RecomputePlanner> make_recompute_planner(const Config& c, const std::shared_ptr<const data::Split>& train,
                                                           MemoryMonitor& monitor, int64_t budget, int64_t world = 1);

// The densest label count of a split (boxes of its most crowded image).
int64_t densest_labels(const data::Split& split);

}  // namespace headroom::memory
