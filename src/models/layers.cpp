#include "headroom/models/layers.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/upsampling.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"

namespace headroom::models {

// ---------------------------------------------------------------------------------------
// Arguments

void RowContext::fail(const std::string& why) const { throw InputError(where + ": " + why); }

bool RowContext::given(size_t i) const {
  read = std::max(read, i + 1);
  if (i >= args.size()) return false;
  const YAML::Node& a = args[i];
  return !(a.IsNull() || (a.IsScalar() && (a.Scalar() == "None" || a.Scalar() == "null")));
}

int64_t RowContext::integer(size_t i, int64_t fallback) const {
  if (!given(i)) return fallback;
  const YAML::Node& a = args[i];
  if (a.IsScalar() && a.Scalar() == "nc") return nc;
  const auto v = a.IsScalar() ? parse_int(a.Scalar()) : std::nullopt;
  if (!v) fail("argument " + std::to_string(i + 1) + " must be an integer, got '" + (a.IsScalar() ? a.Scalar() : "a list") + "'");
  return *v;
}

double RowContext::number(size_t i, double fallback) const {
  if (!given(i)) return fallback;
  const auto v = args[i].IsScalar() ? parse_double(args[i].Scalar()) : std::nullopt;
  if (!v) fail("argument " + std::to_string(i + 1) + " must be a number");
  return *v;
}

bool RowContext::boolean(size_t i, bool fallback) const {
  if (!given(i)) return fallback;
  const std::string s = args[i].IsScalar() ? to_lower(args[i].Scalar()) : "";
  if (s == "true") return true;
  if (s == "false") return false;
  fail("argument " + std::to_string(i + 1) + " must be True or False");
}

std::string RowContext::text(size_t i, const std::string& fallback) const {
  if (!given(i)) return fallback;
  if (!args[i].IsScalar()) fail("argument " + std::to_string(i + 1) + " must be a word");
  return args[i].Scalar();
}

std::vector<int64_t> RowContext::integers(size_t i, std::vector<int64_t> fallback) const {
  if (!given(i)) return fallback;
  const YAML::Node& a = args[i];
  if (!a.IsSequence()) fail("argument " + std::to_string(i + 1) + " must be a list of integers");
  std::vector<int64_t> out;
  for (const auto& v : a) {
    const auto n = v.IsScalar() ? parse_int(v.Scalar()) : std::nullopt;
    if (!n) fail("argument " + std::to_string(i + 1) + " must be a list of integers");
    out.push_back(*n);
  }
  return out;
}

int64_t RowContext::scaled(int64_t c) const {
  // ultralytics/yolov5 keeps a row as wide as its Detect's output (anchors x (nc + 5)) unscaled;
  // Ultralytics 8.4 scales every row but Classify's (8.3 and earlier kept c == nc, which built a
  // full-width stem for 64 classes).
  if (anchors && anchors.IsDefined() && !anchors.IsNull()) {
    const int64_t na = anchors.IsScalar() ? parse_int(anchors.Scalar()).value_or(0)
                       : anchors.IsSequence() && anchors.size() > 0 ? int64_t(anchors[0].size() / 2) : 0;
    if (na > 0 && c == na * (nc + 5)) return c;
  }
  const double v = double(std::min(c, max_channels)) * width;
  return static_cast<int64_t>(std::ceil(v / 8.0)) * 8;
}

namespace {

std::string list_text(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s + "]";
}

std::string ints_text(const std::vector<int64_t>& v) {
  std::vector<std::string> s;
  for (int64_t x : v) s.push_back(std::to_string(x));
  return list_text(s);
}

std::string bool_text(bool b) { return b ? "True" : "False"; }

std::string num_text(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Sequential layer, Hourglass

SequentialLayerImpl::SequentialLayerImpl(torch::nn::Sequential s) : seq(register_module("m", s)) {}

std::vector<at::Tensor> SequentialLayerImpl::forward(const std::vector<at::Tensor>& inputs) {
  return {seq->forward(inputs[0])};
}

namespace {

torch::nn::Sequential residuals(int64_t c1, int64_t c2, int64_t n, int64_t first_stride = 1) {
  torch::nn::Sequential s;
  s->push_back(Residual(c1, c2, first_stride));
  for (int64_t i = 1; i < n; ++i) s->push_back(Residual(c2, c2));
  return s;
}

// make_layer_revr: n - 1 blocks at c1, the last one to c2.
torch::nn::Sequential residuals_revr(int64_t c1, int64_t c2, int64_t n) {
  torch::nn::Sequential s;
  for (int64_t i = 0; i + 1 < n; ++i) s->push_back(Residual(c1, c1));
  s->push_back(Residual(c1, c2));
  return s;
}

at::Tensor run_blocks(torch::nn::Sequential s, const at::Tensor& x, bool recomputed) {
  return recomputed ? recompute_module(s, x) : s->forward(x);
}

at::Tensor upsample2(const at::Tensor& x) {
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
}

}  // namespace

HourglassLevelImpl::HourglassLevelImpl(const std::vector<int64_t>& dims, const std::vector<int64_t>& blocks) {
  up1 = register_module("up1", residuals(dims[0], dims[0], blocks[0]));
  low1 = register_module("low1", residuals(dims[0], dims[1], blocks[0], /*first_stride=*/2));  // no max-pool
  if (dims.size() > 2)
    low2 = register_module("low2", std::make_shared<HourglassLevelImpl>(std::vector<int64_t>(dims.begin() + 1, dims.end()),
                                                                       std::vector<int64_t>(blocks.begin() + 1, blocks.end())));
  else
    low2_blocks = register_module("low2", residuals(dims[1], dims[1], blocks[1]));
  low3 = register_module("low3", residuals_revr(dims[1], dims[0], blocks[0]));
}

// Each block sequence reads its input through its own alias: the gradient of x is then the sum
// of exactly two terms in every recompute mode, so recomputing changes no bit of it
// (with a segment boundary between several readers, floating-point sums would group differently).
at::Tensor HourglassLevelImpl::forward(const at::Tensor& x) {
  const bool c = recompute_blocks;
  const at::Tensor up = run_blocks(up1, at::alias(x), c);
  const at::Tensor l1 = run_blocks(low1, at::alias(x), c);
  const at::Tensor l2 = low2 ? low2->forward(l1) : run_blocks(low2_blocks, l1, c);
  return up + upsample2(run_blocks(low3, l2, c));
}

HourglassImpl::HourglassImpl(int64_t stacks, const std::vector<int64_t>& dims, const std::vector<int64_t>& blocks, int64_t out) {
  for (int64_t s = 0; s < stacks; ++s) {
    kps.push_back(register_module("kps" + std::to_string(s), std::make_shared<HourglassLevelImpl>(dims, blocks)));
    cnvs.push_back(register_module("cnvs" + std::to_string(s), HgConv(3, dims[0], out)));
  }
  for (int64_t s = 0; s + 1 < stacks; ++s) {
    inters.push_back(register_module("inters" + std::to_string(s), Residual(dims[0], dims[0])));
    inters_.push_back(register_module("inters_" + std::to_string(s), ConvBn(ConvBnOptions(dims[0], dims[0], 1))));
    cnvs_.push_back(register_module("cnvs_" + std::to_string(s), ConvBn(ConvBnOptions(out, dims[0], 1))));
  }
}

void HourglassImpl::set_recompute(RecomputeMode m) {
  mode = m;
  std::function<void(HourglassLevelImpl&)> mark = [&](HourglassLevelImpl& level) {
    level.recompute_blocks = m == RecomputeMode::all;
    if (level.low2) mark(*level.low2);
  };
  for (auto& kp : kps) mark(*kp);
}

std::vector<at::Tensor> HourglassImpl::forward(const std::vector<at::Tensor>& inputs) {
  at::Tensor inter = inputs[0];
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < kps.size(); ++s) {
    at::Tensor cnv;
    if (mode == RecomputeMode::stages) {  // one segment per stack: keep only its input
      auto kp = kps[s];
      auto cv = cnvs[s];
      cnv = recompute([kp, cv](const std::vector<at::Tensor>& in) mutable { return std::vector<at::Tensor>{cv->forward(kp->forward(in[0]))}; },
                       {at::alias(inter)}, {kp.get(), cv.ptr().get()})[0];
    } else {
      const at::Tensor kp = kps[s]->forward(at::alias(inter));  // the alias: see HourglassLevelImpl::forward
      cnv = mode == RecomputeMode::all ? recompute_module(cnvs[s], kp) : cnvs[s]->forward(kp);
    }
    outs.push_back(cnv);
    if (s + 1 >= kps.size()) continue;
    if (mode == RecomputeMode::all) {  // the join between stacks is a block too
      auto a = inters_[s], b = cnvs_[s];
      auto r = inters[s];
      inter = recompute([a, b, r](const std::vector<at::Tensor>& in) mutable {
                return std::vector<at::Tensor>{r->forward(at::relu(a->forward(in[0]) + b->forward(in[1])))};
              }, {inter, cnv}, {a.ptr().get(), b.ptr().get(), r.ptr().get()})[0];
    } else {
      inter = inters[s]->forward(at::relu(inters_[s]->forward(inter) + cnvs_[s]->forward(cnv)));
    }
  }
  return outs;
}

// ---------------------------------------------------------------------------------------
// The registry

namespace {

// Single-tensor modules: `repeats` copies in a row (the same arguments each, as Ultralytics).
template <class Make>
BuiltRow sequential_row(const RowContext& c, int64_t c2, int64_t stride_factor, const std::string& args, Make make) {
  if (c.repeats > 1 && c.channels[0] != c2)
    c.fail("repeating it " + std::to_string(c.repeats) + " times needs equal input and output channels (" +
           std::to_string(c.channels[0]) + " vs " + std::to_string(c2) + ")");
  torch::nn::Sequential seq;
  for (int64_t i = 0; i < c.repeats; ++i) seq->push_back(make());
  BuiltRow r;
  r.layer = std::make_shared<SequentialLayerImpl>(seq);
  r.channels = c2;
  r.stride = c.strides[0] * stride_factor;
  r.input_multiple = c.strides[0] * stride_factor;
  r.args = args;
  return r;
}

void single_input(const RowContext& c, const char* module) {
  if (c.channels.size() != 1) c.fail(std::string(module) + " takes one input (from), got " + std::to_string(c.channels.size()));
}

using Registry = std::map<std::string, RowBuilder>;

// The YOLO blocks: convolutions and CSP stages.
void add_csp_blocks(Registry& r) {
  r["Conv"] = [](const RowContext& c) {
    single_input(c, "Conv");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), k = c.integer(1, 1), s = c.integer(2, 1);
    const int64_t p = c.integer(3, -1), g = c.integer(4, 1), d = c.integer(5, 1);
    const bool act = c.boolean(6, true);
    if (c2 <= 0 || k <= 0 || s <= 0) c.fail("Conv needs [channels, kernel, stride, ...] with positive values");
    std::string args = ints_text({c1, c2, k, s});
    if (c.given(3)) args = args.substr(0, args.size() - 1) + ", " + std::to_string(p) + "]";
    return sequential_row(c, c2, s, args, [=] { return Conv(ConvOptions(c1, c2, k, s).padding(p).groups(g).dilation(d).act(act)); });
  };
  r["Bottleneck"] = [](const RowContext& c) {
    single_input(c, "Bottleneck");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), g = c.integer(2, 1);
    const bool shortcut = c.boolean(1, true);
    const std::vector<int64_t> k = c.integers(3, {3, 3});
    const double e = c.number(4, 0.5);
    if (k.size() != 2) c.fail("Bottleneck kernel sizes are a pair [k1, k2]");
    return sequential_row(c, c2, 1, "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + bool_text(shortcut) + "]",
                          [=] { return Bottleneck(c1, c2, shortcut, g, k[0], k[1], e); });
  };
  // C3 and C2f take the repeats as their bottleneck count (n), not as copies.
  for (const char* name : {"C3", "C2f"}) {
    const bool v8 = std::string(name) == "C2f";
    r[name] = [v8, name](const RowContext& c) {
      single_input(c, name);
      const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), n = c.repeats, g = c.integer(2, 1);
      const bool shortcut = c.boolean(1, !v8);
      const double e = c.number(3, 0.5);
      RowContext once = c;
      once.repeats = 1;
      const std::string args = "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + std::to_string(n) +
                               (c.given(1) ? ", " + bool_text(shortcut) : "") + "]";
      return sequential_row(once, c2, 1, args, [=]() -> torch::nn::AnyModule {
        if (v8) return torch::nn::AnyModule(C2f(c1, c2, n, shortcut, g, e));
        return torch::nn::AnyModule(C3(c1, c2, n, shortcut, g, e));
      });
    };
  }
  // YOLO11 C3k2 [c2, c3k, e, attn, g, shortcut]: a C2f whose inner blocks are half-width
  // bottlenecks, C3k blocks where c3k is True (Ultralytics forces it in scales m, l and x), or
  // with YOLO26's attention flag a bottleneck and a PSABlock.
  r["C3k2"] = [](const RowContext& c) {
    single_input(c, "C3k2");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), n = c.repeats;
    const bool c3k = c.boolean(1, false) || c.scale == "m" || c.scale == "l" || c.scale == "x";
    const double e = c.number(2, 0.5);
    const bool attn = c.boolean(3, false);
    const int64_t g = c.integer(4, 1);
    const bool shortcut = c.boolean(5, true);
    if (g < 1) c.fail("C3k2 groups must be at least 1");
    const C2fInner inner = attn ? C2fInner::attention : c3k ? C2fInner::c3k : C2fInner::half_bottleneck;
    RowContext once = c;
    once.repeats = 1;
    BuiltRow b = sequential_row(once, c2, 1, "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + std::to_string(n) + ", " +
                                                 bool_text(c3k) + ", " + num_text(e) + (attn ? ", True" : "") + "]",
                                [=] { return C2f(c1, c2, n, shortcut, g, e, inner); });
    b.depthwise_head = true;
    return b;
  };
}

