// Optimizers against the per-parameter formulas, schedules, the loss scaler, the autocast guard
// and the EMA.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <cmath>

#include "headroom/core/json.h"
#include "headroom/core/torch_compat.h"
#include "headroom/interop/weights_import.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/models/blocks.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "headroom/train/ema.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/parts.h"
#include "headroom/train/schedule.h"
#include "interop_util.h"

using namespace headroom;
using namespace headroom::train;

namespace {

// PyTorch's documented algorithms (RMSprop: TensorFlow's ApplyRMSProp, rho 0.9, decoupled decay),
// one parameter at a time with plain tensor ops.
void reference_step(OptimizerKind kind, at::Tensor& p, at::Tensor g, at::Tensor& buf1, at::Tensor& buf2, int64_t t,
                    double lr, double m, double beta2, double eps, double wd, bool nesterov) {
  if (kind == OptimizerKind::rmsprop) {
    p = p * (1 - lr * wd);
    buf2 = 0.9 * buf2 + 0.1 * g * g;
    if (m == 0) {  // TF's plain RMSProp: eps outside the root
      p = p - lr * g / (buf2.sqrt() + eps);
      return;
    }
    buf1 = m * buf1 + lr * g / (buf2 + eps).sqrt();
    p = p - buf1;
    return;
  }
  if (kind == OptimizerKind::sgd) {
    if (wd != 0) g = g + wd * p;
    buf1 = m * buf1 + g;  // zero-initialised buffer: the first step gives buf = g, as torch.optim
    p = p - lr * (nesterov ? g + m * buf1 : buf1);
    return;
  }
  if (kind == OptimizerKind::adamw)
    p = p * (1 - lr * wd);
  else if (wd != 0)
    g = g + wd * p;
  buf1 = m * buf1 + (1 - m) * g;
  buf2 = beta2 * buf2 + (1 - beta2) * g * g;
  const double bc1 = 1 - std::pow(m, double(t)), bc2 = 1 - std::pow(beta2, double(t));
  p = p - (lr / bc1) * buf1 / (buf2.sqrt() / std::sqrt(bc2) + eps);
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs() / (b.abs() + 1e-12)).max().item<double>();
}

void check_against_reference(OptimizerKind kind, bool fused, bool nesterov = true, double momentum = 0.9) {
  at::manual_seed(3);
  std::vector<at::Tensor> params = {at::randn({4, 3}), at::randn({5}), at::randn({2, 2, 3, 3})};
  for (auto& p : params) p.set_requires_grad(true);
  std::vector<ParamGroup> groups = {{"weights", {params[0], params[2]}, 0.01, momentum, 0.05, false},
                                    {"bias", {params[1]}, 0.02, momentum, 0.0, true}};
  Optimizer opt(groups, OptimizerOptions().kind(kind).fused(fused).nesterov(nesterov));
  std::vector<at::Tensor> ref_p, ref_b1, ref_b2;
  for (const auto& p : params) {
    ref_p.push_back(p.detach().clone());
    ref_b1.push_back(at::zeros_like(p));
    ref_b2.push_back(at::zeros_like(p));
  }
  const int owner[] = {0, 1, 0};
  for (int64_t step = 1; step <= 6; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor g = at::randn(params[i].sizes());
      params[i].mutable_grad() = g.clone();
      const ParamGroup& grp = opt.groups()[size_t(owner[i])];
      reference_step(kind, ref_p[i], g, ref_b1[i], ref_b2[i], step, grp.lr, grp.momentum, 0.999, 1e-8, grp.weight_decay, nesterov);
    }
    opt.step();
    opt.zero_grad();
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(max_rel_diff(params[i].detach(), ref_p[i]), 1e-5)
        << "parameter " << i << (fused ? " (fused)" : " (in place)") << (nesterov ? "" : ", no Nesterov") << ", momentum " << momentum;
}

