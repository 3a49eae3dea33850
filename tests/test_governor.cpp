// The memory governor, the estimator and the automatic batch size on the CPU, where the
// counting allocator enforces budgets and injects out-of-memory errors at exact points.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/data/dataset.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/estimate.h"
#include "headroom/memory/governor.h"
#include "headroom/memory/starvation.h"
#include "train_util.h"

using namespace headroom;
using namespace headroom::test;

namespace {

std::shared_ptr<memory::MemoryMonitor> cpu_monitor() { return memory::make_memory_monitor(c10::Device(c10::kCPU)); }

// Strikes an out-of-memory error `after` allocations into the forward of step `step` (the
// first attempt, or every attempt when `every`).
void inject_at(train::Trainer& t, int64_t step, int64_t after, bool every = false) {
  auto fired = std::make_shared<bool>(false);
  t.set_phase_observer([&t, step, after, every, fired](const char* phase) {
    if (std::string(phase) == "input" && t.state().step == step && (every || !*fired)) {
      *fired = true;
      memory::CountingCpuAllocator::install().inject_oom_after(after);
    }
  });
}

double relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    largest = std::max(largest, b[i].abs().max().item<double>());
  }
  return worst / std::max(largest, 1e-12);
}

std::vector<at::Tensor> buffers_of(models::DetectorImpl& m) {
  std::vector<at::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

}  // namespace

TEST(Governor, AnOomAtStepKEndsWithTheWeightsOfTheSmallerMicroBatchFromTheStart) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=6", "train.warmup_epochs=0", "train.ema=true"}));
  std::vector<std::vector<at::Tensor>> weights;
  std::vector<train::TrainState> states;
  for (bool inject : {true, false}) {
    train::TrainerParts parts = parts_for(c, temp_dir(inject ? "gov-oom" : "gov-small"));
    parts.loss = std::make_unique<PerImageSumLoss>();  // sums over images: split-invariant
    train::Trainer t(std::move(parts));
    t.register_hook(std::make_unique<EvalModeBatchNorm>());  // batch statistics independent of the split
    t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
    if (inject)
      inject_at(t, 3, 200);
    else
      t.set_micro_batch(2);
    t.train();
    weights.push_back(params_of(t.model()));
    states.push_back(t.state());
  }
  EXPECT_EQ(states[0].step, 6);
  EXPECT_EQ(states[0].images, states[1].images);  // no sample lost or repeated
  EXPECT_EQ(states[0].micro_batch, 2);
  ASSERT_EQ(states[0].memory_decisions.size(), 1u);
  EXPECT_EQ(states[0].memory_decisions[0].step, 4);
  EXPECT_EQ(states[0].memory_decisions[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(states[0].memory_decisions[0].reason.find("injected"), std::string::npos);
  EXPECT_LE(relative_difference(weights[0], weights[1]), 1e-5);
}

TEST(Governor, AnOomInTheFirstForwardIsUndoneExactlyWithTheRealLossAndBatchNorm) {
  // The failed attempt has already updated some BatchNorm statistics; the re-run must not see them.
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=3", "train.warmup_epochs=0"}));
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> out;
  for (bool inject : {true, false}) {
    train::Trainer t(parts_for(c, temp_dir(inject ? "gov-first-oom" : "gov-first-small")));
    t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
    if (inject)
      inject_at(t, 0, 400);
    else
      t.set_micro_batch(2);
    t.train();
    EXPECT_EQ(t.micro_batch(), 2);
    out.emplace_back(params_of(t.model()), buffers_of(t.model()));
  }
  for (size_t i = 0; i < out[0].first.size(); ++i) ASSERT_TRUE(at::equal(out[0].first[i], out[1].first[i])) << "parameter " << i;
  for (size_t i = 0; i < out[0].second.size(); ++i) ASSERT_TRUE(at::equal(out[0].second[i], out[1].second[i])) << "buffer " << i;
}

TEST(Governor, TheLadderHalvesCheckpointsSwitchesAmpThenStopsWithTheTable) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=2", "train.warmup_epochs=0"}));
  train::Trainer t(parts_for(c, temp_dir("gov-ladder")));
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
  inject_at(t, 0, 100, /*every=*/true);
  try {
    t.train();
    FAIL() << "expected the governor to give up";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("nothing left to give up"), std::string::npos) << what;
    EXPECT_NE(what.find("parameters"), std::string::npos) << what;
    EXPECT_NE(what.find("data.imgsz=32"), std::string::npos) << what;
  }
  std::vector<std::string> actions;
  for (const auto& d : t.state().memory_decisions) actions.push_back(d.action);
  EXPECT_EQ(actions, (std::vector<std::string>{"micro_batch 4 -> 2", "micro_batch 2 -> 1", "activation_checkpointing all", "amp bf16"}));
  EXPECT_EQ(t.state().step, 0);
}

