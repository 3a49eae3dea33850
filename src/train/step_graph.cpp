#include "headroom/train/step_graph.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/memory_errors.h"
#include "headroom/core/text.h"

namespace headroom::train {

namespace {
const std::pair<const char*, GraphMode> kGraphMode[] = {{"auto", GraphMode::auto_}, {"on", GraphMode::on}, {"off", GraphMode::off}};
constexpr size_t kMeasured = 3;  // replays auto times, after the first, before it decides

int64_t bucket(int64_t n) {
  int64_t b = 8;
  while (b < n) b *= 2;
  return b;
}
}  // namespace

GraphMode graph_mode_from(const std::string& word) { return enum_from_word(word, kGraphMode); }
const char* to_string(GraphMode m) { return enum_word(m, kGraphMode); }

std::string graph_refusal(const Config& c, c10::Device device, int64_t world) {
  const std::string unavailable = DeviceGraph::unavailable(device);
  if (!unavailable.empty()) return unavailable;
  if (c.augment.multi_scale > 0) return "augment.multi_scale changes the image size every step";
  if (world > 1) return "the run has " + std::to_string(world) + " processes, and their gradient exchange is not captured";
  return "";
}

GraphMode resolve_graph_mode(const Config& c, c10::Device device, int64_t world) {
  const GraphMode m = graph_mode_from(c.train.cuda_graphs);
  if (m == GraphMode::off) return m;
  const std::string why = graph_refusal(c, device, world);
  if (why.empty()) return m;
  if (m == GraphMode::on)
    throw InputError(c.where("train.cuda_graphs") + ": train.cuda_graphs=on, but the steps cannot be captured: " + why +
                     ". Use train.cuda_graphs=auto (captures where it can) or off");
  if (device.is_cuda()) spdlog::info("CUDA graphs off: {}", why);  // on the CPU there is nothing to say
  return GraphMode::off;
}

StepGraph::StepGraph(c10::Device device, GraphMode mode) : device_(device), mode_(mode), graph_(device) {
  TORCH_CHECK(mode != GraphMode::off, "StepGraph with train.cuda_graphs off");
}

int64_t StepGraph::padded_boxes(int64_t n) {
  boxes_ = std::max(boxes_, bucket(n));
  return boxes_;
}

void StepGraph::drop() {
  graph_.reset();
  key_.clear();
  inputs_.clear();
}

void StepGraph::release() {
  if (graph_.captured()) drop();
}

StepGraph::Ran StepGraph::run(const std::string& key, const std::vector<at::Tensor>& inputs, const std::function<void()>& step,
                              const std::string& eager_because) {
  if (!active_) {
    step();
    return Ran::eager;
  }
  if (!eager_because.empty()) {
    if (graph_.captured()) drop();  // its memory, before the eager step's
    if (said_.insert(eager_because).second) spdlog::info("CUDA graphs: steps run eagerly where {}", eager_because);
    last_key_.clear();
    step();
    return Ran::eager;
  }
  if (graph_.captured() && key == key_) {
    TORCH_CHECK(inputs.size() == inputs_.size(), "StepGraph::run: ", inputs.size(), " inputs for a graph captured with ", inputs_.size());
    for (size_t i = 0; i < inputs.size(); ++i) inputs_[i].copy_(inputs[i]);  // device to device, on the compute stream
    const bool timed = clock_ && replay_marks_.size() < kMeasured;
    if (timed) replay_marks_.push_back(clock_->mark());
    graph_.replay();
    ++replays_;
    if (timed) {
      clock_->mark();
      if (replay_marks_.size() == kMeasured) decide();
    }
    return Ran::replayed;
  }
  if (graph_.captured()) {
    // debug: an epoch's smaller last batch does this every epoch
    spdlog::debug("CUDA graphs: the step's shapes changed ({} replays of the last graph); its memory is given back and the new "
                  "shape runs eagerly until it repeats", replays_);
    drop();
  }
  repeats_ = key == last_key_ ? repeats_ + 1 : 1;
  last_key_ = key;
  // A key captured before (the next epoch's after the smaller last step, the training step's after
  // validation) has had its eager steps: its shapes are tuned, its caches filled.
  if (repeats_ <= 2 && !captured_keys_.count(key)) {
    // auto times the eager step right before a capture, the one the replays are held to
    const bool timed = mode_ == GraphMode::auto_ && !decided_ && repeats_ == 2;
    if (timed) {
      clock_ = std::make_unique<DeviceClock>(device_);
      eager_mark_ = clock_->mark();
    }
    step();
    if (timed) clock_->mark();
    return Ran::eager;
  }
  try {
    graph_.capture(step);
  } catch (const std::exception& e) {
    drop();
    const std::string what = first_line(e.what());
    if (graph_.invalidated())
      throw Error("CUDA invalidated the capture of the training step as a graph (" + what + "): something in the step waits for "
                  "the device, which a graph cannot hold. CUDA's state after a failed capture is not safe to train on, so the run "
                  "stops here; the last checkpoint is intact. Resume with train.cuda_graphs=off, and report the message");
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    // Out of memory is the governor's (a smaller micro-batch is another key); a cuDNN failure that
    // may be one in disguise is the capture's here: the same step ran eagerly twice just before.
    if (!error || memory_failure(*error) == MemoryFailure::out_of_memory) throw;
    if (mode_ == GraphMode::on)
      throw Error("train.cuda_graphs=on: the step could not be captured as a CUDA graph: " + what +
                  ". Use train.cuda_graphs=auto (which then trains eagerly) or off");
    spdlog::warn("CUDA graphs off for this run: the step could not be captured ({}); it runs eagerly", what);
    active_ = false;
    step();
    return Ran::eager;
  }
  key_ = key;
  captured_keys_.insert(key);
  inputs_ = inputs;  // the capture read these: the next replays' inputs are copied into them
  held_ = 0;
  for (const auto& t : inputs_) held_ += int64_t(t.nbytes());
  ++captures_;
  if (captures_ == 1)  // later ones (a new epoch's, a new micro-batch's) say nothing new
    spdlog::info("CUDA graphs: the step's shapes repeated; it is captured and replayed from now on{}",
                 mode_ == GraphMode::auto_ ? " (auto: three replays are timed against the eager step)" : "");
  replays_ = 0;
  replay_marks_.clear();  // the replays after this first one are timed (it also uploads the graph)
  graph_.replay();        // the captured step, run
  ++replays_;
  return Ran::captured;
}

void StepGraph::decide() {
  // Device time: where the host cannot launch fast enough, the eager step's gaps count, and
  // that is what a graph removes. Reading them waits for the last replay, once per run.
  decided_ = true;  // once per run: a noisy later capture does not turn graphs off
  const double eager = clock_->seconds(eager_mark_, eager_mark_ + 1);
  double replay = 0;
  for (size_t m : replay_marks_) replay += clock_->seconds(m, m + 1) / double(replay_marks_.size());
  clock_.reset();
  if (replay < eager) {
    spdlog::info("CUDA graphs: the step replays in {:.2f} ms on the device, eagerly it took {:.2f} ms: replayed from now on",
                 1e3 * replay, 1e3 * eager);
    return;
  }
  spdlog::info("CUDA graphs off for this run: the step replays in {:.2f} ms on the device and took {:.2f} ms eagerly", 1e3 * replay,
               1e3 * eager);
  drop();
  active_ = false;
}

}  // namespace headroom::train