// YOLO11's, YOLO12's and the pooling blocks.
void add_attention_and_pooling(Registry& r) {
  r["C2PSA"] = [](const RowContext& c) {
    single_input(c, "C2PSA");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), n = c.repeats;
    const double e = c.number(1, 0.5);
    if (c1 != c2) c.fail("C2PSA keeps its channels: input " + std::to_string(c1) + ", output " + std::to_string(c2));
    RowContext once = c;
    once.repeats = 1;
    return sequential_row(once, c2, 1, "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + std::to_string(n) + "]",
                          [=] { return C2PSA(c1, n, e); });
  };
  // YOLO12 A2C2f [c2, a2, area, residual, mlp_ratio, e, g, shortcut]. In scales l and x
  // Ultralytics appends residual True and mlp_ratio 1.2 to the row's arguments, which lands there
  // only after exactly [c2, a2, area]: other rows are refused rather than built otherwise.
  r["A2C2f"] = [](const RowContext& c) {
    single_input(c, "A2C2f");
    const bool large = c.scale == "l" || c.scale == "x";
    if (large && c.count() != 3)
      c.fail("in scale " + c.scale + " Ultralytics appends residual True and mlp_ratio 1.2 to A2C2f's arguments: give exactly [c2, a2, area] (" +
             std::to_string(c.count()) + " given)");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), n = c.repeats;
    A2C2fOptions o(c1, c2, n);
    o.a2(c.boolean(1, true)).area(c.integer(2, 1)).residual(c.boolean(3, large)).mlp_ratio(c.number(4, large ? 1.2 : 2.0));
    o.e(c.number(5, 0.5)).groups(c.integer(6, 1)).shortcut(c.boolean(7, true));
    const int64_t hidden = static_cast<int64_t>(double(c2) * o.e());
    if (hidden <= 0 || hidden % 32)  // Ultralytics asserts it with or without attention
      c.fail("A2C2f needs hidden channels (c2 x e = " + std::to_string(hidden) + ") in a multiple of 32 (attention heads of 32); widen the scale");
    if ((o.a2() && o.area() < 1) || o.mlp_ratio() <= 0 || o.groups() < 1)
      c.fail("A2C2f needs area >= 1 (with a2), mlp_ratio > 0 and groups >= 1");
    if (o.a2() && o.residual() && c1 != c2)
      c.fail("A2C2f's residual adds the input back: input " + std::to_string(c1) + " and output " + std::to_string(c2) + " channels differ");
    RowContext once = c;
    once.repeats = 1;
    std::string args = "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + std::to_string(n) + ", " + bool_text(o.a2()) + ", " +
                       std::to_string(o.area());
    if (o.a2() && o.residual()) args += ", True, " + num_text(o.mlp_ratio());
    BuiltRow b = sequential_row(once, c2, 1, args + "]", [=] { return A2C2f(o); });
    // H x W of the row's map must split into `area` runs: sides that are multiples of the least m
    // with m * m a multiple of area (2 for YOLO12's area 4).
    int64_t m = 1;
    while (o.a2() && (m * m) % o.area() != 0) ++m;
    b.input_multiple = c.strides[0] * m;
    b.depthwise_head = true;
    return b;
  };
  // SPPF [c2, k, n, shortcut]: rows that give n or the shortcut are YOLO26's (cv1 unactivated).
  r["SPPF"] = [](const RowContext& c) {
    single_input(c, "SPPF");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0)), k = c.integer(1, 5), n = c.integer(2, 3);
    const bool shortcut = c.boolean(3, false), yolo26 = c.count() > 2;
    if (k < 1 || k % 2 == 0 || n < 1) c.fail("SPPF takes [channels, odd kernel, pools (at least 1), shortcut]");
    std::string args = ints_text({c1, c2, k});
    if (yolo26) args = args.substr(0, args.size() - 1) + ", " + std::to_string(n) + ", " + bool_text(shortcut) + "]";
    return sequential_row(c, c2, 1, args, [=] { return SPPF(SPPFOptions(c1, c2).k(k).n(n).shortcut(shortcut).cv1_act(!yolo26)); });
  };
  r["SPP"] = [](const RowContext& c) {
    single_input(c, "SPP");
    const int64_t c1 = c.channels[0], c2 = c.scaled(c.integer(0, 0));
    const std::vector<int64_t> ks = c.integers(1, {5, 9, 13});
    return sequential_row(c, c2, 1, "[" + std::to_string(c1) + ", " + std::to_string(c2) + ", " + ints_text(ks) + "]",
                          [=] { return SPP(c1, c2, ks); });
  };
}

