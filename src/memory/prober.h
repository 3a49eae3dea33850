// Internal: the prober behind estimate_memory, choose_batch and make_recompute_planner, and the
// fit of one precision / recompute mode from its probes.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <set>
#include <vector>

#include "headroom/core/logging.h"
#include "headroom/memory/estimate.h"
#include "headroom/train/trainer.h"

namespace headroom::memory {

// Enforces a budget for the probes' lifetime, then puts the previous limit back. On the CPU the
// budget bounds the process: the probes' tensors get what its other memory (code, libraries,
// buffers, the C heap) leaves, but not less than budget - headroom, what a step that fits may
// use anyway (a probe at a size that does not fit ran to the whole budget, the process 0.17 GiB
// over it). The prober measures that again before each step: building it and stepping grow the rest.
class LimitGuard {
 public:
  LimitGuard(MemoryMonitor& m, int64_t budget, double headroom) : m_(m), previous_(m.sample().limit) {
    if (budget > 0) m_.set_limit(probe_limit(m, budget, headroom));
  }
  // `growth`: what the process's other memory grows by during a step (autograd's graph, the heap).
  static int64_t probe_limit(MemoryMonitor& m, int64_t budget, double headroom, int64_t growth = 0);
  static int64_t other_memory(MemoryMonitor& m);  // resident beyond the allocator's reserved memory
  ~LimitGuard() {
    try {
      m_.set_limit(previous_);
    } catch (const std::exception& e) {  // a destructor must not throw; the next set_limit says it again
      spdlog::warn("memory: could not restore the allocator limit: {}", e.what());
    }
  }
  LimitGuard(const LimitGuard&) = delete;
  LimitGuard& operator=(const LimitGuard&) = delete;

 private:
  MemoryMonitor& m_;
  int64_t previous_;
};

class PhaseProbe;

// A throwaway copy of the run (model, loss, optimizer with its state, EMA) on the run's device,
// stepping on synthetic batches of the largest input size and the densest label count through
// the trainer's own step primitives.
class Prober {
 public:
  // `budget`: enforced during each step (on the CPU re-measured before each: LimitGuard).
  Prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp,
         int64_t budget = 0);

  struct Result {
    bool fits = false;
    int64_t peak = 0;                 // above the memory in use before the prober was built
    int64_t step_peak = 0;            // ... during input, forward, loss and backward
    int64_t update_peak = 0;          // ... during the optimizer step and the EMA update
    int64_t held_over = 0;            // what the allocator held at the peak beyond the tensors
    double workspace = 0;             // loss phase peak above the forward's end
    double update_seconds = 0;        // the optimizer step and the EMA update
    double forward_peak = 0;          // at the forward's end plus the loss workspace (above base)
    // The input phase's peak above what it holds at its end: the augmentation's working memory
    // beyond the images it hands over (one loader batch, in pieces on the CPU, whole on CUDA).
    double augment_transient = 0;
    std::vector<double> stage_bytes;  // kept per stage after the forward
    std::vector<double> stage_seconds;
    double seconds = 0;
  };

  // `gradients_held`: every gradient is allocated before the step, as in the second and later
  // micro-batches of an accumulating step (the first makes them during its backward).
  Result step(int64_t b, bool gradients_held = false);
  // The seconds of a whole step (and whether it fitted), as training runs it: no reads of the
  // allocator between rows or phases (each is a device sync), and its cache kept from the step
  // before: the fastest of two steps after one that warms it.
  std::pair<bool, double> timed_step(int64_t b, bool gradients_held);

  train::Trainer& trainer() { return *trainer_; }
  void hold_gradients();
  int64_t size() const { return size_; }
  int64_t min_size() const { return min_size_; }
  int64_t rows() const { return rows_; }
  int64_t densest() const { return densest_; }
  int64_t min_batch() const { return min_batch_; }
  // The augmentation's working memory per loader image, at the largest batch probed so far.
  double augment_per_image() const { return augment_per_image_; }
  const std::vector<models::StageSpan>& stages() const { return stages_; }

 private:
  struct StepTrace;  // what the hooks record during one step

  data::HostBatch synthetic_batch(int64_t b) const;
  void on_row(int row, StepTrace& t);
  void on_phase(train::StepPhase phase, StepTrace& t, Result& r);
  bool train_once(const data::HostBatch& batch, int64_t b, bool gradients_held);
  void measured(const StepTrace& t, Result& r);
  void split_by_stage(const StepTrace& t, Result& r) const;

  void enforce_budget();
  void measure_growth();

  MemoryMonitor& monitor_;
  int64_t budget_ = 0;
  double headroom_ = 0;
  int64_t other_at_step_ = 0, step_growth_ = 0;  // the process's other memory at a step's start; its largest rise in one
  int64_t nc_, base_ = 0, size_ = 0, min_size_ = 0, rows_ = 0, densest_ = 0, min_batch_ = 1;
  std::unique_ptr<train::Trainer> trainer_;
  PhaseProbe* phases_ = nullptr;  // owned by trainer_
  std::vector<models::StageSpan> stages_;
  double augment_per_image_ = 0;
  int64_t augment_batch_ = 0;
  bool tuned_ = false;        // CUDA with cuDNN autotuning: each size's first step is a warm-up
  std::set<std::pair<int64_t, train::AmpMode>> warmed_;  // the sizes stepped so far, in each precision
};

// The prober, or an InputError when the model and its training state alone exceed the budget.
Prober make_prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp,
                   int64_t budget);

// Half the configured batch and the configured batch: the line is fitted where it matters.
std::vector<int64_t> default_probes(const Config& c);

// Probes a mode at the two batch sizes (raised to the smallest the model trains at) and fits the line.
ModeEstimate probe_mode(Prober& p, train::AmpMode amp, models::RecomputeMode ck, std::vector<int64_t> batches);

}  // namespace headroom::memory
