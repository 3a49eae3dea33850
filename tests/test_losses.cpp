#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "headroom/losses/assigner.h"
#include "headroom/losses/box_ops.h"
#include "headroom/losses/centernet.h"
#include "headroom/losses/loss.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/measure.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::losses;

namespace {

at::Tensor floats(std::vector<float> v) { return at::tensor(v); }
at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v); }

models::DetectorInfo yolov8_info(int64_t nc) {
  models::DetectorInfo i;
  i.family = "yolov8";
  i.nc = nc;
  i.reg_max = 16;
  i.strides = {8, 16, 32};
  return i;
}

// The deterministic YOLOv8 head output and targets of the Ultralytics 8.4 reference run
// (the numbers below were produced by its TaskAlignedAssigner, BboxLoss and BCE on these inputs).
models::HeadOutputs reference_yolov8_output(int64_t B, int64_t nc, int64_t S) {
  std::vector<at::Tensor> feats;
  int64_t l = 0;
  for (int64_t s : {8, 16, 32}) {
    const int64_t h = S / s, w = S / s;
    const at::Tensor ch = at::arange(64 + nc, at::kDouble).view({1, -1, 1, 1});
    const at::Tensor y = at::arange(h, at::kDouble).view({1, 1, -1, 1}), x = at::arange(w, at::kDouble).view({1, 1, 1, -1});
    const at::Tensor b = at::arange(B, at::kDouble).view({-1, 1, 1, 1});
    feats.push_back((0.1 * at::sin(0.3 * ch + 0.7 * y + 1.1 * x + 0.5 * b + double(l++))).to(at::kFloat));
  }
  return {{"pred", feats}};
}

Targets reference_targets() {
  Targets t;
  t.boxes = floats({4.f, 4, 30, 28, 20, 10, 60, 50, 33, 35, 40, 40, 0, 0, 0, 0,
                        0, 0, 64, 64, 10, 40, 26, 62, 0, 0, 0, 0, 0, 0, 0, 0}).view({2, 4, 4});
  t.classes = longs({0, 1, 2, 0, 1, 2, 0, 0}).view({2, 4});
  t.mask = longs({1, 1, 1, 0, 1, 1, 0, 0}).to(at::kBool).view({2, 4});
  return t;
}

double item(const BatchLoss& l, const std::string& name) {
  for (const auto& [n, v] : l.items)
    if (n == name) return v.item<double>();
  ADD_FAILURE() << "no loss term " << name;
  return 0;
}

}  // namespace

TEST(BoxOps, IouAndCiouOnKnownBoxes) {
  const at::Tensor a = floats({0.f, 0, 10, 10}).view({1, 4}), b = floats({5.f, 0, 15, 10}).view({1, 4});
  EXPECT_NEAR(box_iou(a, b).item<float>(), 50.0 / 150.0, 1e-6);
  EXPECT_NEAR(ciou(a, a).item<float>(), 1.0, 1e-6);
  // Same size, shifted by half a width: IoU 1/3, centres 5 apart, enclosing diagonal^2 = 15^2 + 10^2.
  EXPECT_NEAR(ciou(a, b).item<float>(), 1.0 / 3 - 25.0 / 325.0, 1e-5);
  EXPECT_TRUE(at::allclose(xywh_to_xyxy(xyxy_to_xywh(b)), b));
}

TEST(Assigner, MatchesTheUltralyticsReference) {
  const int64_t B = 2, nc = 3;
  const auto out = reference_yolov8_output(B, nc, 64);
  const Targets t = reference_targets();
  const BatchLoss l = batch_loss(*make_loss(yolov8_info(nc), LossOptions{}), out, t, 64, 64);
  EXPECT_NEAR(item(l, "box"), 5.812448412, 1e-4);
  EXPECT_NEAR(item(l, "cls"), 46.448352814, 1e-3);
  EXPECT_NEAR(item(l, "dfl"), 4.174154878, 1e-4);
  EXPECT_NEAR(l.total.item<double>(), (5.812448412 + 46.448352814 + 4.174154878) * B, 5e-3);
}