// The model the EMA tests average: YOLOv8n with two classes.
models::ModelSpec yolov8n_two_classes() {
  models::ModelSpec spec;
  spec.file = std::string(HEADROOM_SOURCE_DIR) + "/models/yolov8.yaml";
  spec.scale = "n";
  spec.nc = 2;
  return spec;
}

}  // namespace

TEST(Optimizer, SgdNesterovMatchesTheReference) { check_against_reference(OptimizerKind::sgd, false); }
TEST(Optimizer, SgdWithoutNesterovOrMomentumMatchesTheReference) {
  for (bool fused : {false, bool(HEADROOM_HAS_FUSED_OPTIMIZERS)}) {
    check_against_reference(OptimizerKind::sgd, fused, /*nesterov=*/false);
    check_against_reference(OptimizerKind::sgd, fused, /*nesterov=*/false, /*momentum=*/0);
  }
}
TEST(Optimizer, AdamMatchesTheReference) { check_against_reference(OptimizerKind::adam, false); }
TEST(Optimizer, AdamWMatchesTheReference) { check_against_reference(OptimizerKind::adamw, false); }
TEST(Optimizer, RmspropMatchesTheReference) {
  check_against_reference(OptimizerKind::rmsprop, false);
  check_against_reference(OptimizerKind::rmsprop, true);  // no fused kernel: the in-place path either way
  check_against_reference(OptimizerKind::rmsprop, false, true, /*momentum=*/0);
}

TEST(Optimizer, FusedKernelsMatchTheReference) {
#if HEADROOM_HAS_FUSED_OPTIMIZERS
  for (auto kind : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw}) check_against_reference(kind, true);
#else
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused optimizer kernels (2.4+)";
#endif
}

TEST(Optimizer, AnUpdateNeedsAtMostTheLargestParameterBeyondItsState) {
  // The optimizer phase is parameters + gradients + state + this bound (Hourglass-104: 3.06 GB +
  // 9 MB, not a second copy of everything): the in-place path allocates one workspace the size
  // of the largest parameter, the fused kernels (LibTorch 2.4+) nothing of tensor size.
  auto& alloc = memory::CachingCpuAllocator::install();
  at::manual_seed(3);
  std::vector<at::Tensor> params = {at::randn({64, 32, 3, 3}), at::randn({1000}), at::randn({16, 16})};
  const int64_t largest = params[0].numel() * int64_t(sizeof(float));
  for (auto& p : params) p.set_requires_grad(true);
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw, OptimizerKind::rmsprop})
    for (bool fused : {false, bool(HEADROOM_HAS_FUSED_OPTIMIZERS)}) {
      Optimizer opt({{"weights", {params[0], params[2]}, 0.01, 0.9, 0.05, false}, {"bias", {params[1]}, 0.02, 0.9, 0.0, true}},
                    OptimizerOptions().kind(kind).fused(fused));
      for (int step = 0; step < 2; ++step) {
        for (auto& p : params) p.mutable_grad() = at::randn(p.sizes());
        alloc.reset_peak();
        const int64_t before = alloc.current();
        opt.step();
        const int64_t extra = alloc.peak() - before;
        // 0-dim factors and wrapped numbers: a few hundred bytes
        EXPECT_LE(extra, (opt.fused() ? 0 : largest) + 1024) << to_string(kind) << (opt.fused() ? " fused" : " in place") << ", step " << step;
        if (!opt.fused() && kind != OptimizerKind::sgd) {
          EXPECT_GE(extra, largest) << "the workspace is the largest parameter";
        }
      }
    }
}

