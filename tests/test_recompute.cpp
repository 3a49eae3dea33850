#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "headroom/core/torch_compat.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/measure.h"
#include "headroom/models/recompute.h"
#include "headroom/models/detector.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::models;

namespace {

// Two hourglass stacks with three levels: every checkpointing path of the Hourglass in miniature.
const char* kTwoStackHourglass = R"(nc: 3
backbone:
  - [-1, 1, HourglassStem, [8, 16]]
  - [-1, 1, Hourglass, [2, [16, 16, 24, 32], [1, 1, 1, 2], 16]]
head:
  - [-1, 1, CenterNetHead, [nc, 16]]
)";

Detector build_file(const std::string& path, int64_t nc = -1) {
  ModelSpec s;
  s.file = path;
  s.nc = nc;
  return Detector(s);
}

Detector two_stack_hourglass() {
  static const std::string path = [] {
    const std::string p = test::temp_dir("hg") + "/hg2.yaml";
    test::write_bytes(p, kTwoStackHourglass);
    return p;
  }();
  return build_file(path);
}

Detector small_yolov8() { return build_file(std::string(HEADROOM_SOURCE_DIR) + "/models/yolov8n.yaml", 3); }

// Sum of every head output: a loss that reaches every parameter.
at::Tensor loss_of(const HeadOutputs& o) {
  at::Tensor l = at::zeros({}, at::kFloat);
  for (const auto& [name, list] : o)
    for (const auto& t : list) l = l + t.to(at::kFloat).pow(2).mean();
  return l;
}

std::vector<at::Tensor> gradients(Detector& d, const at::Tensor& x, RecomputeMode mode, bool bf16) {
  d->set_recompute(mode);
  d->zero_grad();
  compat::set_autocast_enabled(c10::kCPU, bf16);
  if (bf16) compat::set_autocast_dtype(c10::kCPU, at::kBFloat16);
  const at::Tensor loss = loss_of(d->forward(x));
  compat::set_autocast_enabled(c10::kCPU, false);
  at::autocast::clear_cache();
  loss.backward();
  std::vector<at::Tensor> g;
  for (const auto& p : d->parameters())
    if (p.requires_grad()) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return g;
}

// max |a - b| / max |a| over all parameters.
double max_relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(b[i].defined()) << "parameter " << i << " got no gradient with checkpointing";
    if (!a[i].defined() || !b[i].defined()) continue;
    const double scale = std::max(a[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

void expect_same_gradients(Detector (*make)(), int64_t size, bool bf16) {
  at::manual_seed(0);
  Detector d = make();
  const at::Tensor x = at::rand({2, 3, size, size});
  const auto reference = gradients(d, x, RecomputeMode::off, bf16);
  for (RecomputeMode mode : {RecomputeMode::stages, RecomputeMode::all}) {
    const auto checkpointed = gradients(d, x, mode, bf16);
    ASSERT_EQ(reference.size(), checkpointed.size());
    // Bit-identical (the Hourglass aliases its block inputs for exactly that).
    EXPECT_EQ(max_relative_difference(reference, checkpointed), 0.0) << to_string(mode) << (bf16 ? " bf16" : " fp32");
  }
}

}  // namespace

TEST(Checkpointing, YoloGradientsEqualWithoutIt) { expect_same_gradients(small_yolov8, 64, false); }
TEST(Checkpointing, YoloGradientsEqualUnderBf16Autocast) { expect_same_gradients(small_yolov8, 64, true); }
TEST(Checkpointing, HourglassGradientsEqualWithoutIt) { expect_same_gradients(two_stack_hourglass, 64, false); }
TEST(Checkpointing, HourglassGradientsEqualUnderBf16Autocast) { expect_same_gradients(two_stack_hourglass, 64, true); }

TEST(Checkpointing, BatchNormStatisticsAreUpdatedOnce) {
  at::manual_seed(1);
  const at::Tensor x = at::rand({2, 3, 64, 64});
  Detector a = two_stack_hourglass(), b = two_stack_hourglass();
  {
    at::NoGradGuard no_grad;
    auto from = a->named_parameters();
    for (auto& p : b->named_parameters()) p.value().copy_(from[p.key()]);
  }
  b->set_recompute(RecomputeMode::all);
  loss_of(a->forward(x)).backward();
  loss_of(b->forward(x)).backward();
  const auto ba = a->buffers(), bb = b->buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) EXPECT_TRUE(at::equal(ba[i], bb[i])) << "buffer " << i;
}

