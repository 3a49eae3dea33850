#include "headroom/memory/estimate.h"

#include <algorithm>
#include <limits>
#include <map>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/data/letterbox.h"
#include "headroom/train/trainer.h"
#include "prober.h"

namespace headroom::memory {

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

int64_t MemoryEstimate::augmented_bytes(int64_t images) const { return images * 3 * imgsz * imgsz * int64_t(sizeof(float)); }

int64_t MemoryEstimate::step_inputs(int64_t b) const { return augmented_bytes(step_images(b) - b); }

int64_t MemoryEstimate::next_input(int64_t b) const {
  if (!input_beside) return 0;
  const int64_t loader_batch = step_batch > 0 ? std::max(step_batch, b) : b;  // augmented as one
  return augmented_bytes(step_images(b)) + int64_t(augment_per_image * double(loader_batch));
}

int64_t MemoryEstimate::graph_inputs(int64_t b) const { return step_graphed ? augmented_bytes(step_images(b)) : 0; }

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
  const int64_t graph = m.recompute == models::RecomputeMode::off && savings == 0 ? graph_inputs(b) : 0;
  return int64_t(std::max(step, m.update_peak)) + next_input(b) + graph + input_buffers(b) + m.allocator_overhead;
}

int64_t MemoryEstimate::largest_batch(const ModeEstimate& m) const {
  if (m.fixed < 0) return 0;
  int64_t b = 0;
  while (b < 65536 && predicted_peak(m, b + 1) <= usable) ++b;
  return b >= min_batch ? b : 0;
}

namespace {
// `world`: the run's processes (several capture no graph).
MemoryEstimate estimate_header(const Config& c, Prober& p, MemoryMonitor& monitor, int64_t budget, int64_t world) {
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
  e.update_workspace = p.trainer().optimizer().update_workspace_bytes();
  e.stages = p.stages().size();
  e.nominal_batch = c.train.nominal_batch;
  e.prefetch = c.data.prefetch;
  e.input_buffers_on_device = monitor.device().is_cpu();
  e.canvas_bytes = double(data::canvas_bytes(c.data.imgsz));
  e.input_beside = monitor.device().is_cuda() && c.data.side_stream;
  e.step_graphed = train::graph_mode_from(c.train.cuda_graphs) != train::GraphMode::off &&
                   train::graph_refusal(c, monitor.device(), world).empty();
  return e;
}
}  // namespace

MemoryEstimate estimate_memory(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor,
                               int64_t budget, const EstimateOptions& o) {
  const LimitGuard limit(monitor, budget, c.memory.headroom);
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
    e = estimate_header(c, p, monitor, budget, 1);
    const std::vector<int64_t> probes = o.probe_batches().size() == 2 ? o.probe_batches() : default_probes(c);
    for (const auto& [amp, ck] : modes) {
      ModeEstimate m = probe_mode(p, amp ? (amp_as_configured ? configured_amp : AmpMode::bf16) : AmpMode::off, ck, probes);
      m.configured = (amp == cfg.first && ck == cfg.second);
      e.modes.push_back(std::move(m));
    }
    e.augment_per_image = p.augment_per_image();
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
  if (e.input_beside)
    s += fmt::format("  {:<40}{:>12}  (and its augmentation's working memory)\n", "the next step's input (side stream)",
                     b(double(e.next_input(e.batch))));
  if (e.step_graphed)
    s += fmt::format("  {:<40}{:>12}  (without recompute)\n", "the CUDA graph's inputs", b(double(e.graph_inputs(e.batch))));
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
  Json modes = Json::array();
  for (const auto& m : e.modes) {
    Json stages = Json::array(), probes = Json::array();
    for (const auto& st : m.stages) stages.push_back(Json::object({{"stage", st.name}, {"per_image", st.per_image}}));
    for (const auto& [batch, peak] : m.probes) probes.push_back(Json::object({{"batch", batch}, {"peak", peak}}));
    Json::Members mj = {{"mode", m.name}, {"configured", m.configured}, {"fits_batch_1", m.fixed >= 0}, {"fixed", m.fixed},
                        {"per_image", m.per_image}, {"update_peak", m.update_peak}, {"forward_fixed", m.forward_fixed},
                        {"forward_per_image", m.forward_per_image}, {"workspace_fixed", m.workspace_fixed},
                        {"workspace_per_image", m.workspace_per_image}, {"held_gradients", m.held_gradients},
                        {"allocator_overhead", m.allocator_overhead}, {"total_at_batch", e.predicted_peak(m, e.batch)}};
    if (e.budget > 0) mj.emplace_back("largest_batch", e.largest_batch(m));
    mj.insert(mj.end(), {{"stages", std::move(stages)}, {"probes", std::move(probes)}});
    modes.push_back(Json::object(std::move(mj)));
  }
  return Json::object({{"device", e.device}, {"budget", e.budget}, {"usable", e.usable}, {"imgsz", e.imgsz},
                       {"max_boxes", e.max_boxes}, {"min_batch", e.min_batch}, {"batch", e.batch},
                       {"parameters", e.fixed.parameters}, {"gradients", e.fixed.gradients}, {"optimizer", e.fixed.optimizer},
                       {"ema", e.fixed.ema}, {"update_workspace", e.update_workspace},
                       {"input_buffers_at_batch", e.input_buffers(e.batch)}, {"input_buffers_on_device", e.input_buffers_on_device},
                       {"step_inputs_at_batch", e.step_inputs(e.batch)}, {"next_input_at_batch", e.next_input(e.batch)},
                       {"graph_inputs_at_batch", e.graph_inputs(e.batch)}, {"step_graphed", e.step_graphed},
                       {"input_beside", e.input_beside}, {"augment_per_image", e.augment_per_image}, {"host_rss", e.host_rss},
                       {"host_peak_rss", e.host_peak_rss}, {"modes", std::move(modes)}});
}

