#include "headroom/memory/estimate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "headroom/augment/augment.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/train/trainer.h"

namespace headroom::memory {

namespace {

// Enforces a budget for the probes' lifetime, then puts the previous limit back.
class LimitGuard {
 public:
  LimitGuard(MemoryMonitor& m, int64_t budget) : m_(m), previous_(m.sample().limit) {
    if (budget > 0) m_.set_limit(budget);
  }
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

// Calls `on` at the trainer's step phases: where the prober reads the allocator.
class PhaseProbe : public train::Hook {
 public:
  std::function<void(train::StepPhase)> on;
  void after_phase(train::Trainer&, train::StepPhase phase) override {
    if (on) on(phase);
  }
};

// A throwaway copy of the run (model, loss, optimizer with its state, EMA) on the run's device,
// stepping on synthetic batches of the largest input size and the densest label count through
// the trainer's own step primitives.
class Prober {
 public:
  Prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp)
      : monitor_(monitor), nc_(int64_t(split->names.size())) {
    monitor_.release_cache();
    base_ = monitor_.sample().allocated;
    Config pc = c;
    pc.train.steps = 1;
    pc.train.amp = train::to_string(amp);
    pc.data.cache = "none";  // the probes never read images: no cache to build
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
    min_batch_ = trainer_->loader().options().min_batch();
  }

  struct Result {
    bool fits = false;
    int64_t peak = 0;                 // above the memory in use before the prober was built
    int64_t step_peak = 0;            // ... during input, forward, loss and backward
    int64_t update_peak = 0;          // ... during the optimizer step and the EMA update
    int64_t held_over = 0;            // what the allocator held at the peak beyond the tensors
    double workspace = 0;             // loss phase peak above the forward's end
    double update_seconds = 0;        // the optimizer step and the EMA update
    double forward_peak = 0;          // at the forward's end plus the loss workspace (above base)
    std::vector<double> stage_bytes;  // kept per stage after the forward
    std::vector<double> stage_seconds;
    double seconds = 0;
  };

  // `gradients_held`: every gradient is allocated before the step, as in the second and later
  // micro-batches of an accumulating step (the first makes them during its backward).
  Result step(int64_t b, bool gradients_held = false) {
    Result r;
    const data::HostBatch batch = synthetic_batch(b);
    int64_t fb_peak = 0;  // input, forward, loss, backward
    std::vector<int64_t> at_row(trainer_->model().stages().empty() ? 0 : size_t(stages_.back().end + 1), 0);
    std::vector<double> time_at_row(at_row.size(), 0);
    auto forward_start = std::chrono::steady_clock::now();
    int64_t input_end = 0, forward_end = 0, overall = 0, overall_held = 0;
    // What the allocator holds at the peak that it cannot give back when memory runs short: CUDA
    // keeps its segments (reserved); the CPU allocator returns its cache before an allocation
    // fails, so there only the blocks in use count (their size classes round requests up).
    const bool cpu = monitor_.device().is_cpu();
    const auto held = [cpu](const MemoryStats& s) { return cpu ? s.peak_active : s.peak_reserved; };
    std::chrono::steady_clock::time_point update_start;
    bool in_forward = false;
    trainer_->model().set_row_observer([&](int row) {
      if (in_forward && size_t(row) < at_row.size()) {
        monitor_.synchronize();  // stage times are device times (a probe, not the training loop)
        at_row[size_t(row)] = monitor_.sample().allocated;
        time_at_row[size_t(row)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count();
      }
    });
    phases_->on = [&](train::StepPhase p) {
      const MemoryStats s = monitor_.sample();
      overall = std::max(overall, s.peak_allocated);
      overall_held = std::max(overall_held, held(s));
      if (p == train::StepPhase::input) {
        input_end = s.allocated;
        in_forward = true;
        monitor_.synchronize();
        forward_start = std::chrono::steady_clock::now();
      } else if (p == train::StepPhase::forward && in_forward) {
        in_forward = false;
        forward_end = s.allocated;
        monitor_.reset_peak();
      } else if (p == train::StepPhase::loss && r.workspace == 0) {
        r.workspace = double(s.peak_allocated - forward_end);
      } else if (p == train::StepPhase::backward) {
        fb_peak = overall;
        monitor_.reset_peak();  // from here: the optimizer step and the EMA update
        monitor_.synchronize();
        update_start = std::chrono::steady_clock::now();
      }
    };
    monitor_.release_cache();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (gradients_held) hold_gradients();
      monitor_.reset_peak();
      const train::StepInput in = trainer_->prepare_step({batch});
      trainer_->forward_backward(in, 0, 0, b);
      trainer_->update();
      if (trainer_->ema()) trainer_->ema()->update(trainer_->model());
      monitor_.synchronize();
      r.update_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - update_start).count();
      const MemoryStats s = monitor_.sample();
      r.fits = true;
      r.peak = std::max(overall, s.peak_allocated) - base_;
      r.step_peak = fb_peak - base_;
      r.forward_peak = double(forward_end - base_) + r.workspace;
      r.update_peak = s.peak_allocated - base_;
      r.held_over = std::max<int64_t>(0, std::max(overall_held, held(s)) - std::max(overall, s.peak_allocated));
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e)) throw;
      trainer_->discard_gradients();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    trainer_->model().set_row_observer(nullptr);
    phases_->on = nullptr;
    monitor_.release_cache();
    if (r.fits) {
      int64_t prev = input_end;
      double prev_t = 0;
      for (const auto& st : stages_) {
        const int64_t now = at_row[size_t(st.end)];
        r.stage_bytes.push_back(double(now - prev));
        r.stage_seconds.push_back(time_at_row[size_t(st.end)] - prev_t);
        prev = now;
        prev_t = time_at_row[size_t(st.end)];
      }
    }
    return r;
  }

