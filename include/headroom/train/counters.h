// The step's loss terms and skip flags, summed on the device over a window of steps and read
// back in one host sync every read_every steps (and at an epoch's and the run's last step): the
// step itself never waits for the host.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/serialize/archive.h>

#include <string>
#include <utility>
#include <vector>

namespace headroom::train {

// A read of the device counters; a hook sees a fresh one when counters().step equals the
// current step.
struct StepCounters {
  int64_t step = -1;            // the step after which they were read
  int64_t steps = 0;            // optimizer steps in the window
  int64_t finite_steps = 0;     // ... with finite loss and gradients (the means cover these)
  std::vector<std::pair<std::string, double>> loss_sums;  // each term summed over the finite steps
  double skipped_steps = 0;     // non-finite steps skipped in the whole run
  double bad_run = 0;           // non-finite steps in a row, ending at the read
  double worst_bad_run = 0;     // the longest such run within the window
  double loss_scale = 0;        // 0 without a scaler
  // Why the window's first skipped step was skipped ("a non-finite loss term 'box'",
  // "non-finite gradients in parameter group 'norm'"); empty when no step was skipped.
  std::string skip_cause;
  // Each term's mean per finite step (NaN when none was finite).
  std::vector<std::pair<std::string, double>> losses() const;
};

class DeviceCounters {
 public:
  // The skip causes in the order they are judged: the loss terms first (a non-finite term makes
  // every gradient non-finite), then the optimizer's parameter groups.
  DeviceCounters(std::vector<std::string> loss_names, const std::vector<std::string>& group_names, c10::Device device);

  // What one step adds, made before the optimizer commits (it allocates); commit() allocates
  // nothing, so an out-of-memory error before it leaves the counters as they were.
  struct Tally {
    at::Tensor loss, finite, found, bad, worst, cause;  // [T], then scalars
  };
  // terms: [T] the step's loss terms (undefined: none yet); found: [] 1 when the step is skipped;
  // group_norms: [G] each parameter group's gradient norm.
  Tally tally(const at::Tensor& terms, const at::Tensor& found, const at::Tensor& group_norms) const;
  void commit(const Tally& t);
  void count_step() { ++window_steps_; }

  // Copies the window to the host (the one sync) as the read after `step`, then opens the next
  // window. loss_scale: the scaler's [] scale, undefined without one.
  void read(int64_t step, const at::Tensor& loss_scale);
  const StepCounters& last() const { return last_; }
  const std::vector<std::string>& loss_names() const { return loss_names_; }

  // The checkpoint entry "counters": the open window and the last read.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  std::string skip_cause(double rank) const;

  std::vector<std::string> loss_names_;
  std::vector<std::string> cause_names_;   // [T + G] loss terms, then parameter groups
  at::Tensor window_loss_, window_finite_; // [T] terms summed over the window's finite steps; [] their count
  at::Tensor skipped_, bad_run_, worst_run_;
  at::Tensor window_cause_;                // [] the rank of the window's first skip cause (0 = none)
  at::Tensor cause_rank_;                  // [T + G] K..1, made once: the max picks the first cause
  at::Tensor readback_;                    // [kLossSums + T] what read() copies to the host
  int64_t window_steps_ = 0;
  StepCounters last_;
};

}  // namespace headroom::train
