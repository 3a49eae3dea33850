// CUDA graphs of the training step (train/step_graph.h): where runs refuse them, what they need
// of the other parts (ground truth padded to a fixed count with the loss unchanged, learning rates
// read from the device, the recompute plan set again), and on CUDA replayed steps held to eager ones.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>

#include "headroom/core/errors.h"
#include "headroom/core/torch_compat.h"
#include "headroom/interop/init_from.h"
#include "headroom/losses/loss.h"
#include "headroom/memory/governor.h"
#include "headroom/memory/monitor.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/step_graph.h"
#include "headroom/train/trainer.h"
#include "test_util.h"
#include "train_util.h"

#ifdef HEADROOM_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "headroom/core/device.h"
#endif

using namespace headroom;
using namespace headroom::test;

namespace {
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// train.cuda_graphs: auto turns itself off where steps cannot be captured; on is then an error
// that names the key and the reason.
TEST(StepGraph, RunsThatCannotCaptureTheirStepsAreToldWhy) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  const Config sgd = load_config("", tiny_run({"train.optimizer=sgd"}));
  EXPECT_TRUE(has(train::graph_refusal(sgd, cpu, 1), "cpu")) << train::graph_refusal(sgd, cpu, 1);
  EXPECT_EQ(train::resolve_graph_mode(sgd, cpu, 1), train::GraphMode::off);
  const Config on = load_config("", tiny_run({"train.optimizer=sgd", "train.cuda_graphs=on"}));
  const std::string e = thrown([&] { train::resolve_graph_mode(on, cpu, 1); });
  EXPECT_TRUE(has(e, "train.cuda_graphs") && has(e, "cpu") && has(e, "train.cuda_graphs=auto")) << e;
  EXPECT_EQ(train::resolve_graph_mode(load_config("", tiny_run({"train.optimizer=sgd", "train.cuda_graphs=off"})), cuda, 1),
            train::GraphMode::off);
#ifdef HEADROOM_WITH_CUDA
  EXPECT_EQ(train::graph_refusal(sgd, cuda, 1), "");
  EXPECT_EQ(train::resolve_graph_mode(sgd, cuda, 1), train::GraphMode::auto_);
  EXPECT_EQ(train::resolve_graph_mode(on, cuda, 1), train::GraphMode::on);
  EXPECT_TRUE(has(train::graph_refusal(load_config("", tiny_run({"train.optimizer=sgd", "augment.multi_scale=0.5"})), cuda, 1),
                  "augment.multi_scale"));
  EXPECT_TRUE(has(train::graph_refusal(sgd, cuda, 2), "2 processes"));
  for (const char* optimizer : {"adam", "adamw", "rmsprop", "musgd"})  // all read their rates from the device
    EXPECT_EQ(train::graph_refusal(load_config("", tiny_run({std::string("train.optimizer=") + optimizer})), cuda, 1), "") << optimizer;
#else
  EXPECT_TRUE(has(train::graph_refusal(sgd, cuda, 1), "no CUDA")) << train::graph_refusal(sgd, cuda, 1);
#endif
  // The trainer of a CPU run has no step graph, and its forward_backward runs at once.
  train::Trainer t(train::make_trainer_parts(sgd, cpu, temp_dir("graph-cpu")));
  EXPECT_EQ(t.step_graph(), nullptr);
}