  train::Trainer& trainer() { return *trainer_; }
  void hold_gradients() {
    at::NoGradGuard no_grad;
    for (auto& param : trainer_->model().parameters())
      if (param.requires_grad() && !param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
  }
  int64_t size() const { return size_; }
  int64_t min_size() const { return min_size_; }
  int64_t rows() const { return rows_; }
  int64_t densest() const { return densest_; }
  int64_t min_batch() const { return min_batch_; }
  const std::vector<models::StageSpan>& stages() const { return stages_; }

 private:
  data::HostBatch synthetic_batch(int64_t b) const {
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

  MemoryMonitor& monitor_;
  int64_t nc_, base_ = 0, size_ = 0, min_size_ = 0, rows_ = 0, densest_ = 0, min_batch_ = 1;
  std::unique_ptr<train::Trainer> trainer_;
  PhaseProbe* phases_ = nullptr;  // owned by trainer_
  std::vector<models::StageSpan> stages_;
};

// The prober, or an InputError when the model and its training state alone exceed the budget.
Prober make_prober(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& monitor, train::AmpMode amp,
                   int64_t budget) {
  try {
    return Prober(c, split, monitor, amp);
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) throw;
    monitor.release_cache();
    throw InputError("the model " + c.model.file + " with its gradients, optimizer state and EMA does not fit memory.budget " +
                     format_bytes(double(budget)) + " on " + monitor.device().str() +
                     ": use a lighter model (model.file / model.scale), train.ema=false, or a larger budget");
  }
}

// Half the configured batch and the configured batch: the line is fitted where it matters.
std::vector<int64_t> default_probes(const Config& c) {
  return c.train.batch >= 2 ? std::vector<int64_t>{c.train.batch / 2, c.train.batch} : std::vector<int64_t>{1, 2};
}

std::string mode_name(train::AmpMode amp, models::RecomputeMode r) {
  std::string s = amp == train::AmpMode::off ? "fp32" : std::string("amp ") + train::to_string(amp);
  if (r != models::RecomputeMode::off) s += std::string(" + recompute ") + models::to_string(r);
  return s;
}

// Probes a mode at the two batch sizes (raised to the smallest the model trains at) and fits the line.
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
    // few when it sits late in the backward (recompute, small batches).
    const double gradients = double(static_memory(p.trainer()).gradients);
    const Prober::Result held = p.step(b2, true);
    m.held_gradients = held.fits ? std::clamp(double(held.step_peak - r2.step_peak), 0.0, gradients) : gradients;
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

}  // namespace

