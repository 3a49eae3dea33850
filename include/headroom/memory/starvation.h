// The starvation monitor: is the device waiting for data? Per epoch it sums the time the step
// waited on the loader against the time in steps, and when the share passes a threshold it says
// which stage is slow (decode threads saturated, decoding on the training thread, or the
// threads idle while the step waits: prefetch depth or host-to-device copies) and what to change.
// With `data.workers: auto` it raises the decode threads between epochs, within the cores.
// It also says how much of the epoch the device spent inside steps, from marks on its queue
// (core/stream.h: CUDA events) at each step's start, its batches in hand, and its end: the time
// between steps is where the device waited for data, the host or the epoch's end.
#pragma once

#include <torch/arg.h>

#include <memory>

#include "headroom/core/stream.h"
#include "headroom/train/trainer.h"

namespace headroom::memory {

struct StarvationOptions {
  TORCH_ARG(double, threshold) = 0.10;  // waiting share of step time that counts as starving
  TORCH_ARG(bool, auto_workers) = false;
  TORCH_ARG(int, max_workers) = 8;
  TORCH_ARG(bool, cached) = false;      // data.cache is on (advice)
  TORCH_ARG(int, prefetch) = 4;         // data.prefetch (advice)
};
StarvationOptions starvation_options(const Config& c);

struct EpochDataTime {
  double wait = 0, steps = 0, max_wait = 0;  // seconds
  double decode = 0;                          // decode-thread seconds
  double decode_busy = 0;                     // decode seconds / (epoch seconds * threads)
  int workers = 0;
  // From the device's marks: its time from the epoch's first step's start to its last step's end,
  // and the part of it between steps (0 with fewer than two steps).
  double device_span = 0, device_idle = 0;
  double share() const { return steps > 0 ? wait / steps : 0; }
  double device_busy() const { return device_span > 0 ? 1 - device_idle / device_span : 1; }
};

class StarvationHook : public train::Hook {
 public:
  explicit StarvationHook(StarvationOptions o) : o_(o) {}
  void before_train(train::Trainer& t) override;
  void after_data(train::Trainer& t) override;
  void after_step(train::Trainer& t) override;
  void after_epoch(train::Trainer& t) override;
  const EpochDataTime& last_epoch() const { return last_; }
  // The diagnosis for an epoch ("" when the loader keeps up).
  std::string diagnose(const EpochDataTime& e) const;

 private:
  void reset(train::Trainer& t);
  StarvationOptions o_;
  EpochDataTime cur_, last_;
  double last_wait_ = 0, decode_at_start_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  std::unique_ptr<DeviceClock> clock_;  // this epoch's marks: a step's start, then its end
};

}  // namespace headroom::memory