// Padding rows change no loss, in any family: the graphs pad ground truth to a bucketed count.
TEST(StepGraph, PaddedGroundTruthLeavesEveryLossAsItWas) {
  const at::Tensor boxes = at::tensor(std::vector<float>{4, 4, 30, 28, 20, 10, 60, 50, 0, 0, 0, 0,  //
                                                         0, 0, 64, 64, 10, 40, 26, 62, 33, 35, 40, 44})
                               .view({2, 3, 4});
  const at::Tensor classes = at::tensor(std::vector<int64_t>{0, 2, -1, 1, 2, 0}).view({2, 3});
  const at::Tensor crowd = at::zeros({2, 3}, at::kBool);
  const losses::Targets t = losses::make_targets(boxes, classes, crowd);
  const losses::Targets p = t.padded(16);
  ASSERT_EQ(p.boxes.size(1), 16);
  EXPECT_EQ(p.mask.sum().item<int64_t>(), t.mask.sum().item<int64_t>());
  EXPECT_EQ(p.classes.narrow(1, 3, 13).eq(-1).all().item<bool>(), true);
  EXPECT_THROW(t.padded(2), c10::Error);
  for (const char* model : {"yolov8.yaml", "yolo26.yaml", "yolov5n.yaml", "centernet_csp.yaml"}) {
    const Config c = load_config("", tiny_run({}, model));
    at::manual_seed(0);
    models::Detector m = interop::run_model(c, 3);
    const models::HeadOutputs out = m->forward(at::rand({2, 3, 64, 64}));
    for (int64_t n : {3, 8, 32}) {
      const auto plain = losses::make_loss(m->info(), losses::loss_options(c)), padded = losses::make_loss(m->info(), losses::loss_options(c));
      const losses::BatchLoss a = losses::batch_loss(*plain, out, t, 64, 64), b = losses::batch_loss(*padded, out, t.padded(n), 64, 64);
      const double total = a.total.sum().item<double>();
      EXPECT_GT(std::abs(total), 0) << model;
      EXPECT_NEAR(b.total.sum().item<double>(), total, 1e-6 * std::abs(total)) << model << " padded to " << n;
      ASSERT_EQ(a.items.size(), b.items.size());
      for (size_t i = 0; i < a.items.size(); ++i)
        EXPECT_NEAR(b.items[i].second.item<double>(), a.items[i].second.item<double>(), 1e-6 * (1 + std::abs(total)))
            << model << " " << a.items[i].first << " padded to " << n;
    }
  }
  // The count is the bucket of the largest seen: it only grows.
  train::StepGraph g(c10::Device(c10::kCPU), train::GraphMode::on);
  EXPECT_EQ(g.padded_boxes(0), 8);
  EXPECT_EQ(g.padded_boxes(3), 8);
  EXPECT_EQ(g.padded_boxes(9), 16);
  EXPECT_EQ(g.padded_boxes(5), 16);
  EXPECT_EQ(g.padded_boxes(33), 64);
}

// Updates that read lr from the device (what a captured update reads), fused (LibTorch 2.4+) or in
// place, step as with lr from the host, and follow load_rates; without it they keep the rate
// loaded last.
TEST(StepGraph, LearningRatesOnTheDeviceStepAsFromTheHost) {
  using train::OptimizerKind;
  for (auto [kind, fused] : std::vector<std::pair<OptimizerKind, bool>>{
           {OptimizerKind::sgd, true}, {OptimizerKind::adam, true}, {OptimizerKind::adamw, true}, {OptimizerKind::sgd, false},
           {OptimizerKind::adam, false}, {OptimizerKind::adamw, false}, {OptimizerKind::rmsprop, false}, {OptimizerKind::musgd, false}}) {
    if (fused && !HEADROOM_HAS_FUSED_OPTIMIZERS) continue;
    at::manual_seed(1);
    const at::Tensor init = at::randn({5, 3});
    std::vector<at::Tensor> params;
    std::vector<std::unique_ptr<train::Optimizer>> opts;
    for (int i = 0; i < 2; ++i) {
      params.push_back(init.clone().requires_grad_());
      train::ParamGroup g;
      g.params = {params.back()};
      g.weight_decay = 1e-3;
      g.muon = kind == OptimizerKind::musgd;  // Muon's half and SGD's
      opts.push_back(std::make_unique<train::Optimizer>(std::vector<train::ParamGroup>{g},
                                                        train::OptimizerOptions().kind(kind).fused(fused)));
    }
    const std::string what = std::string(to_string(kind)) + (opts[0]->fused() ? " fused" : " in place");
    opts[1]->set_rates_on_device();
    for (int step = 0; step < 4; ++step) {
      const at::Tensor grad = at::randn({5, 3});
      for (int i = 0; i < 2; ++i) {
        opts[size_t(i)]->groups()[0].lr = 0.1 / (step + 1);
        params[size_t(i)].mutable_grad() = grad.clone();
      }
      opts[1]->load_rates();
      for (auto& o : opts) o->step();
      EXPECT_LT((params[0] - params[1]).abs().max().item<double>(), 1e-6) << what << " step " << step;
    }
    // lr changes on the host alone: the device steps with the last loaded rate, not with it.
    opts[0]->groups()[0].lr = opts[1]->groups()[0].lr;
    opts[1]->groups()[0].lr = 7;
    for (int i = 0; i < 2; ++i) params[size_t(i)].mutable_grad() = at::ones({5, 3});
    for (auto& o : opts) o->step();
    EXPECT_LT((params[0] - params[1]).abs().max().item<double>(), 1e-6) << what;
  }
}