// The loss scaler's and the non-finite guard's flag skips a step on the device, never read on the
// host (on CUDA a read waits for the whole step): every optimizer, fused or in place, with and
// without momentum, Nesterov and decay, leaves its parameters and state exactly as they were when
// the flag is set, whatever the gradients hold, and then steps as if the skipped step never came.
TEST(Optimizer, AFoundInfFlagSkipsTheStepAndItsCount) {
  const auto snapshot = [](const std::vector<at::Tensor>& params, const Optimizer& opt) {
    std::vector<at::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().clone());
    for (const auto& t : opt.state_tensors()) out.push_back(t.clone());
    return out;
  };
  const auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!at::equal(a[i], b[i])) return false;
    return true;
  };
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw, OptimizerKind::rmsprop, OptimizerKind::musgd})
    for (bool fused : {false, true})
      for (double momentum : {0.0, 0.9})
        for (bool nesterov : {false, true}) {
          const std::string what = std::string(to_string(kind)) + (fused ? " fused" : " in place") + ", momentum " +
                                   std::to_string(momentum) + (nesterov ? ", nesterov" : "");
          at::manual_seed(1);
          std::vector<at::Tensor> p = {at::randn({4, 3}), at::randn({5})}, q;
          for (auto& t : p) {
            t.set_requires_grad(true);
            q.push_back(t.detach().clone().set_requires_grad(true));
          }
          const bool muon = kind == OptimizerKind::musgd;
          const auto groups = [&](const std::vector<at::Tensor>& ps) {
            return std::vector<ParamGroup>{{"weights", {ps[0]}, 0.1, momentum, 0.05, false, muon}, {"bias", {ps[1]}, 0.2, momentum, 0.0, true}};
          };
          const auto o = OptimizerOptions().kind(kind).fused(fused).nesterov(nesterov).momentum(momentum);
          Optimizer skipping(groups(p), o), clean(groups(q), o);
          const auto grads = [](std::vector<at::Tensor>& ps, double v) {
            for (auto& t : ps) t.mutable_grad() = at::full(t.sizes(), v) + 0.1 * at::arange(t.numel()).view(t.sizes());
          };
          grads(p, 1), skipping.step(at::zeros({}));
          grads(p, 2), skipping.step(at::zeros({}));  // state that a skipped step could move
          const std::vector<at::Tensor> before = snapshot(p, skipping);
          for (double bad : {double(NAN), double(INFINITY), 3.0}) {  // 3: finite gradients, the flag set by the guard
            grads(p, bad), skipping.step(at::ones({}));
            EXPECT_TRUE(same(snapshot(p, skipping), before)) << what << ": a skipped step with gradients " << bad << " changed it";
          }
          grads(p, 3), skipping.step(at::zeros({}));
          for (double v : {1.0, 2.0, 3.0}) grads(q, v), clean.step(at::zeros({}));
          EXPECT_TRUE(same(snapshot(p, skipping), snapshot(q, clean))) << what << ": the skipped steps left a trace";
        }
}

TEST(Optimizer, GroupsKeepDecayOffNormWeightsAndBiases) {
  torch::nn::Sequential m(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).bias(false)), torch::nn::BatchNorm2d(4),
                          torch::nn::Conv2d(4, 2, 1));
  const std::vector<ParamGroup> g = parameter_groups(*m, 5e-4);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].name, "weights");
  EXPECT_EQ(g[0].params.size(), 2u);  // two conv weights
  EXPECT_DOUBLE_EQ(g[0].weight_decay, 5e-4);
  EXPECT_EQ(g[1].name, "norm");       // BatchNorm weight
  EXPECT_EQ(g[1].params.size(), 1u);
  EXPECT_EQ(g[2].name, "bias");       // BatchNorm bias, conv bias
  EXPECT_EQ(g[2].params.size(), 2u);
  EXPECT_DOUBLE_EQ(g[1].weight_decay + g[2].weight_decay, 0.0);
  // As Ultralytics decides by the owning module, not the rank: YOLO12's 1-D gamma decays with the
  // weights (MuSGD leaves it to SGD: Muon takes matrices and filters only).
  models::A2C2f a2(models::A2C2fOptions(64, 64, 1).residual(true));
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::musgd}) {
    int found = 0;
    for (const ParamGroup& group : parameter_groups(*a2, 5e-4, kind))
      for (const at::Tensor& p : group.params)
        if (p.is_same(a2->gamma)) {
          ++found;
          EXPECT_EQ(group.name, "weights") << to_string(kind);
          EXPECT_DOUBLE_EQ(group.weight_decay, 5e-4);
        }
    EXPECT_EQ(found, 1) << to_string(kind);
  }
}

