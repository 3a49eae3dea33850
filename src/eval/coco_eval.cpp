#include "headroom/eval/coco_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "headroom/core/errors.h"
#include "headroom/data/labels.h"

namespace headroom::eval {

namespace {

constexpr int kT = 10;   // IoU thresholds .50:.05:.95
constexpr int kR = 101;  // recall thresholds 0:.01:1
constexpr int kA = 4;    // area ranges: all, small, medium, large
constexpr int kM = 3;    // max detections 1, 10, 100
// As numpy.linspace computes them (i * step + start), so that ties at a threshold fall the same
// way as in pycocotools: 0.9 is 0.8999999999999999 there.
double iou_threshold(int t) { return t == kT - 1 ? 0.95 : double(t) * ((0.95 - 0.5) / 9) + 0.5; }
double recall_threshold(int r) { return double(r) * 0.01; }
const double kArea[kA][2] = {{0, 1e10}, {0, 32 * 32}, {32 * 32, 96 * 96}, {96 * 96, 1e10}};
const int kMaxDets[kM] = {1, 10, 100};

// One image and category at one area range, for the largest maxDet (smaller ones truncate).
struct ImageEval {
  std::vector<double> scores;                  // detections, best first
  std::array<std::vector<char>, kT> matched;   // per threshold, per detection
  std::array<std::vector<char>, kT> ignored;   // per threshold, per detection
  int64_t counted_gt = 0;                      // ground truth not ignored
};

double iou_of(const CocoBox& d, const CocoBox& g) {
  const double iw = std::min(d.x + d.w, g.x + g.w) - std::max(d.x, g.x);
  const double ih = std::min(d.y + d.h, g.y + g.h) - std::max(d.y, g.y);
  if (iw <= 0 || ih <= 0) return 0;
  const double inter = iw * ih;
  const double uni = g.crowd ? d.w * d.h : d.w * d.h + g.w * g.h - inter;  // crowd: over the detection
  return uni > 0 ? inter / uni : 0;
}

ImageEval evaluate_image(std::vector<const CocoBox*> gt, std::vector<const CocoBox*> dt, const double area[2]) {
  ImageEval e;
  // Ground truth outside the range or crowd is ignored; ignored ones go last (stable).
  std::vector<char> gt_ignore(gt.size());
  for (size_t i = 0; i < gt.size(); ++i) gt_ignore[i] = gt[i]->crowd || gt[i]->area < area[0] || gt[i]->area > area[1];
  std::vector<size_t> order(gt.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gt_ignore[a] < gt_ignore[b]; });
  std::vector<const CocoBox*> g;
  std::vector<char> g_ig;
  for (size_t i : order) g.push_back(gt[i]), g_ig.push_back(gt_ignore[i]);
  std::stable_sort(dt.begin(), dt.end(), [](const CocoBox* a, const CocoBox* b) { return a->score > b->score; });
  if (dt.size() > size_t(kMaxDets[kM - 1])) dt.resize(size_t(kMaxDets[kM - 1]));
  for (const CocoBox* d : dt) e.scores.push_back(d->score);
  for (char ig : g_ig) e.counted_gt += !ig;