TEST(Assigner, ChunkingDoesNotChangeTheResult) {
  at::manual_seed(3);
  const int64_t B = 2, A = 300, C = 4, N = 37;
  const at::Tensor anchors = at::rand({A, 2}) * 100;
  const at::Tensor centres = at::rand({B, A, 2}) * 100, sizes = at::rand({B, A, 2}) * 30 + 2;
  const at::Tensor pd_boxes = at::cat({centres - sizes / 2, centres + sizes / 2}, -1);
  const at::Tensor scores = at::rand({B, A, C});
  const at::Tensor gc = at::rand({B, N, 2}) * 100, gs = at::rand({B, N, 2}) * 40 + 4;
  const at::Tensor gt = at::cat({gc - gs / 2, gc + gs / 2}, -1);
  const at::Tensor labels = at::randint(0, C, {B, N}, at::kLong), mask = at::rand({B, N}).lt(0.8);
  AssignerOptions whole, chunked;
  chunked.chunk_elements = B * A * 5;  // five boxes at a time
  const Assignment a = task_aligned_assign(scores, pd_boxes, anchors, labels, gt, mask, whole);
  const Assignment b = task_aligned_assign(scores, pd_boxes, anchors, labels, gt, mask, chunked);
  EXPECT_TRUE(at::equal(a.fg_mask, b.fg_mask));
  EXPECT_TRUE(at::equal(a.target_gt_idx, b.target_gt_idx));
  EXPECT_TRUE(at::allclose(a.target_scores, b.target_scores));
  EXPECT_GT(a.fg_mask.sum().item<int64_t>(), 20);
}

TEST(Assigner, KnownLayouts) {
  // Two anchors inside one box, one inside two boxes: it goes to the box it overlaps more.
  const at::Tensor anchors = floats({10.f, 10, 30, 10, 60, 60}).view({3, 2});
  const at::Tensor pd = floats({0.f, 0, 20, 20, 20, 0, 40, 20, 50, 50, 70, 70}).view({1, 3, 4});
  const at::Tensor scores = at::full({1, 3, 2}, 0.5);
  const at::Tensor gt = floats({0.f, 0, 40, 20, 25, 0, 45, 25}).view({1, 2, 4});
  const at::Tensor labels = longs({0, 1}).view({1, 2}), mask = at::ones({1, 2}, at::kBool);
  const Assignment a = task_aligned_assign(scores, pd, anchors, labels, gt, mask);
  EXPECT_TRUE(a.fg_mask[0][0].item<bool>());
  EXPECT_TRUE(a.fg_mask[0][1].item<bool>());
  EXPECT_FALSE(a.fg_mask[0][2].item<bool>());       // outside every box
  EXPECT_EQ(a.target_gt_idx[0][0].item<int64_t>(), 0);
  // Anchor 1 (30, 10) lies in both boxes; its prediction [20, 0, 40, 20] overlaps box 1 more.
  EXPECT_EQ(a.target_gt_idx[0][1].item<int64_t>(), 1);
  EXPECT_GT(a.target_scores[0][1][1].item<float>(), 0);
  EXPECT_EQ(a.target_scores[0][1][0].item<float>(), 0);
  // A box's best-aligned anchor scores that box's best IoU.
  EXPECT_NEAR(a.target_scores[0][0][0].item<float>(), ciou(pd[0][0], gt[0][0]).item<float>(), 1e-5);
}

// Ultralytics 8.4's small-object rule: a side under the finest stride (8) becomes the middle
// stride (16) about the centre; a 12 px side stays 12 (widening it to 16 gave 4 more stride-8
// anchors and a stride-16 one, all outside the box).
TEST(Assigner, OnlySidesUnderTheFinestStrideAreWidened) {
  std::vector<float> xy;
  for (int64_t s : {8, 16, 32})
    for (int64_t y = 0; y < 128 / s; ++y)
      for (int64_t x = 0; x < 128 / s; ++x) xy.insert(xy.end(), {float(x * s + s / 2), float(y * s + s / 2)});
  const int64_t A = int64_t(xy.size()) / 2;
  const at::Tensor anchors = floats(xy).view({A, 2});
  AssignerOptions o;
  o.small_side = 8, o.min_candidate_size = 16;
  // The anchors one box is assigned; every prediction is that box, so each candidate aligns.
  const auto assigned = [&](std::vector<float> box) {
    const at::Tensor gt = floats(box).view({1, 1, 4});
    const at::Tensor pd = gt.expand({1, A, 4}).contiguous();
    const Assignment a = task_aligned_assign(at::full({1, A, 1}, 0.5), pd, anchors, longs({0}).view({1, 1}), gt,
                                             at::ones({1, 1}, at::kBool), o);
    std::vector<std::pair<float, float>> at;
    for (int64_t i = 0; i < A; ++i)
      if (a.fg_mask[0][i].item<bool>()) at.emplace_back(xy[size_t(2 * i)], xy[size_t(2 * i + 1)]);
    return at;
  };
  // 12 x 12 about (98, 98): only the stride-8 anchor (100, 100) lies strictly inside.
  EXPECT_EQ(assigned({92.f, 92, 104, 104}), (std::vector<std::pair<float, float>>{{100.f, 100.f}}));
  // 5 x 5 about (30, 30), taken as 16 x 16, (22, 38): four stride-8 anchors and the stride-16 one (24, 24).
  EXPECT_EQ(assigned({27.5f, 27.5, 32.5, 32.5}),
            (std::vector<std::pair<float, float>>{{28.f, 28.f}, {36.f, 28.f}, {28.f, 36.f}, {36.f, 36.f}, {24.f, 24.f}}));
}