TEST(Schedule, LinearCosineAndManualSteps) {
  const Schedule lin(ScheduleOptions().kind(LrSchedule::linear).lr0(0.01).lrf(0.01).total_steps(100));
  EXPECT_DOUBLE_EQ(lin.base_lr(0), 0.01);
  EXPECT_NEAR(lin.base_lr(50), 0.01 * (0.5 * 0.99 + 0.01), 1e-15);
  EXPECT_NEAR(lin.base_lr(100), 0.0001, 1e-15);
  const Schedule cos(ScheduleOptions().kind(LrSchedule::cosine).lr0(0.01).lrf(0.1).total_steps(100));
  EXPECT_NEAR(cos.base_lr(50), 0.01 * 0.55, 1e-12);
  EXPECT_NEAR(cos.base_lr(100), 0.001, 1e-12);
  // The TF OD API config: 1e-3, 1e-4 from step 1000, 1e-5 from step 5000.
  const Schedule man(ScheduleOptions().kind(LrSchedule::manual).lr0(1e-3).lr_steps({1000, 5000}).lr_values({1e-4, 1e-5}).total_steps(6000));
  EXPECT_DOUBLE_EQ(man.base_lr(999), 1e-3);
  EXPECT_DOUBLE_EQ(man.base_lr(1000), 1e-4);
  EXPECT_DOUBLE_EQ(man.base_lr(4999), 1e-4);
  EXPECT_DOUBLE_EQ(man.base_lr(5000), 1e-5);
}

TEST(Schedule, WarmupAsUltralytics) {
  // 3 epochs of 10 batches = 30 iterations, raised to the minimum of 100; accumulate 4 -> 25 steps.
  EXPECT_EQ(warmup_steps(3.0, 10, 4), 25);
  EXPECT_EQ(warmup_steps(3.0, 1000, 1), 3000);
  EXPECT_EQ(warmup_steps(0.0, 1000, 1), 0);
  const Schedule s(ScheduleOptions().lr0(0.01).lrf(0.01).momentum(0.937).total_steps(1000).warmup_steps(100));
  EXPECT_DOUBLE_EQ(s.rates(0, false).lr, 0.0);
  EXPECT_DOUBLE_EQ(s.rates(0, true).lr, 0.1);  // biases start at warmup_bias_lr
  EXPECT_DOUBLE_EQ(s.rates(0, false).momentum, 0.8);
  EXPECT_NEAR(s.rates(50, false).lr, 0.5 * s.base_lr(50), 1e-15);
  EXPECT_NEAR(s.rates(50, true).lr, 0.1 + 0.5 * (s.base_lr(50) - 0.1), 1e-15);
  EXPECT_NEAR(s.rates(50, false).momentum, 0.8 + 0.5 * 0.137, 1e-12);
  EXPECT_DOUBLE_EQ(s.rates(100, true).lr, s.base_lr(100));
  // A group with a scaled rate (MuSGD's class branch, 3x) warms up towards its own rate.
  EXPECT_NEAR(s.rates(50, true, 3).lr, 0.1 + 0.5 * (3 * s.base_lr(50) - 0.1), 1e-15);
  EXPECT_NEAR(s.rates(50, false, 3).lr, 0.5 * 3 * s.base_lr(50), 1e-15);
  EXPECT_DOUBLE_EQ(s.rates(100, false, 3).lr, 3 * s.base_lr(100));
  EXPECT_DOUBLE_EQ(s.rates(100, false).momentum, 0.937);
}

