// The COCO detection metrics, written to the definitions of pycocotools' COCOeval (bbox):
// AP over IoU .50:.05:.95 with 101-point interpolated precision, AP50, AP75, AP by ground-truth
// area (small < 32^2 <= medium < 96^2 <= large), AR at 1 / 10 / 100 detections per image;
// greedy matching by score per image and category, crowd ground truth matched (by the
// intersection over the detection's area) but never counted, at most 100 detections per image
// and category. Plain C++: no tensors.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "headroom/core/json.h"

namespace headroom::eval {

struct CocoBox {
  int64_t image_id = 0;
  int64_t category_id = 0;
  double x = 0, y = 0, w = 0, h = 0;  // pixels, top-left and size
  double area = 0;                    // ground truth: the annotation's area (w * h when it has none)
  bool crowd = false;                 // ground truth only
  double score = 0;                   // detections only
};

struct CocoStats {
  // AP, AP50, AP75, AP_small, AP_medium, AP_large, AR1, AR10, AR100, AR_small, AR_medium, AR_large;
  // -1 where nothing could be measured (no ground truth in that range).
  std::array<double, 12> stats{};
  struct PerClass {
    int64_t category_id = 0;
    double ap = -1, ap50 = -1;
    int64_t instances = 0, images = 0;  // non-crowd ground truth boxes, images holding one
  };
  std::vector<PerClass> per_class;
};

// Evaluates `dts` against `gts` over `image_ids` and `category_ids` (the ground truth's, as
// pycocotools takes them from the GT file: images without boxes count, unknown ones are an error).
CocoStats coco_evaluate(const std::vector<CocoBox>& gts, const std::vector<CocoBox>& dts,
                        const std::vector<int64_t>& image_ids, const std::vector<int64_t>& category_ids);

struct CocoGroundTruth {
  std::vector<CocoBox> boxes;
  std::vector<int64_t> image_ids;
  std::vector<int64_t> category_ids;
  std::vector<std::string> category_names;
};
CocoGroundTruth read_coco_ground_truth(const std::string& path);
// A COCO results file: [{image_id, category_id, bbox: [x, y, w, h], score}, ...].
std::vector<CocoBox> read_coco_results(const std::string& path);
Json coco_results_json(const std::vector<CocoBox>& dts);

// The summary in pycocotools' wording, then one row per class.
std::string format_coco_stats(const CocoStats& s, const std::vector<std::string>& names);
Json coco_stats_json(const CocoStats& s, const std::vector<std::string>& names);

}  // namespace headroom::eval
