// Building blocks of the YOLO (CSPDarknet) and Hourglass models, with the structure and
// initialisation of the Ultralytics and xingyizhou/CenterNet references (so parameter counts
// match exactly). Every convolution is a ConvBn: the unit that Conv+BN fusion and the FLOP
// counter work on.
#pragma once

#include <functional>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

namespace headroom::models {

struct ConvBnOptions {
  ConvBnOptions(int64_t in, int64_t out, int64_t kernel) : in_(in), out_(out), kernel_(kernel) {}
  TORCH_ARG(int64_t, in);
  TORCH_ARG(int64_t, out);
  TORCH_ARG(int64_t, kernel);
  TORCH_ARG(int64_t, stride) = 1;
  TORCH_ARG(int64_t, padding) = -1;  // -1: "same" for odd kernels (k / 2 * dilation)
  TORCH_ARG(int64_t, groups) = 1;
  TORCH_ARG(int64_t, dilation) = 1;
  TORCH_ARG(bool, batch_norm) = true;  // without: the convolution has a bias
  TORCH_ARG(double, bn_eps) = 1e-5;
  TORCH_ARG(double, bn_momentum) = 0.1;
};

// A differentiable sum over the processes of a run (dist::differentiable_sum).
using StatsSum = std::function<at::Tensor(const at::Tensor&)>;

// Conv2d followed by BatchNorm2d (no activation). fuse() folds the BatchNorm into the
// convolution for inference. With `sync_stats` set, training-mode statistics are those of every
// rank's images (SyncBatchNorm).
class ConvBnImpl : public torch::nn::Module {
 public:
  explicit ConvBnImpl(const ConvBnOptions& o);
  at::Tensor forward(const at::Tensor& x);
  void fuse();
  bool fused() const { return !bn; }

  ConvBnOptions options;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  StatsSum sync_stats;
};
TORCH_MODULE(ConvBn);

// Training-mode BatchNorm whose batch statistics are summed by `sum` over processes, computed
// in fp32 whatever x's dtype; updates bn's running statistics as BatchNorm2d does (unbiased
// variance over every rank's count).
at::Tensor sync_batch_norm(const at::Tensor& x, torch::nn::BatchNorm2dImpl& bn, const StatsSum& sum);

// Ultralytics Conv: conv (no bias) + BN (eps 1e-3, momentum 0.03) + SiLU.
struct ConvOptions {
  ConvOptions(int64_t in, int64_t out, int64_t kernel = 1, int64_t stride = 1) : in_(in), out_(out), kernel_(kernel), stride_(stride) {}
  TORCH_ARG(int64_t, in);
  TORCH_ARG(int64_t, out);
  TORCH_ARG(int64_t, kernel);
  TORCH_ARG(int64_t, stride);
  TORCH_ARG(int64_t, padding) = -1;
  TORCH_ARG(int64_t, groups) = 1;
  TORCH_ARG(int64_t, dilation) = 1;
  TORCH_ARG(bool, act) = true;
};

class ConvImpl : public torch::nn::Module {
 public:
  explicit ConvImpl(const ConvOptions& o);
  at::Tensor forward(const at::Tensor& x);
  ConvBn cb{nullptr};
  bool act;
};
TORCH_MODULE(Conv);

// Ultralytics Bottleneck(c1, c2, shortcut, g, k=(k1, k2), e).
class BottleneckImpl : public torch::nn::Module {
 public:
  BottleneckImpl(int64_t c1, int64_t c2, bool shortcut, int64_t g, int64_t k1, int64_t k2, double e);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  bool add;
};
TORCH_MODULE(Bottleneck);

// C3: CSP bottleneck with three convolutions (YOLOv5). Its bottlenecks are 1x1 then k x k
// (k1 = 1); YOLO11's C3k uses k x k twice (k1 = 3).
class C3Impl : public torch::nn::Module {
 public:
  C3Impl(int64_t c1, int64_t c2, int64_t n, bool shortcut, int64_t g, double e, int64_t k1 = 1);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr}, cv3{nullptr};
  torch::nn::Sequential m;
};
TORCH_MODULE(C3);