  std::vector<std::vector<double>> ious(dt.size(), std::vector<double>(g.size()));
  for (size_t i = 0; i < dt.size(); ++i)
    for (size_t j = 0; j < g.size(); ++j) ious[i][j] = iou_of(*dt[i], *g[j]);
  for (int t = 0; t < kT; ++t) {
    std::vector<char> gt_taken(g.size(), 0);
    e.matched[t].assign(dt.size(), 0);
    e.ignored[t].assign(dt.size(), 0);
    for (size_t i = 0; i < dt.size(); ++i) {
      double best = std::min(iou_threshold(t), 1 - 1e-10);
      int m = -1;
      for (size_t j = 0; j < g.size(); ++j) {
        if (gt_taken[j] && !g[j]->crowd) continue;          // matched already (crowds match many)
        if (m > -1 && !g_ig[size_t(m)] && g_ig[j]) break;   // a real match beats any ignored one
        if (ious[i][j] < best) continue;
        best = ious[i][j];
        m = int(j);
      }
      if (m == -1) continue;
      e.matched[t][i] = 1;
      e.ignored[t][i] = g_ig[size_t(m)];
      gt_taken[size_t(m)] = 1;
    }
    // Unmatched detections outside the area range are ignored too.
    for (size_t i = 0; i < dt.size(); ++i) {
      const double a = dt[i]->w * dt[i]->h;
      if (!e.matched[t][i] && (a < area[0] || a > area[1])) e.ignored[t][i] = 1;
    }
  }
  return e;
}

// Interpolated precision at the 101 recall points and the final recall, for one threshold.
void precision_recall(const std::vector<std::pair<double, std::pair<char, char>>>& dets, int64_t npig, double* precision,
                      double* recall) {
  std::vector<double> tp_sum, fp_sum;
  double tp = 0, fp = 0;
  for (const auto& [score, flags] : dets) {
    const auto [match, ignore] = flags;
    if (ignore) continue;  // neither a hit nor a miss
    (match ? tp : fp) += 1;
    tp_sum.push_back(tp), fp_sum.push_back(fp);
  }
  const size_t nd = tp_sum.size();
  std::vector<double> rc(nd), pr(nd);
  for (size_t i = 0; i < nd; ++i) {
    rc[i] = tp_sum[i] / double(npig);
    pr[i] = tp_sum[i] / (fp_sum[i] + tp_sum[i] + 2.220446049250313e-16);
  }
  *recall = nd ? rc.back() : 0;
  for (size_t i = nd; i-- > 1;) pr[i - 1] = std::max(pr[i - 1], pr[i]);
  for (int r = 0; r < kR; ++r) {
    const double thr = recall_threshold(r);
    const size_t k = size_t(std::lower_bound(rc.begin(), rc.end(), thr) - rc.begin());
    precision[r] = k < nd ? pr[k] : 0;
  }
}

}  // namespace

namespace {

using Key = std::pair<int64_t, int64_t>;  // (category, image)
using Groups = std::map<Key, std::pair<std::vector<const CocoBox*>, std::vector<const CocoBox*>>>;  // ground truth, detections

Groups group_boxes(const std::vector<CocoBox>& gts, const std::vector<CocoBox>& dts, const std::set<int64_t>& images,
                   const std::map<int64_t, size_t>& cat_index) {
  Groups groups;
  for (const auto& g : gts)
    if (images.count(g.image_id) && cat_index.count(g.category_id)) groups[{g.category_id, g.image_id}].first.push_back(&g);
  for (const auto& d : dts) {
    if (!images.count(d.image_id))
      throw InputError("detection for image id " + std::to_string(d.image_id) + ", which is not in the ground truth");
    if (cat_index.count(d.category_id)) groups[{d.category_id, d.image_id}].second.push_back(&d);
  }
  return groups;
}

// precision [T][R][K][A][M], recall [T][K][A][M]; -1 = no ground truth.
struct Curves {
  explicit Curves(size_t k) : K(k), precision(size_t(kT) * kR * K * kA * kM, -1.0), recall(size_t(kT) * K * kA * kM, -1.0) {}
  size_t p_at(int t, int r, size_t k, int a, int m) const { return (((size_t(t) * kR + r) * K + k) * kA + a) * kM + m; }
  size_t r_at(int t, size_t k, int a, int m) const { return ((size_t(t) * K + k) * kA + a) * kM + m; }

  // The mean over the valid entries of AP (precision over thresholds t, recalls and classes k; -1
  // = all) and AR (recall over thresholds and classes), as pycocotools' summarize.
  double ap(int t_only, int a, int m, int64_t k_only) const {
    std::vector<double> v;
    for (int t = 0; t < kT; ++t)
      for (int r = 0; r < kR; ++r)
        for (size_t k = 0; k < K; ++k)
          if ((t_only < 0 || t == t_only) && (k_only < 0 || int64_t(k) == k_only)) v.push_back(precision[p_at(t, r, k, a, m)]);
    return mean_valid(v);
  }
  double ar(int a, int m) const {
    std::vector<double> v;
    for (int t = 0; t < kT; ++t)
      for (size_t k = 0; k < K; ++k) v.push_back(recall[r_at(t, k, a, m)]);
    return mean_valid(v);
  }
  static double mean_valid(const std::vector<double>& v) {
    double s = 0;
    int64_t n = 0;
    for (double x : v)
      if (x > -1) s += x, ++n;
    return n ? s / double(n) : -1.0;
  }