int64_t densest_labels(const data::Split& split) {
  size_t n = 0;
  for (const auto& s : split.samples) n = std::max(n, s.boxes.size());
  return int64_t(n);
}

const ModeEstimate& MemoryEstimate::configured() const {
  for (const auto& m : modes)
    if (m.configured) return m;
  return modes.front();
}

int64_t MemoryEstimate::accumulate(int64_t b) const {
  return train::accumulation_steps(nominal_batch, b);
}

ModeEstimate MemoryEstimate::at_size(const ModeEstimate& m, int64_t size) const {
  const double area = double(size) * double(size) / (double(imgsz) * double(imgsz));
  ModeEstimate s = m;
  s.per_image *= area;
  for (auto& st : s.stages) st.per_image *= area, st.seconds_per_image *= area;
  s.workspace_per_image *= area;
  s.forward_per_image *= area;
  s.seconds_per_image *= area;
  return s;
}

int64_t MemoryEstimate::step_images(int64_t b) const { return step_batch > 0 ? std::max(step_batch, b) : accumulate(b) * b; }

int64_t MemoryEstimate::input_buffers(int64_t b) const {
  if (!input_buffers_on_device) return 0;
  // prefetched loader batches, and the step's own
  const double loaded = step_batch > 0 ? double(step_batch) * double(prefetch + 1) : double(b) * double(prefetch + accumulate(b));
  return int64_t(canvas_bytes * loaded);
}

int64_t MemoryEstimate::step_inputs(int64_t b) const {
  return (step_images(b) - b) * 3 * imgsz * imgsz * int64_t(sizeof(float));
}

int64_t MemoryEstimate::predicted_peak(const ModeEstimate& m, int64_t b, double savings) const {
  // The step's peak moves with the batch: at small batches it sits in the backward, where the
  // gradients have been allocated and few activations are left, so the two probes' peaks grow
  // slowly; at large batches it is the forward's end, which grows by every image's activations.
  // Each line is fitted on its own and the larger taken (Hourglass-104 at 128 px: the step line
  // alone said 74 images fit 5 GiB; 25 do).
  // A step of several micro-batches: the later ones start with every gradient allocated, which
  // lifts the backward line by what the probe measured (not by all the gradients: the first
  // micro-batch's backward peak already holds those it has made; adding them all erred +12% on
  // Hourglass-104 at 128 px) and the forward's end by all of them.
  const bool accumulating = step_images(b) > b;
  const double held = accumulating ? m.held_gradients : 0.0;
  const double phase = std::max(m.fixed + m.per_image * double(b) + held,
                                m.forward_fixed + m.forward_per_image * double(b) + (accumulating ? double(fixed.gradients) : 0.0));
  const double step = phase + double(step_inputs(b)) - savings;
  return int64_t(std::max(step, m.update_peak)) + input_buffers(b) + m.allocator_overhead;
}

int64_t MemoryEstimate::largest_batch(const ModeEstimate& m) const {
  if (m.fixed < 0) return 0;
  int64_t b = 0;
  while (b < 65536 && predicted_peak(m, b + 1) <= usable) ++b;
  return b >= min_batch ? b : 0;
}

namespace {
MemoryEstimate estimate_header(const Config& c, Prober& p, MemoryMonitor& monitor, int64_t budget) {
  MemoryEstimate e;
  e.device = monitor.device().str();
  e.budget = budget;
  e.usable = usable_budget(budget, c.memory.headroom);
  e.imgsz = p.size();
  e.min_imgsz = p.min_size();
  e.canvas = c.data.imgsz;
  e.max_boxes = p.rows();
  e.min_batch = p.min_batch();
  e.batch = c.train.batch;
  e.fixed = static_memory(p.trainer());
  if (!p.trainer().optimizer().fused())
    for (const auto& param : p.trainer().model().parameters())
      e.update_workspace = std::max<int64_t>(e.update_workspace, int64_t(param.nbytes()));
  e.stages = p.stages().size();
  e.nominal_batch = c.train.nominal_batch;
  e.prefetch = c.data.prefetch;
  e.input_buffers_on_device = monitor.device().is_cpu();
  e.canvas_bytes = 3.0 * double(c.data.imgsz) * double(c.data.imgsz);
  return e;
}
}  // namespace