// An anchor two boxes claim, overlapping neither (early in training), goes to one of them, not to
// row 0 when that row is masked (a crowd box), whose class it would then learn.
TEST(Assigner, ATieGoesToAClaimingBoxNotToAMaskedRow) {
  const at::Tensor anchors = floats({50.f, 50}).view({1, 2});
  const at::Tensor pd = floats({200.f, 200, 210, 210}).view({1, 1, 4});  // overlaps no box
  const at::Tensor gt = floats({0.f, 0, 100, 100, 40, 40, 60, 60, 45, 45, 70, 70}).view({1, 3, 4});
  const at::Tensor labels = longs({2, 0, 1}).view({1, 3}), mask = at::tensor(std::vector<uint8_t>{0, 1, 1}).to(at::kBool).view({1, 3});
  const Assignment a = task_aligned_assign(at::full({1, 1, 3}, 0.5), pd, anchors, labels, gt, mask);
  ASSERT_TRUE(a.fg_mask[0][0].item<bool>());
  EXPECT_EQ(a.target_gt_idx[0][0].item<int64_t>(), 1);
  EXPECT_EQ(a.target_scores[0][0][2].item<float>(), 0.0f);  // nothing of the crowd box's class
}

TEST(Assigner, ThousandsOfBoxesInBoundedMemory) {
  auto& alloc = memory::CachingCpuAllocator::install();
  const int64_t B = 1, A = 8400, C = 2, N = 3000;  // a 640-px image crowded with boxes
  const at::Tensor anchors = at::rand({A, 2}) * 640, pd = at::cat({at::rand({B, A, 2}) * 600, at::rand({B, A, 2}) * 600 + 640}, -1);
  const at::Tensor gt = at::cat({at::rand({B, N, 2}) * 600, at::rand({B, N, 2}) * 40 + 600}, -1);
  const at::Tensor scores = at::rand({B, A, C}), labels = at::zeros({B, N}, at::kLong), mask = at::ones({B, N}, at::kBool);
  AssignerOptions o;
  o.chunk_elements = 1 << 21;
  const auto m = memory::measure_cpu_step([&] { task_aligned_assign(scores, pd, anchors, labels, gt, mask, o); });
  // Unchunked, one [B, N, A, 4] float tensor alone would be 403 MB.
  EXPECT_LT(m.above_baseline(), 200ll << 20) << "peak " << m.above_baseline();
  (void)alloc;
}