TEST(LossScaler, BacksOffOnInfAndGrowsAfterTheInterval) {
  LossScaler scaler(c10::Device(c10::kCPU), LossScalerOptions().init_scale(1024).growth_interval(3));
  std::vector<at::Tensor> grads = {at::full({3}, 2048.0f), at::full({2}, 1024.0f)};
  at::Tensor found = scaler.unscale_(grads);
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(at::allclose(grads[0], at::full({3}, 2.0f)));
  EXPECT_TRUE(at::allclose(grads[1], at::ones({2})));
  grads[1][0] = INFINITY;
  found = scaler.unscale_(grads);
  EXPECT_EQ(found.item<float>(), 1.0f);
  scaler.update(found);
  EXPECT_EQ(scaler.scale_tensor().item<float>(), 512.0f);
  for (int i = 0; i < 2; ++i) scaler.update(at::zeros({}));
  EXPECT_EQ(scaler.scale_tensor().item<float>(), 512.0f);
  scaler.update(at::zeros({}));  // the third clean step in a row
  EXPECT_EQ(scaler.scale_tensor().item<float>(), 1024.0f);
  EXPECT_EQ(scaler.growth_tracker().item<int>(), 0);
  EXPECT_EQ(scaler.scale(at::ones({})).item<float>(), 1024.0f);
}

TEST(LossScaler, NanGradientsAreFound) {
  LossScaler scaler(c10::Device(c10::kCPU));
  std::vector<at::Tensor> grads = {at::ones({4}), at::full({1}, NAN)};
  EXPECT_EQ(scaler.unscale_(grads).item<float>(), 1.0f);
}

TEST(Amp, AutocastGuardEnablesBf16AndRestores) {
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
  const at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    AutocastGuard g(c10::kCPU, at::kBFloat16);
    EXPECT_TRUE(compat::autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    AutocastGuard off(c10::kCPU, at::ScalarType::Undefined);
    EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
  }
}

// The guard's end clears autocast's cache of low-precision weight copies: an optimizer step
// changes the weights in place between two forwards, and a stale copy would hide it.
TEST(Amp, AutocastGuardDropsTheCastWeightsWhenItEnds) {
  const at::Tensor x = at::randn({4, 4});
  at::Tensor w = at::randn({4, 4}).set_requires_grad(true);  // a leaf, as a parameter
  {
    AutocastGuard g(c10::kCPU, at::kBFloat16);
    (void)at::mm(x, w);  // caches w's bf16 copy
  }
  {
    at::NoGradGuard no_grad;
    w.add_(1.0);
  }
  at::Tensor y;
  {
    AutocastGuard g(c10::kCPU, at::kBFloat16);
    y = at::mm(x, w);
  }
  const at::Tensor expected = at::mm(x.to(at::kBFloat16), w.detach().to(at::kBFloat16));
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), expected.to(at::kFloat), 1e-2, 1e-2)) << y << expected;
}

TEST(Amp, GradNormAndClipping) {
  std::vector<at::Tensor> grads = {at::full({4}, 3.0f), at::full({9}, 4.0f)};  // norm sqrt(36 + 144)
  const at::Tensor n = grad_norm(grads);
  EXPECT_NEAR(n.item<float>(), std::sqrt(180.0f), 1e-4);
  clip_grads_(grads, n, 1.0);
  EXPECT_NEAR(grad_norm(grads).item<float>(), 1.0f, 1e-4);
  std::vector<at::Tensor> small = {at::full({2}, 0.1f)};
  clip_grads_(small, grad_norm(small), 10.0);
  EXPECT_FLOAT_EQ(small[0][0].item<float>(), 0.1f);
  EXPECT_FALSE(std::isfinite(grad_norm({at::full({2}, INFINITY)}).item<float>()));
  // Finite gradients whose summed squares overflow fp32 are still finite.
  const at::Tensor big = at::full({1}, 1e19f);
  EXPECT_NEAR(grad_norm({big, big, big, big}).item<double>(), 2e19, 1e13);
}

