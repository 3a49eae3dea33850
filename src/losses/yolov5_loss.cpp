// YOLOv5: every box is matched to the anchors whose shape is within anchor_t of its own, in its
// cell and the two neighbouring cells nearest its centre; CIoU box loss on those, objectness
// targets from the IoU, BCE classes; levels weighted [4.0, 1.0, 0.4]. Candidates are kept as a
// fixed [5 offsets, B, N, anchors] block with a validity mask: no boolean indexing, no sync.
// Normalisers (matched candidates and grid cells per level) are counts of the step's targets.
#include <ATen/ATen.h>

#include "headroom/core/device_constant.h"
#include "headroom/losses/box_ops.h"
#include "losses_internal.h"

namespace headroom::losses {

namespace {

class Yolov5Loss : public DetectionLoss {
 public:
  Yolov5Loss(const models::DetectorInfo& info, const LossOptions& o) : info_(info), o_(o) {
    const at::Tensor a = info.anchors.to(at::kCPU).to(at::kDouble).contiguous();  // the model's buffer: on CUDA once moved
    anchors_.assign(a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
  }

  std::vector<std::string> term_names() const override { return {"box", "obj", "cls"}; }

  // Per level: the matched candidates (the box and class terms' normaliser), then the grid
  // cells (the objectness mean's).
  at::Tensor counts(const Targets& t, int64_t height, int64_t width) const override {
    const int64_t nl = int64_t(info_.strides.size()), B = t.boxes.size(0), na = info_.anchors.size(1);
    std::vector<at::Tensor> n, cells;
    for (int64_t i = 0; i < nl; ++i) {
      const int64_t H = height / info_.strides[size_t(i)], W = width / info_.strides[size_t(i)];
      n.push_back(match(t, i, H, W).valid.sum().to(at::kFloat));
      cells.push_back(at::full({}, double(B * na * H * W), t.boxes.options().dtype(at::kFloat)));
    }
    n.insert(n.end(), cells.begin(), cells.end());
    return at::stack(n);
  }

  int64_t count_terms() const override { return 2 * int64_t(info_.strides.size()); }

  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t, const StepNorm& step) override {
    const auto& preds = outputs.at("pred");  // [B, na, H, W, 5 + nc] per level
    const int64_t nl = static_cast<int64_t>(preds.size()), B = preds[0].size(0), na = preds[0].size(1);
    const int64_t nc = info_.nc, N = t.boxes.size(1);
    const auto fopt = preds[0].options().dtype(at::kFloat);
    const std::vector<double> balance = nl == 3 ? std::vector<double>{4.0, 1.0, 0.4} : std::vector<double>{4.0, 1.0, 0.25, 0.06, 0.02};
    // Ultralytics scales the gains by the number of levels, classes and the image size: the
    // run's, not a multi-scale batch's own.
    const double imgsz = o_.imgsz() > 0 ? double(o_.imgsz()) : double(preds[0].size(3) * info_.strides[0]);
    const double box_gain = (o_.box() >= 0 ? o_.box() : 0.05) * 3.0 / double(nl);
    const double cls_gain = o_.cls() * double(nc) / 80.0 * 3.0 / double(nl);
    const double obj_gain = o_.obj() * (imgsz / 640.0) * (imgsz / 640.0) * 3.0 / double(nl);

    const at::Tensor zero = at::zeros({}, fopt);
    at::Tensor lbox = at::zeros({}, fopt), lobj = at::zeros({}, fopt), lcls = at::zeros({}, fopt);
    for (int64_t i = 0; i < nl; ++i) {
      const at::Tensor& p = preds[size_t(i)];
      const int64_t H = p.size(2), W = p.size(3);
      const Match m = match(t, i, H, W);
      const at::Tensor ps = p.reshape({-1, p.size(4)}).index_select(0, m.cell.reshape(-1)).view({5, B, N, na, -1}).to(at::kFloat);
      const at::Tensor pxy = ps.narrow(-1, 0, 2).sigmoid() * 2 - 0.5;
      const at::Tensor pwh = (ps.narrow(-1, 2, 2).sigmoid() * 2).pow(2) * m.anchors.view({1, 1, 1, na, 2});
      const at::Tensor tbox = at::cat({m.txy.expand({5, B, N, na, 2}), m.gwh.unsqueeze(0).unsqueeze(3).expand({5, B, N, na, 2})}, -1);
      const at::Tensor iou = ciou(xywh_to_xyxy(at::cat({pxy, pwh}, -1)), xywh_to_xyxy(tbox));  // [5, B, N, na]
      const at::Tensor n = step.counts[i].clamp_min(1);  // the step's matched candidates at this level
      lbox = lbox + at::where(m.valid, 1.0 - iou, zero).sum() / n;
      // Objectness target: the IoU at every matched cell (one spare slot takes the unmatched writes).
      at::Tensor tobj = at::zeros({B * na * H * W + 1}, fopt);
      const at::Tensor slot = at::where(m.valid, m.cell, at::full({}, B * na * H * W, m.cell.options()));
      tobj.index_put_({slot.reshape(-1)}, iou.detach().clamp_min(0).reshape(-1));
      const at::Tensor obj_target = tobj.narrow(0, 0, B * na * H * W).view({B, na, H, W});
      const at::Tensor bce_obj = at::binary_cross_entropy_with_logits(p.select(-1, 4).to(at::kFloat), obj_target, {}, {},
                                                                     at::Reduction::None);
      lobj = lobj + bce_obj.sum() / step.counts[nl + i] * balance[size_t(i)];  // the mean over the step's cells
      if (nc > 1) {
        const at::Tensor cls = t.classes.clamp_min(0).view({1, B, N, 1}).expand({5, B, N, na});
        const at::Tensor onehot = at::zeros({5, B, N, na, nc}, fopt).scatter_(-1, cls.unsqueeze(-1), 1.0);
        const at::Tensor bce = at::binary_cross_entropy_with_logits(ps.narrow(-1, 5, nc), onehot, {}, {}, at::Reduction::None);
        lcls = lcls + at::where(m.valid.unsqueeze(-1), bce, zero).sum() / (n * double(nc));
      }
    }
    LossTerms out;
    lbox = lbox * box_gain, lobj = lobj * obj_gain, lcls = lcls * cls_gain;
    out.total = (lbox + lobj + lcls) * double(step.images);
    out.items = at::stack({lbox, lobj, lcls}).detach();
    return out;
  }

