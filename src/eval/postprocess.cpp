#include "headroom/eval/postprocess.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "headroom/core/errors.h"
#include "headroom/models/anchors.h"

namespace headroom::eval {

#ifdef HEADROOM_WITH_CUDA
at::Tensor nms_keep_cuda(const at::Tensor& boxes, const at::Tensor& valid, double iou);  // nms_cuda.cpp
#endif

namespace {

at::Tensor nms_keep_cpu(const at::Tensor& boxes_in, const at::Tensor& valid_in, double thr) {
  const at::Tensor boxes = boxes_in.to(at::kFloat).contiguous(), valid = valid_in.to(at::kBool).contiguous();
  const int64_t B = boxes.size(0), K = boxes.size(1);
  at::Tensor keep = at::zeros({B, K}, valid.options());
  const float* bx = boxes.data_ptr<float>();
  const bool* va = valid.data_ptr<bool>();
  bool* kp = keep.data_ptr<bool>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<char> removed(static_cast<size_t>(K));
    for (int64_t b = b0; b < b1; ++b) {
      const float* p = bx + b * K * 4;
      std::fill(removed.begin(), removed.end(), 0);
      for (int64_t i = 0; i < K; ++i) {
        if (!va[b * K + i] || removed[size_t(i)]) continue;
        kp[b * K + i] = true;
        const float ax1 = p[4 * i], ay1 = p[4 * i + 1], ax2 = p[4 * i + 2], ay2 = p[4 * i + 3];
        const float area_a = (ax2 - ax1) * (ay2 - ay1);
        for (int64_t j = i + 1; j < K; ++j) {
          if (removed[size_t(j)] || !va[b * K + j]) continue;
          const float w = std::min(ax2, p[4 * j + 2]) - std::max(ax1, p[4 * j]);
          const float h = std::min(ay2, p[4 * j + 3]) - std::max(ay1, p[4 * j + 1]);
          if (w <= 0 || h <= 0) continue;
          const float inter = w * h;
          const float area_b = (p[4 * j + 2] - p[4 * j]) * (p[4 * j + 3] - p[4 * j + 1]);
          if (inter / (area_a + area_b - inter) > thr) removed[size_t(j)] = 1;
        }
      }
    }
  });
  return keep;
}

// Keeps, per image, the first `max_det` rows where `keep` is set (rows are sorted by score).
Detections compact(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& classes, const at::Tensor& keep,
                   int64_t max_det) {
  const int64_t K = keep.size(1), M = std::min(max_det, K);
  const at::Tensor rank = at::arange(K, keep.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor order = std::get<1>(at::where(keep, rank, rank + K).sort(1)).narrow(1, 0, M);  // kept rows first, in order
  Detections d;
  d.counts = keep.sum(1).clamp_max(M);
  const at::Tensor in_use = at::arange(M, order.options()).unsqueeze(0).lt(d.counts.unsqueeze(1));
  d.boxes = at::where(in_use.unsqueeze(-1), boxes.gather(1, order.unsqueeze(-1).expand({-1, M, 4})), at::zeros({}, boxes.options()));
  d.scores = at::where(in_use, scores.gather(1, order), at::zeros({}, scores.options()));
  d.classes = at::where(in_use, classes.gather(1, order), at::full({}, -1, classes.options()));
  return d;
}

}  // namespace

Detections topk_detections(const at::Tensor& boxes, const at::Tensor& scores, const NmsOptions& o) {
  at::NoGradGuard no_grad;
  const int64_t B = scores.size(0), A = scores.size(1), C = scores.size(2), k = std::min(o.max_det, A);
  at::Tensor top, anchor, classes;  // [B, k]: best first
  if (o.agnostic) {
    const auto [best, cls] = scores.max(-1);
    std::tie(top, anchor) = best.topk(k, 1);
    classes = cls.gather(1, anchor);
  } else {
    const at::Tensor first = std::get<1>(scores.amax(-1).topk(k, 1));                          // [B, k] anchors
    at::Tensor pair;
    std::tie(top, pair) = scores.gather(1, first.unsqueeze(-1).expand({B, k, C})).flatten(1).topk(k, 1);  // of k x C
    classes = pair.remainder(C);
    anchor = first.gather(1, pair.div(C, "floor"));
  }
  const at::Tensor picked = boxes.gather(1, anchor.unsqueeze(-1).expand({B, k, 4}));
  return compact(picked, top, classes, top.gt(o.conf), k);
}

