#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <string>

#include "headroom/core/device.h"
#include "headroom/core/torch_compat.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/models/detector.h"
#include "headroom/train/amp.h"
#include "test_util.h"

using namespace headroom;

TEST(CpuAllocator, CountsCurrentAndPeakBytes) {
  auto& a = memory::CachingCpuAllocator::install();
  EXPECT_EQ(&a, &memory::CachingCpuAllocator::install());
  a.release_cache();
  const int64_t base = a.current();
  a.reset_peak();
  {
    const at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(a.current(), base + 4000);
    const at::Tensor u = at::empty({250}, at::kDouble);
    EXPECT_EQ(a.current(), base + 6000);
    const at::Tensor large = at::empty({1 << 20}, at::kFloat);  // a mapping of its own
    EXPECT_EQ(a.current(), base + 6000 + (4 << 20));
  }
  EXPECT_EQ(a.current(), base);
  EXPECT_EQ(a.peak(), base + 6000 + (4 << 20));
  a.reset_peak();
  EXPECT_EQ(a.peak(), base);
}

TEST(CpuAllocator, ABudgetThrowsTheOutOfMemoryErrorCudaThrows) {
  auto& a = memory::CachingCpuAllocator::install();
  a.release_cache();
  const int64_t base = a.stats().reserved(), ooms = a.ooms();
  a.set_limit(base + (1 << 20));
  EXPECT_THROW(at::empty({1 << 20}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(a.stats().reserved(), base);
  EXPECT_EQ(a.ooms(), ooms + 1);
  EXPECT_NO_THROW(at::empty({1 << 10}, at::kFloat));
  a.set_limit(0);
  EXPECT_NO_THROW(at::empty({1 << 20}, at::kFloat));
  a.release_cache();
}

// A step's large tensors come back as the next step's: the freed block is kept and handed out
// again (the same pages, no fresh mapping to fault in), also to a request up to an eighth
// smaller; a request smaller still maps a block of its own rather than take one a later large
// tensor will want.
TEST(CpuAllocator, FreedBlocksAreReusedAndCountedAsReserved) {
  auto& a = memory::CachingCpuAllocator::install();
  a.release_cache();
  const memory::CpuAllocatorStats before = a.stats();
  void* first = nullptr;
  {
    const at::Tensor t = at::ones({4 << 20}, at::kFloat);  // 16 MiB
    first = t.data_ptr();
  }
  const memory::CpuAllocatorStats freed = a.stats();
  EXPECT_EQ(freed.allocated, before.allocated);
  EXPECT_GE(freed.cached, int64_t(16) << 20);
  EXPECT_EQ(freed.reserved(), before.reserved() + freed.cached);
  EXPECT_EQ(freed.mappings, before.mappings + 1);
  {
    const at::Tensor again = at::empty({4 << 20}, at::kFloat);
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(a.stats().cached, 0);
    EXPECT_EQ(a.stats().reserved(), freed.reserved());
  }
  {
    const at::Tensor slightly_smaller = at::empty({(4 << 20) - (1 << 18)}, at::kFloat);  // 15 MiB: 16 / 15 < 9 / 8
    EXPECT_EQ(slightly_smaller.data_ptr(), first);
  }
  {
    const at::Tensor smaller = at::empty({3 << 20}, at::kFloat);  // 12 MiB: a block of its own
    EXPECT_NE(smaller.data_ptr(), first);
    EXPECT_EQ(a.stats().mappings, before.mappings + 2);
  }
  EXPECT_GE(a.release_cache(), int64_t(28) << 20);
  EXPECT_EQ(a.stats().cached, 0);
  EXPECT_EQ(a.stats().reserved(), before.reserved());
}

// Under a budget the cache is part of what is counted, and it gives way: an allocation that only
// fits once cached blocks are returned succeeds, and the out-of-memory error
// comes only when the live tensors alone would exceed the budget.
TEST(CpuAllocator, CachedBlocksAreReturnedBeforeAnOutOfMemoryError) {
  auto& a = memory::CachingCpuAllocator::install();
  a.release_cache();
  const int64_t base = a.stats().reserved(), evictions = a.stats().evictions, ooms = a.ooms();
  a.set_limit(base + (int64_t(40) << 20));
  { const at::Tensor t = at::ones({6 << 20}, at::kFloat); }  // 24 MiB, cached when freed
  EXPECT_GE(a.stats().cached, int64_t(24) << 20);
  {
    const at::Tensor u = at::ones({8 << 20}, at::kFloat);  // 32 MiB: the 24 MiB block is too small, and both do not fit
    EXPECT_EQ(a.stats().evictions, evictions + 1);
    EXPECT_EQ(a.stats().cached, 0);
    EXPECT_LE(a.stats().reserved(), base + (int64_t(40) << 20));
    EXPECT_THROW(at::ones({4 << 20}, at::kFloat), c10::OutOfMemoryError);  // 16 MiB more live: over
  }
  EXPECT_EQ(a.ooms(), ooms + 1);
  a.set_limit(0);
  a.release_cache();
}

// The cache keeps at most twice the largest working set since it was last emptied, or 64 MiB
// where that is more, and gives up its oldest blocks first.
TEST(CpuAllocator, TheCacheHoldsAtMostTwiceTheWorkingSetOrSixtyFourMiBOldestGoingFirst) {
  auto& a = memory::CachingCpuAllocator::install();
  a.release_cache();
  // Tensors of 1 to 20 MiB, each freed before the next: no cached block fits a later, larger one,
  // so each stays cached until the cap gives up the oldest (210 MiB freed in all).
  for (int64_t mib = 1; mib <= 20; ++mib) {
    { const at::Tensor t = at::empty({mib << 18}, at::kFloat); }
    EXPECT_LE(a.stats().cached, int64_t(64) << 20) << mib << " MiB";
  }
  EXPECT_GE(a.stats().cached, int64_t(57) << 20);  // the newest: 20 + 19 + 18 MiB (with 17 over 64)
  // The newest block is still there: 20 MiB again maps nothing.
  const int64_t mappings = a.stats().mappings;
  { const at::Tensor t = at::empty({int64_t(20) << 18}, at::kFloat); }
  EXPECT_EQ(a.stats().mappings, mappings);
  // A working set of 48 MiB allows 96.
  a.release_cache();
  {
    std::vector<at::Tensor> step;
    for (int i = 0; i < 3; ++i) step.push_back(at::empty({int64_t(16) << 18}, at::kFloat));
  }
  for (int64_t mib = 21; mib <= 40; ++mib) { const at::Tensor t = at::empty({mib << 18}, at::kFloat); }
  EXPECT_GT(a.stats().cached, int64_t(64) << 20);
  EXPECT_LE(a.stats().cached, int64_t(97) << 20);  // 2 x (48 MiB and the blocks' headers and pages)
  a.release_cache();
}

// The process's resident memory follows what the allocator counts, with glibc's settings left as
// they are: large tensors freed stay resident only while cached, and release_cache() returns them
// to the system.
TEST(CpuAllocator, ResidentMemoryFollowsTheReservedBytes) {
  auto& a = memory::CachingCpuAllocator::install();
  a.release_cache();
  const int64_t rss0 = process_memory().rss;
  if (rss0 == 0) GTEST_SKIP() << "no /proc/self/status here";
  {
    std::vector<at::Tensor> step;  // 256 MiB in tensors of 1 to 31 MiB, touched
    for (int64_t mib = 1; mib <= 31; mib += 2) step.push_back(at::ones({mib << 18}, at::kFloat));
    EXPECT_GT(process_memory().rss - rss0, int64_t(240) << 20);
  }
  const int64_t cached = a.stats().cached;
  EXPECT_GE(cached, int64_t(240) << 20);
  EXPECT_LT(std::abs(process_memory().rss - rss0 - cached), int64_t(16) << 20);
  a.release_cache();
  EXPECT_LT(process_memory().rss - rss0, int64_t(16) << 20);
}

TEST(CpuAllocator, AnOutOfMemoryInsideBackwardUnwindsToTheBaseline) {
  auto& a = memory::CachingCpuAllocator::install();
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
