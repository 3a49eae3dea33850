#include "prober.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "headroom/augment/augment.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/text.h"

namespace headroom::memory {

// Calls `on` at the trainer's step phases: where the prober reads the allocator.
class PhaseProbe : public train::Hook {
 public:
  std::function<void(train::StepPhase)> on;
  void after_phase(train::Trainer&, train::StepPhase phase) override {
    if (on) on(phase);
  }
};

struct Prober::StepTrace {
  StepTrace(size_t rows, bool cpu) : at_row(rows, 0), time_at_row(rows, 0), cpu(cpu) {}
  // What the allocator holds at the peak that it cannot give back when memory runs short: CUDA
  // keeps its segments (reserved); the CPU allocator returns its cache before an allocation
  // fails, so there only the blocks in use count (their size classes round requests up).
  int64_t held(const MemoryStats& s) const { return cpu ? s.peak_active : s.peak_reserved; }

  std::vector<int64_t> at_row;      // allocated bytes at each row's end during the forward
  std::vector<double> time_at_row;  // seconds from the forward's start to each row's end
  bool cpu;
  std::chrono::steady_clock::time_point forward_start = std::chrono::steady_clock::now(), update_start;
  int64_t fb_peak = 0;  // input, forward, loss, backward
  int64_t input_end = 0, forward_end = 0, overall = 0, overall_held = 0;
  bool in_forward = false;
};

Prober::Prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp,
               int64_t budget)
    : monitor_(monitor), budget_(budget), headroom_(c.memory.headroom), nc_(int64_t(split->names.size())) {
  monitor_.release_cache();
  base_ = monitor_.sample().allocated;
  Config pc = c;
  pc.train.steps = 1;
  pc.train.amp = train::to_string(amp);
  pc.data.cache = "none";  // the probes never read images: no cache to build
  pc.train.cuda_graphs = "off";  // probes are eager steps (the estimate adds what a graph holds), and say nothing of graphs
  train::TrainerParts parts = train::make_trainer_parts(pc, monitor.device(), "", split, nullptr);
  const int64_t multiple = parts.model->info().input_multiple;
  const augment::Augmenter as_configured(augment::augmenter_options(c, multiple, 1));
  size_ = augment::enabled(c.augment) ? as_configured.max_output_size(c.data.imgsz) : c.data.imgsz;
  min_size_ = augment::enabled(c.augment) ? as_configured.min_output_size(c.data.imgsz) : c.data.imgsz;
  augment::AugmenterOptions fixed_size = augment::augmenter_options(c, multiple, 1);
  fixed_size.policy().multi_scale = 0;  // every probe at the largest size
  parts.augmenter = augment::enabled(fixed_size.policy()) ? std::make_unique<augment::Augmenter>(fixed_size) : nullptr;
  rows_ = densest_labels(*split);
  if (augment::enabled(c.augment) && c.augment.mosaic > 0) rows_ *= 4;  // a mosaic's rows: four images' boxes
  if (augment::enabled(c.augment) && c.augment.mixup > 0) rows_ *= 2;
  rows_ = std::max<int64_t>(rows_, 1);
  densest_ = densest_labels(*split);
  trainer_ = std::make_unique<train::Trainer>(std::move(parts));
  auto probe = std::make_unique<PhaseProbe>();
  phases_ = probe.get();
  trainer_->register_hook(std::move(probe));
  stages_ = trainer_->model().stages();
  tuned_ = monitor.device().is_cuda() && train::cudnn_benchmark(c, monitor.device());
  min_batch_ = trainer_->loader().options().min_batch();
}