namespace {
// Predicted images per second of a step of `step` images in micro-batches of `b` with plan `sp`.
double images_per_second(const ModeEstimate& m, int64_t step, int64_t b, const StagePlan* sp) {
  const int64_t parts = (step + b - 1) / b;
  const double recompute = sp ? sp->recompute_seconds / double(b) * double(step) : 0.0;
  const double seconds = double(parts) * m.seconds_fixed + double(step) * m.seconds_per_batch_image + m.update_seconds + recompute;
  return seconds > 0 ? double(step) / seconds : 0.0;
}

// With memory.activation_checkpointing=auto: the recompute planner. Refits `plain` (and the
// estimate's mode) near the largest batch the first fit says fits.
void fit_recompute_planner(Prober& p, int64_t least, int64_t cap, ModeEstimate& plain, AutoBatch& a) {
  ModeEstimate recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, {least, least + 1});
  a.planner = std::make_shared<RecomputePlanner>(a.estimate, plain, recomputed);
  // The line from the two smallest sizes, then again near the largest batch it says fits: the
  // fit is closest where the choice is made. Each line is refitted only at sizes it says fit.
  int64_t reach = least, reach_plain = least;
  for (int64_t b = least; b <= cap; ++b) {
    if (a.planner->plan(a.estimate.imgsz, b).fits) reach = b;
    if (a.estimate.predicted_peak(plain, b) <= a.estimate.usable) reach_plain = b;
  }
  if (reach_plain >= 2 * (least + 1)) {
    plain = probe_mode(p, train::AmpMode::off, models::RecomputeMode::off, {reach_plain / 2, reach_plain});
    plain.configured = true;
    a.estimate.modes = {plain};
  }
  if (reach >= 2 * (least + 1)) recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, {reach / 2, reach});
  a.planner = std::make_shared<RecomputePlanner>(a.estimate, plain, recomputed);
}

// choose_batch's search. The sizes weighed are the largest parts of a step's balanced cuts (a
// 21-image cap on a 64-image step runs parts of 16, as 16 does). Real steps confirm the fitted
// line's predictions; every step taken is recorded in a.tried.
struct BatchSearch {
  Prober& p;
  AutoBatch& a;
  const ModeEstimate& plain;  // the line without recompute (the planner's base when there is one)
  models::RecomputeMode configured_ck;
  int64_t least, cap;
  MemoryMonitor& monitor;
  int64_t base;               // the memory in use before the probes
  std::vector<int64_t> sizes;  // ascending
  double correction = 1.0;    // measured / predicted peak of the last step that fitted

  // A probe is run only where the corrected prediction is this far under the enforced limit.
  static constexpr double kMargin = 0.05;
  static constexpr int kTimed = 4;  // memory.prefer throughput: the most sizes timed