// YOLO26's end-to-end loss against Ultralytics 8.4's E2ELoss on the inputs that
// scripts/make_e2e_loss_reference.py describes (it printed the numbers): both branches, the
// one-to-one branch's top-1 assignment, the L1 distance term, and the one-to-many weight of
// epochs 0 and 3 of 10.
TEST(YoloLoss, EndToEndLossMatchesTheUltralyticsReference) {
  const int64_t B = 2, nc = 3;
  models::DetectorInfo info = yolov8_info(nc);
  info.reg_max = 1;
  info.end2end = true;
  models::HeadOutputs out;
  for (int64_t branch : {0, 1}) {
    std::vector<at::Tensor> feats;
    int64_t l = 0;
    for (int64_t s : {8, 16, 32}) {
      const int64_t h = 64 / s, w = 64 / s;
      const at::Tensor c = at::arange(4 + nc, at::kDouble).view({1, -1, 1, 1});
      const at::Tensor y = at::arange(h, at::kDouble).view({1, 1, -1, 1}), x = at::arange(w, at::kDouble).view({1, 1, 1, -1});
      const at::Tensor b = at::arange(B, at::kDouble).view({-1, 1, 1, 1});
      const at::Tensor v = 0.6 * at::sin(0.3 * c + 0.7 * y + 1.1 * x + 0.5 * b + double(l++) + 0.25 * double(branch)) + 1.5 * c.lt(4);
      feats.push_back(v.to(at::kFloat));
    }
    out[branch == 0 ? "pred" : "one2one"] = feats;
  }
  const auto loss = make_loss(info, LossOptions{});
  EXPECT_EQ(loss->term_names(), (std::vector<std::string>{"box", "cls", "l1"}));
  EXPECT_EQ(loss->normalisers(), 2);
  EXPECT_EQ(loss->normaliser_of("head.one2one_cv2.0.0.cb.conv.weight"), 0);
  EXPECT_EQ(loss->normaliser_of("head.cv2.0.0.cb.conv.weight"), 1);
  // Before any set_progress (a loss called on its own, a memory probe) it weighs as in the first epoch.
  EXPECT_NEAR(batch_loss(*make_loss(info, LossOptions{}), out, reference_targets(), 64, 64).total.item<double>(), 98.127578735, 1e-4);
  for (const auto& [epoch, total] : std::vector<std::pair<int64_t, double>>{{0, 98.127578735}, {3, 123.207038879}}) {
    loss->set_progress(epoch, 10, c10::kCPU);
    const BatchLoss l = batch_loss(*loss, out, reference_targets(), 64, 64);
    EXPECT_NEAR(l.total.item<double>(), total, 1e-6 * total) << epoch;
    EXPECT_NEAR(item(l, "box"), 3.648587227, 1e-6) << epoch;
    EXPECT_NEAR(item(l, "cls"), 88.284378052, 1e-4) << epoch;
    EXPECT_NEAR(item(l, "l1"), 0.124183938, 1e-7) << epoch;
    std::printf("epoch %lld: total %.9f (Ultralytics %.9f), box %.9f, cls %.9f, l1 %.9f\n", (long long)epoch, l.total.item<double>(), total,
                item(l, "box"), item(l, "cls"), item(l, "l1"));
  }
}

TEST(YoloLoss, NoObjectsMeansOnlyTheClassTerm) {
  // All-zero logits and no boxes: cls = sum of BCE(0, 0) = A * nc * ln 2, normalised by max(0, 1).
  const int64_t B = 2, nc = 3, S = 64;
  auto out = reference_yolov8_output(B, nc, S);
  for (auto& f : out["pred"]) f.zero_();
  Targets t = reference_targets();
  t.mask.zero_();
  const BatchLoss l = batch_loss(*make_loss(yolov8_info(nc), LossOptions{}), out, t, S, S);
  const double anchors = 8 * 8 + 4 * 4 + 2 * 2;
  EXPECT_NEAR(item(l, "cls"), 0.5 * B * anchors * nc * std::log(2.0), 1e-3);
  EXPECT_EQ(item(l, "box"), 0);
  EXPECT_EQ(item(l, "dfl"), 0);
}

TEST(YoloLoss, Yolov5NoObjectsIsObjectnessOnly) {
  models::DetectorInfo info;
  info.family = "yolov5";
  info.nc = 3;
  info.strides = {8, 16, 32};
  info.anchors = floats({10.f, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326}).view({3, 3, 2});
  std::vector<at::Tensor> preds;
  for (int64_t s : {8, 16, 32}) preds.push_back(at::zeros({2, 3, 64 / s, 64 / s, 8}));
  Targets t = reference_targets();
  t.mask.zero_();
  const BatchLoss l = batch_loss(*make_loss(info, LossOptions{}), {{"pred", preds}}, t, 64, 64);
  // lobj = ln 2 x (4.0 + 1.0 + 0.4), gain 1.0 x (64 / 640)^2 x 3 / 3.
  EXPECT_NEAR(item(l, "obj"), std::log(2.0) * 5.4 * 0.01, 1e-6);
  EXPECT_EQ(item(l, "box"), 0);
  EXPECT_EQ(item(l, "cls"), 0);
  // A run of data.imgsz 128 keeps its gain, (128 / 640)^2, on a multi-scale batch of 64 px.
  const BatchLoss run = batch_loss(*make_loss(info, loss_options(load_config("", {"data.imgsz=128"}))), {{"pred", preds}}, t, 64, 64);
  EXPECT_NEAR(item(run, "obj"), std::log(2.0) * 5.4 * 0.04, 1e-6);
}