Prober::Result Prober::step(int64_t b, bool gradients_held) {
  Result r;
  const data::HostBatch batch = synthetic_batch(b);
  // cuDNN autotuning times every algorithm at a shape's first step in each precision, in trial
  // workspaces the steady state does not hold: that step runs unobserved, and its cache is
  // released before the measured one (enforce_budget).
  if (tuned_ && warmed_.insert({b, trainer_->amp()}).second) train_once(batch, b, gradients_held);
  StepTrace t(trainer_->model().stages().empty() ? 0 : size_t(stages_.back().end + 1), monitor_.device().is_cpu());
  trainer_->model().set_row_observer([&](int row) { on_row(row, t); });
  phases_->on = [&](train::StepPhase p) { on_phase(p, t, r); };
  enforce_budget();
  const auto t0 = std::chrono::steady_clock::now();
  if (train_once(batch, b, gradients_held)) measured(t, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  measure_growth();
  trainer_->model().set_row_observer(nullptr);
  phases_->on = nullptr;
  monitor_.release_cache();
  if (r.fits) {
    split_by_stage(t, r);
    // At the largest batch probed: a fixed part divided by a small batch would be multiplied
    // by the whole loader batch in the estimate.
    if (b >= augment_batch_) augment_batch_ = b, augment_per_image_ = r.augment_transient / double(b);
  }
  return r;
}

std::pair<bool, double> Prober::timed_step(int64_t b, bool gradients_held) {
  const data::HostBatch batch = synthetic_batch(b);
  enforce_budget();
  double seconds = std::numeric_limits<double>::infinity();
  bool fits = true;
  for (int i = 0; i < 3 && fits; ++i) {  // the first fills the allocator's cache and first-use state; the best of two after
    const auto t0 = std::chrono::steady_clock::now();
    fits = train_once(batch, b, gradients_held);
    if (i > 0) seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  measure_growth();
  monitor_.release_cache();
  return {fits, fits ? seconds : 0.0};
}

void Prober::enforce_budget() {
  if (budget_ <= 0 || !monitor_.device().is_cpu()) {
    monitor_.release_cache();
    return;
  }
  monitor_.set_limit(LimitGuard::probe_limit(monitor_, budget_, headroom_, step_growth_));  // releases the cache first
  other_at_step_ = LimitGuard::other_memory(monitor_);
}

// Before the cache and the heap give anything back: what the step left beside its tensors.
void Prober::measure_growth() {
  if (budget_ > 0 && monitor_.device().is_cpu())
    step_growth_ = std::max(step_growth_, LimitGuard::other_memory(monitor_) - other_at_step_);
}

void Prober::on_row(int row, StepTrace& t) {
  if (t.in_forward && size_t(row) < t.at_row.size()) {
    monitor_.synchronize();  // stage times are device times (a probe, not the training loop)
    t.at_row[size_t(row)] = monitor_.sample().allocated;
    t.time_at_row[size_t(row)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.forward_start).count();
  }
}

void Prober::on_phase(train::StepPhase p, StepTrace& t, Result& r) {
  const MemoryStats s = monitor_.sample();
  t.overall = std::max(t.overall, s.peak_allocated);
  t.overall_held = std::max(t.overall_held, t.held(s));
  if (p == train::StepPhase::input) {
    t.input_end = s.allocated;
    r.augment_transient = double(std::max<int64_t>(0, s.peak_allocated - s.allocated));
    t.in_forward = true;
    monitor_.synchronize();
    t.forward_start = std::chrono::steady_clock::now();
  } else if (p == train::StepPhase::forward && t.in_forward) {
    t.in_forward = false;
    t.forward_end = s.allocated;
    monitor_.reset_peak();
  } else if (p == train::StepPhase::loss && r.workspace == 0) {
    r.workspace = double(s.peak_allocated - t.forward_end);
  } else if (p == train::StepPhase::backward) {
    t.fb_peak = t.overall;
    monitor_.reset_peak();  // from here: the optimizer step and the EMA update
    monitor_.synchronize();
    t.update_start = std::chrono::steady_clock::now();
  }
}

// One training step on `batch`, as the trainer runs it (EMA included) and finished on the device;
// false when it ran out of memory (its gradients are discarded).
bool Prober::train_once(const data::HostBatch& batch, int64_t b, bool gradients_held) {
  try {
    if (gradients_held) hold_gradients();
    monitor_.reset_peak();
    trainer_->forward_backward(trainer_->prepare_step({batch}), 0, 0, b);
    trainer_->update();
    if (trainer_->ema()) trainer_->ema()->update(trainer_->model());
    monitor_.synchronize();
    return true;
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) throw;
    trainer_->discard_gradients();
    return false;
  }
}

// A step that fitted: its peaks, from the allocator and the trace its phase hooks filled.
void Prober::measured(const StepTrace& t, Result& r) {
  r.update_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.update_start).count();
  const MemoryStats s = monitor_.sample();
  r.fits = true;
  r.peak = std::max(t.overall, s.peak_allocated) - base_;
  r.step_peak = t.fb_peak - base_;
  r.forward_peak = double(t.forward_end - base_) + r.workspace;
  r.update_peak = s.peak_allocated - base_;
  r.held_over = std::max<int64_t>(0, std::max(t.overall_held, t.held(s)) - std::max(t.overall, s.peak_allocated));
}

