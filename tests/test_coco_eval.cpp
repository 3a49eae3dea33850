#include <gtest/gtest.h>

#include "headroom/core/errors.h"
#include "headroom/eval/coco_eval.h"

using namespace headroom;
using namespace headroom::eval;

namespace {

CocoBox gt(int64_t image, int64_t cat, double x, double y, double w, double h, bool crowd = false) {
  CocoBox b;
  b.image_id = image, b.category_id = cat, b.x = x, b.y = y, b.w = w, b.h = h, b.area = w * h, b.crowd = crowd;
  return b;
}

CocoBox dt(int64_t image, int64_t cat, double x, double y, double w, double h, double score) {
  CocoBox b;
  b.image_id = image, b.category_id = cat, b.x = x, b.y = y, b.w = w, b.h = h, b.score = score;
  return b;
}

enum { AP, AP50, AP75, APs, APm, APl, AR1, AR10, AR100, ARs, ARm, ARl };

}  // namespace

TEST(CocoEval, MatchesPycocotoolsOnARandomSet) {
  // 30 images, 3 categories, crowds, misses, duplicates, false positives; the expected values
  // are pycocotools' COCOeval.stats and per-class AP on the same two files.
  const std::string dir = std::string(HEADROOM_SOURCE_DIR) + "/tests/data/";
  const CocoGroundTruth g = read_coco_ground_truth(dir + "coco_random_gt.json");
  const CocoStats s = coco_evaluate(g.boxes, read_coco_results(dir + "coco_random_results.json"), g.image_ids, g.category_ids);
  const double expected[12] = {0.213650707612, 0.495539085928, 0.158772165554, 0.248755969003, 0.189427585616, 0.294169416942,
                               0.208920634921, 0.351095238095, 0.351095238095, 0.375252525253, 0.302457264957, 0.333333333333};
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(s.stats[size_t(i)], expected[i], 1e-9) << "stat " << i;
  ASSERT_EQ(s.per_class.size(), 3u);
  EXPECT_NEAR(s.per_class[0].ap, 0.259792229223, 1e-9);
  EXPECT_NEAR(s.per_class[0].ap50, 0.620933521924, 1e-9);
  EXPECT_NEAR(s.per_class[2].ap, 0.186830377378, 1e-9);
  EXPECT_NEAR(s.per_class[2].ap50, 0.441338444189, 1e-9);
}

TEST(CocoEval, PerfectDetectionsScoreOne) {
  const std::vector<CocoBox> g = {gt(1, 1, 10, 10, 50, 50), gt(1, 2, 100, 100, 120, 80), gt(2, 1, 5, 5, 20, 20)};
  std::vector<CocoBox> d;
  for (const auto& b : g) d.push_back(dt(b.image_id, b.category_id, b.x, b.y, b.w, b.h, 0.9));
  const CocoStats s = coco_evaluate(g, d, {1, 2}, {1, 2});
  EXPECT_DOUBLE_EQ(s.stats[AP], 1.0);
  EXPECT_DOUBLE_EQ(s.stats[AP50], 1.0);
  EXPECT_DOUBLE_EQ(s.stats[AP75], 1.0);
  EXPECT_DOUBLE_EQ(s.stats[APs], 1.0);   // the 20 x 20 box
  EXPECT_DOUBLE_EQ(s.stats[APm], 1.0);   // 50 x 50
  EXPECT_DOUBLE_EQ(s.stats[APl], 1.0);   // 120 x 80
  EXPECT_DOUBLE_EQ(s.stats[AR100], 1.0);
}

TEST(CocoEval, ShiftedBoxesCountUpToTheirIou) {
  // Shifted by 20 px: IoU 80 / 120 = 0.667, a hit at thresholds .50 .55 .60 .65 only.
  const CocoStats s = coco_evaluate({gt(1, 1, 0, 0, 100, 100)}, {dt(1, 1, 20, 0, 100, 100, 0.9)}, {1}, {1});
  EXPECT_NEAR(s.stats[AP], 0.4, 1e-12);
  EXPECT_DOUBLE_EQ(s.stats[AP50], 1.0);
  EXPECT_DOUBLE_EQ(s.stats[AP75], 0.0);
  EXPECT_NEAR(s.stats[AR100], 0.4, 1e-12);
}

TEST(CocoEval, DuplicatesAreFalsePositives) {
  // Two objects; detections A 0.9, a duplicate of A 0.8, B 0.7: precision 1, 1/2, 2/3 at recall
  // 1/2, 1/2, 1 -> interpolated 1 up to recall 0.5 (51 points) and 2/3 after (50 points).
  const std::vector<CocoBox> g = {gt(1, 1, 0, 0, 50, 50), gt(1, 1, 200, 200, 50, 50)};
  const std::vector<CocoBox> d = {dt(1, 1, 0, 0, 50, 50, 0.9), dt(1, 1, 0, 0, 50, 50, 0.8), dt(1, 1, 200, 200, 50, 50, 0.7)};
  const CocoStats s = coco_evaluate(g, d, {1}, {1});
  EXPECT_NEAR(s.stats[AP50], (51.0 + 50.0 * 2.0 / 3.0) / 101.0, 1e-12);
  EXPECT_NEAR(s.stats[AP], (51.0 + 50.0 * 2.0 / 3.0) / 101.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.stats[AR100], 1.0);
}

