// The memory governor, the estimator and the automatic batch size on the CPU, where the
// counting allocator enforces budgets and injects out-of-memory errors at exact points.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/data/dataset.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/estimate.h"
#include "headroom/memory/governor.h"
#include "headroom/memory/starvation.h"
#include "headroom/train/hooks.h"
#include "train_util.h"

using namespace headroom;
using namespace headroom::test;

namespace {

std::shared_ptr<MemoryMonitor> cpu_monitor() { return memory::make_memory_monitor(c10::Device(c10::kCPU)); }

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

// Calls `fire` after every step.
class AfterStep : public train::Hook {
 public:
  explicit AfterStep(std::function<void(train::Trainer&)> fire) : fire_(std::move(fire)) {}
  void after_step(train::Trainer& t) override { fire_(t); }

 private:
  std::function<void(train::Trainer&)> fire_;
};

// The governor registered on `t`, kept for its decisions.
memory::Governor* govern(train::Trainer& t, memory::GovernorOptions o = {}, std::shared_ptr<memory::RecomputePlanner> planner = nullptr) {
  auto g = std::make_unique<memory::Governor>(o, std::move(planner));
  memory::Governor* raw = g.get();
  t.register_hook(std::move(g));
  return raw;
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
    t.train();
    weights.push_back(params_of(t.model()));
    images.push_back(t.state().images);
    if (inject) decisions = g->decisions(), micro = g->micro_batch(t);
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
}

TEST(Estimate, PredictedPeakIsWithinTenPercentOfRealTrainingSteps) {
  auto monitor = cpu_monitor();
  for (const std::string model : {"yolov8.yaml", "centernet_csp.yaml"}) {
    const Config c = load_config("", tiny_run({"train.steps=4", "train.batch=6", "train.nominal_batch=12"}, model));
    const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    const memory::MemoryEstimate e = memory::estimate_memory(c, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
    const int64_t predicted = e.predicted_peak(6);
    const int64_t base = monitor->sample().allocated;
    train::Trainer t(train::make_trainer_parts(c, c10::Device(c10::kCPU), temp_dir("est-" + model), split, nullptr));
    t.loader().start(0, 0);
    t.run_step();  // the first step allocates lazily created state
    monitor->reset_peak();
    for (int i = 0; i < 2; ++i) t.run_step();
    const int64_t measured = monitor->sample().peak_allocated - base;
    EXPECT_NEAR(double(predicted), double(measured), 0.10 * double(measured))
        << model << ": predicted " << format_bytes(double(predicted)) << ", measured " << format_bytes(double(measured)) << "\n"
        << memory::format_memory_estimate(e);
  }
}

TEST(Estimate, TheTableHasEveryPartAndAllThreeModes) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  const memory::MemoryEstimate e = memory::estimate_memory(c, split, *monitor, int64_t(1) << 30);
  ASSERT_EQ(e.modes.size(), 3u);
  EXPECT_EQ(e.modes[0].name, "fp32");
  EXPECT_TRUE(e.modes[0].configured);
  EXPECT_EQ(e.modes[1].name, "amp bf16");
  EXPECT_EQ(e.modes[2].name, "amp bf16 + recompute all");
  EXPECT_GT(e.fixed.parameters, 0);
  EXPECT_GE(e.fixed.optimizer, e.fixed.gradients);  // SGD momentum, and a step counter per group
  EXPECT_LT(e.fixed.optimizer, e.fixed.gradients + 1024);
  EXPECT_GT(e.fixed.ema, 0);
  for (const auto& m : e.modes) {
    EXPECT_GT(m.per_image, 0) << m.name;
    EXPECT_FALSE(m.stages.empty());
  }
  // Recomputing keeps fewer activations per image than keeping them all.
  double kept = 0, kept_recomputed = 0;
  for (const auto& s : e.modes[1].stages) kept += s.per_image;
  for (const auto& s : e.modes[2].stages) kept_recomputed += s.per_image;
  EXPECT_LT(kept_recomputed, 0.5 * kept);
  const std::string table = memory::format_memory_estimate(e);
  for (const char* part : {"parameters", "gradients", "optimizer state", "EMA", "input buffers", "the step's other 1 batches",
                           "per image", "loss and assigner", "largest batch under", "(stride "})
    EXPECT_NE(table.find(part), std::string::npos) << part << "\n" << table;
}

TEST(AutoBatch, TheChosenBatchFitsAndOneMoreDoesNot) {
  auto monitor = cpu_monitor();
  const Config base = load_config("", tiny_run({"train.batch=auto", "train.nominal_batch=32", "memory.headroom=0.1"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(base, "train"));
  const memory::MemoryEstimate e = memory::estimate_memory(base, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  // A budget that should hold about 6 images.
  const int64_t budget = int64_t(double(e.predicted_peak(6) + e.predicted_peak(7)) / 2 / 0.9) + monitor->sample().allocated;
  const memory::AutoBatch a = memory::choose_batch(base, split, *monitor, budget);
  EXPECT_GE(a.batch, 3);
  EXPECT_LE(a.batch, 12);
  bool chosen_fits = false, next_fails = false;
  for (const auto& [b, peak] : a.tried) {
    if (b == a.batch) chosen_fits = peak >= 0 && peak <= a.estimate.usable;
    if (b == a.batch + 1) next_fails = peak < 0 || peak > a.estimate.usable;
  }
  EXPECT_TRUE(chosen_fits);
  EXPECT_TRUE(next_fails);
  EXPECT_EQ(monitor->sample().limit, 0);  // the probes' limit is lifted again
}

// train.batch=auto loads whole steps of nominal_batch images and the governor cuts them into
// balanced micro-batches: every optimizer step sums exactly nominal_batch images (not
// round(12 / 5) * 5 = 10).
TEST(AutoBatch, EveryStepSumsExactlyNominalBatchImages) {
  auto monitor = cpu_monitor();
  const Config base = load_config("", tiny_run({"train.batch=auto", "train.nominal_batch=12", "train.steps=2", "train.val_every=0"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(base, "train"));
  const memory::MemoryEstimate e = memory::estimate_memory(base, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  const int64_t budget = int64_t(double(e.predicted_peak(5)) / 0.9) + monitor->sample().allocated;
  const memory::AutoBatch a = memory::choose_batch(base, split, *monitor, budget);
  EXPECT_EQ(a.step_batch, 12);
  EXPECT_GE(a.batch, 2);
  EXPECT_LT(a.batch, 12);
  ASSERT_FALSE(a.options.empty());
  EXPECT_EQ(a.options.front().batch, a.batch);
  Config c = base;  // as `trainer train` applies the choice
  c.train.batch = int(a.step_batch);
  c.train.batch_auto = false;
  train::Trainer t(parts_for(c, temp_dir("auto-exact")));
  memory::Governor* g = govern(t);
  g->set_micro_batch(a.batch);
  t.train();
  EXPECT_EQ(t.accumulate(), 1);
  EXPECT_EQ(t.state().step, 2);
  EXPECT_EQ(t.state().images, 24);
}

// The automatic batch verifies a micro-batch by a real step run as the run's later micro-batches
// run, with the earlier ones' gradients allocated: its peak is the real accumulating step's, the
// gradients counted once (adding them to a backward peak that already held them erred 12% high
// on Hourglass-104), and the estimate of that step is within 10% above and 5% below it.
TEST(AutoBatch, TheVerifiedPeakIsTheRealAccumulatingStepsPeak) {
  auto monitor = cpu_monitor();
  const Config base = load_config("", tiny_run({"train.batch=auto", "train.nominal_batch=8", "train.steps=3", "train.val_every=0",
                                                "data.imgsz=64", "data.prefetch=1", "memory.activation_checkpointing=all", "model.scale=n"}, "centernet_csp.yaml"));
  const auto split = std::make_shared<const data::Split>(data::load_split(base, "train"));
  const memory::MemoryEstimate e = memory::estimate_memory(base, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  const int64_t budget = int64_t(double(e.predicted_peak(2)) / 0.9) + monitor->sample().allocated;
  const memory::AutoBatch a = memory::choose_batch(base, split, *monitor, budget);
  ASSERT_LT(a.batch, a.step_batch) << "the test needs an accumulating step";
  int64_t verified = -1;
  for (const auto& [b, peak] : a.tried)
    if (b == a.batch) verified = peak;
  ASSERT_GT(verified, 0);
  Config c = base;
  c.train.batch = int(a.step_batch);
  c.train.batch_auto = false;
  const int64_t before = monitor->sample().allocated;
  train::Trainer t(parts_for(c, temp_dir("auto-verified")));
  govern(t)->set_micro_batch(a.batch);
  int64_t peak = -1;  // of step 2 (the first creates the optimizer state), from its own start
  t.register_hook(std::make_unique<AfterStep>([&](train::Trainer& tr) {
    if (tr.state().step == 2) peak = monitor->sample().peak_allocated;
  }));
  t.train();
  ASSERT_GE(t.state().images, 2 * a.step_batch);
  const int64_t measured = peak - before;
  const std::string figures = "micro-batch " + std::to_string(a.batch) + " of " + std::to_string(a.step_batch) + ": verified " +
                              format_bytes(double(verified)) + ", predicted " +
                              format_bytes(double(a.estimate.predicted_peak(a.batch))) + ", measured " +
                              format_bytes(double(measured)) + ", gradients " + format_bytes(double(a.estimate.fixed.gradients));
  EXPECT_NEAR(double(verified), double(measured), 0.03 * double(measured)) << figures << "\n" << memory::format_memory_estimate(a.estimate);
  EXPECT_LE(double(a.estimate.predicted_peak(a.batch)), 1.10 * double(measured)) << figures;
  EXPECT_GE(double(a.estimate.predicted_peak(a.batch)), 0.95 * double(measured)) << figures;
  std::printf("%s\n", figures.c_str());
}

// With activation checkpointing auto, the micro-batch and the recompute plan are chosen together:
// memory.prefer: batch takes the largest micro-batch any plan fits (more than fit without
// recompute), throughput the highest predicted images per second; both verified by a real step.
TEST(AutoBatch, WithRecomputeAutoTheMicroBatchAndThePlanAreChosenTogether) {
  auto monitor = cpu_monitor();
  const Config plain = load_config("", tiny_run({"train.batch=auto", "train.nominal_batch=32"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(plain, "train"));
  const memory::MemoryEstimate e = memory::estimate_memory(plain, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  const int64_t budget = int64_t(double(e.predicted_peak(4)) / 0.9) + monitor->sample().allocated;
  const int64_t without = memory::choose_batch(plain, split, *monitor, budget).batch;
  std::map<std::string, memory::AutoBatch> chosen;
  for (const std::string prefer : {"throughput", "batch"}) {
    const Config c = load_config("", tiny_run({"train.batch=auto", "train.nominal_batch=32", "memory.activation_checkpointing=auto",
                                               "memory.prefer=" + prefer}));
    const memory::AutoBatch a = memory::choose_batch(c, split, *monitor, budget);
    ASSERT_TRUE(a.planner) << prefer;
    ASSERT_FALSE(a.options.empty()) << prefer;
    EXPECT_EQ(a.options.front().batch, a.batch) << prefer;
    for (const auto& o : a.options) {  // predicted to fit, or confirmed by a real step
      bool confirmed = false;
      for (const auto& [b, peak] : a.tried) confirmed = confirmed || (b == o.batch && peak >= 0 && peak <= a.estimate.usable);
      if (!confirmed) EXPECT_LE(o.predicted_peak, a.estimate.usable) << prefer << " " << o.batch;
    }
    bool verified = false;
    for (const auto& [b, peak] : a.tried)
      if (b == a.batch) verified = peak >= 0 && peak <= a.estimate.usable;
    EXPECT_TRUE(verified) << prefer << ": the choice is confirmed by a real step";
    EXPECT_NE(memory::format_batch_options(a).find("(chosen)"), std::string::npos);
    chosen[prefer] = a;
  }
  const memory::AutoBatch& by_batch = chosen["batch"];
  EXPECT_GT(by_batch.batch, without) << "recompute lets a larger micro-batch fit" << memory::format_batch_options(by_batch);
  EXPECT_NE(by_batch.options.front().plan, "no stage");
  const memory::AutoBatch& by_speed = chosen["throughput"];
  for (const auto& o : by_speed.options)  // the best predicted, unless a real step refused it
    if (o.images_per_second > by_speed.options.front().images_per_second) {
      bool refused = false;
      for (const auto& [b, peak] : by_speed.tried) refused = refused || (b == o.batch && (peak < 0 || peak > by_speed.estimate.usable));
      EXPECT_TRUE(refused) << o.batch << memory::format_batch_options(by_speed);
    }
}

TEST(AutoBatch, OneImageThatDoesNotFitIsAClearError) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.batch=auto"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  try {
    memory::choose_batch(c, split, *monitor, monitor->sample().allocated + (int64_t(1) << 20));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit memory.budget 1.00 MiB"), std::string::npos) << e.what();
  }
}

TEST(Memory, BudgetAndAllocatorKeysParseAndRoundTrip) {
  const Config a = load_config("", {"memory.budget=8GiB", "memory.headroom=0.2", "memory.max_split_size_mb=128",
                                     "memory.expandable_segments=true", "memory.garbage_collection_threshold=0.8"});
  EXPECT_EQ(a.memory.budget.kind, MemoryBudgetSpec::Kind::bytes);
  EXPECT_DOUBLE_EQ(a.memory.budget.value, 8.0 * (1 << 30));
  EXPECT_EQ(memory::allocator_settings(a.memory), "max_split_size_mb:128,garbage_collection_threshold:0.8,expandable_segments:True");
  const Config b = load_config("", {"memory.budget=0.5", "train.batch=auto"});
  EXPECT_EQ(b.memory.budget.kind, MemoryBudgetSpec::Kind::fraction);
  EXPECT_TRUE(b.train.batch_auto);
  const std::string yaml = config_to_yaml(a);
  EXPECT_NE(yaml.find("budget: 8589934592"), std::string::npos) << yaml;
  EXPECT_THROW(load_config("", {"memory.budget=8 apples"}), InputError);
  EXPECT_THROW(load_config("", {"memory.budget=0"}), InputError);
  EXPECT_THROW(load_config("", {"train.batch=automatic"}), InputError);
  EXPECT_EQ(parse_bytes("512MiB").value(), 512.0 * (1 << 20));
  EXPECT_EQ(parse_bytes("8GB").value(), 8e9);
  auto monitor = cpu_monitor();
  EXPECT_THROW(memory::resolve_budget(MemoryBudgetSpec{MemoryBudgetSpec::Kind::bytes, 1e18}, *monitor), InputError);
  EXPECT_GT(memory::resolve_budget(MemoryBudgetSpec{}, *monitor), 0);
}

// Allocated is what the tensors hold; reserved adds the blocks the allocator caches, which
// release_cache returns.
TEST(Memory, TheCpuMonitorReadsTheCachingAllocator) {
  auto monitor = cpu_monitor();
  monitor->release_cache();
  const MemoryStats before = monitor->sample();
  EXPECT_EQ(before.reserved, before.active);
  monitor->reset_peak();
  {
    const at::Tensor t = at::empty({1 << 18}, at::kFloat);
    EXPECT_EQ(monitor->sample().allocated, before.allocated + (1 << 20));
    EXPECT_GE(monitor->sample().active, before.active + (1 << 20));
  }
  EXPECT_EQ(monitor->sample().peak_allocated, before.allocated + (1 << 20));
  EXPECT_EQ(monitor->sample().allocated, before.allocated);
  EXPECT_GE(monitor->sample().reserved, before.reserved + (1 << 20));  // the block is cached
  EXPECT_GT(monitor->sample().fragmentation(), 0);
  monitor->release_cache();
  EXPECT_EQ(monitor->sample().reserved, before.reserved);
  monitor->set_limit(before.reserved + 1024);
  EXPECT_THROW(at::empty({1 << 18}, at::kFloat), c10::OutOfMemoryError);
  monitor->set_limit(0);
  EXPECT_EQ(monitor->sample().ooms, before.ooms + 1);
}

TEST(Memory, ErrorsThatMeanMemoryAreRecognisedAndTheRestAreNot) {
  const auto kind = [](const std::string& text) {
    try {
      TORCH_CHECK(false, text);
    } catch (const c10::Error& e) {
      return memory_failure(e);
    }
    return MemoryFailure::none;
  };
  EXPECT_EQ(kind("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryFailure::out_of_memory);
  EXPECT_EQ(kind("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), MemoryFailure::out_of_memory);
  EXPECT_EQ(kind("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."),
            MemoryFailure::library);
  EXPECT_EQ(kind("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), MemoryFailure::library);
  EXPECT_EQ(kind("GET was unable to find an engine to execute this computation"), MemoryFailure::library);
  EXPECT_EQ(kind("Expected more than 1 value per channel when training"), MemoryFailure::none);
}

TEST(Starvation, SaysWhichStageIsSlowAndWhatToChange) {
  memory::StarvationHook h(memory::StarvationOptions().threshold(0.1));
  memory::EpochDataTime e;
  e.steps = 10, e.wait = 0.5, e.workers = 4, e.decode_busy = 0.95;
  EXPECT_EQ(h.diagnose(e), "");  // 5% waiting: fine
  e.wait = 4;
  EXPECT_NE(h.diagnose(e).find("decode threads are busy 95%"), std::string::npos) << h.diagnose(e);
  EXPECT_NE(h.diagnose(e).find("data.cache: ram"), std::string::npos);
  e.decode_busy = 0.2;
  EXPECT_NE(h.diagnose(e).find("data.prefetch"), std::string::npos) << h.diagnose(e);
  e.workers = 0;
  EXPECT_NE(h.diagnose(e).find("data.workers: 0"), std::string::npos);
}

TEST(Starvation, MeasuresAnEpochOfATraining) {
  const Config c = load_config("", tiny_run({"train.steps=4", "train.val_every=0"}));
  train::Trainer t(parts_for(c, temp_dir("starve")));
  auto hook = std::make_unique<memory::StarvationHook>(memory::StarvationOptions().auto_workers(true).max_workers(2));
  memory::StarvationHook* h = hook.get();
  t.register_hook(std::move(hook));
  t.train();
  EXPECT_GT(h->last_epoch().steps, 0);
  EXPECT_GE(h->last_epoch().wait, 0);
  EXPECT_EQ(h->last_epoch().workers, 1);
  EXPECT_GT(h->last_epoch().decode, 0);
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

TEST(Governor, AllocatorRetriesOnConsecutiveStepsShrinkTheMicroBatch) {
  auto monitor = std::make_shared<ScriptedMonitor>();
  const Config c = load_config("", tiny_run({"train.steps=6"}));
  train::TrainerParts parts = parts_for(c, temp_dir("gov-thrash"));
  parts.monitor = monitor;
  train::Trainer t(std::move(parts));
  memory::Governor* g = govern(t);
  t.register_hook(std::make_unique<Thrash>(*monitor, 2));
  t.train();
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
  // A budget between the peak with every stage recomputed and the peak without.
  const auto unbounded = memory::make_recompute_planner(c, split, *monitor, int64_t(1) << 34);
  const memory::MemoryEstimate& e = unbounded->estimate();
  const int64_t plain = e.predicted_peak(e.modes[0], 8), all = e.predicted_peak(e.modes[1], 8);
  ASSERT_LT(all, plain);
  const int64_t base = monitor->sample().allocated;
  const int64_t budget = base + int64_t(double(all + (plain - all) / 3) / 0.9);
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
  // Training with the plan stays under the budget: no out-of-memory error.
  train::TrainerParts parts = train::make_trainer_parts(c, c10::Device(c10::kCPU), temp_dir("planner"), split, nullptr);
  parts.monitor = monitor;
  train::Trainer t(std::move(parts));
  memory::Governor* g = govern(t, memory::governor_options(c, budget), planner);
  t.train();
  monitor->set_limit(0);
  for (const auto& d : g->decisions()) EXPECT_EQ(d.reason.rfind("out of memory", 0), std::string::npos) << d.action << ": " << d.reason;
  EXPECT_EQ(t.model().recompute_mode(), models::RecomputeMode::stages);
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
  memory::Governor* g = govern(t, memory::governor_options(c, 0));
  const std::string what = climb_to_the_top(t);
  ASSERT_FALSE(what.empty()) << "expected the governor to give up";
  EXPECT_NE(what.find("nothing left to give up: micro-batch 2"), std::string::npos) << what;
  EXPECT_EQ(what.find("value per channel"), std::string::npos) << what;
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

// Host memory is memory. A whole CPU run — steps, validation every epoch, checkpoints — keeps its
// resident memory flat from epoch to epoch; and what the process holds beyond its tensors, when
// it grows (here 48 MiB of plain host memory taken mid-run), comes off the tensors' limit, so the
// budget bounds the process.
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
      if (tr.state().epoch == 3 && held.empty()) held.assign(size_t(48) << 20, 1);  // touched: resident
    }
    void after_epoch(train::Trainer& tr) override {
      rss.push_back(process_memory().rss);
      limits.push_back(tr.monitor()->sample().limit);
    }
  };
  auto recorder = std::make_unique<Recorder>();
  Recorder* r = recorder.get();
  t.register_hook(std::move(recorder));
  t.train();
  ASSERT_EQ(r->rss.size(), 5u);
  // epochs 2 and 3: the first epoch builds the validation cache and warms the libraries
  EXPECT_LE(std::abs(r->rss[2] - r->rss[1]), int64_t(8) << 20) << r->rss[1] << " -> " << r->rss[2];
  EXPECT_GE(r->rss[3] - r->rss[2], int64_t(40) << 20);  // the 48 MiB taken in epoch 4
  EXPECT_LE(r->limits[3], budget - (int64_t(40) << 20)) << "the growth comes off the tensors' limit";
  EXPECT_LE(r->limits[2], budget);
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
