#include "headroom/memory/starvation.h"

#include <algorithm>

#include "headroom/core/logging.h"
#include "headroom/core/threads.h"

namespace headroom::memory {

StarvationOptions starvation_options(const Config& c) {
  return StarvationOptions()
      .auto_workers(c.data.workers.is_auto)
      .max_workers(std::max(1, available_cores()))
      .cached(c.data.cache != "none")
      .prefetch(c.data.prefetch);
}

void StarvationHook::reset(train::Trainer& t) {
  cur_ = EpochDataTime{};
  clock_ = std::make_unique<DeviceClock>(t.device());
  last_wait_ = t.data_wait_seconds();
  decode_at_start_ = t.loader().stats().decode_seconds;
  epoch_start_ = std::chrono::steady_clock::now();
}

void StarvationHook::before_train(train::Trainer& t) { reset(t); }

void StarvationHook::after_data(train::Trainer&) { clock_->mark(); }

void StarvationHook::after_step(train::Trainer& t) {
  clock_->mark();
  // data_wait_seconds() sums this epoch's waits; the trainer zeroes it after the epoch's hooks.
  const double now = t.data_wait_seconds();
  const double wait = now >= last_wait_ ? now - last_wait_ : now;
  last_wait_ = now;
  cur_.wait += wait;
  cur_.steps += t.step_seconds();
  cur_.max_wait = std::max(cur_.max_wait, wait);
}

std::string StarvationHook::diagnose(const EpochDataTime& e) const {
  if (e.share() <= o_.threshold()) return "";
  const std::string head = fmt::format("the step waited for data {:.0f}% of the time", 100 * e.share());
  if (e.workers == 0) return head + ": images decode on the training thread (data.workers: 0); set data.workers (or auto)";
  if (e.decode_busy > 0.85) {
    std::string fix = fmt::format(": the {} decode threads are busy {:.0f}% of the time", e.workers, 100 * e.decode_busy);
    if (!o_.cached()) fix += "; data.cache: ram (or disk) decodes each image once instead of every epoch";
    if (e.workers < available_cores()) fix += fmt::format("; raise data.workers (this machine has {} cores)", available_cores());
    return head + fix;
  }
  return head + fmt::format(": the decode threads are idle {:.0f}% of the time, so decoding is not the limit; raise "
                            "data.prefetch ({} now) to smooth bursts, and check that host-to-device copies overlap "
                            "(CUDA runs pin their batches)",
                            100 * (1 - e.decode_busy), o_.prefetch());
}

void StarvationHook::after_epoch(train::Trainer& t) {
  const double epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  cur_.workers = t.loader().options().workers();
  cur_.decode = t.loader().stats().decode_seconds - decode_at_start_;
  cur_.decode_busy = cur_.workers > 0 ? cur_.decode / std::max(epoch_s * cur_.workers, 1e-9) : 1.0;
  const size_t marks = clock_->marks();  // start, end per step (the epoch's end follows a step's end)
  if (marks >= 4) {
    cur_.device_span = clock_->seconds(0, marks - 1);  // waits for the device: the epoch's end reads its counters anyway
    for (size_t i = 1; i + 2 < marks; i += 2) cur_.device_idle += clock_->seconds(i, i + 1);
  }
  last_ = cur_;
  const std::string problem = diagnose(cur_);
  spdlog::info("data, epoch {}: waited {:.2f} s of {:.2f} s in steps ({:.1f}%, longest {:.3f} s); {} decode threads busy {:.0f}%; "
               "{} busy {:.0f}% from the first step to the last",
               t.state().epoch + 1, cur_.wait, cur_.steps, 100 * cur_.share(), cur_.max_wait, cur_.workers,
               100 * std::min(cur_.decode_busy, 1.0), t.device().str(), 100 * cur_.device_busy());
  if (!problem.empty()) {
    spdlog::warn("data, epoch {}: {}", t.state().epoch + 1, problem);
    if (o_.auto_workers() && cur_.workers > 0 && cur_.decode_busy > 0.85 && cur_.workers < o_.max_workers()) {
      const int next = std::min(o_.max_workers(), cur_.workers * 2);
      t.loader().set_workers(next);
      spdlog::info("data.workers auto: {} -> {} decode threads from the next epoch", cur_.workers, next);
    }
  }
  reset(t);
}

}  // namespace headroom::memory