  BatchSearch(Prober& p, AutoBatch& a, const ModeEstimate& plain, models::RecomputeMode ck, int64_t least, int64_t cap,
              MemoryMonitor& monitor, int64_t base)
      : p(p), a(a), plain(plain), configured_ck(ck), least(least), cap(cap), monitor(monitor), base(base) {
    for (int64_t b = least; b <= cap; ++b) {  // Governor::split's largest part, without making the parts
      const int64_t parts = Governor::parts(cap, b, least);
      const int64_t part = (cap + parts - 1) / parts;
      if (sizes.empty() || sizes.back() != part) sizes.push_back(part);
    }
  }

  BatchProbe* tried(int64_t b) {  // the last step at b
    for (auto t = a.tried.rbegin(); t != a.tried.rend(); ++t)
      if (t->batch == b) return &*t;
    return nullptr;
  }

  void use_plan(int64_t b) {
    if (a.planner)
      p.trainer().model().set_recomputed_stages(a.planner->plan(a.estimate.imgsz, b).recomputed);
    else
      p.trainer().model().set_recompute(configured_ck);
  }

  // A real step at b with the plan the run would use there. A step of several micro-batches:
  // its later ones run with the earlier ones' gradients allocated, and its other images' inputs
  // held. A plan that recomputes some stages is the planner's guess (every stage is measured):
  // where it does not fit, b is stepped again with every stage, and the run keeps that plan.
  bool fits(int64_t b) {
    if (const BatchProbe* t = tried(b)) return t->peak >= 0 && t->peak <= a.estimate.usable;
    if (step(b)) return true;
    const StagePlan* sp = a.planner ? &a.planner->plan(a.estimate.imgsz, b) : nullptr;
    if (!sp || std::find(sp->recomputed.begin(), sp->recomputed.end(), false) == sp->recomputed.end() ||
        !a.planner->recompute_all(a.estimate.imgsz, b).fits)
      return false;
    const bool ok = step(b);
    a.tried.back().every_stage = true;
    return ok;
  }

  bool step(int64_t b) {
    use_plan(b);
    const int64_t predicted = option(b).predicted_peak;
    const Prober::Result r = p.step(b, a.estimate.step_images(b) > b);
    a.estimate.augment_per_image = p.augment_per_image();
    const int64_t total =
        r.fits ? std::max(r.step_peak + a.estimate.step_inputs(b), r.update_peak) + a.estimate.next_input(b) + graph_inputs(b) +
                     a.estimate.input_buffers(b)
               : -1;
    a.tried.push_back(BatchProbe{b, total, predicted});
    // The prediction holds the allocator's overhead (reserved beyond allocated): so does the
    // measured side of the correction, or it would come out low by that share.
    if (r.fits && predicted > 0) correction = double(total + r.held_over) / double(predicted);
    return r.fits && total <= a.estimate.usable;
  }

  // A step that recomputes nothing is captured: its graph holds one more set of its inputs.
  int64_t graph_inputs(int64_t b) const {
    return p.trainer().model().recompute_mode() == models::RecomputeMode::off ? a.estimate.graph_inputs(b) : 0;
  }

  // Predicted (by the last step's correction) to fit, or under the enforced limit (on the CPU
  // as the last step left it) with the margin.
  bool safe_to_probe(int64_t b) const {
    const int64_t limit = monitor.sample().limit;
    const double ceiling = limit > 0 ? double(limit - base) : std::numeric_limits<double>::infinity();
    const double bound = std::max(double(a.estimate.usable), (1 - kMargin) * ceiling);
    return correction * double(option(b).predicted_peak) <= bound;
  }

  BatchOption option(int64_t b) const {
    if (!a.planner) return BatchOption{b, models::to_string(configured_ck), a.estimate.predicted_peak(plain, b),
                                       images_per_second(plain, cap, b, nullptr)};
    const StagePlan& sp = a.planner->plan(a.estimate.imgsz, b);
    return BatchOption{b, a.planner->stages_of(sp), sp.predicted_peak, images_per_second(plain, cap, b, &sp)};
  }

  // The largest size a real step confirms (each with its plan): the fit's guess, the sizes above
  // it while the corrected fit says they are safe to step, or a bisection below a guess that
  // did not fit.
  int64_t largest_confirmed() {
    size_t guess = 0;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (option(sizes[i]).predicted_peak <= a.estimate.usable) guess = i;
    size_t lo = 0, hi = sizes.size();  // sizes[lo] fits; sizes[hi] does not (or is past the cap)
    if (guess > lo) (fits(sizes[guess]) ? lo : hi) = guess;
    while (lo + 1 < hi && (hi < sizes.size() || safe_to_probe(sizes[lo + 1]))) {
      const size_t next = hi < sizes.size() ? lo + (hi - lo) / 2 : lo + 1;  // bisect below a failure, else climb
      (fits(sizes[next]) ? lo : hi) = next;
    }
    return sizes[lo];
  }

