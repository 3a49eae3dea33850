// The memory governor on the CPU, where the caching allocator enforces budgets and injects
// out-of-memory errors at exact points.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <regex>
#include <set>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/data/dataset.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/estimate.h"
#include "headroom/memory/governor.h"
#include "headroom/memory/starvation.h"
#include "headroom/models/detector.h"
#include "headroom/train/hooks.h"
#include "governor_util.h"
#include "train_util.h"

using namespace headroom;
using namespace headroom::test;

namespace {

// Calls `fire` at a step phase of step `step` (the first attempt, or every attempt when `every`).
class AtPhase : public train::Hook {
 public:
  AtPhase(int64_t step, train::StepPhase phase, bool every, std::function<void()> fire)
      : step_(step), phase_(phase), every_(every), fire_(std::move(fire)) {}
  void after_phase(train::Trainer& t, train::StepPhase phase) override {
    if (phase != phase_ || t.state().step != step_ || (fired_ && !every_)) return;
    fired_ = true;
    fire_();
  }

 private:
  int64_t step_;
  train::StepPhase phase_;
  bool every_, fired_ = false;
  std::function<void()> fire_;
};

// Strikes an out-of-memory error `after` allocations into the forward of step `step`.
void inject_at(train::Trainer& t, int64_t step, int64_t after, bool every = false) {
  t.register_hook(std::make_unique<AtPhase>(step, train::StepPhase::input, every,
                                            [after] { memory::CachingCpuAllocator::install().inject_oom_after(after); }));
}

std::vector<std::string> actions(const memory::Governor& g) {
  std::vector<std::string> out;
  for (const auto& d : g.decisions()) out.push_back(d.action);
  return out;
}

std::vector<at::Tensor> buffers_of(models::DetectorImpl& m) {
  std::vector<at::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

// An out-of-memory error at every attempt of the first step: the governor climbs the whole
// ladder and gives up; returns its message ("" when the run did not stop).
std::string climb_to_the_top(train::Trainer& t) {
  inject_at(t, 0, 100, /*every=*/true);
  try {
    t.train();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Governor, AnOomAtStepKEndsWithTheWeightsOfTheSmallerMicroBatchFromTheStart) {
  const Config c = load_config("", tiny_run({"train.steps=6", "train.warmup_epochs=0", "train.ema=true"}));
  std::vector<std::vector<at::Tensor>> weights;
  std::vector<int64_t> images;
  std::vector<memory::MemoryDecision> decisions;
  int64_t micro = 0;
  for (bool inject : {true, false}) {
    train::TrainerParts parts = parts_for(c, temp_dir(inject ? "gov-oom" : "gov-small"));
    parts.loss = std::make_unique<PerImageSumLoss>();
    train::Trainer t(std::move(parts));
    t.register_hook(std::make_unique<EvalModeBatchNorm>());  // batch statistics independent of the split
    memory::Governor* g = govern(t);
    if (inject)
      inject_at(t, 3, 200);
    else
      g->set_micro_batch(2);
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    t.train();
    const std::string log = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
    weights.push_back(params_of(t.model()));
    images.push_back(t.state().images);
    if (inject) {
      decisions = g->decisions(), micro = g->micro_batch(t);
      // The lines docs/memory.md quotes and scripts/device/check.sh reads, word for word.
      const std::string bytes = "[0-9.]+ (B|KiB|MiB|GiB)";
      EXPECT_TRUE(std::regex_search(log, std::regex("memory governor, step 4: micro_batch 4 -> 2 \\(out of memory: [^\\n]*injected")))
          << log;
      EXPECT_TRUE(std::regex_search(log, std::regex("memory, epoch 1: peak " + bytes + " allocated, " + bytes +
                                                    " reserved, of budget none; fragmentation now [0-9]+%; since the start 0 "
                                                    "allocator retries, 1 OOMs; micro-batch 2; host RSS " + bytes + " \\(peak " +
                                                    bytes + "\\): " + bytes + " tensors and cache, " + bytes + " the rest")))
          << log;
    }
    EXPECT_EQ(t.state().step, 6);
  }
  EXPECT_EQ(images[0], images[1]);  // no sample lost or repeated
  EXPECT_EQ(micro, 2);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0].step, 4);
  EXPECT_EQ(decisions[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(decisions[0].reason.find("injected"), std::string::npos);
  EXPECT_LE(relative_difference(weights[0], weights[1]), 1e-5);
}

TEST(Governor, AnOomInTheFirstForwardIsUndoneExactlyWithTheRealLossAndBatchNorm) {
  // The failed attempt has already updated some BatchNorm statistics; the re-run must not see them.
  const Config c = load_config("", tiny_run({"train.steps=3", "train.warmup_epochs=0"}));
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> out;
  for (bool inject : {true, false}) {
    train::Trainer t(parts_for(c, temp_dir(inject ? "gov-first-oom" : "gov-first-small")));
    memory::Governor* g = govern(t);
    if (inject)
      inject_at(t, 0, 400);
    else
      g->set_micro_batch(2);
    t.train();
    EXPECT_EQ(g->micro_batch(t), 2);
    out.emplace_back(params_of(t.model()), buffers_of(t.model()));
  }
  for (size_t i = 0; i < out[0].first.size(); ++i) ASSERT_TRUE(at::equal(out[0].first[i], out[1].first[i])) << "parameter " << i;
  for (size_t i = 0; i < out[0].second.size(); ++i) ASSERT_TRUE(at::equal(out[0].second[i], out[1].second[i])) << "buffer " << i;
}

TEST(Governor, TheLadderHalvesRecomputesSwitchesAmpThenStopsWithTheTable) {
  const Config c = load_config("", tiny_run({"train.steps=2", "train.warmup_epochs=0"}));
  train::Trainer t(parts_for(c, temp_dir("gov-ladder")));
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  const std::string what = climb_to_the_top(t);
  ASSERT_FALSE(what.empty()) << "expected the governor to give up";
  EXPECT_NE(what.find("nothing left to give up"), std::string::npos) << what;
  EXPECT_NE(what.find("parameters"), std::string::npos) << what;
  EXPECT_NE(what.find("data.imgsz=32"), std::string::npos) << what;
  EXPECT_EQ(actions(*g), (std::vector<std::string>{"micro_batch 4 -> 2", "micro_batch 2 -> 1", "activation_checkpointing all", "amp bf16"}));
  // On a CPU without native bf16 the AMP rung says what it costs.
  EXPECT_EQ(g->decisions().back().reason.find("emulated") != std::string::npos, !train::cpu_has_native_bf16()) << g->decisions().back().reason;
  EXPECT_EQ(t.state().step, 0);
}

TEST(Governor, WithoutAmpAllowedTheLadderStopsAfterRecompute) {
  const Config c = load_config("", tiny_run({"train.steps=2", "train.batch=2", "memory.allow_amp=false"}));
  train::Trainer t(parts_for(c, temp_dir("gov-no-amp")));
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  inject_at(t, 0, 100, true);
  EXPECT_THROW(t.train(), Error);
  ASSERT_EQ(g->decisions().size(), 2u);
  EXPECT_EQ(g->decisions().back().action, "activation_checkpointing all");
  EXPECT_EQ(t.amp(), train::AmpMode::off);
}

TEST(Governor, WithTheGovernorOffAnOomStopsTheRunWithTheTable) {
  const Config c = load_config("", tiny_run({"train.steps=2", "memory.governor=false"}));
  train::Trainer t(parts_for(c, temp_dir("gov-off")));
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  inject_at(t, 0, 100);
  try {
    t.train();
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("memory.governor is off"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer state"), std::string::npos) << what;
  }
  EXPECT_TRUE(g->decisions().empty());
}

// A cuDNN failure that is often an allocation failure in disguise: one smaller try; when it
// persists at micro-batch 1 the run stops naming it, not calling it an out-of-memory error.
TEST(Governor, ACudnnErrorIsRetriedSmallerAndStopsTheRunNamedWhenItPersists) {
  const auto cudnn = [] { TORCH_CHECK(false, "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"); };
  const Config c = load_config("", tiny_run({"train.steps=2", "train.warmup_epochs=0"}));
  {
    train::Trainer t(parts_for(c, temp_dir("gov-cudnn-once")));
    memory::Governor* g = govern(t);
    t.register_hook(std::make_unique<AtPhase>(1, train::StepPhase::forward, false, cudnn));
    t.train();
    EXPECT_EQ(t.state().step, 2);
    EXPECT_EQ(actions(*g), std::vector<std::string>{"micro_batch 4 -> 2"});
    EXPECT_NE(g->decisions()[0].reason.find("CUDNN_STATUS_INTERNAL_ERROR"), std::string::npos);
  }
  train::Trainer t(parts_for(c, temp_dir("gov-cudnn-always")));
  memory::Governor* g = govern(t);
  t.register_hook(std::make_unique<AtPhase>(1, train::StepPhase::forward, true, cudnn));
  try {
    t.train();
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuDNN error persists at the smallest micro-batch"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDNN_STATUS_INTERNAL_ERROR"), std::string::npos) << what;
    EXPECT_EQ(what.find("out of memory"), std::string::npos) << what;
  }
  EXPECT_EQ(actions(*g), (std::vector<std::string>{"micro_batch 4 -> 2", "micro_batch 2 -> 1"}));
  EXPECT_EQ(t.state().step, 1);
}

TEST(Governor, DecisionsAreSavedInCheckpointsAndResumeKeepsThem) {
  const std::string dir = temp_dir("gov-resume");
  const Config c = load_config("", tiny_run({"train.steps=2"}));
  {
    train::Trainer t(parts_for(c, dir));
    memory::Governor* g = govern(t);
    inject_at(t, 1, 20);  // early in the forward: how many allocations a step makes depends on the CPU's kernels
    t.train();
    ASSERT_EQ(g->micro_batch(t), 2);
    t.save_checkpoint(dir + "/last.pt");
  }
  train::Trainer r(parts_for(c, dir));
  memory::Governor* g = govern(r);
  EXPECT_EQ(g->micro_batch(r), 4);
  r.load_checkpoint(dir + "/last.pt");
  EXPECT_EQ(g->micro_batch(r), 2);
  ASSERT_EQ(g->decisions().size(), 1u);
  EXPECT_EQ(g->decisions()[0].step, 2);
  EXPECT_EQ(g->decisions()[0].action, "micro_batch 4 -> 2");
}

TEST(Governor, ValidationOutOfMemoryHalvesTheValidationBatchWithTheSameResult) {
  const Config c = load_config("", tiny_run({"train.steps=1"}));
  train::Trainer t(parts_for(c, temp_dir("gov-val")));
  memory::Governor* g = govern(t);
  const auto clean = t.validate();
  ASSERT_TRUE(clean);
  memory::CachingCpuAllocator::install().inject_oom_after(300);
  const auto governed = t.validate();
  ASSERT_TRUE(governed);
  ASSERT_EQ(g->decisions().size(), 1u);
  EXPECT_EQ(g->decisions()[0].action.rfind("validation batch ", 0), 0u) << g->decisions()[0].action;
  for (size_t i = 0; i < clean->stats.size(); ++i) EXPECT_NEAR(governed->stats[i], clean->stats[i], 1e-9) << i;
  // A validation pass and the training each end by emptying the allocator's cache (a phase's
  // blocks are not the next one's sizes).
  EXPECT_EQ(memory::CachingCpuAllocator::install().stats().cached, 0);
  t.train();
  EXPECT_EQ(memory::CachingCpuAllocator::install().stats().cached, 0);
}

// Without EMA, validation runs the training model itself: a pass that fails must leave it in
// training mode (it used to stay in eval mode for the rest of the run, BatchNorm frozen).
TEST(Governor, AValidationOomWithoutEmaLeavesTheTrainingModelTraining) {
  const Config c = load_config("", tiny_run({"train.steps=1", "train.ema=false"}));
  train::Trainer t(parts_for(c, temp_dir("gov-val-noema")));
  govern(t);
  ASSERT_TRUE(t.model().is_training());
  memory::CachingCpuAllocator::install().inject_oom_after(300);
  ASSERT_TRUE(t.validate());
  EXPECT_TRUE(t.model().is_training());
  // ... also when nothing recovers it.
  train::Trainer bare(parts_for(c, temp_dir("gov-val-bare")));
  memory::CachingCpuAllocator::install().inject_oom_after(300);
  EXPECT_THROW(bare.validate(), Error);
  EXPECT_TRUE(bare.model().is_training());
}

// The loader's buffers count against a CPU budget: an OOM in a decode thread reaches the governor
// (not std::terminate), which shrinks the micro-batch, and the run ends with the same images.
TEST(Governor, AnOomInTheLoadersThreadIsRecovered) {
  const Config c = load_config("", tiny_run({"train.steps=4", "train.warmup_epochs=0", "data.prefetch=1"}));
  train::Trainer t(parts_for(c, temp_dir("gov-loader")));
  memory::Governor* g = govern(t);
  t.register_hook(std::make_unique<AtPhase>(1, train::StepPhase::update, false, [] {
    memory::CachingCpuAllocator::install().inject_oom_after(1, /*other_threads=*/true);
  }));
  t.train();
  EXPECT_EQ(t.state().step, 4);
  EXPECT_EQ(t.state().images, 26);  // the whole epoch, no image lost or repeated
  ASSERT_EQ(g->decisions().size(), 1u);
  EXPECT_NE(g->decisions()[0].reason.find("injected"), std::string::npos);
}

TEST(Governor, ShrinksBeforeAnOomWhenThePeakCrossesBudgetMinusHeadroom) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=3"}));
  const int64_t base = monitor->sample().allocated;
  int64_t peak = 0;  // of a step, above what was in use before the trainer
  {
    train::Trainer probe(parts_for(c, temp_dir("gov-pre-probe")));
    probe.loader().start(0, 0);
    monitor->reset_peak();
    probe.run_step();
    peak = monitor->sample().peak_allocated - base;
  }
  train::Trainer t(parts_for(c, temp_dir("gov-pre")));
  // A budget just above the step's peak: the step fits, but crosses budget minus 10%.
  memory::Governor* g = govern(t, memory::GovernorOptions().budget(base + int64_t(double(peak) * 1.05)).headroom(0.10));
  t.train();
  monitor->set_limit(0);
  ASSERT_FALSE(g->decisions().empty());
  EXPECT_EQ(g->decisions()[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(g->decisions()[0].reason.find("crossed budget - headroom"), std::string::npos);
  EXPECT_EQ(t.state().step, 3);
}

TEST(Governor, RefusesAModelTensorOffTheRunDevice) {
  const Config c = load_config("", tiny_run({"train.steps=1"}));
  train::Trainer t(parts_for(c, temp_dir("gov-device")));
  EXPECT_NO_THROW(memory::check_on_device(t));
  const at::Tensor elsewhere = at::empty({2, 3}, at::TensorOptions().device(c10::kMeta));
  try {
    memory::check_tensors_on(c10::Device(c10::kCPU), "model parameter", {at::zeros({1}), elsewhere});
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("model parameter tensor of shape [2, 3] is on meta"), std::string::npos) << e.what();
  }
  // The governor checks at the start of training: a model buffer, then an EMA buffer, elsewhere
  // stops the run before its first step.
  for (const std::string what : {"model buffer", "EMA buffer"}) {
    train::Trainer run(parts_for(c, temp_dir("gov-device")));
    govern(run, memory::governor_options(c, int64_t(1) << 30));
    ASSERT_TRUE(run.ema());
    torch::nn::Module& owner = what == "model buffer" ? static_cast<torch::nn::Module&>(run.model()) : *run.ema()->model();
    owner.register_buffer("stray", elsewhere);
    try {
      run.train();
      ADD_FAILURE() << "the run trained with its " << what << " off the device";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(what + " tensor of shape [2, 3] is on meta"), std::string::npos) << e.what();
    }
    EXPECT_EQ(run.state().step, 0);
  }
}


namespace {
// Scripted allocator counters: the CUDA allocator's retry count, which the CPU never has.
class ScriptedMonitor final : public MemoryMonitor {
 public:
  ScriptedMonitor() : MemoryMonitor(c10::Device(c10::kCPU)) {}
  MemoryStats sample() const override { return stats; }
  void reset_peak() override {}
  int64_t capacity() const override { return int64_t(1) << 34; }
  int64_t available() const override { return int64_t(1) << 33; }
  void set_limit(int64_t) override {}
  void release_cache() override { ++released; }
  MemoryStats stats;
  int released = 0;
};

// Raises the scripted retry count during every step from `from` on.
class Thrash : public train::Hook {
 public:
  Thrash(ScriptedMonitor& m, int64_t from) : m_(m), from_(from) {}
  void after_phase(train::Trainer& t, train::StepPhase phase) override {
    if (phase == train::StepPhase::update && t.state().step + 1 >= from_) ++m_.stats.alloc_retries;
  }

