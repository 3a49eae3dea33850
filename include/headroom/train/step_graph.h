// train.cuda_graphs: a step whose shapes repeat (a fixed image size and micro-batch, the common
// case) is captured as one CUDA graph — every part's forward, loss and backward, then the update
// (unscale, the non-finite check, clipping, the optimizer, the loss scaler, the counters) — and
// replayed: one launch instead of thousands, so the device no longer waits for the host to launch
// small kernels (YOLOv8n's step is bound by that, not by arithmetic).
//
// What changes between steps reaches the graph through memory it reads: the step's batches are
// copied into the tensors the captured step read, the learning rates are device tensors
// (Optimizer::set_rates_on_device), the loss scaler's scale and the counters stay on the device.
// What a graph bakes in makes its key: the shapes of every batch and part, the precision, the
// recompute plan, the step's image count, each group's momentum and weight decay (YOLO26's branch
// weight, which moves each epoch, is a device tensor: DetectionLoss::set_progress). A step with a
// new key runs eagerly; a key seen in two eager steps in a row is captured at the third (the
// first step of a shape also tunes cuDNN and fills caches, which a capture must not do; a key
// captured before is captured again at once); a graph of another key is dropped, with its memory,
// before a step runs eagerly. So an Ultralytics
// warmup of SGD or MuSGD (its momentum moves every step) runs eagerly, and a governor that changes the
// micro-batch gets a new graph, never a wrong step. Ground truth is padded to a bucketed box
// count (the largest power of two seen, at least 8), so that a crowded batch changes the key
// once, not every step.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/core/stream.h"

namespace headroom::train {

enum class GraphMode { off, on, auto_ };
GraphMode graph_mode_from(const std::string& word);  // train.cuda_graphs
const char* to_string(GraphMode m);

// Why this run's steps cannot be captured ("" = they can): not CUDA, multi-scale training, several
// processes (the gradient exchange is not captured).
std::string graph_refusal(const Config& c, c10::Device device, int64_t world);
// train.cuda_graphs for this run: `on` where a refusal applies is an error naming it; `auto` is
// then off, and says why once.
GraphMode resolve_graph_mode(const Config& c, c10::Device device, int64_t world);

class StepGraph {
 public:
  // mode: on or auto (auto measures the first replays against the eager step and keeps the faster).
  StepGraph(c10::Device device, GraphMode mode);

  // The box rows a batch with n rows is padded to: the bucket of the largest n seen.
  int64_t padded_boxes(int64_t n);

  enum class Ran { eager, captured, replayed };
  // Runs one step: replays the graph of `key` after copying `inputs` into the tensors its capture
  // read, or runs `step` eagerly, or captures `step` (which must then start from the state every
  // step starts from: it is run again eagerly if the capture fails) and replays it. `inputs` are
  // every device tensor the step reads that changes between steps, in the same order each time.
  // `eager_because` (said once per reason): this step cannot be captured and runs eagerly.
  // Errors: an out-of-memory error in a capture is thrown as it is (nothing ran; a cuDNN failure
  // that is often one in disguise is not: the same step just ran eagerly); a capture CUDA
  // invalidated ends the run with an Error (the device is not safe to use after it); with `on`,
  // any other LibTorch error in a capture is an Error too, where auto trains eagerly from then
  // on; an error of another kind is the step's own and is thrown as it is.
  Ran run(const std::string& key, const std::vector<at::Tensor>& inputs, const std::function<void()>& step,
          const std::string& eager_because = "");
  // Gives the graph and its pool back, for work that runs beside it (validation: its memory
  // would sit on top of the pool's, which the estimate does not count). The next step of the same
  // key is captured again at once, as any key captured before: its shapes have been run and tuned.
  void release();
  // Bytes of the inputs the last graph's capture read, which it holds between steps (kept after
  // the graph is dropped: the step that dropped it, auto's last timed replay, held them).
  int64_t held_bytes() const { return held_; }
  bool active() const { return active_; }  // false once auto found the eager step faster, or a capture failed
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  void drop();
  void decide();  // auto, after kMeasured timed replays: keep the graph, or train eagerly

  c10::Device device_;
  GraphMode mode_;
  DeviceGraph graph_;
  bool active_ = true;
  std::string key_;                 // the captured graph's
  std::vector<at::Tensor> inputs_;  // what its capture read
  std::set<std::string> captured_keys_;  // every key captured in this run
  std::string last_key_;            // the last eager step's, and how many steps in a row had it
  int64_t repeats_ = 0;
  int64_t boxes_ = 0;
  int64_t held_ = 0;
  int64_t captures_ = 0, replays_ = 0;
  std::set<std::string> said_;  // the eager reasons logged
  bool decided_ = false;        // auto timed its first capture
  // auto: the eager step before the capture against the replays after it (device time).
  std::unique_ptr<DeviceClock> clock_;
  size_t eager_mark_ = 0;          // the eager step's first mark; the next is its end
  std::vector<size_t> replay_marks_;  // each timed replay's first mark
};

}  // namespace headroom::train
