#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "headroom/core/device.h"
#include "headroom/eval/postprocess.h"
#include "headroom/losses/box_ops.h"

using namespace headroom;
using namespace headroom::eval;

namespace {

// Greedy NMS written the obvious way, on one image: the reference the kernels must equal.
std::vector<bool> brute_force_keep(const at::Tensor& boxes, const at::Tensor& valid, double thr) {
  const int64_t K = boxes.size(0);
  const at::Tensor iou = losses::box_iou(boxes, boxes);
  std::vector<bool> keep(size_t(K), false);
  for (int64_t i = 0; i < K; ++i) {
    if (!valid[i].item<bool>()) continue;
    bool suppressed = false;
    for (int64_t j = 0; j < i && !suppressed; ++j) suppressed = keep[size_t(j)] && iou[j][i].item<float>() > thr;
    keep[size_t(i)] = !suppressed;
  }
  return keep;
}

at::Tensor random_boxes(int64_t B, int64_t K) {
  const at::Tensor c = at::rand({B, K, 2}) * 100, s = at::rand({B, K, 2}) * 40 + 5;
  return at::cat({c - s / 2, c + s / 2}, -1);
}

at::Tensor floats(std::vector<float> v) { return at::tensor(v); }

}  // namespace

TEST(Nms, EqualsTheBruteForceReference) {
  at::manual_seed(11);
  const int64_t B = 3, K = 200;
  const at::Tensor boxes = random_boxes(B, K);
  const at::Tensor valid = at::rand({B, K}).lt(0.9);
  for (double thr : {0.3, 0.5, 0.7}) {
    const at::Tensor keep = nms_keep(boxes, valid, thr);
    for (int64_t b = 0; b < B; ++b) {
      const auto ref = brute_force_keep(boxes[b], valid[b], thr);
      for (int64_t i = 0; i < K; ++i) ASSERT_EQ(keep[b][i].item<bool>(), ref[size_t(i)]) << "image " << b << " box " << i << " thr " << thr;
    }
  }
}

TEST(Nms, CudaKernelEqualsTheCpuKernel) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  at::manual_seed(12);
  const at::Tensor boxes = random_boxes(8, 3000), valid = at::rand({8, 3000}).lt(0.8);
  const at::Tensor cpu = nms_keep(boxes, valid, 0.6);
  const at::Tensor gpu = nms_keep(boxes.cuda(), valid.cuda(), 0.6).cpu();
  EXPECT_TRUE(at::equal(cpu, gpu));
}

TEST(Nms, ClassAwareThresholdsAndLimits) {
  // Two nearly identical boxes of different classes, and a third box of class 0 that overlaps the first.
  const at::Tensor boxes = floats({0, 0, 10, 10, 0, 0, 10, 10.5, 1, 0, 11, 10}).view({1, 3, 4});
  at::Tensor scores = at::zeros({1, 3, 2});
  scores[0][0][0] = 0.9, scores[0][1][1] = 0.8, scores[0][2][0] = 0.7;
  NmsOptions o;
  o.conf = 0.25;
  o.iou = 0.5;
  Detections d = batched_nms(boxes, scores, o);
  EXPECT_EQ(d.counts[0].item<int64_t>(), 2);  // the class-0 duplicate goes, the class-1 box stays
  EXPECT_EQ(d.classes[0][0].item<int64_t>(), 0);
  EXPECT_EQ(d.classes[0][1].item<int64_t>(), 1);
  EXPECT_FLOAT_EQ(d.scores[0][1].item<float>(), 0.8f);
  EXPECT_EQ(d.classes[0][2].item<int64_t>(), -1);  // padding
  o.agnostic = true;
  EXPECT_EQ(batched_nms(boxes, scores, o).counts[0].item<int64_t>(), 1);
  o.agnostic = false;
  o.max_det = 1;
  d = batched_nms(boxes, scores, o);
  EXPECT_EQ(d.counts[0].item<int64_t>(), 1);
  EXPECT_EQ(d.boxes.size(1), 1);
  o.max_det = 300;
  o.conf = 0.85;
  EXPECT_EQ(batched_nms(boxes, scores, o).counts[0].item<int64_t>(), 1);
  // Multi-label: one box, two classes above the threshold -> two detections.
  at::Tensor both = at::zeros({1, 1, 2});
  both[0][0][0] = 0.6, both[0][0][1] = 0.5;
  o.conf = 0.1;
  o.multi_label = true;
  EXPECT_EQ(batched_nms(boxes.narrow(1, 0, 1), both, o).counts[0].item<int64_t>(), 2);
}