// scripts/make_yolov5_loss_reference.py describes the inputs; YOLOv5's own ComputeLoss
// (ultralytics/yolov5, utils/loss.py) printed the numbers: anchor matching with the two
// neighbouring cells, CIoU, IoU objectness targets, the level balance and the train.py gains.
TEST(YoloLoss, Yolov5LossMatchesTheYolov5Reference) {
  const int64_t B = 2, nc = 3, S = 64;
  models::DetectorInfo info;
  info.family = "yolov5";
  info.nc = nc;
  info.strides = {8, 16, 32};
  info.anchors = floats({10.f, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326}).view({3, 3, 2});
  std::vector<at::Tensor> preds;
  int64_t l = 0;
  for (int64_t s : {8, 16, 32}) {
    const int64_t h = S / s, w = S / s;
    const at::Tensor b = at::arange(B, at::kDouble).view({-1, 1, 1, 1, 1}), a = at::arange(3, at::kDouble).view({1, -1, 1, 1, 1});
    const at::Tensor y = at::arange(h, at::kDouble).view({1, 1, -1, 1, 1}), x = at::arange(w, at::kDouble).view({1, 1, 1, -1, 1});
    const at::Tensor c = at::arange(5 + nc, at::kDouble).view({1, 1, 1, 1, -1});
    preds.push_back((0.8 * at::sin(0.3 * c + 0.7 * y + 1.1 * x + 0.5 * b + 0.9 * a + double(l++))).to(at::kFloat));
  }
  Targets t;
  t.boxes = floats({5.f, 3, 30, 28, 21, 10, 60, 51, 41, 45, 48, 50, 1, 0, 64, 63, 10, 41, 26, 62, 0, 0, 0, 0}).view({2, 3, 4});
  t.classes = longs({0, 1, 2, 1, 2, 0}).view({2, 3});
  t.mask = longs({1, 1, 1, 1, 1, 0}).to(at::kBool).view({2, 3});
  const BatchLoss loss = batch_loss(*make_loss(info, LossOptions().imgsz(S)), {{"pred", preds}}, t, S, S);
  EXPECT_NEAR(loss.total.item<double>(), 0.379968047, 1e-6);
  EXPECT_NEAR(item(loss, "box"), 0.111714713, 1e-7);
  EXPECT_NEAR(item(loss, "obj"), 0.038461037, 1e-7);
  EXPECT_NEAR(item(loss, "cls"), 0.039808270, 1e-7);
  std::printf("total %.9f (YOLOv5 0.379968047), box %.9f, obj %.9f, cls %.9f\n", loss.total.item<double>(), item(loss, "box"), item(loss, "obj"),
              item(loss, "cls"));
}

TEST(YoloLoss, GradientsReachEveryHeadOutput) {
  models::DetectorInfo v5;
  v5.family = "yolov5";
  v5.nc = 3;
  v5.strides = {8, 16, 32};
  v5.anchors = floats({10.f, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326}).view({3, 3, 2});
  std::vector<at::Tensor> p5;
  for (int64_t s : {8, 16, 32}) p5.push_back(at::randn({2, 3, 64 / s, 64 / s, 8}).requires_grad_());
  batch_loss(*make_loss(v5, LossOptions{}), {{"pred", p5}}, reference_targets(), 64, 64).total.backward();
  for (const auto& p : p5) EXPECT_GT(p.grad().abs().sum().item<float>(), 0);
  auto out = reference_yolov8_output(2, 3, 64);
  for (auto& f : out["pred"]) f.requires_grad_();
  batch_loss(*make_loss(yolov8_info(3), LossOptions{}), out, reference_targets(), 64, 64).total.backward();
  for (const auto& f : out["pred"]) {
    EXPECT_GT(f.grad().narrow(1, 0, 64).abs().sum().item<float>(), 0);  // box bins
    EXPECT_GT(f.grad().narrow(1, 64, 3).abs().sum().item<float>(), 0);  // classes
  }
}