TEST(CocoEval, MissingAndAbsentClasses) {
  // Class 1 found perfectly, class 2 never detected: AP 1 and 0; class 3 has no ground truth
  // and does not enter the mean.
  const std::vector<CocoBox> g = {gt(1, 1, 0, 0, 50, 50), gt(1, 2, 100, 0, 50, 50)};
  const CocoStats s = coco_evaluate(g, {dt(1, 1, 0, 0, 50, 50, 0.9), dt(1, 3, 300, 300, 40, 40, 0.5)}, {1}, {1, 2, 3});
  EXPECT_DOUBLE_EQ(s.stats[AP], 0.5);
  EXPECT_DOUBLE_EQ(s.per_class[0].ap, 1.0);
  EXPECT_DOUBLE_EQ(s.per_class[1].ap, 0.0);
  EXPECT_DOUBLE_EQ(s.per_class[2].ap, -1.0);
  EXPECT_EQ(s.per_class[1].instances, 1);
}

TEST(CocoEval, CrowdRegionsAreMatchedButNotCounted) {
  // High-scoring detections inside a crowd region are neither hits nor false positives.
  const std::vector<CocoBox> g = {gt(1, 1, 0, 0, 40, 40), gt(1, 1, 100, 100, 300, 300, /*crowd=*/true)};
  const std::vector<CocoBox> d = {dt(1, 1, 120, 120, 50, 50, 0.99), dt(1, 1, 250, 250, 60, 60, 0.98), dt(1, 1, 0, 0, 40, 40, 0.5)};
  CocoStats s = coco_evaluate(g, d, {1}, {1});
  EXPECT_DOUBLE_EQ(s.stats[AP], 1.0);
  EXPECT_EQ(s.per_class[0].instances, 1);
  // The same ground truth without the crowd flag: those detections are false positives.
  std::vector<CocoBox> plain = g;
  plain[1].crowd = false;
  s = coco_evaluate(plain, d, {1}, {1});
  EXPECT_LT(s.stats[AP50], 0.6);
}

TEST(CocoEval, EmptyImages) {
  const std::vector<CocoBox> g = {gt(1, 1, 0, 0, 50, 50)};
  // Image 2 has no ground truth: its detection is a false positive ranked first.
  CocoStats s = coco_evaluate(g, {dt(1, 1, 0, 0, 50, 50, 0.5), dt(2, 1, 0, 0, 50, 50, 0.9)}, {1, 2, 3}, {1});
  EXPECT_NEAR(s.stats[AP50], 0.5, 1e-12);  // precision 1/2 at recall 1
  // Image 3 (no ground truth, no detections) changes nothing; no detections at all gives 0.
  s = coco_evaluate(g, {}, {1, 2, 3}, {1});
  EXPECT_DOUBLE_EQ(s.stats[AP], 0.0);
  EXPECT_DOUBLE_EQ(s.stats[AR100], 0.0);
  EXPECT_THROW(coco_evaluate(g, {dt(9, 1, 0, 0, 5, 5, 0.5)}, {1}, {1}), InputError);
}

TEST(CocoEval, RecallAtOneAndTenDetections) {
  const std::vector<CocoBox> g = {gt(1, 1, 0, 0, 50, 50), gt(1, 1, 100, 0, 50, 50)};
  const std::vector<CocoBox> d = {dt(1, 1, 0, 0, 50, 50, 0.9), dt(1, 1, 100, 0, 50, 50, 0.8)};
  const CocoStats s = coco_evaluate(g, d, {1}, {1});
  EXPECT_DOUBLE_EQ(s.stats[AR1], 0.5);   // one detection per image: one of two objects
  EXPECT_DOUBLE_EQ(s.stats[AR10], 1.0);
  EXPECT_DOUBLE_EQ(s.stats[APs], -1.0);  // no small ground truth
}

TEST(CocoEval, ResultsJsonRoundTrips) {
  const std::vector<CocoBox> d = {dt(4, 2, 1.23456, 2, 3, 4, 0.123456789)};
  const Json j = coco_results_json(d);
  EXPECT_EQ(j.items()[0].find("image_id")->as_number(), 4);
  EXPECT_NEAR(j.items()[0].find("bbox")->items()[0].as_number(), 1.235, 1e-9);
  EXPECT_NEAR(j.items()[0].find("score")->as_number(), 0.12346, 1e-9);
}