  // Images per second of a step in micro-batches of b, measured on warm real steps.
  double time_size(int64_t b) {
    use_plan(b);
    const auto [ok, seconds] = p.timed_step(b, a.estimate.step_images(b) > b);
    const double parts = double((cap + b - 1) / b);
    const double step = parts * std::max(seconds - plain.update_seconds, 0.0) + plain.update_seconds;
    const double ips = ok && step > 0 ? double(cap) / step : 0.0;
    if (BatchProbe* t = tried(b)) t->images_per_second = ips;
    return ips;
  }

  // The sizes up to lo that fit, best first by the preference.
  void rank_options(int64_t lo, bool by_batch) {
    for (int64_t b : sizes) {  // predicted to fit (or measured to, where stepped), and lo
      const BatchProbe* t = tried(b);
      const bool fit = t ? t->peak >= 0 && t->peak <= a.estimate.usable : option(b).predicted_peak <= a.estimate.usable;
      if (b <= lo && (fit || b == lo)) a.options.insert(a.options.begin(), option(b));  // largest first
    }
    if (!by_batch) rank_by_timing();
  }

  // memory.prefer throughput: the largest size and then the best predicted are timed on real
  // steps, the others' modelled figures scaled by the nearest timed size's measured / modelled,
  // until the best is a timed one (at most kTimed are); only a timed size is chosen.
  void rank_by_timing() {
    std::map<int64_t, double> model, ratio;  // size -> modelled img/s; timed size -> measured / modelled
    for (const BatchOption& o : a.options) model[o.batch] = o.images_per_second;
    const auto time = [&](BatchOption& o) {
      o.images_per_second = time_size(o.batch);
      o.timed = true;
      if (model[o.batch] > 0 && o.images_per_second > 0) ratio[o.batch] = o.images_per_second / model[o.batch];
    };
    const auto rescale = [&] {
      for (BatchOption& o : a.options) {
        if (o.timed || ratio.empty()) continue;
        auto near = ratio.lower_bound(o.batch);  // the nearest timed size
        if (near == ratio.end() || (near != ratio.begin() && o.batch - std::prev(near)->first < near->first - o.batch)) --near;
        o.images_per_second = model[o.batch] * near->second;
      }
    };
    time(a.options.front());  // the largest that fits: memory.prefer batch's choice
    for (int timed = 1; timed < kTimed;) {
      rescale();
      const auto best = std::max_element(a.options.begin(), a.options.end(), [](const BatchOption& x, const BatchOption& y) {
        return x.images_per_second < y.images_per_second;
      });
      if (best->timed) break;
      if (!fits(best->batch)) {  // the prediction was wrong: not a choice
        a.options.erase(best);
        continue;
      }
      *best = option(best->batch);  // its plan may have become every stage there
      model[best->batch] = best->images_per_second;
      time(*best);
      ++timed;
    }
    rescale();
    // Only a timed size is chosen; the rest are listed by their scaled predictions.
    std::stable_sort(a.options.begin(), a.options.end(), [](const BatchOption& x, const BatchOption& y) {
      if (x.timed != y.timed) return x.timed;
      return x.images_per_second > y.images_per_second;
    });
  }
};

}  // namespace