 private:
  ScriptedMonitor& m_;
  int64_t from_;
};
}  // namespace

// Scripted step peaks, as fractions of the budget, one per step, and allocator retries in the
// steps (1-based) of `retries`.
class PeaksOf : public train::Hook {
 public:
  PeaksOf(ScriptedMonitor& m, int64_t budget, std::vector<double> peaks, std::set<int64_t> retries = {})
      : m_(m), budget_(budget), peaks_(std::move(peaks)), retries_(std::move(retries)) {}
  void after_phase(train::Trainer& t, train::StepPhase phase) override {
    if (phase != train::StepPhase::update) return;
    m_.stats.peak_allocated = int64_t(peaks_.at(size_t(t.state().step)) * double(budget_));
    if (retries_.count(t.state().step + 1)) ++m_.stats.alloc_retries;
  }

 private:
  ScriptedMonitor& m_;
  int64_t budget_;
  std::vector<double> peaks_;
  std::set<int64_t> retries_;
};

// memory.grow_after counts steps in a row under half of budget - headroom (0.45 of the budget
// here): a step above it, as a crowded batch gives, starts the count again.
TEST(Governor, GrowsBackOnlyAfterStepsInARowUnderHalfTheBudget) {
  const int64_t budget = int64_t(1) << 30;
  // The decisions over a run of one step per scripted peak (a share of the budget), the
  // allocator retrying in the steps `retried`, a validation pass that runs out of memory after
  // step `validation_oom`.
  struct ValidationOomAfter : train::Hook {
    int64_t step = 0;
    void after_step(train::Trainer& t) override {
      if (t.state().step != step) return;
      memory::CachingCpuAllocator::install().inject_oom_after(300);
      EXPECT_TRUE(t.validate());
    }
  };
  const auto decisions = [&](const std::vector<double>& peaks, std::set<int64_t> retried, int64_t validation_oom = 0) {
    auto monitor = std::make_shared<ScriptedMonitor>();
    const Config c = load_config("", tiny_run({"train.steps=" + std::to_string(peaks.size()), "memory.grow_after=2"}));
    train::TrainerParts parts = parts_for(c, temp_dir("gov-grow-half"));
    parts.monitor = monitor;
    train::Trainer t(std::move(parts));
    memory::Governor* g = govern(t, memory::governor_options(c, budget));
    t.register_hook(std::make_unique<PeaksOf>(*monitor, budget, peaks, std::move(retried)));
    auto validation = std::make_unique<ValidationOomAfter>();
    validation->step = validation_oom;
    t.register_hook(std::move(validation));
    t.train();
    return g->decisions();
  };
  const std::vector<memory::MemoryDecision> d = decisions({0.95, 0.6, 0.1, 0.6, 0.1, 0.1, 0.1}, {});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].action, "micro_batch 4 -> 2");
  EXPECT_EQ(d[1].action, "micro_batch 2 -> 4");
  // A decision's step is the first it applies to: the steps run 1, 2, ... with peaks as scripted.
  EXPECT_EQ(d[0].step, 2);
  // Steps 5 and 6 under half, so from step 7; counting every step since the shrink would have
  // grown from step 4 (steps 2 and 3, the first above half), into step 4's peak above half.
  EXPECT_EQ(d[1].step, 7);
  EXPECT_NE(d[1].reason.find("2 steps in a row"), std::string::npos) << d[1].reason;
  // A step whose allocator had to retry is not calm either: with a retry in step 6, steps 7 and 8.
  const std::vector<memory::MemoryDecision> r = decisions({0.95, 0.6, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1}, {6});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].action, "micro_batch 2 -> 4");
  EXPECT_EQ(r[1].step, 9);
  // Any out-of-memory error starts the count again, one in validation too: after step 5, steps 6
  // and 7.
  const std::vector<memory::MemoryDecision> v = decisions({0.95, 0.6, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1}, {}, 5);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[1].action.rfind("validation batch ", 0), 0u) << v[1].action;
  EXPECT_EQ(v[2].action, "micro_batch 2 -> 4");
  EXPECT_EQ(v[2].step, 8);
}