at::Tensor nms_keep(const at::Tensor& boxes, const at::Tensor& valid, double iou) {
#ifdef HEADROOM_WITH_CUDA
  if (boxes.is_cuda()) return nms_keep_cuda(boxes, valid, iou);
#endif
  TORCH_CHECK(boxes.is_cpu(), "nms_keep: boxes on ", boxes.device(), " but this build has no CUDA kernel");
  return nms_keep_cpu(boxes, valid, iou);
}

Detections batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const NmsOptions& o) {
  at::NoGradGuard no_grad;
  const int64_t B = scores.size(0), A = scores.size(1), C = scores.size(2);
  at::Tensor cand_scores, cand_classes, cand_box_idx;
  if (o.multi_label && C > 1) {  // every (box, class) pair is a candidate
    cand_scores = scores.reshape({B, A * C});
    cand_box_idx = at::arange(A * C, scores.options().dtype(at::kLong)).div(C, "floor").unsqueeze(0).expand({B, A * C});
    cand_classes = at::arange(A * C, scores.options().dtype(at::kLong)).remainder(C).unsqueeze(0).expand({B, A * C});
  } else {
    auto [best, cls] = scores.max(2);
    cand_scores = best;
    cand_classes = cls;
    cand_box_idx = at::arange(A, scores.options().dtype(at::kLong)).unsqueeze(0).expand({B, A});
  }
  const int64_t K = std::min<int64_t>(o.max_candidates, cand_scores.size(1));
  auto [top_scores, top] = cand_scores.topk(K, 1);  // sorted, best first
  const at::Tensor top_classes = cand_classes.gather(1, top);
  const at::Tensor top_boxes = boxes.gather(1, cand_box_idx.gather(1, top).unsqueeze(-1).expand({B, K, 4}));
  const at::Tensor valid = top_scores.gt(o.conf);
  // Class-aware: shift each class into its own region (Ultralytics' max_wh offset trick).
  const at::Tensor shifted = o.agnostic ? top_boxes : top_boxes + top_classes.unsqueeze(-1).to(top_boxes.scalar_type()) * 7680.0;
  const at::Tensor keep = nms_keep(shifted, valid, o.iou);
  return compact(top_boxes, top_scores, top_classes, keep, o.max_det);
}

Candidates decode_candidates(const models::DetectorInfo& info, const models::HeadOutputs& out, bool one_to_one) {
  at::NoGradGuard no_grad;
  if (info.family == "yolov8") {
    const auto& feats = out.at(info.end2end && one_to_one ? "one2one" : "pred");
    auto [dist, logits] = models::split_yolov8(feats, info.reg_max);
    const models::AnchorGrid grid = models::make_anchor_grid(feats, info.strides, 0.5);
    const at::Tensor boxes = models::dist_to_bbox(models::dfl_expectation(dist.to(at::kFloat), info.reg_max), grid.points) * grid.strides;
    return {boxes, logits.to(at::kFloat).sigmoid()};
  }
  if (info.family == "yolov5") {
    std::vector<at::Tensor> boxes, scores;
    const auto& preds = out.at("pred");
    for (size_t i = 0; i < preds.size(); ++i) {
      const at::Tensor p = preds[i].to(at::kFloat).sigmoid();  // [B, na, H, W, 5 + nc]
      const int64_t B = p.size(0), na = p.size(1), H = p.size(2), W = p.size(3);
      const double s = double(info.strides[i]);
      const auto grid = at::meshgrid({at::arange(H, p.options()), at::arange(W, p.options())}, "ij");
      const at::Tensor cell = at::stack({grid[1], grid[0]}, -1).view({1, 1, H, W, 2});
      const at::Tensor xy = (p.narrow(-1, 0, 2) * 2 - 0.5 + cell) * s;
      const at::Tensor wh = (p.narrow(-1, 2, 2) * 2).pow(2) * info.anchors[int64_t(i)].to(p.device()).view({1, na, 1, 1, 2});
      boxes.push_back(at::cat({xy - wh / 2, xy + wh / 2}, -1).view({B, -1, 4}));
      scores.push_back((p.narrow(-1, 5, info.nc) * p.narrow(-1, 4, 1)).view({B, -1, info.nc}));  // obj x cls
    }
    return {at::cat(boxes, 1), at::cat(scores, 1)};
  }
  throw Error("model family '" + info.family + "' has no per-anchor candidates");
}