MemoryEstimate estimate_memory(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor,
                               int64_t budget, const EstimateOptions& o) {
  const LimitGuard limit(monitor, budget);
  MemoryEstimate e;
  {
    using models::RecomputeMode;
    using train::AmpMode;
    const AmpMode configured_amp = train::resolve_amp(c, monitor.device());
    const RecomputeMode configured_ck = models::recompute_mode_from(c.memory.activation_checkpointing);
    // A mode list with AMP last: switching AMP on is one-way on a trainer.
    std::vector<std::pair<bool, RecomputeMode>> modes;  // (amp, recompute)
    if (o.all_modes()) modes = {{false, RecomputeMode::off}, {true, RecomputeMode::off}, {true, RecomputeMode::all}};
    const std::pair<bool, RecomputeMode> cfg{configured_amp != AmpMode::off, configured_ck};
    if (std::find(modes.begin(), modes.end(), cfg) == modes.end()) modes.push_back(cfg);
    std::stable_sort(modes.begin(), modes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const bool amp_as_configured = !o.all_modes();
    Prober p = make_prober(c, train, monitor, amp_as_configured ? configured_amp : AmpMode::off, budget);
    e = estimate_header(c, p, monitor, budget);
    const std::vector<int64_t> probes = o.probe_batches().size() == 2 ? o.probe_batches() : default_probes(c);
    for (const auto& [amp, ck] : modes) {
      ModeEstimate m = probe_mode(p, amp ? (amp_as_configured ? configured_amp : AmpMode::bf16) : AmpMode::off, ck, probes);
      m.configured = (amp == cfg.first && ck == cfg.second);
      e.modes.push_back(std::move(m));
    }
  }
  const ProcessMemory host = process_memory();
  e.host_rss = host.rss;
  e.host_peak_rss = host.peak_rss;
  return e;
}

std::string format_memory_estimate(const MemoryEstimate& e) {
  const auto b = [](double v) { return format_bytes(v); };
  std::string s = fmt::format("Memory estimate on {} at {} px (largest training size), {} label rows per image (densest image{}), "
                              "batch {}\n",
                              e.device, e.imgsz, e.max_boxes, "", e.batch);
  if (e.min_batch > 1)
    s += fmt::format("  smallest micro-batch the model trains at: {} (BatchNorm needs 2 values per channel; at {} px a map is 1x1)\n",
                     e.min_batch, e.min_imgsz);
  s += fmt::format("  {:<40}{:>12}\n", "parameters", b(double(e.fixed.parameters)));
  s += fmt::format("  {:<40}{:>12}\n", "gradients", b(double(e.fixed.gradients)));
  s += fmt::format("  {:<40}{:>12}\n", "optimizer state", b(double(e.fixed.optimizer)));
  s += fmt::format("  {:<40}{:>12}\n", "EMA", b(double(e.fixed.ema)));
  s += fmt::format("  {:<40}{:>12}{}\n", fmt::format("loader input buffers at batch {}", e.batch),
                   b(double(e.input_buffers_on_device ? e.input_buffers(e.batch)
                                                      : int64_t(e.canvas_bytes * double(e.batch * (e.prefetch + e.accumulate(e.batch)))))),
                   e.input_buffers_on_device ? "" : "  (host memory, not on the device)");
  if (e.accumulate(e.batch) > 1)
    s += fmt::format("  {:<40}{:>12}\n", fmt::format("the step's other {} batches, augmented", e.accumulate(e.batch) - 1),
                     b(double(e.step_inputs(e.batch))));
  for (const auto& m : e.modes) {
    s += fmt::format("\n  {}{}\n", m.name, m.configured ? "  (this config)" : "");
    if (m.fixed < 0) {
      s += "    a batch of 1 does not fit the budget\n";
      continue;
    }
    s += fmt::format("    {:<38}{:>12}\n", "per step, whatever the batch", b(m.fixed));
    s += fmt::format("    {:<38}{:>12}\n", "per image (activations, input, loss)", b(m.per_image));
    for (const auto& st : m.stages) s += fmt::format("      {:<36}{:>12}\n", st.name, b(st.per_image));
    s += fmt::format("    {:<38}{:>12}  + {} per image\n", "loss and assigner workspace", b(m.workspace_fixed), b(m.workspace_per_image));
    s += fmt::format("    {:<38}{:>12}  + {} per image\n", "forward end + loss (large batches)", b(m.forward_fixed), b(m.forward_per_image));
    s += fmt::format("    {:<38}{:>12}  (parameters + gradients + state + EMA {} + update workspace {})\n",
                     "optimizer step + EMA update peak", b(m.update_peak), b(double(e.fixed.total())),
                     b(double(e.update_workspace)));
    if (e.accumulate(e.batch) > 1 || e.step_batch > e.batch)
      s += fmt::format("    {:<38}{:>12}\n", "later micro-batches' held gradients", b(m.held_gradients));
    if (m.allocator_overhead > 0) s += fmt::format("    {:<38}{:>12}\n", "allocator overhead (held - used)", b(double(m.allocator_overhead)));
    s += fmt::format("    {:<38}{:>12}\n", fmt::format("total at batch {}", e.batch), b(double(e.predicted_peak(m, e.batch))));
    if (e.budget > 0)
      s += fmt::format("    {:<38}{:>12}\n", fmt::format("largest batch under {}", b(double(e.usable))), std::to_string(e.largest_batch(m)));
    s += fmt::format("    {:<38}{:>12}\n", "step time per image (probe)", fmt::format("{:.3f} s", m.seconds_per_image));
    if (e.min_imgsz < e.imgsz)  // multi-scale: the batch that fits changes with the size
      for (int64_t size : {e.min_imgsz, e.canvas, e.imgsz}) {
        const ModeEstimate at = e.at_size(m, size);
        s += fmt::format("    {:<38}{:>12}{}\n", fmt::format("at {} px: per image", size), b(at.per_image),
                         e.budget > 0 ? fmt::format(", largest batch {}", e.largest_batch(at)) : std::string());
      }
  }
  if (e.budget > 0) s += fmt::format("\nBudget {} minus headroom: {}\n", b(double(e.budget)), b(double(e.usable)));
  if (e.host_rss > 0)
    s += fmt::format("Host resident memory (RSS) {} now, {} at the probes' peak{}\n", b(double(e.host_rss)), b(double(e.host_peak_rss)),
                     e.input_buffers_on_device ? " (the budget bounds it: tensors, code, libraries, buffers)"
                                               : " (host side: code, libraries, pinned loader buffers)");
  return s;
}

Json memory_estimate_json(const MemoryEstimate& e) {
  Json j = Json::object();
  j["device"] = e.device;
  j["budget"] = e.budget;
  j["usable"] = e.usable;
  j["imgsz"] = e.imgsz;
  j["max_boxes"] = e.max_boxes;
  j["min_batch"] = e.min_batch;
  j["batch"] = e.batch;
  j["parameters"] = e.fixed.parameters;
  j["gradients"] = e.fixed.gradients;
  j["optimizer"] = e.fixed.optimizer;
  j["ema"] = e.fixed.ema;
  j["update_workspace"] = e.update_workspace;
  j["input_buffers_at_batch"] = e.input_buffers(e.batch);
  j["input_buffers_on_device"] = e.input_buffers_on_device;
  j["step_inputs_at_batch"] = e.step_inputs(e.batch);
  j["host_rss"] = e.host_rss;
  j["host_peak_rss"] = e.host_peak_rss;
  Json modes = Json::array();
  for (const auto& m : e.modes) {
    Json mj = Json::object();
    mj["mode"] = m.name;
    mj["configured"] = m.configured;
    mj["fits_batch_1"] = m.fixed >= 0;
    mj["fixed"] = m.fixed;
    mj["per_image"] = m.per_image;
    mj["update_peak"] = m.update_peak;
    mj["forward_fixed"] = m.forward_fixed;
    mj["forward_per_image"] = m.forward_per_image;
    mj["workspace_fixed"] = m.workspace_fixed;
    mj["workspace_per_image"] = m.workspace_per_image;
    mj["held_gradients"] = m.held_gradients;
    mj["allocator_overhead"] = m.allocator_overhead;
    mj["total_at_batch"] = e.predicted_peak(m, e.batch);
    if (e.budget > 0) mj["largest_batch"] = e.largest_batch(m);
    Json stages = Json::array();
    for (const auto& st : m.stages) {
      Json sj = Json::object();
      sj["stage"] = st.name;
      sj["per_image"] = st.per_image;
      stages.push_back(std::move(sj));
    }
    mj["stages"] = std::move(stages);
    Json probes = Json::array();
    for (const auto& [batch, peak] : m.probes) {
      Json pj = Json::object();
      pj["batch"] = batch;
      pj["peak"] = peak;
      probes.push_back(std::move(pj));
    }
    mj["probes"] = std::move(probes);
    modes.push_back(std::move(mj));
  }
  j["modes"] = std::move(modes);
  return j;
}

namespace {
// Predicted images per second of a step of `step` images in micro-batches of `b` with plan `sp`.
double images_per_second(const ModeEstimate& m, int64_t step, int64_t b, const StagePlan* sp) {
  const int64_t parts = (step + b - 1) / b;
  const double recompute = sp ? sp->recompute_seconds / double(b) * double(step) : 0.0;
  const double seconds = double(parts) * m.seconds_fixed + double(step) * m.seconds_per_batch_image + m.update_seconds + recompute;
  return seconds > 0 ? double(step) / seconds : 0.0;
}
}  // namespace

AutoBatch choose_batch(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor, int64_t budget) {
  AutoBatch a;
  const LimitGuard limit(monitor, budget);
  const bool plan_auto = c.memory.activation_checkpointing == "auto";
  const models::RecomputeMode configured_ck = plan_auto ? models::RecomputeMode::off : models::recompute_mode_from(c.memory.activation_checkpointing);
  Prober p = make_prober(c, train, monitor, train::resolve_amp(c, monitor.device()), budget);
  const int64_t least = p.min_batch();
  a.estimate = estimate_header(c, p, monitor, budget);
  a.step_batch = a.estimate.step_batch =
      std::max(least, std::min<int64_t>(c.train.nominal_batch, int64_t(train->samples.size())));
  ModeEstimate plain = probe_mode(p, train::AmpMode::off, configured_ck, {least, least + 1});
  plain.configured = true;
  a.estimate.modes.push_back(plain);
  const int64_t usable = a.estimate.usable, cap = a.step_batch;
  if (plan_auto) {
    ModeEstimate recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, {least, least + 1});
    a.planner = std::make_shared<RecomputePlanner>(a.estimate, plain, recomputed);
    // The line from the two smallest sizes, then again near the largest batch it says fits: the
    // fit is closest where the choice is made.
    int64_t reach = least;
    for (int64_t b = least; b <= cap; ++b)
      if (a.planner->plan(a.estimate.imgsz, b).fits) reach = b;
    if (reach >= 2 * (least + 1)) {
      plain = probe_mode(p, train::AmpMode::off, models::RecomputeMode::off, {reach / 2, reach});
      plain.configured = true;
      recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, {reach / 2, reach});
      a.estimate.modes = {plain};
      a.planner = std::make_shared<RecomputePlanner>(a.estimate, plain, recomputed);
    }
  }
  // A real step at b with the plan the run would use there.
  const auto fits = [&](int64_t b) {
    for (const auto& [tb, peak] : a.tried)
      if (tb == b) return peak >= 0 && peak <= usable;
    if (a.planner)
      p.trainer().model().set_recomputed_stages(a.planner->plan(a.estimate.imgsz, b).recomputed);
    else
      p.trainer().model().set_recompute(configured_ck);
    // A step of several micro-batches: its later ones run with the earlier ones' gradients
    // allocated, and its other images' inputs held.
    const Prober::Result r = p.step(b, a.estimate.step_images(b) > b);
    const int64_t total =
        r.fits ? std::max(r.step_peak + a.estimate.step_inputs(b), r.update_peak) + a.estimate.input_buffers(b) : -1;
    a.tried.emplace_back(b, total);
    return r.fits && total <= usable;
  };
  if (plain.fixed < 0 || !fits(least))
    throw InputError("train.batch=auto: " + (least == 1 ? std::string("one image does") : std::to_string(least) + " images (the "
                     "smallest micro-batch the model trains at) do") + " not fit memory.budget " + format_bytes(double(budget)) +
                     " minus " + std::to_string(int(100 * c.memory.headroom)) + "% headroom on " + monitor.device().str() + ".\n" +
                     format_memory_estimate(a.estimate) +
                     "Lower data.imgsz, use a lighter model, train.amp, memory.activation_checkpointing=all, or a larger budget.");
  const auto option = [&](int64_t b) {
    if (!a.planner) return BatchOption{b, models::to_string(configured_ck), a.estimate.predicted_peak(plain, b),
                                       images_per_second(plain, cap, b, nullptr)};
    const StagePlan& sp = a.planner->plan(a.estimate.imgsz, b);
    return BatchOption{b, a.planner->stages_of(sp), sp.predicted_peak, images_per_second(plain, cap, b, &sp)};
  };
  // The largest micro-batch a real step confirms (each with its plan): the fit's guess, then
  // bisection between a size that fits and one that does not.
  int64_t guess = least;
  for (int64_t b = least; b <= cap; ++b)
    if (a.planner ? a.planner->plan(a.estimate.imgsz, b).fits : a.estimate.predicted_peak(plain, b) <= usable) guess = b;
  int64_t lo = least, hi = cap + 1;  // lo fits; hi does not (or is past the cap)
  const auto probe = [&](int64_t b) {
    if (b <= lo || b >= hi) return;
    (fits(b) ? lo : hi) = b;
  };
  probe(guess);
  probe(lo + 1);
  while (hi - lo > 1) probe(lo + (hi - lo) / 2);
  a.batch = lo;
  // Below it, the choices the preference weighs: the largest (batch), or the highest predicted
  // images per second (throughput), confirmed by its own step.
  for (int64_t b = least; b <= lo; ++b)  // those predicted to fit (a smaller one can need more: it accumulates), and lo
    if (const BatchOption o = option(b); o.predicted_peak <= usable || b == lo) a.options.push_back(o);
  const bool by_batch = !a.planner || c.memory.prefer == "batch";
  std::stable_sort(a.options.begin(), a.options.end(), [&](const BatchOption& x, const BatchOption& y) {
    if (by_batch || x.images_per_second == y.images_per_second) return x.batch > y.batch;
    return x.images_per_second > y.images_per_second;
  });
  if (!fits(a.options.front().batch)) {  // the prediction was wrong: the largest confirmed
    const auto it = std::find_if(a.options.begin(), a.options.end(), [&](const BatchOption& o) { return o.batch == lo; });
    std::rotate(a.options.begin(), it, it + 1);
  }
  a.batch = a.options.front().batch;
  return a;
}