TEST(Decode, CenterNetPeakBecomesItsBox) {
  models::DetectorInfo info;
  info.family = "centernet";
  info.nc = 2;
  info.strides = {4};
  at::Tensor heat = at::full({1, 2, 16, 16}, -10.0), size = at::zeros({1, 2, 16, 16}), off = at::zeros({1, 2, 16, 16});
  heat[0][1][5][7] = 5.0;
  heat[0][1][5][8] = 4.0;  // a neighbour, suppressed by the 3x3 max-pool
  size[0][0][5][7] = 10, size[0][1][5][7] = 6, off[0][0][5][7] = 0.25, off[0][1][5][7] = 0.5;
  DecodeOptions o;
  o.nms.conf = 0.5;
  const Detections d = decode(info, {{"heatmap", {heat}}, {"size", {size}}, {"offset", {off}}}, o);
  ASSERT_EQ(d.counts[0].item<int64_t>(), 1);
  EXPECT_EQ(d.classes[0][0].item<int64_t>(), 1);
  EXPECT_NEAR(d.scores[0][0].item<float>(), 1 / (1 + std::exp(-5.0)), 1e-6);
  const std::vector<float> want = {(7.25f - 5) * 4, (5.5f - 3) * 4, (7.25f + 5) * 4, (5.5f + 3) * 4};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(d.boxes[0][0][k].item<float>(), want[size_t(k)], 1e-4);
}

TEST(Decode, Yolov8DistributionsBecomeBoxes) {
  models::DetectorInfo info;
  info.family = "yolov8";
  info.nc = 2;
  info.reg_max = 16;
  info.strides = {8, 16, 32};
  std::vector<at::Tensor> feats;
  for (int64_t s : {8, 16, 32}) feats.push_back(at::full({1, 64 + 2, 64 / s, 64 / s}, -20.0));
  // Cell (x 3, y 2) of the stride-8 level: every side 2 bins from the centre, class 0.
  for (int side = 0; side < 4; ++side) feats[0][0][side * 16 + 2][2][3] = 20.0;
  feats[0][0][64][2][3] = 3.0;
  DecodeOptions o;
  o.nms.conf = 0.5;
  const Detections d = decode(info, {{"pred", feats}}, o);
  ASSERT_EQ(d.counts[0].item<int64_t>(), 1);
  EXPECT_EQ(d.classes[0][0].item<int64_t>(), 0);
  const std::vector<float> want = {(3.5f - 2) * 8, (2.5f - 2) * 8, (3.5f + 2) * 8, (2.5f + 2) * 8};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(d.boxes[0][0][k].item<float>(), want[size_t(k)], 1e-3);
}

TEST(Decode, Yolov5AnchorsAndObjectness) {
  models::DetectorInfo info;
  info.family = "yolov5";
  info.nc = 1;
  info.strides = {8};
  info.anchors = floats({10, 13}).view({1, 1, 2});
  at::Tensor p = at::full({1, 1, 4, 4, 6}, -20.0);
  // Cell (x 1, y 2): sigmoid(0) = 0.5 -> xy offset 0.5, wh = (2 * 0.5)^2 x anchor.
  for (int k = 0; k < 4; ++k) p[0][0][2][1][k] = 0.0;
  p[0][0][2][1][4] = 4.0, p[0][0][2][1][5] = 4.0;
  DecodeOptions o;
  o.nms.conf = 0.5;
  const Detections d = decode(info, {{"pred", {p}}}, o);
  ASSERT_EQ(d.counts[0].item<int64_t>(), 1);
  const float cx = (0.5f + 1) * 8, cy = (0.5f + 2) * 8;
  const std::vector<float> want = {cx - 5, cy - 6.5f, cx + 5, cy + 6.5f};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(d.boxes[0][0][k].item<float>(), want[size_t(k)], 1e-4);
  const float s = 1 / (1 + std::exp(-4.f));
  EXPECT_NEAR(d.scores[0][0].item<float>(), s * s, 1e-6);
}

TEST(Decode, DetectionsMapBackToTheOriginalImage) {
  Detections d;
  d.boxes = floats({16, 32, 48, 48}).view({1, 1, 4});
  d.scores = floats({0.9f}).view({1, 1});
  d.classes = at::zeros({1, 1}, at::kLong);
  d.counts = at::ones({1}, at::kLong);
  data::ImageMeta m;
  m.geometry = data::letterbox_geometry(200, 100, 64);  // scaled to 64 x 32, 16 px of padding on top
  const auto rows = to_original_pixels(d, {m});
  ASSERT_EQ(rows[0].size(), 1u);
  EXPECT_NEAR(rows[0][0][0], 16 * 200.0 / 64, 1e-4);
  EXPECT_NEAR(rows[0][0][1], (32 - 16) * 100.0 / 32, 1e-4);
  EXPECT_NEAR(rows[0][0][3], 100.0, 1e-4);  // clipped to the image
}
