#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <string>

#include "headroom/core/torch_compat.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "test_util.h"

using namespace headroom;

TEST(CpuAllocator, CountsCurrentAndPeakBytes) {
  auto& a = memory::CountingCpuAllocator::install();
  EXPECT_EQ(&a, &memory::CountingCpuAllocator::install());
  const int64_t base = a.current();
  a.reset_peak();
  {
    const at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(a.current(), base + 4000);
    const at::Tensor u = at::empty({250}, at::kDouble);
    EXPECT_EQ(a.current(), base + 6000);
  }
  EXPECT_EQ(a.current(), base);
  EXPECT_EQ(a.peak(), base + 6000);
  a.reset_peak();
  EXPECT_EQ(a.peak(), base);
}

TEST(CpuAllocator, ABudgetThrowsTheOutOfMemoryErrorCudaThrows) {
  auto& a = memory::CountingCpuAllocator::install();
  const int64_t base = a.current(), ooms = a.ooms();
  a.set_limit(base + (1 << 20));
  EXPECT_THROW(at::empty({1 << 20}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(a.current(), base);
  EXPECT_EQ(a.ooms(), ooms + 1);
  EXPECT_NO_THROW(at::empty({1 << 10}, at::kFloat));
  a.set_limit(0);
  EXPECT_NO_THROW(at::empty({1 << 20}, at::kFloat));
}

TEST(CpuAllocator, AnOutOfMemoryInsideBackwardUnwindsToTheBaseline) {
  auto& a = memory::CountingCpuAllocator::install();
  models::ModelSpec s;
  s.file = std::string(HEADROOM_SOURCE_DIR) + "/models/yolov8n.yaml";
  s.nc = 3;
  models::Detector d(s);
  const at::Tensor x = at::rand({2, 3, 64, 64});
  const int64_t base = a.current();
  a.reset_peak();
  {
    at::Tensor loss = d->forward(x).at("pred")[0].sum();
    a.set_limit(a.current() + (1 << 16));  // room for almost nothing more
    EXPECT_THROW(loss.backward(), c10::OutOfMemoryError);
    a.set_limit(0);
  }
  // The next step trains normally, and afterwards nothing of the failed one is left (the
  // autograd engine frees the failed step's pending gradients when it next runs).
  d->forward(x).at("pred")[0].sum().backward();
  EXPECT_TRUE(d->parameters()[0].grad().defined());
  for (auto& p : d->parameters()) p.mutable_grad() = at::Tensor();
  EXPECT_EQ(a.current(), base);
}

TEST(TorchCompat, AutocastWrappersSwitchCpuBf16) {
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
  const at::ScalarType before = compat::autocast_dtype(c10::kCPU);
  compat::set_autocast_dtype(c10::kCPU, at::kBFloat16);
  compat::set_autocast_enabled(c10::kCPU, true);
  EXPECT_TRUE(compat::autocast_enabled(c10::kCPU));
  EXPECT_EQ(compat::autocast_dtype(c10::kCPU), at::kBFloat16);
  const at::Tensor y = at::mm(at::rand({4, 4}), at::rand({4, 4}));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  compat::set_autocast_enabled(c10::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(at::mm(at::rand({4, 4}), at::rand({4, 4})).scalar_type(), at::kFloat);
  compat::set_autocast_dtype(c10::kCPU, before);
  EXPECT_FALSE(compat::autocast_enabled(c10::kCUDA));
  EXPECT_EQ(compat::autocast_dtype(c10::kCUDA), at::kHalf);
}

TEST(TorchCompat, VersionGate) {
  EXPECT_TRUE(HEADROOM_TORCH_AT_LEAST(1, 13));
  EXPECT_FALSE(HEADROOM_TORCH_AT_LEAST(99, 0));
  EXPECT_EQ(HEADROOM_TORCH_AT_LEAST(2, 4), TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4));
}

// bf16 on a CPU without native support is emulated and many times slower than fp32: the run and
// the governor's AMP rung say so. The kernel's own flags are the reference for the CPU check.
TEST(Amp, Bf16OnACpuWithoutNativeSupportIsNamedAsSlow) {
#if defined(__x86_64__)
  std::ifstream info("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(info, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  ASSERT_FALSE(flags.empty());
  const bool native = flags.find(" avx512_bf16 ") != std::string::npos || flags.find(" amx_bf16 ") != std::string::npos;
  EXPECT_EQ(train::cpu_has_native_bf16(), native) << flags;
#endif
  const std::string note = train::bf16_cost_note(train::AmpMode::bf16, c10::Device(c10::kCPU));
  EXPECT_EQ(note.empty(), train::cpu_has_native_bf16()) << note;
  EXPECT_EQ(train::bf16_cost_note(train::AmpMode::off, c10::Device(c10::kCPU)), "");
  EXPECT_EQ(train::bf16_cost_note(train::AmpMode::bf16, c10::Device(c10::kCUDA, 0)), "");
}