std::string format_batch_options(const AutoBatch& a) {
  std::string s;
  for (size_t i = 0; i < a.options.size() && i < 8; ++i) {
    const BatchOption& o = a.options[i];
    s += fmt::format("\n  micro-batch {:>3}, recompute {}: predicted peak {}, {:.2f} img/s{}", o.batch, o.plan,
                     format_bytes(double(o.predicted_peak)), o.images_per_second, i == 0 ? "  (chosen)" : "");
  }
  if (a.options.size() > 8) s += fmt::format("\n  ... {} more", a.options.size() - 8);
  return s;
}

RecomputePlanner::RecomputePlanner(MemoryEstimate estimate, ModeEstimate plain, ModeEstimate recomputed)
    : e_(std::move(estimate)), plain_(std::move(plain)), recomputed_(std::move(recomputed)) {}

const StagePlan& RecomputePlanner::plan(int64_t size, int64_t micro) {
  const auto key = std::make_pair(size, micro);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  const ModeEstimate scaled = e_.at_size(plain_, size), scaled_ck = e_.at_size(recomputed_, size);
  const size_t n = e_.stages;  // the model's: a probe that did not fit measured none
  std::vector<double> saving(n, 0), cost(n, 0);
  for (size_t i = 0; i < n && i < scaled.stages.size() && i < scaled_ck.stages.size(); ++i) {
    saving[i] = std::max(0.0, scaled.stages[i].per_image - scaled_ck.stages[i].per_image) * double(micro);
    cost[i] = scaled.stages[i].seconds_per_image * double(micro);
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (saving[i] > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return saving[a] * cost[b] > saving[b] * cost[a]; });
  StagePlan p;
  p.recomputed.assign(n, plain_.fixed < 0);  // no probe fitted: recompute everything, the governor does the rest
  p.step_seconds = scaled.seconds_per_image * double(micro);
  double saved = 0;
  for (size_t i : order) p.recompute_all_seconds += cost[i];
  for (size_t i : order) {
    if (plain_.fixed < 0 || e_.predicted_peak(scaled, micro, saved) <= e_.usable) break;
    p.recomputed[i] = true;
    saved += saving[i];
    p.recompute_seconds += cost[i];
  }
  p.predicted_peak = e_.predicted_peak(scaled, micro, saved);
  p.fits = plain_.fixed >= 0 && p.predicted_peak <= e_.usable;
  return cache_.emplace(key, std::move(p)).first->second;
}