TEST(Ema, FollowsTheDecayRamp) {
  at::manual_seed(0);
  models::Detector model(yolov8n_two_classes()), copy(yolov8n_two_classes());
  ModelEma ema(*model, copy, 0.9999, 2000);
  const at::Tensor w0 = model->parameters()[0].detach().clone();
  EXPECT_TRUE(at::equal(ema.model()->parameters()[0], w0));
  {
    at::NoGradGuard g;
    model->parameters()[0].add_(1.0);
  }
  const double d = ema.decay_now();
  EXPECT_NEAR(d, 0.9999 * (1 - std::exp(-1.0 / 2000)), 1e-15);
  ema.update(*model);
  EXPECT_EQ(ema.updates(), 1);
  EXPECT_TRUE(at::allclose(ema.model()->parameters()[0], w0 * d + (w0 + 1) * (1 - d), 1e-6, 1e-6));
  EXPECT_FALSE(ema.model()->parameters()[0].requires_grad());
  // BatchNorm's running statistics are averaged the same way; its batch count, an integer no
  // average fits, is copied.
  auto buffers = model->named_buffers(), averaged = ema.model()->named_buffers();
  std::string bn;  // the first BatchNorm's name, up to its "running_mean"
  for (const auto& item : buffers)
    if (item.key().size() > 12 && item.key().compare(item.key().size() - 12, 12, "running_mean") == 0) {
      bn = item.key().substr(0, item.key().size() - 12);
      break;
    }
  ASSERT_FALSE(bn.empty()) << "no BatchNorm running mean";
  const at::Tensor mean0 = buffers[bn + "running_mean"].clone(), ema_mean0 = averaged[bn + "running_mean"].clone();
  {
    at::NoGradGuard g;
    buffers[bn + "running_mean"].add_(2.0);
    buffers[bn + "num_batches_tracked"].fill_(7);
  }
  const double d2 = ema.decay_now();
  ema.update(*model);
  EXPECT_TRUE(at::allclose(averaged[bn + "running_mean"], ema_mean0 * d2 + (mean0 + 2) * (1 - d2), 1e-6, 1e-6)) << bn;
  EXPECT_EQ(averaged[bn + "num_batches_tracked"].item<int64_t>(), 7) << bn;
}

// TF's ramp (train.ema_ramp: tf, what a TF OD API pipeline's use_moving_average maps to): the
// decay at update u is min(decay, (1 + u) / (10 + u)), as TF's ExponentialMovingAverage with
// dynamic decay: 2/11 at the first update, the configured decay from about 9 / (1 - decay).
TEST(Ema, TheTfRampIsTfsDynamicDecay) {
  models::Detector model(yolov8n_two_classes()), copy(yolov8n_two_classes());
  ModelEma ema(*model, copy, 0.99, 2000, EmaRamp::tf);
  EXPECT_DOUBLE_EQ(ema.decay_now(), 2.0 / 11.0);
  const at::Tensor w0 = model->parameters()[0].detach().clone();
  {
    at::NoGradGuard g;
    model->parameters()[0].add_(1.0);
  }
  ema.update(*model);
  EXPECT_TRUE(at::allclose(ema.model()->parameters()[0], w0 * (2.0 / 11.0) + (w0 + 1) * (9.0 / 11.0), 1e-6, 1e-6));
  EXPECT_DOUBLE_EQ(ema.decay_now(), 3.0 / 12.0);
  for (int i = 0; i < 1000; ++i) ema.update(*model);
  EXPECT_DOUBLE_EQ(ema.decay_now(), 0.99);  // (1 + 1002) / (10 + 1002) is above it
}