// What a C2f-style block chains: YOLOv8's C2f uses full-width 3x3 bottlenecks; YOLO11's C3k2
// uses half-width bottlenecks (Ultralytics' defaults, e = 0.5) or, in scales m/l/x and where
// the file asks, C3k blocks of two bottlenecks; YOLO26's C3k2 with its attention flag a
// half-width bottleneck followed by a PSABlock (heads: a 64th of the channels, at least one).
enum class C2fInner { bottleneck, half_bottleneck, c3k, attention };

// C2f: CSP bottleneck with two convolutions, every inner block's output concatenated (YOLOv8;
// C3k2 of YOLO11 with another inner block).
class C2fImpl : public torch::nn::Module {
 public:
  C2fImpl(int64_t c1, int64_t c2, int64_t n, bool shortcut, int64_t g, double e, C2fInner inner = C2fInner::bottleneck);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  torch::nn::ModuleList m;
  int64_t c;
};
TORCH_MODULE(C2f);

// Ultralytics Attention (YOLO11's position-sensitive attention): one 1x1 conv makes queries and
// keys (key_dim = head_dim / 2 each) and values per head; attention over all H x W positions,
// plus a depthwise 3x3 positional encoding of the values, then a 1x1 projection.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads, double attn_ratio = 0.5);
  at::Tensor forward(const at::Tensor& x);  // [B, dim, H, W] -> same
  Conv qkv{nullptr}, proj{nullptr}, pe{nullptr};
  int64_t heads, head_dim, key_dim;
  double scale;
};
TORCH_MODULE(Attention);

// PSABlock: x + attention(x), then x + ffn(x) (two 1x1 convs, 2x wide).
class PSABlockImpl : public torch::nn::Module {
 public:
  PSABlockImpl(int64_t c, int64_t heads);
  at::Tensor forward(const at::Tensor& x);
  Attention attn{nullptr};
  torch::nn::Sequential ffn;
};
TORCH_MODULE(PSABlock);

// C2PSA: a CSP split whose second half runs n PSABlocks (heads = half the channels / 64).
class C2PSAImpl : public torch::nn::Module {
 public:
  C2PSAImpl(int64_t c1, int64_t n, double e = 0.5);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  torch::nn::Sequential m;
  int64_t c;
};
TORCH_MODULE(C2PSA);

// YOLO12's area attention (Ultralytics AAttn): the H x W positions, in row-major order, are cut
// into `area` equal runs and each attends only within its own; heads of 32 channels with
// queries, keys and values interleaved per head in one 1x1 conv; a depthwise 7x7 positional
// encoding of the values; a 1x1 projection. H x W must be a multiple of `area`.
class AreaAttentionImpl : public torch::nn::Module {
 public:
  AreaAttentionImpl(int64_t dim, int64_t heads, int64_t area);
  at::Tensor forward(const at::Tensor& x);  // [B, dim, H, W] -> same
  Conv qkv{nullptr}, proj{nullptr}, pe{nullptr};
  int64_t heads, head_dim, area;
};
TORCH_MODULE(AreaAttention);

// ABlock: x + attn(x), then x + mlp(x) (1x1 convs, mlp_ratio wide). Its convolutions start
// from N(0, 0.02), as Ultralytics initialises them.
class ABlockImpl : public torch::nn::Module {
 public:
  ABlockImpl(int64_t dim, int64_t heads, double mlp_ratio, int64_t area);
  at::Tensor forward(const at::Tensor& x);
  AreaAttention attn{nullptr};
  torch::nn::Sequential mlp;
};
TORCH_MODULE(ABlock);