// A step recorded under one recompute plan runs under it again (the governor sets the plan per
// batch; a captured step runs its parts later).
TEST(StepGraph, TheRecomputeSettingIsSetAgainAsItWas) {
  models::Detector m = interop::run_model(load_config("", tiny_run({})), 3);
  const size_t stages = m->stages().size();
  ASSERT_GE(stages, 2u);
  std::vector<bool> plan(stages, false);
  plan[1] = true;
  m->set_recomputed_stages(plan);
  const auto planned = m->recompute_setting();
  EXPECT_EQ(planned.mode, models::RecomputeMode::stages);
  EXPECT_EQ(planned.stages, plan);
  m->set_recompute(models::RecomputeMode::all);
  const auto all = m->recompute_setting();
  m->restore(planned);
  EXPECT_TRUE(m->recompute_setting() == planned);
  m->restore(all);
  EXPECT_EQ(m->recompute_mode(), models::RecomputeMode::all);
  m->set_recompute(models::RecomputeMode::stages);  // every stage: the flags say so
  EXPECT_EQ(m->recompute_setting().stages, std::vector<bool>(stages, true));
}

#ifdef HEADROOM_WITH_CUDA
namespace {
struct GraphRun {
  std::vector<at::Tensor> weights;
  int64_t captures = 0, replays = 0;
  bool active = false;  // auto: kept the graphs after timing them
};

// One epoch of the small set (6 steps of 4 images, then one of 2) through the governor's
// executor at micro-batch 2, graphs on or off; after step `change_at`, micro-batch 1.
// Every `validate_every` steps (0: never), Trainer::validate as the eval hook calls it.
GraphRun train_with_graphs(const std::string& graphs, const std::string& model, const std::string& amp, int64_t change_at = 0,
                           bool recompute = false, const std::vector<std::string>& extra = {}, int64_t validate_every = 0) {
  const c10::Device cuda(c10::kCUDA, 0);
  struct Deterministic {  // cuDNN's own run-to-run differences out of the comparison
    bool before = at::globalContext().deterministicCuDNN();
    Deterministic() { at::globalContext().setDeterministicCuDNN(true); }
    ~Deterministic() { at::globalContext().setDeterministicCuDNN(before); }
  } deterministic;
  std::vector<std::string> overrides = {"device=cuda", "train.steps=7", "train.nominal_batch=4", "train.val_every=0",
                                        "train.warmup_epochs=0", "train.optimizer=sgd", "train.amp=" + amp,
                                        "train.cudnn_benchmark=off", "augment.mosaic=0", "train.cuda_graphs=" + graphs};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  const Config c = load_config("", tiny_run(overrides, model));
  at::manual_seed(0);
  train::TrainerParts parts = train::make_trainer_parts(c, cuda, temp_dir("graphs"));
  parts.monitor = memory::make_memory_monitor(cuda);
  train::Trainer t(std::move(parts));
  if (recompute) t.model().set_recompute(models::RecomputeMode::stages);
  auto governor = std::make_unique<memory::Governor>(memory::GovernorOptions());
  governor->set_micro_batch(2);
  memory::Governor* g = governor.get();
  t.set_executor(g);
  t.register_hook(std::move(governor));
  struct Change : train::Hook {
    memory::Governor* g;
    int64_t at;
    Change(memory::Governor* g, int64_t at) : g(g), at(at) {}
    void after_step(train::Trainer& tr) override {
      if (tr.state().step == at) g->set_micro_batch(1);
    }
  };
  t.register_hook(std::make_unique<Change>(g, change_at));
  struct Validate : train::Hook {
    int64_t every;
    explicit Validate(int64_t every) : every(every) {}
    void after_step(train::Trainer& tr) override {
      if (every > 0 && tr.state().step % every == 0) tr.validate();
    }
  };
  t.register_hook(std::make_unique<Validate>(validate_every));
  t.train();
  GraphRun r;
  r.weights = params_of(t.model());
  if (t.step_graph()) r.captures = t.step_graph()->captures(), r.replays = t.step_graph()->replays(), r.active = t.step_graph()->active();
  return r;
}
}  // namespace

