#include "headroom/memory/governor.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/memory/estimate.h"

namespace headroom::memory {

namespace {
int64_t bytes_of(const std::vector<at::Tensor>& v) {
  int64_t n = 0;
  for (const auto& t : v)
    if (t.defined()) n += int64_t(t.nbytes());
  return n;
}

std::string text_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

GovernorOptions governor_options(const Config& c, int64_t budget) {
  return GovernorOptions()
      .budget(budget)
      .headroom(c.memory.headroom)
      .recover(c.memory.governor)
      .allow_amp(c.memory.allow_amp)
      .grow_after(c.memory.grow_after)
      .imgsz(c.data.imgsz);
}

StaticMemory static_memory(train::Trainer& t) {
  StaticMemory s;
  s.parameters = bytes_of(t.model().parameters());
  std::vector<at::Tensor> trainable;
  for (const auto& p : t.model().parameters())
    if (p.requires_grad()) trainable.push_back(p);
  s.gradients = bytes_of(trainable);  // fp32 gradients of every trainable parameter during backward
  s.optimizer = bytes_of(t.optimizer().state_tensors());
  if (t.ema()) s.ema = bytes_of(t.ema()->model()->parameters()) + bytes_of(t.ema()->model()->buffers());
  return s;
}

void check_tensors_on(c10::Device device, const char* what, const std::vector<at::Tensor>& tensors) {
  for (const auto& x : tensors)
    if (x.defined() && x.device() != device)
      throw DeviceError(std::string(what) + " tensor of shape " + c10::str(x.sizes()) + " is on " + x.device().str() +
                        ", the run trains on " + device.str() + ": it would silently compute on the wrong device");
}

void check_on_device(train::Trainer& t) {
  check_tensors_on(t.device(), "model parameter", t.model().parameters());
  check_tensors_on(t.device(), "model buffer", t.model().buffers());
  check_tensors_on(t.device(), "optimizer state", t.optimizer().state_tensors());
  if (t.ema()) {
    check_tensors_on(t.device(), "EMA parameter", t.ema()->model()->parameters());
    check_tensors_on(t.device(), "EMA buffer", t.ema()->model()->buffers());
  }
}

Governor::Governor(GovernorOptions options, std::shared_ptr<RecomputePlanner> planner)
    : o_(options), planner_(std::move(planner)) {}

MemoryMonitor& Governor::monitor(train::Trainer& t) const {
  if (!t.monitor())
    throw Error("the memory governor needs the run's memory monitor (TrainerParts::monitor), which reads every step's memory");
  return *t.monitor();
}

int64_t Governor::least(const train::Trainer& t) { return std::max<int64_t>(1, t.loader().options().min_batch()); }

int64_t Governor::micro_batch(const train::Trainer& t) const {
  const int64_t b = t.batch();
  return micro_ > 0 ? std::min(micro_, b) : b;
}

void Governor::run(train::Trainer& t, const std::vector<data::HostBatch>& batches) {
  std::vector<at::Tensor> snapshot;  // BatchNorm statistics as the step found them
  for (;;) {
    std::string error;                 // this rank's failure (first line)
    MemoryFailure kind = MemoryFailure::none;
    try {
      if (snapshot.empty()) {  // inside the try: the copy itself may hit the budget
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> copy;
        for (const auto& b : t.model().buffers()) copy.push_back(b.clone());
        snapshot = std::move(copy);
      }
      const train::StepInput in = t.prepare_step(batches);
      const int64_t micro = micro_batch(t);
      const bool synced = t.syncs_batchnorm();  // walks the model's modules: once a step, not per batch
      for (size_t b = 0; b < in.batches.size(); ++b) {
        // With SyncBatchNorm live, as many parts on every rank (it exchanges once per part):
        // counted from the largest share of the batch any rank has, and no more than the smallest
        // share's images (shares differ by one at most), so that none is empty; its statistics
        // are every rank's, so a part below the smallest micro-batch is no BatchNorm error.
        // Otherwise each rank cuts its own share.
        const int64_t n = in.batches[b].images.size(0);
        std::vector<int64_t> cut = split(n, micro, least(t));
        if (synced) {
          const int64_t largest = std::max<int64_t>(batches[b].largest_share, n);
          const int64_t smallest = batches[b].global_size > 0 ? batches[b].global_size / t.world() : n;
          cut = distribute(n, std::max<int64_t>(1, std::min(parts(largest, micro, least(t)), smallest)));
        }
        apply_plan(t, in.batches[b].images.size(2), cut.front());
        int64_t start = 0;
        for (int64_t m : cut) {
          t.forward_backward(in, b, start, m);
          start += m;
        }
      }
    } catch (const c10::Error& e) {
      kind = memory_failure(e);
      if (kind == MemoryFailure::none) throw;
      error = first_line(e.what_without_backtrace());
      t.abandon_step();  // the device exchange this rank skipped, so that no rank waits on it
    }
    // Every rank learns here whether any failed (one process: only itself), before the update.
    const train::StepAgreement a = t.agree_step(kind != MemoryFailure::none, !pressure_.empty());
    loader_oom_waiting_ = false;
    if (a.failed.empty()) {
      try {
        t.update();  // atomic: an out-of-memory error inside leaves every group untouched
        if (!a.pressed.empty()) {  // voted after this step's update: from the next step
          shrink(t, pressure_.empty() ? "memory pressure on rank " + text_list(a.pressed) : pressure_, t.state().step + 2);
          pressure_.clear();
        }
        return;
      } catch (const c10::Error& e) {
        kind = memory_failure(e);
        if (kind == MemoryFailure::none) throw;
        if (t.world() > 1)  // the others have taken the step: this rank cannot take it again alone
          throw Error("rank " + std::to_string(t.rank()) + ": out of memory in the optimizer update of step " +
                      std::to_string(t.state().step + 1) + ", after the gradients were exchanged; the last checkpoint is intact. "
                      "Lower train.batch or raise memory.budget. " + first_line(e.what_without_backtrace()));
        error = first_line(e.what_without_backtrace());
      }
    }
    // Undo the attempt: the graph unwound with the exception; gradients and the BatchNorm
    // statistics the failed forward updated go back to where the step began.
    t.discard_gradients();
    {
      at::NoGradGuard no_grad;
      const std::vector<at::Tensor> live = t.model().buffers();
      for (size_t i = 0; i < snapshot.size(); ++i) live[i].copy_(snapshot[i]);  // empty: it failed before changing any
    }
    // Every rank climbs the same rung: the ladder's state is the same on all of them. The rung
    // answers a pressure vote still pending too (else the retry would halve again).
    pressure_.clear();
    if (error.empty()) {
      kind = MemoryFailure::out_of_memory;
      error = "out of memory on rank " + text_list(a.failed);
    }
    climb(t, error, kind);
    monitor(t).reset_peak();  // the step's memory is that of the attempt that succeeds
  }
}

int64_t Governor::parts(int64_t n, int64_t micro, int64_t smallest) {
  const int64_t parts = (n + micro - 1) / std::max<int64_t>(micro, 1);
  return std::max<int64_t>(1, std::min(parts, n / std::max<int64_t>(smallest, 1)));
}

std::vector<int64_t> Governor::split(int64_t n, int64_t micro, int64_t smallest) {
  return distribute(n, Governor::parts(n, micro, smallest));
}

std::vector<int64_t> Governor::distribute(int64_t n, int64_t parts) {
  std::vector<int64_t> out(size_t(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++out[size_t(i)];  // the larger parts first: the plan is made for them
  return out;
}

void Governor::apply_plan(train::Trainer& t, int64_t size, int64_t micro) {
  if (!planner_ || recompute_all_) return;
  const StagePlan& p = planner_->plan(size, micro);
  if (plans_logged_.insert({size, micro}).second) spdlog::info("{}", planner_->describe(p, size, micro));
  if (p.recomputed == plan_) return;
  t.model().set_recomputed_stages(p.recomputed);
  plan_ = p.recomputed;
}

void Governor::record(train::Trainer& t, std::string action, std::string reason, int64_t from) {
  if (from == 0) from = t.state().step + 1;
  spdlog::warn("memory governor, step {}: {} ({})", from, action, reason);
  decisions_.push_back(MemoryDecision{from, std::move(action), std::move(reason)});
}

void Governor::before_train(train::Trainer& t) {
  MemoryMonitor& m = monitor(t);
  TORCH_CHECK(t.executor() == this, "the memory governor is registered but does not run the steps: install it with set_executor");
  check_on_device(t);
  if (o_.budget() > 0) m.set_limit(o_.budget());
  if (recompute_all_) t.model().set_recompute(models::RecomputeMode::all);
  const MemoryStats s = m.sample();
  last_retries_ = retries_at_start_ = s.alloc_retries;
  if (t.device().is_cpu()) return_free_heap();  // as after_epoch measures
  other_at_start_ = process_memory().rss - (t.device().is_cpu() ? s.reserved : 0);
  eval_step_seen_ = t.state().last_eval_step;
  ooms_at_start_ = s.ooms;
  if (!decisions_.empty())
    spdlog::info("resume keeps the memory governor's {} decisions: micro-batch {}, recompute {}, amp {}", decisions_.size(),
                 micro_batch(t), recompute_all_ ? "all" : "as configured", to_string(t.amp()));
  spdlog::info("memory: budget {} on {} (aiming under {} with {:.0f}% headroom), {} in use; micro-batch {} of loader batch {}{}",
               o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"), t.device().str(),
               format_bytes(double(usable_budget(o_.budget(), o_.headroom()))), 100 * o_.headroom(),
               format_bytes(double(s.allocated)), micro_batch(t), t.batch(),
               o_.recover() ? "" : "; memory.governor off: an out-of-memory error stops the run");
}

void Governor::shrink(train::Trainer& t, const std::string& reason, int64_t from) {
  const int64_t m = micro_batch(t);
  if (m > least(t)) {
    const int64_t next = std::max<int64_t>(least(t), m / 2);
    micro_ = next;
    record(t, "micro_batch " + std::to_string(m) + " -> " + std::to_string(next), reason, from);
    t.forget_step_peaks();
  }
  monitor(t).release_cache();
  calm_steps_ = 0;
}

void Governor::after_step(train::Trainer& t) {
  const std::optional<MemoryStats>& sampled = t.step_memory();
  if (!sampled) return;
  const MemoryStats& s = *sampled;
  epoch_peak_ = std::max(epoch_peak_, s.peak_allocated);
  epoch_peak_reserved_ = std::max(epoch_peak_reserved_, s.peak_reserved);
  peak_so_far_ = std::max(peak_so_far_, s.peak_allocated);
  const int64_t usable = usable_budget(o_.budget() - other_growth_, o_.headroom());
  const bool new_retries = s.alloc_retries > last_retries_;
  retry_run_ = new_retries ? retry_run_ + 1 : 0;
  last_retries_ = s.alloc_retries;
  if (!o_.recover()) return;
  const int64_t m = micro_batch(t), floor = least(t);
  // Several ranks shrink together: the reason waits for the next step's agreement (run).
  const auto press = [&](const std::string& reason) {
    if (t.world() > 1)
      pressure_ = "rank " + std::to_string(t.rank()) + ": " + reason;
    else
      shrink(t, reason);
  };
  if (o_.budget() > 0 && s.peak_allocated > usable && m > floor) {
    press("step peak " + format_bytes(double(s.peak_allocated)) + " crossed budget - headroom " + format_bytes(double(usable)));
  } else if (retry_run_ >= o_.retry_steps() && m > floor) {
    press("the allocator freed its cache and retried on " + std::to_string(retry_run_) + " steps in a row (thrashing)");
    retry_run_ = 0;
  } else if (t.world() == 1 && o_.grow_after() > 0 && m < t.batch()) {
    // Twice the micro-batch fits after grow_after steps in a row under half the usable budget
    // without allocator retries; one step above it (a crowded batch) starts the count again.
    calm_steps_ = s.peak_allocated * 2 < usable && !new_retries ? calm_steps_ + 1 : 0;
    if (calm_steps_ >= o_.grow_after()) {
      const int64_t next = std::min<int64_t>(m * 2, t.batch());
      micro_ = next;
      t.forget_step_peaks();
      record(t, "micro_batch " + std::to_string(m) + " -> " + std::to_string(next),
             std::to_string(calm_steps_) + " steps in a row with peak below half of budget - headroom (the last " +
                 format_bytes(double(s.peak_allocated)) + ")");
      calm_steps_ = 0;
    }
  }
}

void Governor::after_epoch(train::Trainer& t) {
  const MemoryStats s = monitor(t).sample();
  const bool cpu = t.device().is_cpu();
  if (cpu) return_free_heap();  // the budget counts memory in use, not the heap's free pages
  const ProcessMemory host = process_memory();
  const int64_t other = host.rss - (cpu ? s.reserved : 0), growth = other - other_at_start_;
  spdlog::info("memory, epoch {}: peak {} allocated, {} reserved, of budget {}; fragmentation now {:.0f}%; since the start {} "
               "allocator retries, {} OOMs; micro-batch {}; host RSS {} (peak {}){}",
               t.state().epoch + 1, format_bytes(double(epoch_peak_)), format_bytes(double(epoch_peak_reserved_)),
               o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"), 100 * s.fragmentation(),
               s.alloc_retries - retries_at_start_, s.ooms - ooms_at_start_, micro_batch(t), format_bytes(double(host.rss)),
               format_bytes(double(host.peak_rss)),
               cpu ? fmt::format(": {} tensors and cache, {} the rest ({:+.1f} MiB since training began)", format_bytes(double(s.reserved)),
                                 format_bytes(double(other)), double(growth) / double(1 << 20))
                   : std::string());
  take_growth_off(t, growth, s);
  epoch_peak_ = epoch_peak_reserved_ = 0;
}

void Governor::before_epoch(train::Trainer& t) {
  after_validation(t);  // the epoch's validation ran after this hook's after_epoch
}

void Governor::before_step(train::Trainer& t) {
  after_validation(t);  // one inside the epoch (val_every_steps) ran after the last step's hooks
}

void Governor::after_validation(train::Trainer& t) {
  if (t.state().last_eval_step == eval_step_seen_) return;
  eval_step_seen_ = t.state().last_eval_step;
  if (!t.device().is_cpu() || o_.budget() <= 0) return;
  const MemoryStats s = monitor(t).sample();
  return_free_heap();
  take_growth_off(t, process_memory().rss - s.reserved - other_at_start_, s);
}

// On the CPU the budget bounds the process: the growth of its other memory (the validation
// images' RAM cache, made at the first validation) comes off the tensors' limit, down to the
// largest step's peak at the least. Growth the tensors cannot give (oneDNN's kernels for each new
// batch shape grew 18 MiB of a 27 MiB test budget) would leave a limit no batch fits, and end the
// run at its next step or validation; there the process is over its budget, and the log says so.
// The usable share of that limit (headroom off) is below the peak: the next such step shrinks
// the micro-batch.
void Governor::take_growth_off(train::Trainer& t, int64_t growth, const MemoryStats& s) {
  if (!t.device().is_cpu() || o_.budget() <= 0) return;
  growth = std::max<int64_t>(0, growth);
  const int64_t least = std::min(o_.budget(), std::max(s.allocated, peak_so_far_));
  const int64_t limit = std::max(o_.budget() - growth, least);
  other_growth_ = o_.budget() - limit;
  if (limit > o_.budget() - growth)
    spdlog::warn("memory: the process's memory other than tensors grew by {} since training began, leaving the tensors less of "
                 "the {} budget than their largest step's peak; they keep {} and the process is over its budget by {}: raise "
                 "memory.budget",
                 format_bytes(double(growth)), format_bytes(double(o_.budget())), format_bytes(double(limit)),
                 format_bytes(double(growth - other_growth_)));
  if (limit != s.limit) {
    monitor(t).set_limit(limit);
    if (growth > 0)
      spdlog::info("memory: tensors may use {} of the {} budget: the process's other memory grew by {}", format_bytes(double(limit)),
                   format_bytes(double(o_.budget())), format_bytes(double(growth)));
  }
}

// The CUDA allocator frees its cache and retries once before every out-of-memory error it
// raises: that retry is the error's, not a sign of thrashing in the steps that follow.
void Governor::forget_retries(train::Trainer& t) {
  last_retries_ = monitor(t).sample().alloc_retries;
  retry_run_ = 0;
}

bool Governor::on_oom(train::Trainer& t, const c10::Error& e, train::OomSite site) {
  monitor(t).release_cache();
  forget_retries(t);
  if (site == train::OomSite::validation) {
    calm_steps_ = 0;  // memory is short now: the grow-back counts from the next step
    const int64_t b = t.state().val_batch;
    if (!o_.recover() || b <= 1) return false;
    t.state().val_batch = b / 2;
    record(t, "validation batch " + std::to_string(b) + " -> " + std::to_string(b / 2), "out of memory: " + first_line(e.what_without_backtrace()));
    return true;
  }
  // The loader: less memory for the step leaves more for its buffers. On several ranks one rank
  // alone cannot climb (the micro-batch and plan are every rank's, SyncBatchNorm exchanges once
  // per part): it asks at the next step's agreement, as memory pressure does, and retries on the
  // cache it freed; a second failure before that agreement stops the run.
  if (t.world() > 1) {
    if (!o_.recover() || loader_oom_waiting_) return false;
    loader_oom_waiting_ = true;
    pressure_ = "rank " + std::to_string(t.rank()) + ": out of memory while the loader filled a batch: " + first_line(e.what_without_backtrace());
    return true;
  }
  climb(t, first_line(e.what_without_backtrace()), memory_failure(e));
  return true;
}

void Governor::climb(train::Trainer& t, const std::string& what, MemoryFailure kind) {
  monitor(t).release_cache();
  forget_retries(t);
  calm_steps_ = 0;  // every rung, not only a shrink: the step after an OOM starts no calm stretch
  t.forget_step_peaks();
  const int64_t m = micro_batch(t);
  if (kind == MemoryFailure::library) {
    // Often an allocation failure in disguise: one smaller try each time; at the smallest
    // micro-batch it is not memory, and the run stops naming it.
    if (o_.recover() && m > least(t)) {
      shrink(t, "cuDNN failure, treated as out of memory: " + what);
      return;
    }
    throw Error(std::string("a cuDNN error ") + (o_.recover() ? "persists at the smallest micro-batch after shrinking" : "stopped the step "
                "(memory.governor is off)") + ": " + what + ". It is not an out-of-memory error the governor can work around: "
                "check the CUDA / cuDNN installation, or set train.amp=off. The last checkpoint is intact.");
  }
  if (!o_.recover()) give_up(t, what, "memory.governor is off");
  const std::string cause = "out of memory: " + what;
  if (m > least(t)) {
    shrink(t, cause);
    return;
  }
  const std::string floor = "at micro-batch " + std::to_string(m) + (m > 1 ? " (the smallest the model trains at)" : "");
  if (!recompute_all_ && t.model().recompute_mode() != models::RecomputeMode::all) {
    recompute_all_ = true;
    plan_.clear();
    t.model().set_recompute(models::RecomputeMode::all);
    record(t, "activation_checkpointing all", cause + " " + floor);
    return;
  }
  if (o_.allow_amp() && t.enable_amp()) {
    const std::string note = train::bf16_cost_note(t.amp(), t.device());
    record(t, std::string("amp ") + to_string(t.amp()), cause + " " + floor + " with every stage recomputed" + (note.empty() ? "" : "; " + note));
    return;
  }
  give_up(t, what, "nothing left to give up: micro-batch " + std::to_string(m) + ", every stage recomputed, amp " +
                    std::string(to_string(t.amp())));
}

void Governor::give_up(train::Trainer& t, const std::string& what, const std::string& why) {
  const StaticMemory st = static_memory(t);
  // ¾ of the size on the model's input multiple, where that is a smaller size the model takes
  const int64_t imgsz = o_.imgsz(), multiple = std::max<int64_t>(t.model().info().input_multiple, 1);
  const int64_t smaller = (imgsz * 3 / 4) / multiple * multiple;
  const std::string size = smaller >= multiple && smaller < imgsz
                               ? fmt::format("Train at data.imgsz={} (activations shrink with the square of the size), use", smaller)
                               : std::string("Use");
  throw Error(fmt::format(
      "out of memory in step {} with micro-batch {} ({}).\n"
      "  budget                {:>10}\n  parameters            {:>10}\n  gradients             {:>10}\n"
      "  optimizer state       {:>10}\n  EMA                   {:>10}\n  step peak so far      {:>10}\n"
      "{} a lighter backbone (model.file, e.g. a smaller scale), raise memory.budget{}, or run `trainer memory --config ...` "
      "for the full table.{} ({})",
      t.state().step + 1, micro_batch(t), why, o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"),
      format_bytes(double(st.parameters)), format_bytes(double(st.gradients)), format_bytes(double(st.optimizer)),
      format_bytes(double(st.ema)), format_bytes(double(std::max(peak_so_far_, monitor(t).sample().peak_allocated))), size,
      o_.recover() ? (o_.allow_amp() ? "" : ", or allow memory.allow_amp") : ", or leave memory.governor on",
      t.state().step > 0 ? " The checkpoints written so far are intact." : "", what));
}

Json Governor::save_state() const {
  Json j = Json::object();
  j["micro_batch"] = micro_;
  j["recompute_all"] = recompute_all_;
  j["calm_steps"] = calm_steps_;
  j["retry_run"] = retry_run_;
  Json list = Json::array();
  for (const auto& d : decisions_) {
    Json e = Json::object();
    e["step"] = d.step;
    e["action"] = d.action;
    e["reason"] = d.reason;
    list.push_back(std::move(e));
  }
  j["decisions"] = std::move(list);
  return j;
}

void Governor::load_state(const Json& j) {
  micro_ = int64_t(j.find("micro_batch")->as_number());
  recompute_all_ = j.find("recompute_all")->as_bool();
  calm_steps_ = int64_t(j.find("calm_steps")->as_number());
  retry_run_ = int64_t(j.find("retry_run")->as_number());
  decisions_.clear();
  for (const Json& d : j.find("decisions")->items())
    decisions_.push_back(MemoryDecision{int64_t(d.find("step")->as_number()), d.find("action")->as_string(), d.find("reason")->as_string()});
}

}  // namespace headroom::memory
