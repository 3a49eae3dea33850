#include "headroom/memory/governor.h"

#include <algorithm>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"

namespace headroom::memory {

namespace {
int64_t bytes_of(const std::vector<at::Tensor>& v) {
  int64_t n = 0;
  for (const auto& t : v)
    if (t.defined()) n += int64_t(t.nbytes());
  return n;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
}  // namespace

GovernorOptions governor_options(const Config& c, int64_t budget) {
  return GovernorOptions().budget(budget).headroom(c.memory.headroom).allow_amp(c.memory.allow_amp).grow_after(c.memory.grow_after);
}

StaticMemory static_memory(train::Trainer& t) {
  StaticMemory s;
  s.parameters = bytes_of(t.model().parameters());
  std::vector<at::Tensor> trainable;
  for (const auto& p : t.model().parameters())
    if (p.requires_grad()) trainable.push_back(p);
  s.gradients = bytes_of(trainable);  // fp32 gradients of every trainable parameter during backward
  s.optimizer = bytes_of(t.optimizer().state_tensors());
  if (t.ema()) {
    s.ema = bytes_of(t.ema()->model()->parameters()) + bytes_of(t.ema()->model()->buffers());
  }
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
  if (t.ema()) check_tensors_on(t.device(), "EMA", t.ema()->model()->parameters());
}

GovernorHook::GovernorHook(std::shared_ptr<MemoryMonitor> monitor, GovernorOptions options)
    : monitor_(std::move(monitor)), o_(options) {}

void GovernorHook::before_train(train::Trainer& t) {
  check_on_device(t);
  if (o_.budget() > 0) monitor_->set_limit(o_.budget());
  const MemoryStats s = monitor_->sample();
  last_retries_ = s.alloc_retries;
  retries_at_start_ = s.alloc_retries;
  ooms_at_start_ = s.ooms;
  monitor_->reset_peak();
  spdlog::info("memory: budget {} on {} (aiming under {} with {:.0f}% headroom), {} in use; micro-batch {} of loader batch {}",
               o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"), t.device().str(),
               format_bytes(double(usable_budget(o_.budget(), o_.headroom()))), 100 * o_.headroom(),
               format_bytes(double(s.allocated)), t.micro_batch(), t.config().train.batch);
}

void GovernorHook::before_step(train::Trainer&) { monitor_->reset_peak(); }  // the peak of this step only

void GovernorHook::shrink(train::Trainer& t, const std::string& reason) {
  const int64_t m = t.micro_batch();
  if (m > 1) {
    const int64_t next = std::max<int64_t>(1, m / 2);
    t.set_micro_batch(next);
    t.record_memory_decision("micro_batch " + std::to_string(m) + " -> " + std::to_string(next), reason);
  }
  monitor_->release_cache();
  calm_steps_ = 0;
}

void GovernorHook::after_step(train::Trainer& t) {
  const MemoryStats s = monitor_->sample();
  epoch_peak_ = std::max(epoch_peak_, s.peak_allocated);
  epoch_peak_reserved_ = std::max(epoch_peak_reserved_, s.peak_reserved);
  const int64_t usable = usable_budget(o_.budget(), o_.headroom());
  const bool new_retries = s.alloc_retries > last_retries_;
  retry_run_ = new_retries ? retry_run_ + 1 : 0;
  last_retries_ = s.alloc_retries;
  if (o_.budget() > 0 && s.peak_allocated > usable && t.micro_batch() > 1) {
    shrink(t, "step peak " + format_bytes(double(s.peak_allocated)) + " crossed budget - headroom " + format_bytes(double(usable)));
  } else if (retry_run_ >= o_.retry_steps() && t.micro_batch() > 1) {
    shrink(t, "the allocator freed its cache and retried on " + std::to_string(retry_run_) + " steps in a row (thrashing)");
    retry_run_ = 0;
  } else if (o_.grow_after() > 0 && t.micro_batch() < t.config().train.batch && ++calm_steps_ >= o_.grow_after() &&
             s.peak_allocated * 2 < usable) {
    const int64_t m = t.micro_batch(), next = std::min<int64_t>(m * 2, t.config().train.batch);
    t.set_micro_batch(next);
    t.record_memory_decision("micro_batch " + std::to_string(m) + " -> " + std::to_string(next),
                             std::to_string(calm_steps_) + " steps with peak " + format_bytes(double(s.peak_allocated)) +
                                 " below half of budget - headroom");
    calm_steps_ = 0;
  }
  monitor_->reset_peak();
}

void GovernorHook::after_epoch(train::Trainer& t) {
  const MemoryStats s = monitor_->sample();
  spdlog::info("memory, epoch {}: peak {} allocated, {} reserved, of budget {}; fragmentation now {:.0f}%; since the start {} "
               "allocator retries, {} OOMs; micro-batch {}",
               t.state().epoch + 1, format_bytes(double(epoch_peak_)), format_bytes(double(epoch_peak_reserved_)),
               o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"),
               100 * s.fragmentation(), s.alloc_retries - retries_at_start_, s.ooms - ooms_at_start_, t.micro_batch());
  epoch_peak_ = epoch_peak_reserved_ = 0;
}

bool GovernorHook::on_oom(train::Trainer& t, const c10::Error& e, train::OomSite site) {
  monitor_->release_cache();
  epoch_peak_ = std::max(epoch_peak_, monitor_->sample().peak_allocated);
  monitor_->reset_peak();  // the pre-emptive check after the step judges the attempt that succeeds
  const std::string cause = "out of memory: " + first_line(e.what_without_backtrace());
  if (site == train::OomSite::validation) {
    const int64_t b = t.state().val_batch;
    if (b <= 1) return false;
    t.state().val_batch = b / 2;
    t.record_memory_decision("validation batch " + std::to_string(b) + " -> " + std::to_string(b / 2), cause);
    return true;
  }
  const int64_t m = t.micro_batch();
  if (m > 1) {
    shrink(t, cause);
    return true;
  }
  if (t.model().activation_checkpointing() != CheckpointMode::all) {
    t.set_activation_checkpointing(CheckpointMode::all);
    t.record_memory_decision("activation_checkpointing all", cause + " at micro-batch 1");
    return true;
  }
  if (o_.allow_amp() && t.enable_amp()) {
    t.record_memory_decision(std::string("amp ") + to_string(t.amp()), cause + " at micro-batch 1 with every stage checkpointed");
    return true;
  }
  const StaticMemory st = static_memory(t);
  const int64_t imgsz = t.config().data.imgsz;
  const int64_t smaller = std::max<int64_t>(32, (imgsz * 3 / 4) / 32 * 32);
  throw Error(fmt::format(
      "out of memory with nothing left to give up: micro-batch 1, every stage checkpointed, amp {}.\n"
      "  budget                {:>10}\n  parameters            {:>10}\n  gradients             {:>10}\n"
      "  optimizer state       {:>10}\n  EMA                   {:>10}\n  step peak so far      {:>10}\n"
      "One image of {} px does not fit: train at data.imgsz={} (activations shrink with the square of the size), "
      "use a lighter backbone (model.file, e.g. a smaller scale), raise memory.budget{}, or run `trainer memory --config ...` "
      "for the full table. The last checkpoint is intact. ({})",
      to_string(t.amp()), o_.budget() > 0 ? format_bytes(double(o_.budget())) : std::string("none"),
      format_bytes(double(st.parameters)), format_bytes(double(st.gradients)), format_bytes(double(st.optimizer)),
      format_bytes(double(st.ema)), format_bytes(double(std::max(epoch_peak_, monitor_->sample().peak_allocated))), imgsz,
      smaller, o_.allow_amp() ? "" : ", or allow memory.allow_amp", first_line(e.what_without_backtrace())));
}

}  // namespace headroom::memory
