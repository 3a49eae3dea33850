// The row modules a model file can name, and how each row is built from its arguments (a
// registry: module name -> builder); ONNX export walks the same modules.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/functional/upsampling.h>
#include <yaml-cpp/yaml.h>

#include <cmath>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headroom/models/blocks.h"
#include "headroom/models/detector.h"
#include "headroom/models/recompute.h"

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
  int64_t reg_max = 16;              // the file's reg_max and end2end: Detect reads them
  bool end2end = false;
  bool depthwise_head = false;       // an earlier row asked Detect for YOLO11's class branch
  mutable size_t read = 0;           // one past the highest argument the builder looked at

  [[noreturn]] void fail(const std::string& why) const;
  size_t count() const { return args.size(); }
  bool given(size_t i) const;                       // present and not None (every accessor asks it)
  int64_t integer(size_t i, int64_t fallback) const;  // "nc" reads as the class count
  double number(size_t i, double fallback) const;
  bool boolean(size_t i, bool fallback) const;
  std::string text(size_t i, const std::string& fallback) const;
  std::vector<int64_t> integers(size_t i, std::vector<int64_t> fallback) const;
  // Ultralytics width scaling: make_divisible(min(c, max_channels) * width, 8); YOLOv5 files
  // (anchors) keep anchors x (nc + 5) as it is.
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

// ---------------------------------------------------------------------------------------
// Layers and heads (declared here, not in layers.cpp, because the ONNX exporter walks them)

class ConcatLayerImpl : public LayerImpl {
 public:
  explicit ConcatLayerImpl(int64_t dim) : dim_(dim) {}
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::cat(in, dim_)}; }
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

class UpsampleLayerImpl : public LayerImpl {
 public:
  explicit UpsampleLayerImpl(double scale) : scale_(scale) {}
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    namespace F = torch::nn::functional;
    return {F::interpolate(in[0], F::InterpolateFuncOptions().scale_factor(std::vector<double>{scale_, scale_}).mode(torch::kNearest))};
  }
  double scale() const { return scale_; }

 private:
  double scale_;
};

// ---------------------------------------------------------------------------------------
// Heads

// Two convolutions in a row, named "0" and "1" as in the Sequential Ultralytics nests in its
// YOLO11 class branch (a Sequential cannot hold a Sequential here).
class ConvPairImpl : public torch::nn::Module {
 public:
  ConvPairImpl(Conv a, Conv b) : first(register_module("0", a)), second(register_module("1", b)) {}
  at::Tensor forward(const at::Tensor& x) { return second->forward(first->forward(x)); }
  Conv first, second;
};
TORCH_MODULE(ConvPair);

// YOLOv8 Detect: per level a box branch (DFL bins) and a class branch. YOLO11's class branch
// replaces each 3x3 conv by a depthwise 3x3 then a 1x1 (`depthwise`). YOLO26 (reg_max 1) has
// no DFL: the box branch outputs the four distances. With `end2end` the head carries a second,
// one-to-one branch (a copy of the first at construction, as Ultralytics deep-copies it), fed
// with detached features in training: its boxes need no NMS. Outputs "pred" (one-to-many) and,
// end to end, "one2one".
class DetectV8Impl : public HeadImpl {
 public:
  DetectV8Impl(int64_t nc, const std::vector<int64_t>& ch, bool depthwise, int64_t reg_max = 16, bool end2end = false)
      : nc_(nc), reg_max_(reg_max) {
    cv2 = register_module("cv2", box_branches(ch));
    cv3 = register_module("cv3", class_branches(ch, depthwise));
    if (reg_max > 1) {
      // The DFL projection: a frozen 1x1 conv whose weights are the bin indices; the decoder uses
      // it to turn bin distributions into distances (reg_max parameters, counted as the reference does).
      dfl = register_module("dfl", torch::nn::Conv2d(torch::nn::Conv2dOptions(reg_max, 1, 1).bias(false)));
      at::NoGradGuard no_grad;
      dfl->weight.copy_(at::arange(reg_max, at::kFloat).view({1, reg_max, 1, 1}));
      dfl->weight.set_requires_grad(false);
    }
    if (end2end) {
      one2one_cv2 = register_module("one2one_cv2", box_branches(ch));
      one2one_cv3 = register_module("one2one_cv3", class_branches(ch, depthwise));
      copy_state(*cv2, *one2one_cv2);
      copy_state(*cv3, *one2one_cv3);
    }
  }