TEST(Governor, WithoutAmpAllowedTheLadderStopsAfterCheckpointing) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=2", "train.batch=2", "memory.allow_amp=false"}));
  train::Trainer t(parts_for(c, temp_dir("gov-no-amp")));
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::governor_options(c, 0)));
  inject_at(t, 0, 100, true);
  EXPECT_THROW(t.train(), Error);
  ASSERT_EQ(t.state().memory_decisions.size(), 2u);
  EXPECT_EQ(t.state().memory_decisions.back().action, "activation_checkpointing all");
  EXPECT_EQ(t.amp(), AmpMode::off);
}

TEST(Governor, DecisionsAreSavedInCheckpointsAndResumeKeepsThem) {
  auto monitor = cpu_monitor();
  const std::string dir = temp_dir("gov-resume");
  const Config c = load_config("", tiny_run({"train.steps=2"}));
  {
    train::Trainer t(parts_for(c, dir));
    t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
    inject_at(t, 1, 150);
    t.train();
    ASSERT_EQ(t.micro_batch(), 2);
    t.save_checkpoint(dir + "/last.pt");
  }
  train::Trainer r(parts_for(c, dir));
  EXPECT_EQ(r.micro_batch(), 4);
  r.load_checkpoint(dir + "/last.pt");
  EXPECT_EQ(r.micro_batch(), 2);
  ASSERT_EQ(r.state().memory_decisions.size(), 1u);
  EXPECT_EQ(r.state().memory_decisions[0].step, 2);
  EXPECT_EQ(r.state().memory_decisions[0].action, "micro_batch 4 -> 2");
}