TEST(Checkpointing, RecomputationReplaysTheRandomNumbersAndAutocast) {
  at::manual_seed(3);
  struct Net : torch::nn::Module {
    at::Tensor w = register_parameter("w", at::randn({8, 8}));
  } net;
  at::ScalarType seen_in_backward = at::kFloat;
  int calls = 0;
  const SegmentFn fn = [&](const std::vector<at::Tensor>& in) {
    ++calls;
    const at::Tensor y = at::mm(in[0], net.w);  // bf16 under CPU autocast
    if (calls == 2) seen_in_backward = y.scalar_type();
    return std::vector<at::Tensor>{at::dropout(y.to(at::kFloat), 0.5, /*train=*/true)};
  };
  const at::Tensor x = at::randn({4, 8});
  compat::set_autocast_dtype(c10::kCPU, at::kBFloat16);
  compat::set_autocast_enabled(c10::kCPU, true);
  at::manual_seed(7);
  const at::Tensor plain = fn({x})[0];
  at::manual_seed(7);
  calls = 0;
  const at::Tensor y = recompute(fn, {x}, {&net})[0];
  compat::set_autocast_enabled(c10::kCPU, false);
  EXPECT_TRUE(at::equal(plain, y));
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen_in_backward, at::kBFloat16);
  // The forward's mask, drawn again from the same seed (mm draws nothing), not read off y:
  // a kept element whose product rounds to 0 would look dropped.
  at::manual_seed(7);
  const at::Tensor mask = at::dropout(at::ones({4, 8}), 0.5, /*train=*/true);  // 0 or 2
  // d(sum(dropout(x w)))/dw = x^T mask: the same mask as the forward's. The product is
  // rounded to bf16 (8 significant bits); one differing mask element moves it by 2|x| >> that.
  const at::Tensor expected = at::mm(x.t().to(at::kBFloat16).to(at::kFloat), mask);
  const double bf16_rounding = expected.abs().max().item<double>() / 256;
  EXPECT_LE((net.w.grad() - expected).abs().max().item<double>(), bf16_rounding);
}

TEST(Checkpointing, ParametersGetGradientsWhenNoInputRequiresThem) {
  struct Net : torch::nn::Module {
    at::Tensor w = register_parameter("w", at::ones({3}));
  } net;
  const at::Tensor x = at::full({3}, 2.0);  // no requires_grad
  const SegmentFn fn = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] * net.w}; };
  recompute(fn, {x}, {&net})[0].sum().backward();
  ASSERT_TRUE(net.w.grad().defined());
  EXPECT_TRUE(at::equal(net.w.grad(), x));
}

TEST(Checkpointing, NothingLeaksWhenBackwardNeverRuns) {
  auto& alloc = memory::CachingCpuAllocator::install();
  Detector d = two_stack_hourglass();
  d->set_recompute(RecomputeMode::all);
  const at::Tensor x = at::rand({2, 3, 64, 64});
  const int64_t baseline = alloc.current();
  {
    const HeadOutputs o = d->forward(x);  // a step that dies before backward (an OOM, say)
    EXPECT_GT(alloc.current(), baseline);
  }
  EXPECT_EQ(alloc.current(), baseline);
}


namespace {

// The activation part of a forward + backward: its peak above parameters and gradients.
int64_t activation_peak(Detector& d, const at::Tensor& x, RecomputeMode mode) {
  d->set_recompute(mode);
  loss_of(d->forward(x)).backward();  // gradients exist from here on: they are in the baseline
  d->zero_grad(/*set_to_none=*/false);
  return memory::measure_cpu_step([&] { loss_of(d->forward(x)).backward(); }).above_baseline();
}

}  // namespace

void expect_activation_drop(Detector d, const at::Tensor& x, double stages_at_least, double all_at_least) {
  memory::CachingCpuAllocator::install();
  const int64_t off = activation_peak(d, x, RecomputeMode::off);
  const int64_t stages = activation_peak(d, x, RecomputeMode::stages);
  const int64_t all = activation_peak(d, x, RecomputeMode::all);
  std::printf("activation peak: off %lld, stages %lld (-%.1f%%), all %lld (-%.1f%%)\n", (long long)off, (long long)stages,
              100.0 * (1 - double(stages) / double(off)), (long long)all, 100.0 * (1 - double(all) / double(off)));
  EXPECT_LE(double(stages), (1 - stages_at_least) * double(off));
  EXPECT_LE(double(all), (1 - all_at_least) * double(off));
}

TEST(Checkpointing, ActivationMemoryDropsForSmallModels) {
  expect_activation_drop(two_stack_hourglass(), at::rand({2, 3, 128, 128}), 0.40, 0.55);
  expect_activation_drop(small_yolov8(), at::rand({2, 3, 128, 128}), 0.50, 0.50);
}

// The issue's figure: Hourglass-104 at 256 px, batch 2 (about a minute on two cores).
TEST(Checkpointing, ActivationMemoryDropsForHourglass104) {
  ModelSpec s;
  s.file = std::string(HEADROOM_SOURCE_DIR) + "/models/centernet_hg104.yaml";
  s.nc = 80;
  memory::CachingCpuAllocator::install();  // before the model: its parameters are counted
  expect_activation_drop(Detector(s), at::rand({2, 3, 256, 256}), 0.40, 0.60);
}