  HeadOutputs forward(const std::vector<at::Tensor>& x) override {
    if (one2one_cv2 && one_to_one_only_ && !is_training()) return {{"one2one", run(one2one_cv2, one2one_cv3, x)}};
    HeadOutputs out{{"pred", run(cv2, cv3, x)}};
    if (one2one_cv2) {
      // The one-to-one loss trains its branch, not the features: whatever the mode (a frozen
      // BatchNorm is still training), so that each loss normaliser has its own parameters.
      std::vector<at::Tensor> detached;
      for (const auto& f : x) detached.push_back(f.detach());
      out["one2one"] = run(one2one_cv2, one2one_cv3, detached);
    }
    return out;
  }

  void init_biases(const std::vector<int64_t>& strides) override {
    at::NoGradGuard no_grad;
    // Box bias: 2 grid cells for YOLO26's raw distances (Ultralytics 8.4); DFL heads keep the
    // 1.0 that YOLOv8 and YOLO11 were trained with here from the start.
    const double box = reg_max_ > 1 ? 1.0 : 2.0;
    for (auto [boxes, classes] : {std::pair(cv2, cv3), std::pair(one2one_cv2, one2one_cv3)}) {
      if (!boxes) continue;
      for (size_t i = 0; i < strides.size(); ++i) {
        last_conv(boxes[i])->bias.fill_(box);
        // Class prior: about 5 objects of nc classes in a 640 image, per cell of this level.
        last_conv(classes[i])->bias.fill_(std::log(5.0 / double(nc_) / std::pow(640.0 / double(strides[i]), 2)));
      }
    }
  }

  void set_one_to_one_only(bool on) override { one_to_one_only_ = on; }

  void describe(DetectorInfo& info) const override {
    info.family = "yolov8";
    info.nc = nc_;
    info.reg_max = reg_max_;
    info.end2end = bool(one2one_cv2);
  }

  static torch::nn::Conv2d last_conv(const std::shared_ptr<torch::nn::Module>& seq) {
    auto s = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq);
    return s->ptr(s->size() - 1)->as<ConvBnImpl>()->conv;
  }

  torch::nn::ModuleList cv2, cv3, one2one_cv2{nullptr}, one2one_cv3{nullptr};
  torch::nn::Conv2d dfl{nullptr};

  int64_t nc() const { return nc_; }
  int64_t reg_max() const { return reg_max_; }

 private:
  torch::nn::ModuleList box_branches(const std::vector<int64_t>& ch) const {
    const int64_t c2 = std::max({int64_t(16), ch[0] / 4, reg_max_ * 4});
    torch::nn::ModuleList list;
    for (int64_t c : ch)
      list->push_back(torch::nn::Sequential(Conv(ConvOptions(c, c2, 3)), Conv(ConvOptions(c2, c2, 3)),
                                            ConvBn(ConvBnOptions(c2, 4 * reg_max_, 1).batch_norm(false))));
    return list;
  }
  torch::nn::ModuleList class_branches(const std::vector<int64_t>& ch, bool depthwise) const {
    const int64_t c3 = std::max(ch[0], std::min(nc_, int64_t(100)));
    // Ultralytics DWConv: groups = gcd(in, out), here in = out.
    const auto dw_then_pw = [](int64_t in, int64_t out) {
      return ConvPair(Conv(ConvOptions(in, in, 3).groups(in)), Conv(ConvOptions(in, out, 1)));
    };
    torch::nn::ModuleList list;
    for (int64_t c : ch) {
      torch::nn::Sequential cls;
      if (depthwise) {
        cls->push_back(dw_then_pw(c, c3));
        cls->push_back(dw_then_pw(c3, c3));
      } else {
        cls->push_back(Conv(ConvOptions(c, c3, 3)));
        cls->push_back(Conv(ConvOptions(c3, c3, 3)));
      }
      cls->push_back(ConvBn(ConvBnOptions(c3, nc_, 1).batch_norm(false)));
      list->push_back(cls);
    }
    return list;
  }
  static void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
    at::NoGradGuard no_grad;
    const auto src = from.named_parameters(), src_buffers = from.named_buffers();
    for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
    for (auto& b : to.named_buffers()) b.value().copy_(src_buffers[b.key()]);
  }
  static std::vector<at::Tensor> run(torch::nn::ModuleList boxes, torch::nn::ModuleList classes, const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> pred;  // per level [B, 4 * reg_max + nc, H, W]
    for (size_t i = 0; i < x.size(); ++i)
      pred.push_back(at::cat({boxes[i]->as<torch::nn::Sequential>()->forward(x[i]), classes[i]->as<torch::nn::Sequential>()->forward(x[i])}, 1));
    return pred;
  }

  int64_t nc_, reg_max_;
  bool one_to_one_only_ = false;
};