 private:
  // Level i's candidates: every box matched to the anchors whose shape is within anchor_t of its
  // own, in its cell and the two neighbouring cells nearest its centre, as a fixed block.
  struct Match {
    at::Tensor valid;    // [5, B, N, na] bool
    at::Tensor cell;     // [5, B, N, na] int64: flat index into the level's [B, na, H, W]
    at::Tensor txy;      // [5, B, N, 1, 2] box centre within its cell (grid units)
    at::Tensor gwh;      // [B, N, 2] box size (grid units)
    at::Tensor anchors;  // [na, 2] grid units
  };
  Match match(const Targets& t, int64_t i, int64_t H, int64_t W) const {
    const int64_t B = t.boxes.size(0), na = info_.anchors.size(1);
    const auto fopt = t.boxes.options().dtype(at::kFloat);
    const double s = double(info_.strides[size_t(i)]);
    Match m;
    m.anchors = device_constant(anchors_, at::kFloat, t.boxes.device()).view({-1, na, 2})[i] / s;
    const at::Tensor g = xyxy_to_xywh(t.boxes.to(at::kFloat)) / s;  // [B, N, 4] grid units
    const at::Tensor gxy = g.narrow(2, 0, 2);
    m.gwh = g.narrow(2, 2, 2);
    const at::Tensor r = m.gwh.unsqueeze(2) / m.anchors.view({1, 1, na, 2});  // [B, N, na, 2]
    const at::Tensor shape_ok = at::max(r, 1.0 / r).amax(-1).lt(o_.anchor_t()).logical_and(t.mask.unsqueeze(-1));
    const at::Tensor gxi = at::stack({double(W) - gxy.select(2, 0), double(H) - gxy.select(2, 1)}, 2);
    const at::Tensor near = at::fmod(gxy, 1.0).lt(0.5).logical_and(gxy.gt(1.0));   // [B, N, 2]: left / up
    const at::Tensor far = at::fmod(gxi, 1.0).lt(0.5).logical_and(gxi.gt(1.0));    // right / down
    const at::Tensor use = at::stack({at::ones_like(near.select(2, 0)), near.select(2, 0), near.select(2, 1),
                                      far.select(2, 0), far.select(2, 1)});          // [5, B, N]
    m.valid = use.unsqueeze(-1).logical_and(shape_ok.unsqueeze(0));                  // [5, B, N, na]
    // Cell offsets: the own cell and the neighbours left, up, right, down (half a cell).
    const at::Tensor off = device_constant({0, 0, 0.5, 0, 0, 0.5, -0.5, 0, 0, -0.5}, at::kFloat, t.boxes.device()).view({5, 1, 1, 1, 2});
    const at::Tensor gij = (gxy.unsqueeze(0).unsqueeze(3) - off).floor();            // [5, B, N, 1, 2]
    const at::Tensor gi = gij.select(-1, 0).clamp(0, W - 1), gj = gij.select(-1, 1).clamp(0, H - 1);
    m.txy = gxy.unsqueeze(0).unsqueeze(3) - at::stack({gi, gj}, -1);
    const at::Tensor bidx = at::arange(B, fopt.dtype(at::kLong)).view({1, B, 1, 1});
    const at::Tensor aidx = at::arange(na, fopt.dtype(at::kLong)).view({1, 1, 1, na});
    m.cell = ((bidx * na + aidx) * H + gj.to(at::kLong)) * W + gi.to(at::kLong);  // [5, B, N, na]
    return m;
  }

  models::DetectorInfo info_;
  LossOptions o_;
  std::vector<double> anchors_;  // [levels, na, 2] pixels, flattened
};

}  // namespace

std::unique_ptr<DetectionLoss> make_yolov5_loss(const models::DetectorInfo& info, const LossOptions& o) {
  return std::make_unique<Yolov5Loss>(info, o);
}

}  // namespace headroom::losses