  size_t K;
  std::vector<double> precision, recall;
};

// Class k's images evaluated at every area range, then its precision and recall curves.
CocoStats::PerClass evaluate_class(const Groups& groups, int64_t cat, size_t k, Curves& curves) {
  CocoStats::PerClass pc;
  pc.category_id = cat;
  std::vector<std::array<ImageEval, kA>> evals;
  for (auto it = groups.lower_bound({cat, INT64_MIN}); it != groups.end() && it->first.first == cat; ++it) {
    std::array<ImageEval, kA> e;
    for (int a = 0; a < kA; ++a) e[size_t(a)] = evaluate_image(it->second.first, it->second.second, kArea[a]);
    pc.instances += e[0].counted_gt;
    pc.images += e[0].counted_gt > 0;
    evals.push_back(std::move(e));
  }
  for (int a = 0; a < kA; ++a)
    for (int m = 0; m < kM; ++m) {
      int64_t npig = 0;
      for (const auto& e : evals) npig += e[size_t(a)].counted_gt;
      if (npig == 0) continue;
      for (int t = 0; t < kT; ++t) {
        // Every image's first maxDet detections, merged by score (stable, as mergesort).
        std::vector<std::pair<double, std::pair<char, char>>> dets;
        for (const auto& e : evals) {
          const ImageEval& ie = e[size_t(a)];
          for (size_t i = 0; i < ie.scores.size() && i < size_t(kMaxDets[m]); ++i)
            dets.push_back({ie.scores[i], {ie.matched[t][i], ie.ignored[t][i]}});
        }
        std::stable_sort(dets.begin(), dets.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
        double pr[kR];
        precision_recall(dets, npig, pr, &curves.recall[curves.r_at(t, k, a, m)]);
        for (int r = 0; r < kR; ++r) curves.precision[curves.p_at(t, r, k, a, m)] = pr[r];
      }
    }
  return pc;
}

}  // namespace

CocoStats coco_evaluate(const std::vector<CocoBox>& gts, const std::vector<CocoBox>& dts,
                        const std::vector<int64_t>& image_ids, const std::vector<int64_t>& category_ids) {
  const std::set<int64_t> images(image_ids.begin(), image_ids.end());
  std::map<int64_t, size_t> cat_index;
  for (size_t k = 0; k < category_ids.size(); ++k) cat_index[category_ids[k]] = k;
  const Groups groups = group_boxes(gts, dts, images, cat_index);
  const size_t K = category_ids.size();
  Curves c(K);
  CocoStats stats;
  for (size_t k = 0; k < K; ++k) stats.per_class.push_back(evaluate_class(groups, category_ids[k], k, c));
  stats.stats = {c.ap(-1, 0, 2, -1), c.ap(0, 0, 2, -1), c.ap(5, 0, 2, -1), c.ap(-1, 1, 2, -1), c.ap(-1, 2, 2, -1), c.ap(-1, 3, 2, -1),
                 c.ar(0, 0),         c.ar(0, 1),        c.ar(0, 2),        c.ar(1, 2),         c.ar(2, 2),         c.ar(3, 2)};
  for (size_t k = 0; k < K; ++k) {
    stats.per_class[k].ap = c.ap(-1, 0, 2, int64_t(k));
    stats.per_class[k].ap50 = c.ap(0, 0, 2, int64_t(k));
  }
  return stats;
}

// ---------------------------------------------------------------------------------------
// Files

namespace {

double number(const Json& obj, const char* key, const std::string& where) {
  const Json* v = obj.find(key);
  if (!v || !v->is_number()) throw InputError(where + ": \"" + key + "\" must be a number");
  return v->as_number();
}

CocoBox box_of(const Json& obj, const std::string& where) {
  CocoBox b;
  b.image_id = static_cast<int64_t>(number(obj, "image_id", where));
  b.category_id = static_cast<int64_t>(number(obj, "category_id", where));
  const Json* bbox = obj.find("bbox");
  if (!bbox || !bbox->is_array() || bbox->size() != 4)
    throw InputError(where + ": \"bbox\" must be [x, y, width, height]");
  for (const auto& v : bbox->items())
    if (!v.is_number()) throw InputError(where + ": \"bbox\" must hold four numbers");
  b.x = bbox->items()[0].as_number(), b.y = bbox->items()[1].as_number();
  b.w = bbox->items()[2].as_number(), b.h = bbox->items()[3].as_number();
  return b;
}

}  // namespace

CocoGroundTruth read_coco_ground_truth(const std::string& path) {
  const Json root = read_json_file(path);
  const Json* images = root.find("images");
  const Json* cats = root.find("categories");
  const Json* anns = root.find("annotations");
  if (!images || !images->is_array() || !cats || !cats->is_array())
    throw InputError(path + ": a COCO ground-truth file needs \"images\" and \"categories\" arrays");
  CocoGroundTruth gt;
  for (const Json& im : images->items()) gt.image_ids.push_back(static_cast<int64_t>(number(im, "id", format_location(path, im.line()))));
  std::vector<std::pair<int64_t, std::string>> c;
  for (const Json& cat : cats->items()) {
    const Json* name = cat.find("name");
    c.emplace_back(static_cast<int64_t>(number(cat, "id", format_location(path, cat.line()))), name && name->is_string() ? name->as_string() : "");
  }
  std::sort(c.begin(), c.end());
  for (const auto& [id, name] : c) gt.category_ids.push_back(id), gt.category_names.push_back(name);
  if (anns && anns->is_array())
    for (const Json& a : anns->items()) {
      const std::string where = format_location(path, a.line());
      CocoBox b = box_of(a, where);
      const Json* area = a.find("area");
      b.area = area && area->is_number() ? area->as_number() : b.w * b.h;
      b.crowd = data::coco_crowd(a);
      gt.boxes.push_back(b);
    }
  return gt;
}

std::vector<CocoBox> read_coco_results(const std::string& path) {
  const Json root = read_json_file(path);
  if (!root.is_array()) throw InputError(path + ": a COCO results file is an array of {image_id, category_id, bbox, score}");
  std::vector<CocoBox> out;
  for (const Json& r : root.items()) {
    const std::string where = format_location(path, r.line());
    CocoBox b = box_of(r, where);
    b.score = number(r, "score", where);
    out.push_back(b);
  }
  return out;
}

Json coco_results_json(const std::vector<CocoBox>& dts) {
  Json arr = Json::array();
  const auto round_to = [](double v, double q) { return std::round(v / q) * q; };
  for (const auto& d : dts) {
    Json r = Json::object();
    r["image_id"] = d.image_id;
    r["category_id"] = d.category_id;
    Json bbox = Json::array();
    for (double v : {d.x, d.y, d.w, d.h}) bbox.push_back(round_to(v, 1e-3));
    r["bbox"] = bbox;
    r["score"] = round_to(d.score, 1e-5);
    arr.push_back(std::move(r));
  }
  return arr;
}

namespace {
const char* kStatNames[12] = {
    "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
    "Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ]",
    "Average Precision  (AP) @[ IoU=0.75      | area=   all | maxDets=100 ]",
    "Average Precision  (AP) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
    "Average Precision  (AP) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
    "Average Precision  (AP) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=  1 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets= 10 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
    "Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]"};
const char* kStatKeys[12] = {"AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
                             "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large"};
}  // namespace

std::string format_coco_stats(const CocoStats& s, const std::vector<std::string>& names) {
  std::string out;
  char buf[256];
  for (int i = 0; i < 12; ++i) {
    std::snprintf(buf, sizeof buf, " %s = %.3f\n", kStatNames[i], s.stats[size_t(i)]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "\n %-20s %8s %10s %8s %10s\n", "class", "images", "instances", "AP50", "AP50-95");
  out += buf;
  for (size_t k = 0; k < s.per_class.size(); ++k) {
    const auto& c = s.per_class[k];
    const std::string name = k < names.size() && !names[k].empty() ? names[k] : std::to_string(c.category_id);
    std::snprintf(buf, sizeof buf, " %-20s %8lld %10lld %8.3f %10.3f\n", name.c_str(), (long long)c.images,
                  (long long)c.instances, c.ap50, c.ap);
    out += buf;
  }
  return out;
}

Json coco_stats_json(const CocoStats& s, const std::vector<std::string>& names) {
  Json j = Json::object();
  for (int i = 0; i < 12; ++i) j[kStatKeys[i]] = s.stats[size_t(i)];
  Json per = Json::array();
  for (size_t k = 0; k < s.per_class.size(); ++k) {
    const auto& c = s.per_class[k];
    Json::Members m = {{"category_id", c.category_id}};
    if (k < names.size()) m.emplace_back("name", names[k]);
    m.insert(m.end(), {{"images", c.images}, {"instances", c.instances}, {"AP50", c.ap50}, {"AP", c.ap}});
    per.push_back(Json::object(std::move(m)));
  }
  j["per_class"] = per;
  return j;
}

}  // namespace headroom::eval