Detections decode(const models::DetectorInfo& info, const models::HeadOutputs& out, const DecodeOptions& o) {
  at::NoGradGuard no_grad;
  if (info.family == "yolov8" || info.family == "yolov5") {
    const Candidates c = decode_candidates(info, out, o.one_to_one);
    return info.end2end && o.one_to_one ? topk_detections(c.boxes, c.scores, o.nms) : batched_nms(c.boxes, c.scores, o.nms);
  }
  if (info.family == "centernet") {  // the last stack: 3x3 max-pool peaks, top-K over all classes
    const at::Tensor heat = out.at("heatmap").back().to(at::kFloat).sigmoid();
    const at::Tensor size = out.at("size").back().to(at::kFloat), off = out.at("offset").back().to(at::kFloat);
    const int64_t B = heat.size(0), C = heat.size(1), H = heat.size(2), W = heat.size(3);
    const at::Tensor peaks = heat * at::max_pool2d(heat, {3, 3}, {1, 1}, {1, 1}).eq(heat);
    const int64_t K = std::min<int64_t>(o.topk, C * H * W);
    auto [score, idx] = peaks.view({B, -1}).topk(K, 1);
    const at::Tensor cls = idx.div(H * W, "floor"), pix = idx.remainder(H * W);
    const at::Tensor ys = pix.div(W, "floor").to(at::kFloat), xs = pix.remainder(W).to(at::kFloat);
    const auto at_peaks = [&](const at::Tensor& m) { return m.view({B, 2, H * W}).gather(2, pix.unsqueeze(1).expand({B, 2, K})); };
    const at::Tensor wh = at_peaks(size), dxy = at_peaks(off);
    const at::Tensor cx = xs + dxy.select(1, 0), cy = ys + dxy.select(1, 1);
    const at::Tensor w = wh.select(1, 0), h = wh.select(1, 1);
    const double s = double(info.strides[0]);
    Detections d;
    d.boxes = at::stack({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2}, -1) * s;
    const at::Tensor keep = score.gt(o.nms.conf);
    return compact(d.boxes, score, cls, keep, std::min(o.nms.max_det, K));
  }
  throw Error("no decoder for model family '" + info.family + "'");
}

Detections detect(models::DetectorImpl& model, const at::Tensor& input, const DecodeOptions& o) {
  struct OneToOneOnly {  // set for this call only: the model is also trained, exported, compared
    models::HeadImpl& head;
    explicit OneToOneOnly(models::HeadImpl& h, bool on) : head(h) { head.set_one_to_one_only(on); }
    ~OneToOneOnly() { head.set_one_to_one_only(false); }
  } branch(model.head(), o.one_to_one);
  return decode(model.info(), model.forward(input), o);
}

std::vector<std::vector<std::array<float, 6>>> to_original_pixels(const Detections& d, const std::vector<data::ImageMeta>& meta) {
  const at::Tensor boxes = d.boxes.to(at::kCPU, at::kFloat).contiguous(), scores = d.scores.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor classes = d.classes.to(at::kCPU).contiguous(), counts = d.counts.to(at::kCPU).contiguous();
  const int64_t M = boxes.size(1);
  std::vector<std::vector<std::array<float, 6>>> out(meta.size());
  for (size_t b = 0; b < meta.size(); ++b) {
    const data::Letterbox& g = meta[b].geometry;
    const float sx = float(g.orig_w) / float(g.resized_w), sy = float(g.orig_h) / float(g.resized_h);
    const int64_t n = counts.data_ptr<int64_t>()[b];
    for (int64_t j = 0; j < n; ++j) {
      const float* p = boxes.data_ptr<float>() + (int64_t(b) * M + j) * 4;
      std::array<float, 6> r{};
      r[0] = std::clamp((p[0] - float(g.pad_x)) * sx, 0.f, float(g.orig_w));
      r[1] = std::clamp((p[1] - float(g.pad_y)) * sy, 0.f, float(g.orig_h));
      r[2] = std::clamp((p[2] - float(g.pad_x)) * sx, 0.f, float(g.orig_w));
      r[3] = std::clamp((p[3] - float(g.pad_y)) * sy, 0.f, float(g.orig_h));
      r[4] = scores.data_ptr<float>()[int64_t(b) * M + j];
      r[5] = float(classes.data_ptr<int64_t>()[int64_t(b) * M + j]);
      out[b].push_back(r);
    }
  }
  return out;
}

}  // namespace headroom::eval