// Each stage's share of the forward: the bytes it left allocated and the time it took.
void Prober::split_by_stage(const StepTrace& t, Result& r) const {
  int64_t prev = t.input_end;
  double prev_t = 0;
  for (const auto& st : stages_) {
    const int64_t now = t.at_row[size_t(st.end)];
    r.stage_bytes.push_back(double(now - prev));
    r.stage_seconds.push_back(t.time_at_row[size_t(st.end)] - prev_t);
    prev = now;
    prev_t = t.time_at_row[size_t(st.end)];
  }
}

void Prober::hold_gradients() {
  at::NoGradGuard no_grad;
  for (auto& param : trainer_->model().parameters())
    if (param.requires_grad() && !param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
}

data::HostBatch Prober::synthetic_batch(int64_t b) const {
  data::HostBatch h;
  const int64_t S = size_, N = densest_;
  h.images = at::randint(0, 256, {b, 3, S, S}, at::TensorOptions().dtype(at::kByte));
  // N boxes per image on a grid, sizes varied: the loss and assigner see a crowded image.
  const int64_t side = int64_t(std::ceil(std::sqrt(double(std::max<int64_t>(N, 1)))));
  at::Tensor k = at::arange(N, at::kFloat);
  at::Tensor cx = (at::remainder(k, double(side)) + 0.5) * (double(S) / double(side));
  at::Tensor cy = (at::floor(k / double(side)) + 0.5) * (double(S) / double(side));
  at::Tensor half = (double(S) / double(side)) * (0.2 + 0.25 * at::remainder(k, 3.0) / 2.0);
  at::Tensor box = at::stack({cx - half, cy - half, cx + half, cy + half}, 1).clamp(0, double(S));  // [N, 4] xyxy px
  h.meta.resize(size_t(b));
  for (int64_t i = 0; i < b; ++i) h.meta[size_t(i)] = data::ImageMeta{i, data::letterbox_geometry(int(S), int(S), int(S))};
  data::collate(h, std::vector<data::ItemBoxes>(size_t(b)), false);  // the per-image tensors
  h.boxes = box.unsqueeze(0).expand({b, N, 4}).contiguous();         // then the crowded boxes
  h.classes = at::remainder(at::arange(N, at::kLong), std::max<int64_t>(nc_, 1)).unsqueeze(0).expand({b, N}).contiguous();
  h.crowd = at::zeros({b, N}, at::kBool);
  h.counts = at::full({b}, N, at::kLong);
  return h;
}

int64_t LimitGuard::other_memory(MemoryMonitor& m) { return process_memory().rss - m.sample().reserved; }

int64_t LimitGuard::probe_limit(MemoryMonitor& m, int64_t budget, double headroom, int64_t growth) {
  if (!m.device().is_cpu()) return budget;
  m.release_cache();
  return_free_heap();  // the heap's free pages are not memory in use
  return std::clamp(budget - other_memory(m) - growth, usable_budget(budget, headroom), budget);
}

Prober make_prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp,
                   int64_t budget) {
  try {
    return Prober(c, split, monitor, amp, budget);
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) throw;
    monitor.release_cache();
    throw InputError("the model " + c.model.file + " with its gradients, optimizer state and EMA does not fit memory.budget " +
                     format_bytes(double(budget)) + " on " + monitor.device().str() +
                     ": use a lighter model (model.file / model.scale), train.ema=false, or a larger budget");
  }
}

std::vector<int64_t> default_probes(const Config& c) {
  return c.train.batch >= 2 ? std::vector<int64_t>{c.train.batch / 2, c.train.batch} : std::vector<int64_t>{1, 2};
}

namespace {

std::string mode_name(train::AmpMode amp, models::RecomputeMode r) {
  std::string s = amp == train::AmpMode::off ? "fp32" : std::string("amp ") + train::to_string(amp);
  if (r != models::RecomputeMode::off) s += std::string(" + recompute ") + models::to_string(r);
  return s;
}

}  // namespace