// YOLOv5 Detect: per level one 1x1 conv to anchors x (5 + nc).
class DetectV5Impl : public HeadImpl {
 public:
  DetectV5Impl(int64_t nc, at::Tensor anchors, const std::vector<int64_t>& ch) : nc_(nc) {
    na_ = anchors.size(1);
    anchors_ = register_buffer("anchors", anchors);
    for (int64_t c : ch) m->push_back(ConvBn(ConvBnOptions(c, na_ * (nc + 5), 1).batch_norm(false)));
    register_module("m", m);
  }

  HeadOutputs forward(const std::vector<at::Tensor>& x) override {
    std::vector<at::Tensor> pred;
    for (size_t i = 0; i < x.size(); ++i) {
      const at::Tensor y = m[i]->as<ConvBnImpl>()->forward(x[i]);  // [B, na * no, H, W]
      pred.push_back(y.view({y.size(0), na_, nc_ + 5, y.size(2), y.size(3)}).permute({0, 1, 3, 4, 2}).contiguous());
    }
    return {{"pred", pred}};
  }

  void init_biases(const std::vector<int64_t>& strides) override {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < strides.size(); ++i) {
      at::Tensor b = m[i]->as<ConvBnImpl>()->conv->bias.view({na_, -1});
      b.select(1, 4).add_(std::log(8.0 / std::pow(640.0 / double(strides[i]), 2)));  // 8 objects per 640 image
      b.narrow(1, 5, nc_).add_(std::log(0.6 / (double(nc_) - 0.99999)));
    }
  }

  void describe(DetectorInfo& info) const override {
    info.family = "yolov5";
    info.nc = nc_;
    info.anchors = anchors_;
  }

  torch::nn::ModuleList m;

  int64_t nc() const { return nc_; }
  int64_t anchors_per_cell() const { return na_; }
  const at::Tensor& anchors() const { return anchors_; }  // [levels, anchors, 2] pixels

 private:
  int64_t nc_, na_;
  at::Tensor anchors_;
};

// CenterNet heads on every input (Hourglass stack or neck output): 3x3 conv + ReLU + 1x1.
class CenterNetHeadImpl : public HeadImpl {
 public:
  CenterNetHeadImpl(int64_t nc, int64_t width, const std::vector<int64_t>& ch) : nc_(nc) {
    for (const auto& [name, out] : std::vector<std::pair<std::string, int64_t>>{{"heatmap", nc}, {"size", 2}, {"offset", 2}}) {
      torch::nn::ModuleList list;
      for (int64_t c : ch)
        list->push_back(torch::nn::Sequential(HgConv(3, c, width, 1, /*with_bn=*/false),
                                              ConvBn(ConvBnOptions(width, out, 1).batch_norm(false))));
      heads_.emplace_back(name, register_module(name, list));
    }
  }

  HeadOutputs forward(const std::vector<at::Tensor>& x) override {
    HeadOutputs out;
    for (auto& [name, list] : heads_)
      for (size_t i = 0; i < x.size(); ++i) {
        torch::nn::Sequential head(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(list[i]));
        // at::alias: one reader of x per head, as in HourglassLevelImpl::forward.
        out[name].push_back(recomputed_ ? recompute_module(head, at::alias(x[i])) : head->forward(at::alias(x[i])));
      }
    return out;
  }

  void set_recompute(RecomputeMode mode) override { recomputed_ = mode == RecomputeMode::all; }

  void init_biases(const std::vector<int64_t>&) override {
    at::NoGradGuard no_grad;
    for (const auto& m : *heads_[0].second)  // heatmap: sigmoid(-2.19) = 0.1, the focal-loss prior
      DetectV8Impl::last_conv(m)->bias.fill_(-2.19);
  }

  void describe(DetectorInfo& info) const override {
    info.family = "centernet";
    info.nc = nc_;
    info.stacks = static_cast<int64_t>(heads_[0].second->size());
  }

  // {"heatmap" | "size" | "offset", one Sequential per input}
  const std::vector<std::pair<std::string, torch::nn::ModuleList>>& heads() const { return heads_; }

 private:
  int64_t nc_;
  std::vector<std::pair<std::string, torch::nn::ModuleList>> heads_;
  bool recomputed_ = false;
};

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