AutoBatch choose_batch(const Config& c, const std::shared_ptr<const data::Split>& train, MemoryMonitor& monitor, int64_t budget,
                       int64_t world) {
  AutoBatch a;
  const LimitGuard limit(monitor, budget, c.memory.headroom);
  const bool plan_auto = c.memory.activation_checkpointing == "auto";
  const models::RecomputeMode configured_ck = plan_auto ? models::RecomputeMode::off : models::recompute_mode_from(c.memory.activation_checkpointing);
  const int64_t base = monitor.sample().allocated;
  Prober p = make_prober(c, train, monitor, train::resolve_amp(c, monitor.device()), budget);
  const int64_t least = p.min_batch();
  a.estimate = estimate_header(c, p, monitor, budget, world);
  // A rank's share of the step: what its loader batches hold and its micro-batches are cut from.
  const int64_t step = std::min<int64_t>(c.train.nominal_batch, int64_t(train->samples.size()));
  a.step_batch = a.estimate.step_batch = std::max(least, (step + world - 1) / std::max<int64_t>(world, 1));
  ModeEstimate plain = probe_mode(p, train::AmpMode::off, configured_ck, {least, least + 1});
  plain.configured = true;
  a.estimate.modes.push_back(plain);
  a.estimate.augment_per_image = p.augment_per_image();
  const int64_t cap = a.step_batch;
  if (plan_auto) fit_recompute_planner(p, least, cap, plain, a);
  BatchSearch search(p, a, plain, configured_ck, least, cap, monitor, base);
  if (plain.fixed < 0 || !search.fits(search.sizes.front()))  // the smallest part a step is cut into
    throw InputError("train.batch=auto: " + (least == 1 ? std::string("one image does") : std::to_string(least) + " images (the "
                     "smallest micro-batch the model trains at) do") + " not fit memory.budget " + format_bytes(double(budget)) +
                     " minus " + std::to_string(int(100 * c.memory.headroom)) + "% headroom on " + monitor.device().str() + ".\n" +
                     format_memory_estimate(a.estimate) +
                     "Lower data.imgsz, use a lighter model, train.amp, memory.activation_checkpointing=all, or a larger budget.");
  search.rank_options(search.largest_confirmed(), !a.planner || c.memory.prefer == "batch");
  a.batch = a.options.front().batch;
  return a;
}

std::string format_batch_options(const AutoBatch& a) {
  std::string s;
  for (size_t i = 0; i < a.options.size() && i < 8; ++i) {
    const BatchOption& o = a.options[i];
    s += fmt::format("\n  micro-batch {:>3}, recompute {}: predicted peak {}, {:.2f} img/s {}{}", o.batch, o.plan,
                     format_bytes(double(o.predicted_peak)), o.images_per_second, o.timed ? "timed" : "predicted",
                     i == 0 ? "  (chosen)" : "");
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
  // No plan peaks below every stage recomputed, whose own probes measured it: the bytes a stage
  // keeps at the forward's end do not show that its backward makes its activations again.
  // Subtracting the savings alone from the plain line erred 4.5% low for every stage on YOLOv8n.
  const int64_t floor = recomputed_.fixed >= 0 ? e_.predicted_peak(scaled_ck, micro) : 0;
  const auto peak = [&](double saved) {
    const int64_t plain = e_.predicted_peak(scaled, micro, saved);
    return saved > 0 ? std::max(plain, floor) : plain;
  };
  p.step_seconds = scaled.seconds_per_image * double(micro);
  double saved = 0;
  for (size_t i : order) p.recompute_all_seconds += cost[i];
  for (size_t i : order) {
    if (plain_.fixed < 0 || peak(saved) <= e_.usable) break;
    p.recomputed[i] = true;
    saved += saving[i];
    p.recompute_seconds += cost[i];
  }
  p.predicted_peak = peak(saved);
  p.fits = plain_.fixed >= 0 && p.predicted_peak <= e_.usable;
  return cache_.emplace(key, std::move(p)).first->second;
}

const StagePlan& RecomputePlanner::recompute_all(int64_t size, int64_t micro) {
  StagePlan p = plan(size, micro);
  p.recomputed.assign(p.recomputed.size(), true);
  p.recompute_seconds = p.recompute_all_seconds;
  p.predicted_peak = recomputed_.fixed >= 0 ? e_.predicted_peak(e_.at_size(recomputed_, size), micro) : p.predicted_peak;
  p.fits = recomputed_.fixed >= 0 && p.predicted_peak <= e_.usable;
  return cache_[std::make_pair(size, micro)] = std::move(p);
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
                                                           MemoryMonitor& monitor, int64_t budget, int64_t world) {
  const LimitGuard limit(monitor, budget, c.memory.headroom);
  Prober p = make_prober(c, train, monitor, train::resolve_amp(c, monitor.device()), budget);
  ModeEstimate plain = probe_mode(p, train::AmpMode::off, models::RecomputeMode::off, default_probes(c));
  ModeEstimate recomputed = probe_mode(p, train::AmpMode::off, models::RecomputeMode::stages, default_probes(c));
  plain.configured = true;
  MemoryEstimate e = estimate_header(c, p, monitor, budget, world);
  e.modes = {plain, recomputed};
  e.augment_per_image = p.augment_per_image();
  return std::make_shared<RecomputePlanner>(std::move(e), std::move(plain), std::move(recomputed));
}

}  // namespace headroom::memory