// Replayed steps train as eager ones: the same weights after an epoch (cuDNN's own
// non-determinism aside), in every loss family and with fp16's loss scaler; two eager steps of a
// shape, then a capture whose replay is the third step, replays, and the epoch's smaller last step
// eager again.
TEST(StepGraph, ReplayedStepsTrainAsEagerOnes) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  struct Case {
    std::string model, amp, optimizer;
  };
  for (const Case& k : std::vector<Case>{{"yolov8.yaml", "off", "sgd"},
                                         {"yolov8.yaml", "fp16", "sgd"},
                                         {"yolo26.yaml", "off", "sgd"},
                                         {"yolov5n.yaml", "off", "sgd"},
                                         {"centernet_csp.yaml", "off", "sgd"},
                                         {"yolov8.yaml", "fp16", "adamw"},
                                         {"yolo26.yaml", "off", "musgd"},  // in place: Newton-Schulz in the graph
                                         {"yolov8.yaml", "fp16", "rmsprop"}}) {
    const std::string what = k.model + " " + k.amp + " " + k.optimizer;
    const GraphRun graphed = train_with_graphs("on", k.model, k.amp, 0, false, {"train.optimizer=" + k.optimizer}),
                   eager = train_with_graphs("off", k.model, k.amp, 0, false, {"train.optimizer=" + k.optimizer});
    EXPECT_EQ(graphed.captures, 1) << what;
    EXPECT_EQ(graphed.replays, 4) << what;  // steps 3 (the capture's) to 6
    EXPECT_EQ(eager.captures, 0);
    EXPECT_LT(relative_difference(graphed.weights, eager.weights), k.amp == "off" ? 1e-5 : 1e-3) << what;
  }
}

// The governor changing the micro-batch gives a new graph, never a wrong step: after step 3 the
// parts are other shapes, which run eagerly twice and are captured again at step 6.
TEST(StepGraph, ANewMicroBatchIsCapturedAgain) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const GraphRun graphed = train_with_graphs("on", "yolov8.yaml", "off", 3), eager = train_with_graphs("off", "yolov8.yaml", "off", 3);
  EXPECT_EQ(graphed.captures, 2);
  EXPECT_EQ(graphed.replays, 1);  // the second graph's own step (6); 7 is the epoch's smaller step
  EXPECT_LT(relative_difference(graphed.weights, eager.weights), 1e-5);
}

// Steps that recompute activations run eagerly (the recomputation saves and sets the random
// generators' state, which a capture cannot), and train as with graphs off.
TEST(StepGraph, StepsThatRecomputeRunEagerly) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const GraphRun graphed = train_with_graphs("on", "yolov8.yaml", "off", 0, true),
                 eager = train_with_graphs("off", "yolov8.yaml", "off", 0, true);
  EXPECT_EQ(graphed.captures, 0);
  EXPECT_LT(relative_difference(graphed.weights, eager.weights), 1e-6);
}

// Validation runs without the graph's pool beside it (the estimate counts no such sum): the graph
// is given back before it, and the next step, of the same shapes, is captured again at once.
// Steps 1-2 eager, 3 captured, 4 replayed, validation, 5 captured, 6 replayed, 7 (2 images) eager.
TEST(StepGraph, ValidationGivesTheGraphBack) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const GraphRun graphed = train_with_graphs("on", "yolov8.yaml", "off", 0, false, {}, 4),
                 eager = train_with_graphs("off", "yolov8.yaml", "off", 0, false, {}, 4);
  EXPECT_EQ(graphed.captures, 2);
  EXPECT_EQ(graphed.replays, 2);  // since the last capture: its own step (5) and 6
  EXPECT_LT(relative_difference(graphed.weights, eager.weights), 1e-5);
}

// A cuDNN failure inside a capture, which the governor elsewhere takes for an out-of-memory
// error in disguise, is the capture's: the same step had just run eagerly. auto trains eagerly
// from then on (the step runs again, eagerly); on stops the run, naming it.
TEST(StepGraph, ACudnnFailureInACaptureIsTheCapturesNotTheGovernors) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  for (const train::GraphMode mode : {train::GraphMode::auto_, train::GraphMode::on}) {
    train::StepGraph g(cuda, mode);
    const at::Tensor x = at::zeros({4}, at::TensorOptions().device(cuda));
    int calls = 0;
    const std::function<void()> step = [&] {
      TORCH_CHECK(++calls != 3, "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR");  // the third call is the capture
      x.add_(1);
    };
    EXPECT_EQ(g.run("k", {x}, step), train::StepGraph::Ran::eager);
    EXPECT_EQ(g.run("k", {x}, step), train::StepGraph::Ran::eager);
    if (mode == train::GraphMode::on) {
      const std::string what = thrown([&] { g.run("k", {x}, step); });
      EXPECT_TRUE(has(what, "train.cuda_graphs=on") && has(what, "CUDNN_STATUS_INTERNAL_ERROR")) << what;
      continue;
    }
    EXPECT_EQ(g.run("k", {x}, step), train::StepGraph::Ran::eager);  // the capture failed; the step ran eagerly
    EXPECT_FALSE(g.active());
    EXPECT_EQ(g.captures(), 0);
    EXPECT_EQ(x.sum().item<float>(), 12.0f);  // three steps ran, each once
  }
}