namespace {
// A governed tiny run of `steps` steps whose allocator counters the test scripts.
struct ScriptedRun {
  std::shared_ptr<ScriptedMonitor> monitor = std::make_shared<ScriptedMonitor>();
  std::unique_ptr<train::Trainer> trainer;
  memory::Governor* governor = nullptr;
  ScriptedRun(int64_t steps, const std::string& name) {
    train::TrainerParts parts = parts_for(load_config("", tiny_run({"train.steps=" + std::to_string(steps)})), temp_dir(name));
    parts.monitor = monitor;
    trainer = std::make_unique<train::Trainer>(std::move(parts));
    governor = govern(*trainer);
  }
};
}  // namespace

TEST(Governor, AllocatorRetriesOnConsecutiveStepsShrinkTheMicroBatch) {
  ScriptedRun run(6, "gov-thrash");
  const auto& monitor = run.monitor;
  const memory::Governor* g = run.governor;
  run.trainer->register_hook(std::make_unique<Thrash>(*monitor, 2));
  run.trainer->train();
  // New retries in steps 2 and 3 shrink from step 4; the count starts again, so the retries in
  // steps 4 and 5 shrink once more, from step 6.
  ASSERT_EQ(g->decisions().size(), 2u);
  EXPECT_EQ(g->decisions()[0].step, 4);
  EXPECT_EQ(g->decisions()[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(g->decisions()[0].reason.find("retried on 2 steps in a row"), std::string::npos);
  EXPECT_EQ(g->decisions()[1].step, 6);
  EXPECT_EQ(g->decisions()[1].action, "micro_batch 2 -> 1");
  EXPECT_GE(monitor->released, 1);
}

// The CUDA allocator frees its cache and retries once before every out-of-memory error it raises
// (scripted here): after the governor recovers from one, a single retry in the next step is not
// two steps of thrashing and does not shrink the micro-batch again.
TEST(Governor, TheRetryBehindAnOutOfMemoryErrorIsNotThrashing) {
  ScriptedRun run(4, "gov-oom-retry");
  train::Trainer& t = *run.trainer;
  ScriptedMonitor& m = *run.monitor;
  t.register_hook(std::make_unique<AtPhase>(1, train::StepPhase::input, false, [&m] {
    ++m.stats.alloc_retries;
    memory::CachingCpuAllocator::install().inject_oom_after(200);
  }));
  t.register_hook(std::make_unique<AtPhase>(2, train::StepPhase::update, false, [&m] { ++m.stats.alloc_retries; }));
  t.train();
  EXPECT_EQ(t.state().step, 4);
  EXPECT_EQ(actions(*run.governor), std::vector<std::string>{"micro_batch 4 -> 2"});
}

TEST(Governor, GrowsBackAfterAStableStretch) {
  const Config c = load_config("", tiny_run({"train.steps=6", "memory.grow_after=2"}));
  train::Trainer t(parts_for(c, temp_dir("gov-grow")));
  memory::Governor* g = govern(t, memory::governor_options(c, int64_t(1) << 32));
  inject_at(t, 1, 200);
  t.train();
  t.monitor()->set_limit(0);
  ASSERT_EQ(g->decisions().size(), 2u);
  EXPECT_EQ(g->decisions()[0].action, "micro_batch 4 -> 2");
  EXPECT_EQ(g->decisions()[1].action, "micro_batch 2 -> 4");
  EXPECT_EQ(g->decisions()[1].step, 4);
}

TEST(Planner, RecomputesTheFewestStagesThatFitAndTheRunStaysUnderBudget) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=3", "train.batch=8", "train.nominal_batch=8", "data.imgsz=128"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  // A budget below the peak without recompute, and above the peak with every stage but the one
  // that saves most recomputed: the planner adds stages in the order of saving per second of
  // recompute, and the seconds are measured (under load they vary), so in any order some stage is
  // needed and not every one.
  const auto unbounded = memory::make_recompute_planner(c, split, *monitor, int64_t(1) << 34);
  const memory::MemoryEstimate& e = unbounded->estimate();
  const int64_t plain = e.predicted_peak(e.modes[0], 8), all = e.predicted_peak(e.modes[1], 8);
  ASSERT_LT(all, plain);
  ASSERT_EQ(e.modes[0].stages.size(), e.modes[1].stages.size());
  double savings = 0, largest = 0;
  for (size_t i = 0; i < e.modes[0].stages.size(); ++i) {
    const double saving = std::max(0.0, e.modes[0].stages[i].per_image - e.modes[1].stages[i].per_image) * 8;
    savings += saving, largest = std::max(largest, saving);
  }
  const int64_t all_but_one = std::max(e.predicted_peak(e.modes[0], 8, savings - largest), all);
  ASSERT_LT(all_but_one, plain);
  const int64_t budget = int64_t(double(all_but_one + (plain - all_but_one) / 2) / 0.9);
  const auto planner = memory::make_recompute_planner(c, split, *monitor, budget);
  const memory::StagePlan& p = planner->plan(128, 8);
  const auto on = std::count(p.recomputed.begin(), p.recomputed.end(), true);
  EXPECT_GT(on, 0);
  EXPECT_LT(size_t(on), p.recomputed.size());
  EXPECT_TRUE(p.fits);
  EXPECT_LT(p.recompute_seconds, p.recompute_all_seconds);
  EXPECT_NE(planner->describe(p, 128, 8).find("recompute +"), std::string::npos);
  // A smaller input needs fewer stages (activations scale with the area).
  const memory::StagePlan& small = planner->plan(64, 8);
  EXPECT_LE(std::count(small.recomputed.begin(), small.recomputed.end(), true), on);
  // Where a real step refutes a plan (train.batch=auto), every stage is recomputed there, at the
  // peak every stage's own probes measured; other sizes keep theirs.
  const auto refuted = memory::make_recompute_planner(c, split, *monitor, budget);
  const std::vector<bool> small_before = refuted->plan(64, 8).recomputed;
  const memory::StagePlan& every = refuted->recompute_all(128, 8);
  EXPECT_EQ(std::count(every.recomputed.begin(), every.recomputed.end(), true), int64_t(every.recomputed.size()));
  EXPECT_EQ(every.predicted_peak, refuted->estimate().predicted_peak(refuted->estimate().modes[1], 8));
  EXPECT_EQ(refuted->plan(128, 8).recomputed, every.recomputed);
  EXPECT_EQ(refuted->stages_of(refuted->plan(128, 8)), "every stage");
  EXPECT_EQ(refuted->plan(64, 8).recomputed, small_before);
  // Training with the plan stays under the budget: no out-of-memory error. memory.governor:
  // false keeps the plan (only the recovery goes): the same stages, and it fits as well.
  std::vector<bool> stages;
  for (const bool governor : {true, false}) {
    Config run = c;
    run.memory.governor = governor;
    train::TrainerParts parts = train::make_trainer_parts(run, c10::Device(c10::kCPU), temp_dir("planner"), split, nullptr);
    parts.monitor = monitor;
    train::Trainer t(std::move(parts));
    memory::Governor* g = govern(t, memory::governor_options(run, budget), planner);
    t.train();
    monitor->set_limit(0);
    for (const auto& d : g->decisions()) EXPECT_EQ(d.reason.rfind("out of memory", 0), std::string::npos) << d.action << ": " << d.reason;
    EXPECT_EQ(t.model().recompute_mode(), models::RecomputeMode::stages) << "governor " << governor;
    if (governor)
      stages = t.model().recompute_setting().stages;
    else
      EXPECT_EQ(t.model().recompute_setting().stages, stages);
  }
  // The run `trainer train` builds from the config (memory.activation_checkpointing: auto under
  // that budget) plans some stages, not every one, and keeps them with memory.governor: false
  // (an out-of-memory error would stop that run). Which stages depends on the recompute times
  // its own planner measures, so they are not compared with the plan above.
  for (const char* governor : {"true", "false"}) {
    cli::Run r = run_for(load_config("", tiny_run({"train.steps=3", "train.batch=8", "train.nominal_batch=8", "data.imgsz=128",
                                                   "memory.activation_checkpointing=auto", "memory.budget=" + std::to_string(budget), "train.val_every=0",
                                                   std::string("memory.governor=") + governor})),
                         temp_dir("planner-run"));
    r.trainer->train();
    r.monitor->set_limit(0);
    EXPECT_TRUE(r.governor->decisions().empty()) << "governor " << governor << ": " << r.governor->decisions()[0].reason;
    EXPECT_EQ(r.trainer->model().recompute_mode(), models::RecomputeMode::stages) << "governor " << governor;
    const std::vector<bool>& planned = r.trainer->model().recompute_setting().stages;
    const auto recomputed = std::count(planned.begin(), planned.end(), true);
    EXPECT_GT(recomputed, 0) << "governor " << governor;
    EXPECT_LT(size_t(recomputed), planned.size()) << "governor " << governor;
  }
}

TEST(Governor, CudaBudgetIsEnforcedAndAnOomThereIsRecovered) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  std::shared_ptr<MemoryMonitor> monitor = memory::make_memory_monitor(cuda);
  Config c = load_config("", tiny_run({"train.steps=4", "train.batch=32", "train.nominal_batch=32", "data.imgsz=128", "device=cuda"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  // What a step of 32 needs, measured; then a budget that holds about a quarter of its
  // activations. (12 images and 64 MiB of slack held all 32 on an H200: the step's 113 MiB fit.)
  const memory::MemoryEstimate e = memory::estimate_memory(c, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  const memory::ModeEstimate& m = e.configured();
  const int64_t budget = monitor->sample().reserved + int64_t(m.fixed + m.per_image * 8) + (int64_t(8) << 20);
  at::manual_seed(0);
  train::TrainerParts parts = train::make_trainer_parts(c, cuda, temp_dir("gov-cuda"), split, nullptr);
  parts.monitor = monitor;
  train::Trainer t(std::move(parts));
  memory::Governor* g = govern(t, memory::governor_options(c, budget));
  t.train();
  monitor->set_limit(0);
  EXPECT_EQ(t.state().step, 4);
  ASSERT_FALSE(g->decisions().empty());
  EXPECT_LT(g->micro_batch(t), 32);
  EXPECT_LE(monitor->sample().peak_reserved, budget + (int64_t(2) << 20));
}

namespace {
// A one-stack hourglass whose bottom is 1x1 at 64 px (stem /4, four halvings): BatchNorm there
// cannot train on one image, as Hourglass-104's at 128 px.
std::vector<std::string> one_by_one_hourglass(std::vector<std::string> extra) {
  const std::string path = temp_dir("hg-1x1") + "/hg_1x1.yaml";
  write_bytes(path,
              "nc: 80\nbackbone:\n  - [-1, 1, HourglassStem, [8, 16]]\n"
              "  - [-1, 1, Hourglass, [1, [16, 16, 16, 16, 16], [1, 1, 1, 1, 1], 16]]\n"
              "head:\n  - [-1, 1, CenterNetHead, [nc, 16]]\n");
  std::vector<std::string> o = tiny_run(std::move(extra));
  o.push_back("model.file=" + path);
  o.erase(std::remove_if(o.begin(), o.end(), [](const std::string& s) { return s.rfind("model.scale=", 0) == 0; }), o.end());
  o.push_back("augment.multi_scale=0");
  return o;
}
}  // namespace

TEST(Governor, SplitsALoaderBatchIntoBalancedPartsNoneBelowTheSmallest) {
  using P = std::vector<int64_t>;
  EXPECT_EQ(memory::Governor::split(8, 4, 1), (P{4, 4}));
  EXPECT_EQ(memory::Governor::split(8, 3, 1), (P{3, 3, 2}));
  EXPECT_EQ(memory::Governor::split(7, 2, 1), (P{2, 2, 2, 1}));
  EXPECT_EQ(memory::Governor::split(7, 2, 2), (P{3, 2, 2}));  // never a part of 1 where 2 is the least
  EXPECT_EQ(memory::Governor::split(32, 7, 2), (P{7, 7, 6, 6, 6}));
  EXPECT_EQ(memory::Governor::split(3, 8, 2), (P{3}));
  EXPECT_EQ(memory::Governor::split(1, 1, 1), (P{1}));
}

// The ladder never picks an impossible rung: with the smallest micro-batch 2 (a 1x1 BatchNorm
// map), an OOM at every attempt halves 4 -> 2, then recomputes, then switches AMP, then stops
// with the table — never with BatchNorm's "Expected more than 1 value per channel".
TEST(Governor, TheLadderNeverGoesBelowTheSmallestMicroBatchTheModelTrainsAt) {
  const Config c = load_config("", one_by_one_hourglass({"train.steps=2", "train.warmup_epochs=0"}));
  train::Trainer t(parts_for(c, temp_dir("gov-least")));
  EXPECT_EQ(t.loader().options().min_batch(), 2);
  // The search's trial forwards (one image, refused; two) leave the BatchNorm statistics and the
  // model's mode as they were.
  for (const bool training : {false, true}) {  // training last: the run below trains as built
    t.model().train(training);
    const std::vector<at::Tensor> before = buffers_of(t.model());
    EXPECT_EQ(models::smallest_trainable_batch(t.model(), 64), 2);
    const std::vector<at::Tensor> after = buffers_of(t.model());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << "buffer " << i;
    EXPECT_EQ(t.model().is_training(), training);
  }
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  const std::string what = climb_to_the_top(t);
  ASSERT_FALSE(what.empty()) << "expected the governor to give up";
  EXPECT_NE(what.find("nothing left to give up: micro-batch 2"), std::string::npos) << what;
  EXPECT_EQ(what.find("value per channel"), std::string::npos) << what;
  // Its input is a multiple of 64: at 64 px there is no smaller size to advise (¾ on 32 would be 32).
  EXPECT_EQ(what.find("data.imgsz="), std::string::npos) << what;
  EXPECT_NE(what.find("Use a lighter backbone"), std::string::npos) << what;
  EXPECT_EQ(actions(*g), (std::vector<std::string>{"micro_batch 4 -> 2", "activation_checkpointing all", "amp bf16"}));
  ASSERT_FALSE(g->decisions().empty());
  EXPECT_NE(g->decisions()[1].reason.find("at micro-batch 2 (the smallest the model trains at)"), std::string::npos);
}

// Without an injected OOM the same model trains, and an epoch whose last batch would hold one
// image leaves it out (33 images by 4: 8 batches, not 9).
TEST(Governor, AModelThatNeedsTwoImagesTrainsAndLeavesOutALastBatchOfOne) {
  const Config c = load_config("", one_by_one_hourglass({"train.steps=3", "train.batch=4", "train.nominal_batch=4"}));
  train::Trainer t(parts_for(c, temp_dir("gov-least-train")));
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  g->set_micro_batch(1);  // asked for less than the model can do: the split keeps parts of 2
  t.train();
  EXPECT_EQ(t.state().step, 3);
  EXPECT_EQ(data::Loader::batches_in(33, 4, false, 2), 8);
  EXPECT_EQ(data::Loader::batches_in(34, 4, false, 2), 9);
  EXPECT_EQ(data::Loader::batches_in(33, 4, false, 1), 9);
}

// Host memory is memory. A whole CPU run — steps, validation every epoch, checkpoints — keeps the
// memory it uses flat from epoch to epoch; and what the process holds beyond its tensors, when it
// grows (here 96 MiB of plain host memory taken in the last epoch), comes off the tensors' limit,
// so the budget bounds the process. Both read RSS after the heap's free pages went back to the
// system (return_free_heap), as the governor reads it: under load glibc kept up to 10 MiB more.
TEST(Governor, HostMemoryStaysFlatAcrossEpochsAndItsGrowthIsCounted) {
  const Config c = load_config("", tiny_run({"train.epochs=5", "train.batch=8", "train.nominal_batch=8"}));
  const std::string dir = temp_dir("gov-rss");
  train::Trainer t(parts_for(c, dir));
  auto monitor_now = [&] { return t.monitor()->sample(); };
  const int64_t budget = monitor_now().allocated + (int64_t(256) << 20);
  govern(t, memory::GovernorOptions().budget(budget));
  train::register_default_hooks(t, c);
  struct Recorder : train::Hook {
    std::vector<int64_t> rss;
    std::vector<int64_t> limits;
    std::vector<char> held;
    void after_step(train::Trainer& tr) override {
      if (tr.state().epoch == 4 && held.empty()) held.assign(size_t(96) << 20, 1);  // touched: resident
    }
    void after_epoch(train::Trainer& tr) override {
      tr.wait_for_checkpoints();  // the last epoch's snapshot is gone: its write ends at a moment timing decides
      return_free_heap();
      rss.push_back(process_memory().rss);
      limits.push_back(tr.monitor()->sample().limit);
    }
  };
  auto recorder = std::make_unique<Recorder>();
  Recorder* r = recorder.get();
  t.register_hook(std::move(recorder));
  t.train();
  ASSERT_EQ(r->rss.size(), 5u);
  // epochs 2 to 4 (the first builds the validation cache and warms the libraries): a snapshot of
  // the model, its EMA and the optimizer kept each epoch (913k parameters, 3 copies) would add 22 MiB
  EXPECT_LE(std::abs(r->rss[3] - r->rss[1]), int64_t(12) << 20) << r->rss[1] << " -> " << r->rss[3];
  EXPECT_GE(r->rss[4] - r->rss[3], int64_t(80) << 20);  // the 96 MiB taken in epoch 5
  EXPECT_LE(r->limits[4], budget - (int64_t(80) << 20)) << "the growth comes off the tensors' limit";
  EXPECT_LE(r->limits[4], r->limits[3] - (int64_t(80) << 20)) << "the limit falls by what the process grew";
  t.monitor()->set_limit(0);
}

// A fixed batch below what the model trains on is refused up front, naming the key and the fix,
// not a BatchNorm error mid-step.
TEST(Governor, ABatchBelowTheSmallestTheModelTrainsOnIsAClearError) {
  const Config c = load_config("", one_by_one_hourglass({"train.batch=1", "train.nominal_batch=1"}));
  try {
    train::Trainer t(parts_for(c, temp_dir("gov-batch-1")));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.batch 1 is below the 2 images per micro-batch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("set train.batch to at least 2"), std::string::npos) << e.what();
  }
}