ModeEstimate probe_mode(Prober& p, train::AmpMode amp, models::RecomputeMode ck, std::vector<int64_t> batches) {
  const int64_t least = p.min_batch();
  if (batches.front() < least) batches = {least, std::max(batches.back(), least + 1)};
  ModeEstimate m;
  p.trainer().model().set_recompute(ck);
  if (amp != train::AmpMode::off) p.trainer().enable_amp();
  m.amp = p.trainer().amp();
  m.recompute = ck;
  m.name = mode_name(m.amp, ck);
  std::vector<int64_t> sizes = batches;
  std::vector<Prober::Result> rs;
  p.step(least);  // warm-up: lazily created state, first-use caches
  for (;;) {  // the two sizes, halved while the larger does not fit
    rs.clear();
    for (int64_t b : sizes) {
      rs.push_back(p.step(b));
      m.probes.emplace_back(b, rs.back().fits ? rs.back().peak : -1);
    }
    if (rs.back().fits || sizes.back() <= least + 1) break;
    sizes = {std::max<int64_t>(least, sizes.back() / 4), std::max<int64_t>(least + 1, sizes.back() / 2)};
  }
  const int64_t b1 = sizes.front(), b2 = sizes.back();
  const Prober::Result &r1 = rs.front(), &r2 = rs.back();
  if (r1.fits && r2.fits && b2 > b1) {
    m.per_image = double(r2.step_peak - r1.step_peak) / double(b2 - b1);
    m.fixed = double(r1.step_peak) - m.per_image * double(b1);
    m.update_peak = double(std::max(r1.update_peak, r2.update_peak));
    m.forward_per_image = (r2.forward_peak - r1.forward_peak) / double(b2 - b1);
    m.forward_fixed = r1.forward_peak - m.forward_per_image * double(b1);
    m.workspace_per_image = (r2.workspace - r1.workspace) / double(b2 - b1);
    m.workspace_fixed = r1.workspace - m.workspace_per_image * double(b1);
    for (size_t i = 0; i < p.stages().size(); ++i)
      m.stages.push_back(
          StageBytes{p.stages()[i].name, (r2.stage_bytes[i] - r1.stage_bytes[i]) / double(b2 - b1), r2.stage_seconds[i] / double(b2)});
    m.allocator_overhead = r2.held_over;
    m.seconds_per_image = r2.seconds / double(b2);
    const double fb1 = r1.seconds - r1.update_seconds, fb2 = r2.seconds - r2.update_seconds;
    m.seconds_per_batch_image = (fb2 - fb1) / double(b2 - b1);
    m.seconds_fixed = fb1 - m.seconds_per_batch_image * double(b1);
    if (m.seconds_per_batch_image <= 0 || m.seconds_fixed < 0)  // timing noise: no fixed part
      m.seconds_fixed = 0, m.seconds_per_batch_image = fb2 / double(b2);
    m.update_seconds = std::min(r1.update_seconds, r2.update_seconds);
    // The larger size once more as a later micro-batch of an accumulating step runs: with every
    // gradient allocated from the start. Its peak is above the first's by the gradients the
    // first had not made yet at its own peak: all of them when that sits at the forward's end,
    // few when it sits late in the backward (recompute, small batches). Where the larger does
    // not fit that way, the smaller: counting every gradient instead over-predicted
    // Hourglass-104 at 256 px with every stage recomputed by 0.6 GiB (3.66 GiB for 3.04 at one image).
    const double gradients = double(static_memory(p.trainer()).gradients);
    Prober::Result held = p.step(b2, true);
    double first = double(r2.step_peak);
    if (!held.fits) held = p.step(b1, true), first = double(r1.step_peak);
    m.held_gradients = held.fits ? std::clamp(double(held.step_peak) - first, 0.0, gradients) : gradients;
  } else if (r1.fits) {  // only the smaller probe fits: attribute everything above the static memory to its images
    const double fixed = double(static_memory(p.trainer()).total());
    m.fixed = fixed;
    m.per_image = (double(r1.step_peak) - fixed) / double(b1);
    m.update_peak = double(r1.update_peak);
    m.seconds_per_image = r1.seconds / double(b1);
    m.seconds_per_batch_image = (r1.seconds - r1.update_seconds) / double(b1);
    m.update_seconds = r1.update_seconds;
    m.held_gradients = double(static_memory(p.trainer()).gradients);
    for (size_t i = 0; i < p.stages().size(); ++i)
      m.stages.push_back(StageBytes{p.stages()[i].name, r1.stage_bytes[i] / double(b1), r1.stage_seconds[i] / double(b1)});
  } else {
    m.fixed = -1;  // not even the smallest probe fits
  }
  return m;
}

}  // namespace headroom::memory