// An epoch's smaller last step runs eagerly; the next epoch's first step, whose shapes were
// captured before, is captured again at once: steps 1-2 eager, 3 captured, 4-6 replayed, 7 eager,
// 8 captured, 9-13 replayed, 14 eager.
TEST(StepGraph, TheNextEpochIsCapturedAtItsFirstStep) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const GraphRun graphed = train_with_graphs("on", "yolov8.yaml", "off", 0, false, {"train.steps=14"}),
                 eager = train_with_graphs("off", "yolov8.yaml", "off", 0, false, {"train.steps=14"});
  EXPECT_EQ(graphed.captures, 2);
  EXPECT_EQ(graphed.replays, 6);  // 8 to 13
  EXPECT_LT(relative_difference(graphed.weights, eager.weights), 1e-5);
}

// YOLO26's branch weight moves each epoch (0.8, then 0.1 in a 2-epoch run) and is read by the
// graph from the device: with steps of 2 images (13 a epoch, none smaller) one capture serves
// both epochs (steps 3 to 26), and the second epoch trains with its own weight, as eagerly.
TEST(StepGraph, OneGraphServesYolo26sEpochsWithEachEpochsBranchWeight) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const std::vector<std::string> two_epochs = {"train.batch=2", "train.nominal_batch=2", "train.steps=26"};
  const GraphRun graphed = train_with_graphs("on", "yolo26.yaml", "off", 0, false, two_epochs),
                 eager = train_with_graphs("off", "yolo26.yaml", "off", 0, false, two_epochs);
  EXPECT_EQ(graphed.captures, 1);
  EXPECT_EQ(graphed.replays, 24);
  EXPECT_LT(relative_difference(graphed.weights, eager.weights), 1e-5);
}

// auto times three replays against the eager step before the capture (steps 4-6) and decides
// once: kept, the next epoch is captured at its first step (8) and replayed to 13; dropped, the
// run trains eagerly from step 7 on. Either way it trains as eagerly.
TEST(StepGraph, AutoDecidesOnceAndTrainsAsEager) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const GraphRun automatic = train_with_graphs("auto", "yolov8.yaml", "off", 0, false, {"train.steps=14"}),
                 eager = train_with_graphs("off", "yolov8.yaml", "off", 0, false, {"train.steps=14"});
  std::printf("auto %s the graphs: %lld captures, %lld replays since the last\n", automatic.active ? "kept" : "dropped",
              (long long)automatic.captures, (long long)automatic.replays);
  EXPECT_EQ(automatic.captures, automatic.active ? 2 : 1);
  EXPECT_EQ(automatic.replays, automatic.active ? 6 : 4);
  EXPECT_LT(relative_difference(automatic.weights, eager.weights), 1e-5);
}

// Replays never sync the host; each batch's box count (1 to 5) is padded to one shape.
TEST(StepGraph, ReplaysNeverSyncTheHost) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  for (const char* model : {"yolov8.yaml", "yolo26.yaml", "centernet_csp.yaml"}) {
    const Config c = load_config("", tiny_run({"device=cuda", "train.log_every=1000", "train.steps=1000", "train.nominal_batch=4",
                                               "train.warmup_epochs=0", "train.optimizer=sgd", "train.cuda_graphs=on",
                                               "augment.mosaic=0", "augment.fliplr=0.5", "augment.hsv_v=0.4"},
                                              model));
    train::TrainerParts parts = train::make_trainer_parts(c, cuda, temp_dir("graph-sync"));
    parts.monitor = memory::make_memory_monitor(cuda);
    train::Trainer t(std::move(parts));
    auto governor = std::make_unique<memory::Governor>(memory::GovernorOptions());
    t.set_executor(governor.get());
    t.register_hook(std::move(governor));
    t.loader().start(0, 0);
    while (t.step_graph()->captures() == 0 && t.state().step < 5) t.run_step();
    ASSERT_EQ(t.step_graph()->captures(), 1) << model;
    const int64_t before = t.step_graph()->replays(), steps = 6 - t.state().step;  // the epoch's full steps left
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      for (int64_t i = 0; i < steps; ++i) t.run_step();
    } catch (...) {
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
      throw;
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    EXPECT_EQ(t.step_graph()->replays() - before, steps) << model;
  }
}
#endif