TEST(Governor, ValidationOutOfMemoryHalvesTheValidationBatchWithTheSameResult) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=1"}));
  train::Trainer t(parts_for(c, temp_dir("gov-val")));
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
  const auto clean = t.validate();
  ASSERT_TRUE(clean);
  memory::CountingCpuAllocator::install().inject_oom_after(300);
  const auto governed = t.validate();
  ASSERT_TRUE(governed);
  ASSERT_EQ(t.state().memory_decisions.size(), 1u);
  EXPECT_EQ(t.state().memory_decisions[0].action.rfind("validation batch ", 0), 0u) << t.state().memory_decisions[0].action;
  for (size_t i = 0; i < clean->stats.size(); ++i) EXPECT_NEAR(governed->stats[i], clean->stats[i], 1e-9) << i;
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
  t.register_hook(std::make_unique<memory::GovernorHook>(
      monitor, memory::GovernorOptions().budget(base + int64_t(double(peak) * 1.05)).headroom(0.10)));
  t.train();
  monitor->set_limit(0);
  ASSERT_FALSE(t.state().memory_decisions.empty());
  EXPECT_EQ(t.state().memory_decisions[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(t.state().memory_decisions[0].reason.find("crossed budget - headroom"), std::string::npos);
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
  EXPECT_EQ(e.modes[2].name, "amp bf16 + checkpointing all");
  EXPECT_GT(e.fixed.parameters, 0);
  EXPECT_GE(e.fixed.optimizer, e.fixed.gradients);  // SGD momentum, and a step counter per group
  EXPECT_LT(e.fixed.optimizer, e.fixed.gradients + 1024);
  EXPECT_GT(e.fixed.ema, 0);
  for (const auto& m : e.modes) {
    EXPECT_GT(m.per_image, 0) << m.name;
    EXPECT_FALSE(m.stages.empty());
  }
  // Checkpointing keeps fewer activations per image than keeping them all.
  double kept = 0, kept_checkpointed = 0;
  for (const auto& s : e.modes[1].stages) kept += s.per_image;
  for (const auto& s : e.modes[2].stages) kept_checkpointed += s.per_image;
  EXPECT_LT(kept_checkpointed, 0.5 * kept);
  const std::string table = memory::format_memory_estimate(e);
  for (const char* part : {"parameters", "gradients", "optimizer state", "EMA", "input buffers", "per image", "loss and assigner",
                           "largest batch under", "(stride "})
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

TEST(Memory, TheCpuMonitorReadsTheCountingAllocator) {
  auto monitor = cpu_monitor();
  const memory::MemoryStats before = monitor->sample();
  monitor->reset_peak();
  {
    const at::Tensor t = at::empty({1 << 18}, at::kFloat);
    EXPECT_EQ(monitor->sample().allocated, before.allocated + (1 << 20));
  }
  EXPECT_EQ(monitor->sample().peak_allocated, before.allocated + (1 << 20));
  EXPECT_EQ(monitor->sample().fragmentation(), 0);
  monitor->set_limit(before.allocated + 1024);
  EXPECT_THROW(at::empty({1 << 18}, at::kFloat), c10::OutOfMemoryError);
  monitor->set_limit(0);
  EXPECT_EQ(monitor->sample().ooms, before.ooms + 1);
}

TEST(Starvation, SaysWhichStageIsSlowAndWhatToChange) {
  memory::StarvationHook h(memory::StarvationOptions().threshold(0.1));
  const Config c = load_config("", {});
  memory::EpochDataTime e;
  e.steps = 10, e.wait = 0.5, e.workers = 4, e.decode_busy = 0.95;
  EXPECT_EQ(h.diagnose(e, c), "");  // 5% waiting: fine
  e.wait = 4;
  EXPECT_NE(h.diagnose(e, c).find("decode threads are busy 95%"), std::string::npos) << h.diagnose(e, c);
  EXPECT_NE(h.diagnose(e, c).find("data.cache: ram"), std::string::npos);
  e.decode_busy = 0.2;
  EXPECT_NE(h.diagnose(e, c).find("data.prefetch"), std::string::npos) << h.diagnose(e, c);
  e.workers = 0;
  EXPECT_NE(h.diagnose(e, c).find("data.workers: 0"), std::string::npos);
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
class ScriptedMonitor final : public memory::MemoryMonitor {
 public:
  ScriptedMonitor() : MemoryMonitor(c10::Device(c10::kCPU)) {}
  memory::MemoryStats sample() const override { return stats; }
  void reset_peak() override {}
  int64_t capacity() const override { return int64_t(1) << 34; }
  int64_t available() const override { return int64_t(1) << 33; }
  void set_limit(int64_t) override {}
  void release_cache() override { ++released; }
  memory::MemoryStats stats;
  int released = 0;
};

// Raises the scripted retry count after every step from `from` on.
class Thrash : public train::Hook {
 public:
  Thrash(ScriptedMonitor& m, int64_t from) : m_(m), from_(from) {}
  void after_step(train::Trainer& t) override {
    if (t.state().step >= from_) ++m_.stats.alloc_retries;
  }

 private:
  ScriptedMonitor& m_;
  int64_t from_;
};
}  // namespace

TEST(Governor, AllocatorRetriesOnConsecutiveStepsShrinkTheMicroBatch) {
  auto monitor = std::make_shared<ScriptedMonitor>();
  const Config c = load_config("", tiny_run({"train.steps=6"}));
  train::Trainer t(parts_for(c, temp_dir("gov-thrash")));
  t.register_hook(std::make_unique<Thrash>(*monitor, 2));  // runs before the governor's after_step
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::GovernorOptions()));
  t.train();
  // New retries after steps 2 and 3 shrink from step 4; the count starts again, so the retries
  // after steps 4 and 5 shrink once more, from step 6.
  ASSERT_EQ(t.state().memory_decisions.size(), 2u);
  EXPECT_EQ(t.state().memory_decisions[0].step, 4);
  EXPECT_EQ(t.state().memory_decisions[0].action, "micro_batch 4 -> 2");
  EXPECT_NE(t.state().memory_decisions[0].reason.find("retried on 2 steps in a row"), std::string::npos);
  EXPECT_EQ(t.state().memory_decisions[1].step, 6);
  EXPECT_EQ(t.state().memory_decisions[1].action, "micro_batch 2 -> 1");
  EXPECT_GE(monitor->released, 1);
}