std::string RecomputePlanner::stages_of(const StagePlan& p) const {
  std::string stages;
  size_t n = 0;
  for (size_t i = 0; i < p.recomputed.size(); ++i)
    if (p.recomputed[i])
      ++n, stages += (stages.empty() ? "" : ", ") + (i < plain_.stages.size() ? plain_.stages[i].name : "stage " + std::to_string(i));
  if (n == 0) return "no stage";
  return n == p.recomputed.size() ? "every stage" : stages;
}

std::string RecomputePlanner::describe(const StagePlan& p, int64_t size, int64_t micro) const {
  const std::string stages = stages_of(p);
  const double step = std::max(p.step_seconds, 1e-12);
  return fmt::format("activation checkpointing auto at {} px, micro-batch {}: {}; predicted peak {} of {}{}; recompute +{:.0f}% "
                     "of the step (every stage: +{:.0f}%)",
                     size, micro, stages, format_bytes(double(p.predicted_peak)),
                     format_bytes(double(e_.usable)), p.fits ? "" : " (over: the governor shrinks the micro-batch)",
                     100 * p.recompute_seconds / step, 100 * p.recompute_all_seconds / step);
}

std::shared_ptr<RecomputePlanner> make_recompute_planner(const Config& c, const std::shared_ptr<const data::Split>& train,
                                                           MemoryMonitor& monitor, int64_t budget) {
  const LimitGuard limit(monitor, budget);
  Prober p = make_prober(c, train, monitor, train::resolve_amp(c, monitor.device()), budget);
  ModeEstimate plain = probe_mode(p, train::AmpMode::off, models::RecomputeMode::off, default_probes(c));
  ModeEstimate recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, default_probes(c));
  plain.configured = true;
  MemoryEstimate e = estimate_header(c, p, monitor, budget);
  e.modes = {plain, recomputed};
  return std::make_shared<RecomputePlanner>(std::move(e), std::move(plain), std::move(recomputed));
}

}  // namespace headroom::memory