TEST(CenterNet, GaussianRadiusAsTheReference) {
  // Values of CenterNet's gaussian_radius((h, w), 0.7) computed by hand from its three roots.
  const at::Tensor h = at::tensor(std::vector<double>{10.0, 30.0, 4.0}), w = at::tensor(std::vector<double>{10.0, 20.0, 50.0});
  const auto r = gaussian_radius(h, w, 0.7);
  const auto ref = [](double H, double W) {
    const double m = 0.7;
    const double b1 = H + W, c1 = W * H * (1 - m) / (1 + m), r1 = (b1 + std::sqrt(b1 * b1 - 4 * c1)) / 2;
    const double b2 = 2 * (H + W), c2 = (1 - m) * W * H, r2 = (b2 + std::sqrt(b2 * b2 - 16 * c2)) / 2;
    const double b3 = -2 * m * (H + W), c3 = (m - 1) * W * H, r3 = (b3 + std::sqrt(b3 * b3 - 16 * m * c3)) / 2;
    return std::min({r1, r2, r3});
  };
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(r[i].item<double>(), ref(h[i].item<double>(), w[i].item<double>()), 1e-9);
  EXPECT_NEAR(r[0].item<double>(), 2.733200531, 1e-6);  // a 10 x 10 box: the third root
}

TEST(CenterNet, TargetsPutPeaksSizesAndOffsetsAtTheCentres) {
  // One 40 x 24 px box centred at (50, 30) px: at stride 4 a 10 x 6 cell box centred at (12.5, 7.5).
  const at::Tensor boxes = floats({30.f, 18, 70, 42, 0, 0, 0, 0}).view({1, 2, 4});
  const at::Tensor classes = longs({1, -1}).view({1, 2}), mask = floats({true, false}).view({1, 2});
  const CenterNetTargets t = centernet_targets(boxes, classes, mask, 3, 32, 32, 4, 0.7);
  EXPECT_EQ(t.heatmap.sizes(), (at::IntArrayRef{1, 3, 32, 32}));
  EXPECT_FLOAT_EQ(t.heatmap[0][1][7][12].item<float>(), 1.0f);  // the integer centre
  EXPECT_EQ(t.heatmap.eq(1).sum().item<int64_t>(), 1);
  EXPECT_EQ(t.heatmap[0][0].sum().item<float>(), 0);              // other classes untouched
  const int64_t r = int64_t(gaussian_radius(at::tensor(std::vector<double>{6.0}), at::tensor(std::vector<double>{10.0}), 0.7).floor().item<double>());
  const double sigma = (2.0 * r + 1) / 6;
  EXPECT_NEAR(t.heatmap[0][1][7][12 + r].item<float>(), std::exp(-double(r * r) / (2 * sigma * sigma)), 1e-6);
  EXPECT_EQ(t.heatmap[0][1][7][12 + r + 1].item<float>(), 0);     // outside the window
  EXPECT_EQ(t.index[0][0].item<int64_t>(), 7 * 32 + 12);
  EXPECT_FLOAT_EQ(t.size[0][0][0].item<float>(), 10);
  EXPECT_FLOAT_EQ(t.size[0][0][1].item<float>(), 6);
  EXPECT_FLOAT_EQ(t.offset[0][0][0].item<float>(), 0.5);
  EXPECT_FLOAT_EQ(t.offset[0][0][1].item<float>(), 0.5);
  EXPECT_FALSE(t.mask[0][1].item<bool>());
}

TEST(CenterNet, OverlappingPeaksMergeByMaximum) {
  const at::Tensor boxes = floats({0.f, 0, 40, 40, 8, 0, 48, 40}).view({1, 2, 4});
  const at::Tensor classes = at::zeros({1, 2}, at::kLong), mask = at::ones({1, 2}, at::kBool);
  const CenterNetTargets both = centernet_targets(boxes, classes, mask, 1, 16, 16, 4, 0.7);
  const CenterNetTargets one = centernet_targets(boxes.narrow(1, 0, 1), classes.narrow(1, 0, 1), mask.narrow(1, 0, 1), 1, 16, 16, 4, 0.7);
  const CenterNetTargets two = centernet_targets(boxes.narrow(1, 1, 1), classes.narrow(1, 1, 1), mask.narrow(1, 1, 1), 1, 16, 16, 4, 0.7);
  EXPECT_TRUE(at::equal(both.heatmap, at::max(one.heatmap, two.heatmap)));
  // Chunked drawing gives the same heatmap.
  EXPECT_TRUE(at::equal(both.heatmap, centernet_targets(boxes, classes, mask, 1, 16, 16, 4, 0.7, 16 * 16).heatmap));
}