TEST(Governor, GrowsBackAfterAStableStretch) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=6", "memory.grow_after=2"}));
  train::Trainer t(parts_for(c, temp_dir("gov-grow")));
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::governor_options(c, int64_t(1) << 32)));
  inject_at(t, 1, 200);
  t.train();
  ASSERT_EQ(t.state().memory_decisions.size(), 2u);
  EXPECT_EQ(t.state().memory_decisions[0].action, "micro_batch 4 -> 2");
  EXPECT_EQ(t.state().memory_decisions[1].action, "micro_batch 2 -> 4");
  EXPECT_EQ(t.state().memory_decisions[1].step, 4);
  monitor->set_limit(0);
}

TEST(Planner, CheckpointsTheFewestStagesThatFitAndTheRunStaysUnderBudget) {
  auto monitor = cpu_monitor();
  const Config c = load_config("", tiny_run({"train.steps=3", "train.batch=8", "train.nominal_batch=8", "data.imgsz=128"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  // A budget between the peak with every stage checkpointed and the peak without.
  const auto unbounded = memory::make_checkpoint_planner(c, split, *monitor, int64_t(1) << 34);
  const memory::MemoryEstimate& e = unbounded->estimate();
  const int64_t plain = e.predicted_peak(e.modes[0], 8), all = e.predicted_peak(e.modes[1], 8);
  ASSERT_LT(all, plain);
  const int64_t base = monitor->sample().allocated;
  const int64_t budget = base + int64_t(double(all + (plain - all) / 3) / 0.9);
  const auto planner = memory::make_checkpoint_planner(c, split, *monitor, budget);
  const memory::StagePlan& p = planner->plan(128, 8);
  const auto on = std::count(p.checkpointed.begin(), p.checkpointed.end(), true);
  EXPECT_GT(on, 0);
  EXPECT_LT(size_t(on), p.checkpointed.size());
  EXPECT_TRUE(p.fits);
  EXPECT_LT(p.recompute_seconds, p.recompute_all_seconds);
  EXPECT_NE(planner->describe(p, 128, 8).find("recompute +"), std::string::npos);
  // A smaller input needs fewer stages (activations scale with the area).
  const memory::StagePlan& small = planner->plan(64, 8);
  EXPECT_LE(std::count(small.checkpointed.begin(), small.checkpointed.end(), true), on);
  // Training with the plan stays under the budget: no out-of-memory error.
  train::Trainer t(train::make_trainer_parts(c, c10::Device(c10::kCPU), temp_dir("planner"), split, nullptr));
  t.set_checkpoint_planner([planner](int64_t size, int64_t micro) { return planner->plan(size, micro).checkpointed; });
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::governor_options(c, budget)));
  t.train();
  monitor->set_limit(0);
  for (const auto& d : t.state().memory_decisions) EXPECT_EQ(d.reason.rfind("out of memory", 0), std::string::npos) << d.action << ": " << d.reason;
  EXPECT_EQ(t.model().activation_checkpointing(), CheckpointMode::stages);
}

TEST(Governor, CudaBudgetIsEnforcedAndAnOomThereIsRecovered) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  std::shared_ptr<memory::MemoryMonitor> monitor = memory::make_memory_monitor(cuda);
  Config c = load_config("", tiny_run({"train.steps=4", "train.batch=32", "train.nominal_batch=32", "data.imgsz=128", "device=cuda"}));
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  // What a step of 32 needs, measured; then a budget that holds about a third of its activations.
  const memory::MemoryEstimate e = memory::estimate_memory(c, split, *monitor, 0, memory::EstimateOptions().all_modes(false));
  const memory::ModeEstimate& m = e.configured();
  const int64_t budget = monitor->sample().reserved + int64_t(m.fixed + m.per_image * 12) + (int64_t(64) << 20);
  at::manual_seed(0);
  train::Trainer t(train::make_trainer_parts(c, cuda, temp_dir("gov-cuda"), split, nullptr));
  t.register_hook(std::make_unique<memory::GovernorHook>(monitor, memory::governor_options(c, budget)));
  t.train();
  monitor->set_limit(0);
  EXPECT_EQ(t.state().step, 4);
  ASSERT_FALSE(t.state().memory_decisions.empty());
  EXPECT_LT(t.micro_batch(), 32);
  EXPECT_LE(monitor->sample().peak_reserved, budget + (int64_t(2) << 20));
}
