#include "headroom/train/step.h"

#include "headroom/train/trainer.h"

namespace headroom::train {

void DirectExecutor::run(Trainer& t, const std::vector<data::HostBatch>& batches) {
  const StepInput in = t.prepare_step(batches);
  for (size_t b = 0; b < in.batches.size(); ++b) t.forward_backward(in, b, 0, in.batches[b].images.size(0));
  t.update();
}

}  // namespace headroom::train