// A2C2f (YOLO12): cv1, then n blocks chained, every output concatenated, cv2. A block is two
// ABlocks (a2) or a C3k; with `residual` the output is x + gamma * y, gamma per channel from 0.01.
struct A2C2fOptions {
  A2C2fOptions(int64_t c1, int64_t c2, int64_t n) : c1_(c1), c2_(c2), n_(n) {}
  TORCH_ARG(int64_t, c1);
  TORCH_ARG(int64_t, c2);
  TORCH_ARG(int64_t, n);
  TORCH_ARG(bool, a2) = true;
  TORCH_ARG(int64_t, area) = 1;
  TORCH_ARG(bool, residual) = false;
  TORCH_ARG(double, mlp_ratio) = 2.0;
  TORCH_ARG(double, e) = 0.5;
  TORCH_ARG(int64_t, groups) = 1;
  TORCH_ARG(bool, shortcut) = true;
};
class A2C2fImpl : public torch::nn::Module {
 public:
  explicit A2C2fImpl(const A2C2fOptions& o);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  torch::nn::ModuleList m;
  at::Tensor gamma;  // [c2], or undefined without the residual
};
TORCH_MODULE(A2C2f);

// SPPF: n chained k x k max-pools, concatenated. YOLO26's rows (which give n or the shortcut)
// leave cv1 unactivated and may add the input back (shortcut, when the channels match); older
// rows keep cv1's SiLU, as Ultralytics builds them.
struct SPPFOptions {
  SPPFOptions(int64_t c1, int64_t c2) : c1_(c1), c2_(c2) {}
  TORCH_ARG(int64_t, c1);
  TORCH_ARG(int64_t, c2);
  TORCH_ARG(int64_t, k) = 5;
  TORCH_ARG(int64_t, n) = 3;
  TORCH_ARG(bool, shortcut) = false;
  TORCH_ARG(bool, cv1_act) = true;
};
class SPPFImpl : public torch::nn::Module {
 public:
  explicit SPPFImpl(const SPPFOptions& o);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  SPPFOptions options;
  bool add;
};
TORCH_MODULE(SPPF);

// SPP: parallel max-pools of several sizes, concatenated.
class SPPImpl : public torch::nn::Module {
 public:
  SPPImpl(int64_t c1, int64_t c2, std::vector<int64_t> ks);
  at::Tensor forward(const at::Tensor& x);
  Conv cv1{nullptr}, cv2{nullptr};
  std::vector<int64_t> ks;
};
TORCH_MODULE(SPP);

// --- Hourglass (xingyizhou/CenterNet large_hourglass.py) ---------------------------------

// "convolution": k x k conv (+ BN, or a bias without it) + ReLU.
class HgConvImpl : public torch::nn::Module {
 public:
  HgConvImpl(int64_t k, int64_t c1, int64_t c2, int64_t stride = 1, bool with_bn = true);
  at::Tensor forward(const at::Tensor& x);
  ConvBn cb{nullptr};
};
TORCH_MODULE(HgConv);

// "residual": two 3x3 ConvBn with ReLU between, plus a 1x1 ConvBn skip when the shape changes.
class ResidualImpl : public torch::nn::Module {
 public:
  ResidualImpl(int64_t c1, int64_t c2, int64_t stride = 1);
  at::Tensor forward(const at::Tensor& x);
  ConvBn conv1{nullptr}, conv2{nullptr}, skip{nullptr};
};
TORCH_MODULE(Residual);

// The Hourglass stem: 7x7/2 conv + residual/2, output stride 4.
class HourglassStemImpl : public torch::nn::Module {
 public:
  HourglassStemImpl(int64_t c1, int64_t mid, int64_t out);
  at::Tensor forward(const at::Tensor& x);
  HgConv conv{nullptr};
  Residual res{nullptr};
};
TORCH_MODULE(HourglassStem);

// Sums the FLOPs of every ConvBn forward on this thread while alive (Ultralytics/thop rules:
// a conv counts its multiply-adds, a BatchNorm 4 per element; FLOPs = 2 x MACs).
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  double flops() const { return 2 * macs_; }
  void add(double macs) { macs_ += macs; }

 private:
  double macs_ = 0;
  FlopCounter* previous_;
};

}  // namespace headroom::models
