// Internal: the row modules a model file can name, and how each row is built from its
// arguments (a registry: module name -> builder).
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headroom/models/blocks.h"
#include "headroom/models/detector.h"

namespace headroom::models {

// What a row builder sees: its inputs and arguments, the model's scaling, and how to fail
// with the file, row and reason.
struct RowContext {
  std::string where;                 // "models/x.yaml:12: row 7"
  std::vector<int64_t> channels;     // of each input
  std::vector<int64_t> strides;      // of each input
  int64_t repeats = 1;               // after depth scaling
  YAML::Node args;
  double width = 1.0;
  int64_t max_channels = INT64_MAX;
  int64_t nc = 80;
  YAML::Node anchors;
  std::string scale;                 // the scale's name ("n", "m", ...): YOLO11 rows read it
  bool depthwise_head = false;       // an earlier row asked Detect for YOLO11's class branch

  [[noreturn]] void fail(const std::string& why) const;
  size_t count() const { return args.size(); }
  bool given(size_t i) const;                       // present and not None
  int64_t integer(size_t i, int64_t fallback) const;  // "nc" reads as the class count
  double number(size_t i, double fallback) const;
  bool boolean(size_t i, bool fallback) const;
  std::string text(size_t i, const std::string& fallback) const;
  std::vector<int64_t> integers(size_t i, std::vector<int64_t> fallback) const;
  // Ultralytics width scaling: make_divisible(min(c, max_channels) * width, 8), except for nc.
  int64_t scaled(int64_t c) const;
};

struct BuiltRow {
  std::shared_ptr<LayerImpl> layer;  // or
  std::shared_ptr<HeadImpl> head;
  int64_t channels = 0;              // of each output
  int64_t outputs = 1;
  int64_t stride = 0;                // of each output
  int64_t input_multiple = 1;        // the input's sides must be multiples of this (in pixels)
  std::string args;                  // resolved arguments for the layer table
  // Ultralytics gives Detect the depthwise class branch (its `legacy = False`) once a YOLO11
  // block (C3k2) is in the file.
  bool depthwise_head = false;
};

using RowBuilder = std::function<BuiltRow(const RowContext&)>;
const std::map<std::string, RowBuilder>& row_builders();

// Runs single-tensor modules one after another (a row with repeats > 1 holds that many).
class SequentialLayerImpl : public LayerImpl {
 public:
  explicit SequentialLayerImpl(torch::nn::Sequential seq);
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) override;
  torch::nn::Sequential seq;
};

// One Hourglass level (xingyizhou's kp_module): up1 + upsample(low3(low2(low1(x)))).
class HourglassLevelImpl : public torch::nn::Module {
 public:
  HourglassLevelImpl(const std::vector<int64_t>& dims, const std::vector<int64_t>& blocks);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Sequential up1, low1, low3, low2_blocks;  // low2_blocks: innermost level only
  std::shared_ptr<HourglassLevelImpl> low2;             // deeper levels
  bool recompute_blocks = false;
};

// Stacked hourglasses; returns the output features of every stack.
class HourglassImpl : public LayerImpl {
 public:
  HourglassImpl(int64_t stacks, const std::vector<int64_t>& dims, const std::vector<int64_t>& blocks, int64_t out);
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) override;
  void set_recompute(RecomputeMode mode) override;
  bool has_internal_recompute() const override { return true; }

  std::vector<std::shared_ptr<HourglassLevelImpl>> kps;
  std::vector<HgConv> cnvs;
  std::vector<Residual> inters;
  std::vector<ConvBn> inters_, cnvs_;
  RecomputeMode mode = RecomputeMode::off;
};

}  // namespace headroom::models