// Joins, upsampling and the YOLO heads.
void add_joins_and_heads(Registry& r) {
  r["Concat"] = [](const RowContext& c) {
    const int64_t dim = c.integer(0, 1);
    if (dim != 1) c.fail("Concat joins channels: dimension must be 1");
    BuiltRow b;
    b.layer = std::make_shared<ConcatLayerImpl>(dim);
    for (size_t i = 0; i < c.channels.size(); ++i) {
      if (c.strides[i] != c.strides[0])
        c.fail("Concat inputs have different strides (" + std::to_string(c.strides[0]) + " and " + std::to_string(c.strides[i]) + ")");
      b.channels += c.channels[i];
    }
    b.stride = c.strides[0];
    b.args = "[" + std::to_string(dim) + "]";
    return b;
  };
  r["nn.Upsample"] = [](const RowContext& c) {
    single_input(c, "nn.Upsample");
    const double scale = c.number(1, 2.0);
    const std::string mode = c.text(2, "nearest");
    if (c.given(0)) c.fail("nn.Upsample to a fixed size is not supported; use [None, scale, 'nearest']");
    if (mode != "nearest") c.fail("nn.Upsample mode '" + mode + "' is not supported; use 'nearest'");
    if (scale != std::floor(scale) || scale < 1 || c.strides[0] % int64_t(scale) != 0)
      c.fail("nn.Upsample scale must be a whole number that divides the input stride");
    BuiltRow b;
    b.layer = std::make_shared<UpsampleLayerImpl>(scale);
    b.channels = c.channels[0];
    b.stride = c.strides[0] / int64_t(scale);
    b.args = "[None, " + num_text(scale) + ", 'nearest']";
    return b;
  };
  r["Detect"] = [](const RowContext& c) {
    const int64_t nc = c.integer(0, c.nc);
    BuiltRow b;
    b.args = "[" + std::to_string(nc);
    if (c.given(1)) {  // YOLOv5: [nc, anchors]
      const YAML::Node a = c.args[1].IsScalar() && c.args[1].Scalar() == "anchors" ? c.anchors : c.args[1];
      if (!a || !a.IsSequence() || a.size() != c.channels.size())
        c.fail("Detect anchors must list one row of w,h pairs per input level (" + std::to_string(c.channels.size()) + ")");
      std::vector<float> values;
      int64_t na = -1;
      for (const auto& level : a) {
        if (!level.IsSequence() || level.size() % 2 || (na >= 0 && int64_t(level.size()) / 2 != na))
          c.fail("each anchor row must hold the same number of w,h pairs");
        na = int64_t(level.size()) / 2;
        for (const auto& v : level) {
          const auto x = v.IsScalar() ? parse_double(v.Scalar()) : std::nullopt;
          if (!x || *x <= 0) c.fail("anchor sizes must be positive numbers");
          values.push_back(float(*x));
        }
      }
      if (c.end2end || c.reg_max != 16) c.fail("end2end and reg_max belong to the anchor-free Detect ([nc]); anchors were given");
      at::Tensor anchors = at::tensor(values).view({int64_t(a.size()), na, 2});
      b.head = std::make_shared<DetectV5Impl>(nc, anchors, c.channels);
      b.args += ", anchors " + std::to_string(a.size()) + "x" + std::to_string(na);
    } else {
      b.head = std::make_shared<DetectV8Impl>(nc, c.channels, c.depthwise_head, c.reg_max, c.end2end);
    }
    b.args += ", " + ints_text(c.channels) + "]";
    return b;
  };
}