// The EMA update runs after the optimizer's, where the governor cannot re-run the step: on the
// CPU it allocates one 0-dim factor before its first write, and nothing after.
TEST(Ema, AnUpdateAllocatesOnlyItsFactorBeforeItsFirstWrite) {
  auto& alloc = memory::CachingCpuAllocator::install();
  models::Detector model(yolov8n_two_classes()), copy(yolov8n_two_classes());
  ModelEma ema(*model, copy, 0.9999, 2000);
  {
    at::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(1.0);
  }
  const auto state = [&] {
    std::vector<at::Tensor> s;
    for (const auto& t : model_state(*ema.model())) s.push_back(t.clone());
    return s;
  };
  const std::vector<at::Tensor> before = state();
  alloc.inject_oom_after(1);
  EXPECT_THROW(ema.update(*model), c10::OutOfMemoryError);
  EXPECT_EQ(ema.updates(), 0) << "a failed update does not count";
  std::vector<at::Tensor> after = state();
  for (size_t i = 0; i < before.size(); ++i) ASSERT_TRUE(at::equal(before[i], after[i])) << "tensor " << i << " changed by a failed update";
  alloc.inject_oom_after(2);
  EXPECT_NO_THROW(ema.update(*model));
  alloc.inject_oom_after(0);
  EXPECT_EQ(ema.updates(), 1);
  after = state();
  EXPECT_FALSE(at::equal(before[0], after[0]));
}

TEST(Optimizer, AnOutOfMemoryErrorAnywhereInTheStepLeavesEveryGroupUntouched) {
  // The governor re-runs a step after an OOM: a half-applied update would be applied twice. The
  // fused kernels (LibTorch 2.4+) too: two groups, each with its own step count.
  auto& alloc = memory::CachingCpuAllocator::install();
  std::vector<std::pair<OptimizerKind, bool>> cases;
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw, OptimizerKind::rmsprop, OptimizerKind::musgd})
    cases.emplace_back(kind, false);
  if (HEADROOM_HAS_FUSED_OPTIMIZERS)
    for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw}) cases.emplace_back(kind, true);
  for (const auto& [kind, fused] : cases) {
    at::manual_seed(5);
    std::vector<at::Tensor> params = {at::randn({4, 3}), at::randn({5}), at::randn({2, 2, 3, 3})};
    for (auto& p : params) p.set_requires_grad(true);
    const bool muon = kind == OptimizerKind::musgd;  // MuSGD's matrices take Muon's update and SGD's
    Optimizer opt({{"weights", {params[0], params[2]}, 0.01, 0.9, 0.05, false, muon}, {"bias", {params[1]}, 0.02, 0.9, 0.0, true}},
                  OptimizerOptions().kind(kind).fused(fused));
    ASSERT_EQ(opt.fused(), fused);
    for (auto& p : params) p.mutable_grad() = at::randn(p.sizes());
    opt.step();  // non-zero state
    for (auto& p : params) p.mutable_grad() = at::randn(p.sizes());
    int failures = 0;
    for (int64_t n = 1; n < 200; ++n) {
      std::vector<at::Tensor> before;
      for (const auto& p : params) before.push_back(p.detach().clone());
      for (const auto& t : opt.state_tensors()) before.push_back(t.clone());
      alloc.inject_oom_after(n);
      try {
        opt.step();
      } catch (const c10::OutOfMemoryError&) {
        ++failures;
        std::vector<at::Tensor> after;
        for (const auto& p : params) after.push_back(p.detach());
        for (const auto& t : opt.state_tensors()) after.push_back(t);
        for (size_t i = 0; i < before.size(); ++i)
          ASSERT_TRUE(at::equal(before[i], after[i])) << to_string(kind) << (fused ? " fused" : "") << ": tensor " << i
                                                      << " changed by a step that failed at allocation " << n;
        continue;
      }
      alloc.inject_oom_after(0);
      break;  // the step needed fewer than n allocations: every failure point was covered
    }
    // The in-place path allocates its workspace and 0-dim factors, the fused one its increment.
    EXPECT_GE(failures, fused ? 1 : 3) << to_string(kind) << (fused ? " fused" : "");
  }
}