TEST(CenterNet, FocalLossOnAHandComputedCase) {
  // 1 x 1 x 2 x 2 heatmap: a centre (target 1) and three negatives with targets 0, 0.5, 0.
  const at::Tensor target = floats({1.f, 0, 0.5, 0}).view({1, 1, 2, 2});
  const at::Tensor logits = floats({0.f, 0, 0, 0}).view({1, 1, 2, 2});  // p = 0.5 everywhere
  // pos: log(0.5) (1-0.5)^2; neg: log(0.5) 0.5^2 (1-t)^4 for t = 0, 0.5, 0; one positive.
  const double pos = std::log(0.5) * 0.25, neg = std::log(0.5) * 0.25 * (1 + std::pow(0.5, 4) + 1);
  EXPECT_NEAR(centernet_focal_loss(logits, target).item<double>(), -(pos + neg), 1e-6);
  // No centres at all: the negatives alone, not divided by zero.
  EXPECT_NEAR(centernet_focal_loss(logits, at::zeros({1, 1, 2, 2})).item<double>(), -4 * std::log(0.5) * 0.25, 1e-6);
}

TEST(CenterNet, LossAveragesStacksAndUsesTheTfWeights) {
  models::DetectorInfo info;
  info.family = "centernet";
  info.nc = 3;
  info.strides = {4, 4};
  const at::Tensor boxes = floats({30.f, 18, 70, 42}).view({1, 1, 4});
  Targets t{boxes, longs({1}).view({1, 1}), at::ones({1, 1}, at::kBool)};
  // Perfect size and offset predictions; the heatmap logits are zeros.
  at::Tensor size = at::zeros({1, 2, 32, 32}), off = at::zeros({1, 2, 32, 32});
  size[0][0][7][12] = 10, size[0][1][7][12] = 6, off[0][0][7][12] = 0.5, off[0][1][7][12] = 0.5;
  const at::Tensor heat = at::zeros({1, 3, 32, 32});
  const LossOptions o = LossOptions().heatmap_weight(2.0);
  const BatchLoss one = batch_loss(*make_loss(info, o), {{"heatmap", {heat}}, {"size", {size}}, {"offset", {off}}}, t, 128, 128);
  const BatchLoss two =
      batch_loss(*make_loss(info, o), {{"heatmap", {heat, heat}}, {"size", {size, size + 1}}, {"offset", {off, off}}}, t, 128, 128);
  EXPECT_NEAR(item(one, "size"), 0, 1e-6);
  EXPECT_NEAR(item(one, "offset"), 0, 1e-6);
  EXPECT_NEAR(item(one, "heatmap"), item(two, "heatmap"), 1e-6);
  // The second stack's sizes are all off by 1: L1 = 2 for the box's two coordinates (TF sums them per
  // box), averaged with the perfect stack, x 0.1.
  EXPECT_NEAR(item(two, "size"), 0.1 * 0.5 * 2.0, 1e-6);
  const CenterNetTargets ct = centernet_targets(boxes, t.classes, t.mask, 3, 32, 32, 4, 0.7);
  EXPECT_NEAR(item(one, "heatmap"), 2.0 * centernet_focal_loss(heat, ct.heatmap).item<double>(), 1e-6);
}

// TF divides every term by the objects: two boxes of one class on one centre make one peak and
// count twice (xingyizhou's CenterNet divides its heatmap by the peaks).
TEST(CenterNet, EveryTermIsOverTheObjectsAsTfNormalises) {
  models::DetectorInfo info;
  info.family = "centernet";
  info.nc = 3;
  info.strides = {4};
  const at::Tensor boxes = floats({30.f, 18, 70, 42, 30, 18, 70, 42}).view({1, 2, 4});
  Targets t{boxes, longs({1, 1}).view({1, 2}), at::ones({1, 2}, at::kBool)};
  const at::Tensor heat = at::zeros({1, 3, 32, 32}), size = at::ones({1, 2, 32, 32}), off = at::zeros({1, 2, 32, 32});
  const BatchLoss l = batch_loss(*make_loss(info, LossOptions()), {{"heatmap", {heat}}, {"size", {size}}, {"offset", {off}}}, t, 128, 128);
  const CenterNetTargets ct = centernet_targets(boxes, t.classes, t.mask, 3, 32, 32, 4, 0.7);
  ASSERT_EQ(ct.heatmap.eq(1).sum().item<int64_t>(), 1);
  EXPECT_NEAR(item(l, "heatmap"), centernet_focal_loss(heat, ct.heatmap).item<double>() / 2, 1e-6);
  // Sizes 10 x 6 predicted 1 x 1: (9 + 5) per box, both boxes, over 2 objects, x 0.1.
  EXPECT_NEAR(item(l, "size"), 0.1 * (9 + 5), 1e-5);
}