// CenterNet's Hourglass network and head.
void add_hourglass(Registry& r) {
  r["HourglassStem"] = [](const RowContext& c) {
    single_input(c, "HourglassStem");
    const int64_t c1 = c.channels[0], mid = c.integer(0, 128), out = c.integer(1, 256);
    RowContext once = c;
    once.repeats = 1;
    // 7x7/2 conv + residual/2: output stride 4.
    return sequential_row(once, out, 4, ints_text({c1, mid, out}),
                          [=] { return HourglassStem(c1, mid, out); });
  };
  r["Hourglass"] = [](const RowContext& c) {
    single_input(c, "Hourglass");
    const int64_t stacks = c.integer(0, 2), out = c.integer(3, 256);
    const std::vector<int64_t> dims = c.integers(1, {256, 256, 384, 384, 384, 512});
    const std::vector<int64_t> blocks = c.integers(2, {2, 2, 2, 2, 2, 4});
    if (stacks < 1 || dims.size() < 2 || dims.size() != blocks.size())
      c.fail("Hourglass takes [stacks, channels per level, blocks per level, output channels] with as many blocks as channels (at least 2)");
    if (dims[0] != c.channels[0])
      c.fail("Hourglass's first level has " + std::to_string(dims[0]) + " channels but its input has " + std::to_string(c.channels[0]));
    BuiltRow b;
    b.layer = std::make_shared<HourglassImpl>(stacks, dims, blocks, out);
    b.channels = out;
    b.outputs = stacks;
    b.stride = c.strides[0];
    b.input_multiple = c.strides[0] << (dims.size() - 1);  // every level halves the size
    b.args = "[" + std::to_string(stacks) + ", " + ints_text(dims) + ", " + ints_text(blocks) + ", " + std::to_string(out) + "]";
    return b;
  };
  r["CenterNetHead"] = [](const RowContext& c) {
    if (c.end2end || c.reg_max != 16) c.fail("end2end and reg_max belong to YOLO's Detect, not to CenterNetHead");
    const int64_t nc = c.integer(0, c.nc), width = c.integer(1, 256);
    BuiltRow b;
    b.head = std::make_shared<CenterNetHeadImpl>(nc, width, c.channels);
    b.args = "[" + std::to_string(nc) + ", " + std::to_string(width) + ", " + ints_text(c.channels) + "]";
    return b;
  };
}

Registry make_registry() {
  Registry r;
  add_csp_blocks(r);
  add_attention_and_pooling(r);
  add_joins_and_heads(r);
  add_hourglass(r);
  return r;
}

}  // namespace

const std::map<std::string, RowBuilder>& row_builders() {
  static const std::map<std::string, RowBuilder> registry = make_registry();
  return registry;
}

}  // namespace headroom::models
