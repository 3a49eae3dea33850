#include "headroom/models/blocks.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/pooling.h>

#include <cmath>

namespace headroom::models {

namespace F = torch::nn::functional;

namespace {
thread_local FlopCounter* g_flop_counter = nullptr;
}

FlopCounter::FlopCounter() : previous_(g_flop_counter) { g_flop_counter = this; }
FlopCounter::~FlopCounter() { g_flop_counter = previous_; }

ConvBnImpl::ConvBnImpl(const ConvBnOptions& o) : options(o) {
  // Ultralytics' autopad: half the effective kernel, rounded down (1 for a 2x2 kernel).
  const int64_t pad = o.padding() >= 0 ? o.padding() : (o.dilation() * (o.kernel() - 1) + 1) / 2;
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in(), o.out(), o.kernel())
                                                        .stride(o.stride())
                                                        .padding(pad)
                                                        .groups(o.groups())
                                                        .dilation(o.dilation())
                                                        .bias(!o.batch_norm())));
  if (o.batch_norm())
    bn = register_module("bn", torch::nn::BatchNorm2d(
                                   torch::nn::BatchNormOptions(o.out()).eps(o.bn_eps()).momentum(o.bn_momentum())));
}

at::Tensor ConvBnImpl::forward(const at::Tensor& x) {
  at::Tensor y = conv->forward(x);
  if (g_flop_counter) {
    const auto& w = conv->weight;
    g_flop_counter->add(double(y.numel()) * (double(w.size(1) * w.size(2) * w.size(3)) + (conv->bias.defined() ? 1 : 0)));
    if (bn) g_flop_counter->add(4.0 * double(y.numel()));
  }
  if (!bn) return y;
  return sync_stats && is_training() ? sync_batch_norm(y, *bn, sync_stats) : bn->forward(y);
}

namespace {
// sum over (N, H, W) of (x - m)^2 for a constant m [C]; saves only x (which the normalisation
// keeps anyway) and m, and recomputes the difference in backward.
struct CenteredSquareSum : public torch::autograd::Function<CenteredSquareSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& m) {
    ctx->save_for_backward({x, m});
    at::NoGradGuard no_grad;
    return (x - m.view({1, -1, 1, 1})).square().sum({0, 2, 3});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& m = saved[1];
    return {(x - m.view({1, -1, 1, 1})) * (2 * grads[0]).view({1, -1, 1, 1}), at::Tensor()};
  }
};
}  // namespace

at::Tensor sync_batch_norm(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn, const StatsSum& sum) {
  const int64_t C = x.size(1);
  const at::Tensor xf = x.to(at::kFloat);
  // Two passes over every rank's images, as BatchNorm's own variance: the mean, then the sum of
  // squared differences from it (one pass's E[x^2] - E[x]^2 loses digits where the mean is large).
  // The variance's gradient does not depend on the mean's (the differences sum to zero), so the
  // second pass takes it as a constant.
  const at::Tensor first = sum(at::cat({xf.sum({0, 2, 3}), at::full({1}, double(x.numel() / C), xf.options())}));  // [C + 1]
  const at::Tensor n = first.narrow(0, C, 1);
  const at::Tensor mean = first.narrow(0, 0, C) / n;
  const at::Tensor var = sum(CenteredSquareSum::apply(xf, mean.detach())) / n;  // biased, as the normalisation uses
  {
    at::NoGradGuard no_grad;
    const double m = bn.options.momentum().value_or(0.1);
    bn.running_mean.mul_(1 - m).add_(mean.detach() * m);
    bn.running_var.mul_(1 - m).add_(var.detach() * (n / (n - 1).clamp_min(1)) * m);
    bn.num_batches_tracked.add_(1);
  }
  const at::Tensor scale = bn.weight * at::rsqrt(var + bn.options.eps());  // [C]
  const at::Tensor shift = bn.bias - mean * scale;
  return (xf * scale.view({1, C, 1, 1}) + shift.view({1, C, 1, 1})).to(x.scalar_type());
}

void ConvBnImpl::fuse() {
  if (!bn) return;
  at::NoGradGuard no_grad;
  const at::Tensor scale = bn->weight / at::sqrt(bn->running_var + bn->options.eps());  // [out]
  const at::Tensor bias = conv->bias.defined() ? conv->bias : at::zeros_like(bn->running_mean);
  const auto& o = conv->options;
  torch::nn::Conv2d fused(torch::nn::Conv2dOptions(o.in_channels(), o.out_channels(), o.kernel_size())
                              .stride(o.stride())
                              .padding(o.padding())
                              .dilation(o.dilation())
                              .groups(o.groups())
                              .bias(true));
  fused->to(conv->weight.device(), conv->weight.scalar_type());
  fused->weight.copy_(conv->weight * scale.view({-1, 1, 1, 1}));
  fused->bias.copy_((bias - bn->running_mean) * scale + bn->bias);
  fused->train(is_training());
  conv = replace_module("conv", fused);
  unregister_module("bn");
  bn = nullptr;
}