// loss.assigner_chunk bounds the heatmap's drawing too: 2,000 centres on a 128 x 128 output drawn
// a few at a time stay far below drawing them all at once (131 MB of Gaussians), with the same loss.
TEST(CenterNet, TheHeatmapIsDrawnInChunksOfTheLossOption) {
  auto& alloc = memory::CachingCpuAllocator::install();
  models::DetectorInfo info;
  info.family = "centernet";
  info.nc = 1;
  info.strides = {4};
  const int64_t N = 2000;
  const at::Tensor xy = at::rand({1, N, 2}) * 480;
  const at::Tensor boxes = at::cat({xy, xy + 8 + at::rand({1, N, 2}) * 24}, -1);
  const Targets t{boxes, at::zeros({1, N}, at::kLong), at::ones({1, N}, at::kBool)};
  const models::HeadOutputs out{{"heatmap", {at::zeros({1, 1, 128, 128})}}, {"size", {at::zeros({1, 2, 128, 128})}},
                                {"offset", {at::zeros({1, 2, 128, 128})}}};
  double loss[2];
  int64_t peak[2];
  for (int k = 0; k < 2; ++k) {
    const auto l = make_loss(info, LossOptions().assigner_chunk(k == 0 ? int64_t(1) << 16 : int64_t(1) << 30));
    const auto m = memory::measure_cpu_step([&] { loss[k] = item(batch_loss(*l, out, t, 512, 512), "heatmap"); });
    peak[k] = m.above_baseline();
  }
  EXPECT_DOUBLE_EQ(loss[0], loss[1]);
  EXPECT_GT(peak[1], int64_t(N) * 128 * 128 * 4);
  EXPECT_LT(peak[0], peak[1] / 4) << "chunked " << peak[0] << " vs whole " << peak[1];
  (void)alloc;
}

// The adapter carries every key of the loss section, and the options' own defaults are the
// config's (tests and tools that build LossOptions() get the run's defaults).
TEST(LossOptions, TheAdapterCarriesTheConfigAndTheDefaultsAgree) {
  const LossOptions d = loss_options(load_config("", {}));
  const LossOptions o;
  EXPECT_EQ(d.box(), o.box());
  EXPECT_EQ(d.cls(), o.cls());
  EXPECT_EQ(d.dfl(), o.dfl());
  EXPECT_EQ(d.tal_topk(), o.tal_topk());
  EXPECT_EQ(d.tal_alpha(), o.tal_alpha());
  EXPECT_EQ(d.tal_beta(), o.tal_beta());
  EXPECT_EQ(d.assigner_chunk(), o.assigner_chunk());
  EXPECT_EQ(d.obj(), o.obj());
  EXPECT_EQ(d.anchor_t(), o.anchor_t());
  EXPECT_EQ(d.heatmap_weight(), o.heatmap_weight());
  EXPECT_EQ(d.size_weight(), o.size_weight());
  EXPECT_EQ(d.offset_weight(), o.offset_weight());
  EXPECT_EQ(d.min_overlap(), o.min_overlap());
  const LossOptions set = loss_options(load_config("", {"loss.task_loss_weight=2", "loss.scale_loss_weight=0.3",
                                                        "loss.offset_loss_weight=0.5", "loss.min_overlap=0.5", "loss.box=3"}));
  EXPECT_EQ(set.heatmap_weight(), 2);
  EXPECT_EQ(set.size_weight(), 0.3);
  EXPECT_EQ(set.offset_weight(), 0.5);
  EXPECT_EQ(set.min_overlap(), 0.5);
  EXPECT_EQ(set.box(), 3);
}
