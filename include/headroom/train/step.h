// One optimizer step, as the trainer hands it to an executor: the step's loader batches,
// prepared on the device (copied, augmented, targets padded, the loss normalisers counted over
// the whole step), then forward and backward over parts of them, then the update. The executor
// decides how the batches are cut into parts; the direct one runs each loader batch whole, the
// memory governor's (memory/governor.h) adds micro-batches, retry, undo and a recompute plan,
// and a distributed one would add the all-reduce. The step's result does not depend on the cut
// (floating point and BatchNorm's batch statistics aside): docs/training.md.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "headroom/data/batch.h"
#include "headroom/losses/loss.h"

namespace headroom::train {

class Trainer;

struct StepInput {
  struct Batch {
    at::Tensor images;        // [B, 3, S, S] float in [0, 1] on the run's device (S may differ between batches: multi-scale)
    losses::Targets targets;  // [B, N, ...] in the images' pixels
  };
  std::vector<Batch> batches;  // the step's loader batches, in order
  losses::StepNorm norm;       // the loss normalisers of the whole step
  int64_t images = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Runs the step on its loader batches through the trainer's primitives: prepare_step, then
  // forward_backward over parts that cover every image once, then update.
  virtual void run(Trainer& t, const std::vector<data::HostBatch>& batches) = 0;
};

// Each loader batch in one forward and backward; errors (an out-of-memory one included) reach the
// caller as they are. `trainer train` runs its steps with the memory governor's executor, which
// recovers from out-of-memory errors; this one serves tests and benchmarks that measure steps.
class DirectExecutor final : public StepExecutor {
 public:
  void run(Trainer& t, const std::vector<data::HostBatch>& batches) override;
};

}  // namespace headroom::train