ConvImpl::ConvImpl(const ConvOptions& o) : act(o.act()) {
  cb = register_module("cb", ConvBn(ConvBnOptions(o.in(), o.out(), o.kernel())
                                        .stride(o.stride())
                                        .padding(o.padding())
                                        .groups(o.groups())
                                        .dilation(o.dilation())
                                        .bn_eps(1e-3)
                                        .bn_momentum(0.03)));
}

at::Tensor ConvImpl::forward(const at::Tensor& x) {
  at::Tensor y = cb->forward(x);
  return act ? at::silu(y) : y;
}

BottleneckImpl::BottleneckImpl(int64_t c1, int64_t c2, bool shortcut, int64_t g, int64_t k1, int64_t k2, double e)
    : add(shortcut && c1 == c2) {
  const int64_t c_ = static_cast<int64_t>(double(c2) * e);
  cv1 = register_module("cv1", Conv(ConvOptions(c1, c_, k1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions(c_, c2, k2, 1).groups(g)));
}

at::Tensor BottleneckImpl::forward(const at::Tensor& x) {
  at::Tensor y = cv2->forward(cv1->forward(x));
  return add ? x + y : y;
}

C3Impl::C3Impl(int64_t c1, int64_t c2, int64_t n, bool shortcut, int64_t g, double e, int64_t k1) {
  const int64_t c_ = static_cast<int64_t>(double(c2) * e);
  cv1 = register_module("cv1", Conv(ConvOptions(c1, c_, 1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions(c1, c_, 1, 1)));
  cv3 = register_module("cv3", Conv(ConvOptions(2 * c_, c2, 1)));
  for (int64_t i = 0; i < n; ++i) m->push_back(Bottleneck(c_, c_, shortcut, g, k1, 3, 1.0));
  register_module("m", m);
}

at::Tensor C3Impl::forward(const at::Tensor& x) {
  return cv3->forward(at::cat({m->forward(cv1->forward(x)), cv2->forward(x)}, 1));
}

C2fImpl::C2fImpl(int64_t c1, int64_t c2, int64_t n, bool shortcut, int64_t g, double e, C2fInner inner)
    : c(static_cast<int64_t>(double(c2) * e)) {
  cv1 = register_module("cv1", Conv(ConvOptions(c1, 2 * c, 1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions((2 + n) * c, c2, 1)));
  for (int64_t i = 0; i < n; ++i) {
    if (inner == C2fInner::c3k)
      m->push_back(C3(c, c, 2, shortcut, g, 0.5, /*k1=*/3));
    else if (inner == C2fInner::attention)
      m->push_back(torch::nn::Sequential(Bottleneck(c, c, shortcut, g, 3, 3, 0.5), PSABlock(c, std::max<int64_t>(c / 64, 1))));
    else
      m->push_back(Bottleneck(c, c, shortcut, g, 3, 3, inner == C2fInner::bottleneck ? 1.0 : 0.5));
  }
  register_module("m", m);
}

at::Tensor C2fImpl::forward(const at::Tensor& x) {
  std::vector<at::Tensor> y = cv1->forward(x).chunk(2, 1);
  for (const auto& b : *m) {
    if (auto* bottleneck = b->as<Bottleneck>())
      y.push_back(bottleneck->forward(y.back()));
    else if (auto* c3 = b->as<C3>())
      y.push_back(c3->forward(y.back()));
    else
      y.push_back(b->as<torch::nn::Sequential>()->forward(y.back()));
  }
  return cv2->forward(at::cat(y, 1));
}

AttentionImpl::AttentionImpl(int64_t dim, int64_t heads_, double attn_ratio)
    : heads(heads_), head_dim(dim / heads_), key_dim(static_cast<int64_t>(double(dim / heads_) * attn_ratio)) {
  scale = 1.0 / std::sqrt(double(key_dim));
  qkv = register_module("qkv", Conv(ConvOptions(dim, dim + 2 * key_dim * heads, 1).act(false)));
  proj = register_module("proj", Conv(ConvOptions(dim, dim, 1).act(false)));
  pe = register_module("pe", Conv(ConvOptions(dim, dim, 3).groups(dim).act(false)));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), N = H * W;
  const std::vector<at::Tensor> qkv_ = qkv->forward(x).view({B, heads, 2 * key_dim + head_dim, N}).split_with_sizes({key_dim, key_dim, head_dim}, 2);
  const at::Tensor& q = qkv_[0];  // [B, heads, key_dim, N]
  const at::Tensor& k = qkv_[1];  // [B, heads, key_dim, N]
  const at::Tensor& v = qkv_[2];  // [B, heads, head_dim, N]
  // q scaled first, as Ultralytics does: the unscaled product is what overflows in fp16.
  const at::Tensor attn = at::matmul((q * scale).transpose(-2, -1), k).softmax(-1);  // [B, heads, N, N]
  const at::Tensor y = at::matmul(v, attn.transpose(-2, -1)).view({B, C, H, W}) + pe->forward(v.reshape({B, C, H, W}));
  return proj->forward(y);
}

PSABlockImpl::PSABlockImpl(int64_t c, int64_t heads) {
  attn = register_module("attn", Attention(c, heads, 0.5));
  ffn = register_module("ffn", torch::nn::Sequential(Conv(ConvOptions(c, 2 * c, 1)), Conv(ConvOptions(2 * c, c, 1).act(false))));
}

at::Tensor PSABlockImpl::forward(const at::Tensor& x) {
  const at::Tensor y = x + attn->forward(x);
  return y + ffn->forward(y);
}

C2PSAImpl::C2PSAImpl(int64_t c1, int64_t n, double e) : c(static_cast<int64_t>(double(c1) * e)) {
  cv1 = register_module("cv1", Conv(ConvOptions(c1, 2 * c, 1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions(2 * c, c1, 1)));
  for (int64_t i = 0; i < n; ++i) m->push_back(PSABlock(c, std::max<int64_t>(c / 64, 1)));  // Ultralytics: one head at least
  register_module("m", m);
}

at::Tensor C2PSAImpl::forward(const at::Tensor& x) {
  const std::vector<at::Tensor> ab = cv1->forward(x).split(c, 1);
  return cv2->forward(at::cat({ab[0], m->forward(ab[1])}, 1));
}

AreaAttentionImpl::AreaAttentionImpl(int64_t dim, int64_t heads_, int64_t area_) : heads(heads_), head_dim(dim / heads_), area(area_) {
  qkv = register_module("qkv", Conv(ConvOptions(dim, 3 * dim, 1).act(false)));
  proj = register_module("proj", Conv(ConvOptions(dim, dim, 1).act(false)));
  pe = register_module("pe", Conv(ConvOptions(dim, dim, 7).groups(dim).act(false)));
}

// Ultralytics folds the areas into the batch ([B * area, N / area, ...]); the same memory read
// as [B, area, N / area, ...] keeps the batch symbolic in the ONNX mirror.
at::Tensor AreaAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const at::Tensor t = qkv->forward(x).flatten(2).transpose(1, 2)                   // [B, N, 3C]
                           .reshape({B, area, -1, heads, 3 * head_dim})             // [B, area, n, heads, 3 hd]
                           .permute({0, 1, 3, 4, 2});                               // [B, area, heads, 3 hd, n]
  const std::vector<at::Tensor> qkv_ = t.split(head_dim, 3);
  const at::Tensor& q = qkv_[0];
  const at::Tensor& k = qkv_[1];
  const at::Tensor& v = qkv_[2];                                                    // [B, area, heads, hd, n]
  const at::Tensor attn = at::matmul((q * std::pow(double(head_dim), -0.5)).transpose(-2, -1), k).softmax(-1);  // [.., n, n]
  const auto to_map = [&](const at::Tensor& y) {  // [B, area, heads, hd, n] -> [B, C, H, W]
    return y.permute({0, 1, 4, 2, 3}).reshape({B, H, W, C}).permute({0, 3, 1, 2}).contiguous();
  };
  const at::Tensor y = to_map(at::matmul(v, attn.transpose(-2, -1))) + pe->forward(to_map(v));
  return proj->forward(y);
}

ABlockImpl::ABlockImpl(int64_t dim, int64_t heads, double mlp_ratio, int64_t area) {
  const int64_t hidden = static_cast<int64_t>(double(dim) * mlp_ratio);
  attn = register_module("attn", AreaAttention(dim, heads, area));
  mlp = register_module("mlp", torch::nn::Sequential(Conv(ConvOptions(dim, hidden, 1)), Conv(ConvOptions(hidden, dim, 1).act(false))));
  at::NoGradGuard no_grad;
  // trunc_normal_(std=0.02) cuts at +-2 (absolute), a hundred standard deviations out: a normal.
  for (auto& m : modules(/*include_self=*/false))
    if (auto* conv = m->as<torch::nn::Conv2d>()) conv->weight.normal_(0.0, 0.02);
}

at::Tensor ABlockImpl::forward(const at::Tensor& x) {
  const at::Tensor y = x + attn->forward(x);
  return y + mlp->forward(y);
}

A2C2fImpl::A2C2fImpl(const A2C2fOptions& o) {
  const int64_t c = static_cast<int64_t>(double(o.c2()) * o.e());
  cv1 = register_module("cv1", Conv(ConvOptions(o.c1(), c, 1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions((1 + o.n()) * c, o.c2(), 1)));
  if (o.a2() && o.residual()) gamma = register_parameter("gamma", at::full({o.c2()}, 0.01));
  for (int64_t i = 0; i < o.n(); ++i) {
    if (o.a2())
      m->push_back(torch::nn::Sequential(ABlock(c, c / 32, o.mlp_ratio(), o.area()), ABlock(c, c / 32, o.mlp_ratio(), o.area())));
    else
      m->push_back(C3(c, c, 2, o.shortcut(), o.groups(), 0.5, /*k1=*/3));  // C3k
  }
  register_module("m", m);
}

at::Tensor A2C2fImpl::forward(const at::Tensor& x) {
  std::vector<at::Tensor> y = {cv1->forward(x)};
  for (const auto& b : *m) {
    if (auto* c3 = b->as<C3>())
      y.push_back(c3->forward(y.back()));
    else
      y.push_back(b->as<torch::nn::Sequential>()->forward(y.back()));
  }
  const at::Tensor out = cv2->forward(at::cat(y, 1));
  return gamma.defined() ? x + gamma.view({1, -1, 1, 1}) * out : out;
}

SPPFImpl::SPPFImpl(const SPPFOptions& o) : options(o), add(o.shortcut() && o.c1() == o.c2()) {
  const int64_t c_ = o.c1() / 2;
  cv1 = register_module("cv1", Conv(ConvOptions(o.c1(), c_, 1, 1).act(o.cv1_act())));
  cv2 = register_module("cv2", Conv(ConvOptions(c_ * (o.n() + 1), o.c2(), 1, 1)));
}

at::Tensor SPPFImpl::forward(const at::Tensor& x) {
  const int64_t k = options.k();
  std::vector<at::Tensor> y = {cv1->forward(x)};
  for (int64_t i = 0; i < options.n(); ++i) y.push_back(at::max_pool2d(y.back(), {k, k}, {1, 1}, {k / 2, k / 2}));
  const at::Tensor out = cv2->forward(at::cat(y, 1));
  return add ? out + x : out;
}

SPPImpl::SPPImpl(int64_t c1, int64_t c2, std::vector<int64_t> ks_) : ks(std::move(ks_)) {
  const int64_t c_ = c1 / 2;
  cv1 = register_module("cv1", Conv(ConvOptions(c1, c_, 1, 1)));
  cv2 = register_module("cv2", Conv(ConvOptions(c_ * int64_t(ks.size() + 1), c2, 1, 1)));
}

at::Tensor SPPImpl::forward(const at::Tensor& x) {
  const at::Tensor y = cv1->forward(x);
  std::vector<at::Tensor> parts = {y};
  for (int64_t k : ks) parts.push_back(at::max_pool2d(y, {k, k}, {1, 1}, {k / 2, k / 2}));
  return cv2->forward(at::cat(parts, 1));
}

HgConvImpl::HgConvImpl(int64_t k, int64_t c1, int64_t c2, int64_t stride, bool with_bn) {
  cb = register_module("cb", ConvBn(ConvBnOptions(c1, c2, k).stride(stride).batch_norm(with_bn)));
}

at::Tensor HgConvImpl::forward(const at::Tensor& x) { return at::relu(cb->forward(x)); }

ResidualImpl::ResidualImpl(int64_t c1, int64_t c2, int64_t stride) {
  conv1 = register_module("conv1", ConvBn(ConvBnOptions(c1, c2, 3).stride(stride)));
  conv2 = register_module("conv2", ConvBn(ConvBnOptions(c2, c2, 3)));
  if (stride != 1 || c1 != c2) skip = register_module("skip", ConvBn(ConvBnOptions(c1, c2, 1).stride(stride)));
}

at::Tensor ResidualImpl::forward(const at::Tensor& x) {
  const at::Tensor y = conv2->forward(at::relu(conv1->forward(x)));
  return at::relu(y + (skip ? skip->forward(x) : x));
}

HourglassStemImpl::HourglassStemImpl(int64_t c1, int64_t mid, int64_t out) {
  conv = register_module("conv", HgConv(7, c1, mid, 2));
  res = register_module("res", Residual(mid, out, 2));
}

at::Tensor HourglassStemImpl::forward(const at::Tensor& x) { return res->forward(conv->forward(x)); }

}  // namespace headroom::models