// MuSGD against Ultralytics' own (scripts/make_musgd_reference.py): the parameters of a YOLO26 that
// `yolo train` wrote, grouped as the Trainer groups them, four steps of the same gradients with a
// falling lr; every parameter's change after every step against Ultralytics'. The Muon half runs
// Newton-Schulz in bf16 on both sides, so the two agree to bf16's rounding, not to fp32's.
TEST(Optimizer, MuSgdFollowsUltralyticsStepByStep) {
  models::LoadedWeights w = interop::load_any_weights(test::fixture("ul_yolo26t.pt"), c10::Device(c10::kCPU));
  const Json ref = read_json_file(test::fixture("ul_yolo26t.musgd.json"));
  std::map<std::string, const Json*> ref_param;
  for (const Json& p : ref.find("params")->items()) ref_param[p.find("name")->as_string()] = &p;
  std::map<std::string, std::string> theirs;  // our name -> Ultralytics'
  for (const auto& [mine, their] : interop::file_names(*w.model, interop::Naming::ultralytics)) theirs[mine] = their;
  std::map<const void*, std::string> name_of;
  for (const auto& p : w.model->named_parameters()) name_of[p.value().unsafeGetTensorImpl()] = theirs.at(p.key());

  const double lr0 = ref.find("lr")->as_number(), momentum = ref.find("momentum")->as_number();
  Optimizer opt(parameter_groups(*w.model, ref.find("weight_decay")->as_number(), OptimizerKind::musgd, musgd_boosted(w.model->info())),
                OptimizerOptions().kind(OptimizerKind::musgd).momentum(momentum).nesterov(true).fused(false));
  // The groups: Muon or not, lr and decay, parameter by parameter as Ultralytics' build_optimizer made them.
  std::vector<std::pair<std::string, at::Tensor>> params;  // Ultralytics' name, the tensor
  int boosted = 0;
  for (const ParamGroup& g : opt.groups())
    for (const at::Tensor& p : g.params) {
      const std::string& name = name_of.at(p.unsafeGetTensorImpl());
      const Json& r = *ref_param.at(name);
      EXPECT_EQ(g.muon, r.find("muon")->as_bool()) << name;
      EXPECT_NEAR(lr0 * g.lr_scale, r.find("lr")->as_number(), 1e-12) << name;
      EXPECT_NEAR(g.weight_decay, r.find("weight_decay")->as_number(), 1e-12) << name;
      boosted += g.lr_scale == 3;
      params.emplace_back(name, p);
    }
  EXPECT_EQ(params.size(), ref_param.size());
  EXPECT_EQ(boosted, 84);  // the class branches' convolutions and BatchNorms, both branches

  std::vector<at::Tensor> p0;
  for (const auto& [name, p] : params) p0.push_back(p.detach().clone());
  double worst_norm = 0, worst_projection = 0;
  for (int64_t step = 0; step < 4; ++step) {
    for (ParamGroup& g : opt.groups()) g.lr = lr0 * g.lr_scale * (1 - 0.1 * double(step)), g.momentum = momentum;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = 0.01 * at::cos(37 * p0[i] + 0.5 * double(step)) + 0.001 * double(step);
    opt.step();
    const Json& want = ref.find("steps")->items()[size_t(step)];
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor d = (params[i].second.detach() - p0[i]).to(at::kDouble).flatten();
      const at::Tensor weights = at::cos(0.7 * at::arange(d.numel(), at::kDouble));
      const std::vector<Json>& r = want.find(params[i].first)->items();  // sum, projection, max |d|, norm
      const double norm = r[3].as_number();
      ASSERT_GT(norm, 0) << params[i].first;
      // p - p0 is exact to p's fp32 spacing on each side: a bias of -5.48 moved by 8e-5 is known to 0.6%
      const double floor = 2 * std::sqrt(double(d.numel())) * p0[i].abs().max().item<double>() * 1.2e-7;
      worst_norm = std::max(worst_norm, (std::abs(d.norm().item<double>() - norm) - floor) / norm);
      worst_projection = std::max(worst_projection, (std::abs((d * weights).sum().item<double>() - r[1].as_number()) - floor) / norm);
    }
  }
  printf("MuSGD against Ultralytics: the change's norm within %.2e, its projection within %.2e of its norm\n", worst_norm, worst_projection);
  EXPECT_LT(worst_norm, 2e-3);
  EXPECT_LT(worst_projection, 2e-2);
}
