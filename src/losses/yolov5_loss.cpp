// YOLOv5: every box is matched to the anchors whose shape is within anchor_t of its own, in its
// cell and the two neighbouring cells nearest its centre; CIoU box loss on those, objectness
// targets from the IoU, BCE classes; levels weighted [4.0, 1.0, 0.4]. Candidates are kept as a
// fixed [5 offsets, B, N, anchors] block with a validity mask: no boolean indexing, no sync.
#include <ATen/ATen.h>

#include "headroom/losses/box_ops.h"
#include "losses_internal.h"

namespace headroom::losses {

namespace {

class Yolov5Loss : public DetectionLoss {
 public:
  Yolov5Loss(const models::DetectorInfo& info, const LossOptions& o) : info_(info), o_(o) {}

  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t) override {
    const auto& preds = outputs.at("pred");  // [B, na, H, W, 5 + nc] per level
    const int64_t nl = static_cast<int64_t>(preds.size()), B = preds[0].size(0), na = preds[0].size(1);
    const int64_t nc = info_.nc, N = t.boxes.size(1);
    const auto fopt = preds[0].options().dtype(at::kFloat);
    const std::vector<double> balance = nl == 3 ? std::vector<double>{4.0, 1.0, 0.4} : std::vector<double>{4.0, 1.0, 0.25, 0.06, 0.02};
    // Ultralytics scales the gains by the number of levels, classes and the image size.
    const double imgsz = double(preds[0].size(3) * info_.strides[0]);
    const double box_gain = (o_.box >= 0 ? o_.box : 0.05) * 3.0 / double(nl);
    const double cls_gain = o_.cls * double(nc) / 80.0 * 3.0 / double(nl);
    const double obj_gain = o_.obj * (imgsz / 640.0) * (imgsz / 640.0) * 3.0 / double(nl);

    const at::Tensor xywh = xyxy_to_xywh(t.boxes.to(at::kFloat));             // [B, N, 4] pixels
    // Cell offsets: the own cell and the neighbours left, up, right, down (half a cell).
    const at::Tensor off = at::tensor({0.f, 0.f, 0.5f, 0.f, 0.f, 0.5f, -0.5f, 0.f, 0.f, -0.5f}, fopt).view({5, 1, 1, 1, 2});
    const at::Tensor zero = at::zeros({}, fopt);
    at::Tensor lbox = at::zeros({}, fopt), lobj = at::zeros({}, fopt), lcls = at::zeros({}, fopt);
    for (int64_t i = 0; i < nl; ++i) {
      const at::Tensor& p = preds[size_t(i)];
      const int64_t H = p.size(2), W = p.size(3);
      const double s = double(info_.strides[size_t(i)]);
      const at::Tensor anc = info_.anchors[i].to(p.device()).to(at::kFloat) / s;  // [na, 2] grid units
      const at::Tensor g = xywh / s;                                           // [B, N, 4] grid units
      const at::Tensor gxy = g.narrow(2, 0, 2), gwh = g.narrow(2, 2, 2);
      const at::Tensor r = gwh.unsqueeze(2) / anc.view({1, 1, na, 2});         // [B, N, na, 2]
      const at::Tensor shape_ok = at::max(r, 1.0 / r).amax(-1).lt(o_.anchor_t).logical_and(t.mask.unsqueeze(-1));
      const at::Tensor gxi = at::tensor({float(W), float(H)}, fopt) - gxy;
      const at::Tensor near = at::fmod(gxy, 1.0).lt(0.5).logical_and(gxy.gt(1.0));   // [B, N, 2]: left / up
      const at::Tensor far = at::fmod(gxi, 1.0).lt(0.5).logical_and(gxi.gt(1.0));     // right / down
      const at::Tensor use = at::stack({at::ones_like(near.select(2, 0)), near.select(2, 0), near.select(2, 1),
                                        far.select(2, 0), far.select(2, 1)});          // [5, B, N]
      const at::Tensor valid = use.unsqueeze(-1).logical_and(shape_ok.unsqueeze(0));   // [5, B, N, na]
      const at::Tensor gij = (gxy.unsqueeze(0).unsqueeze(3) - off).floor();            // [5, B, N, 1, 2]
      const at::Tensor gi = gij.select(-1, 0).clamp(0, W - 1), gj = gij.select(-1, 1).clamp(0, H - 1);
      const at::Tensor txy = gxy.unsqueeze(0).unsqueeze(3) - at::stack({gi, gj}, -1);  // [5, B, N, 1, 2]
      const at::Tensor bidx = at::arange(B, fopt.dtype(at::kLong)).view({1, B, 1, 1});
      const at::Tensor aidx = at::arange(na, fopt.dtype(at::kLong)).view({1, 1, 1, na});
      const at::Tensor cell = ((bidx * na + aidx) * H + gj.to(at::kLong)) * W + gi.to(at::kLong);  // [5, B, N, na]
      const at::Tensor ps = p.reshape({-1, p.size(4)}).index_select(0, cell.reshape(-1)).view({5, B, N, na, -1}).to(at::kFloat);
      const at::Tensor pxy = ps.narrow(-1, 0, 2).sigmoid() * 2 - 0.5;
      const at::Tensor pwh = (ps.narrow(-1, 2, 2).sigmoid() * 2).pow(2) * anc.view({1, 1, 1, na, 2});
      const at::Tensor tbox = at::cat({txy.expand({5, B, N, na, 2}), gwh.unsqueeze(0).unsqueeze(3).expand({5, B, N, na, 2})}, -1);
      const at::Tensor iou = ciou(xywh_to_xyxy(at::cat({pxy, pwh}, -1)), xywh_to_xyxy(tbox));  // [5, B, N, na]
      const at::Tensor n = valid.sum().clamp_min(1).to(at::kFloat);
      lbox = lbox + at::where(valid, 1.0 - iou, zero).sum() / n;
      // Objectness target: the IoU at every matched cell (one spare slot takes the unmatched writes).
      at::Tensor tobj = at::zeros({B * na * H * W + 1}, fopt);
      const at::Tensor slot = at::where(valid, cell, at::full({}, B * na * H * W, cell.options()));
      tobj.index_put_({slot.reshape(-1)}, iou.detach().clamp_min(0).reshape(-1));
      const at::Tensor obj_target = tobj.narrow(0, 0, B * na * H * W).view({B, na, H, W});
      lobj = lobj + at::binary_cross_entropy_with_logits(p.select(-1, 4).to(at::kFloat), obj_target) * balance[size_t(i)];
      if (nc > 1) {
        const at::Tensor cls = t.classes.clamp_min(0).view({1, B, N, 1}).expand({5, B, N, na});
        const at::Tensor onehot = at::zeros({5, B, N, na, nc}, fopt).scatter_(-1, cls.unsqueeze(-1), 1.0);
        const at::Tensor bce = at::binary_cross_entropy_with_logits(ps.narrow(-1, 5, nc), onehot, {}, {}, at::Reduction::None);
        lcls = lcls + at::where(valid.unsqueeze(-1), bce, zero).sum() / (n * double(nc));
      }
    }
    LossTerms out;
    lbox = lbox * box_gain, lobj = lobj * obj_gain, lcls = lcls * cls_gain;
    out.total = (lbox + lobj + lcls) * double(B);
    out.items = {{"box", lbox.detach()}, {"obj", lobj.detach()}, {"cls", lcls.detach()}};
    return out;
  }

 private:
  models::DetectorInfo info_;
  LossOptions o_;
};

}  // namespace

std::unique_ptr<DetectionLoss> make_yolov5_loss(const models::DetectorInfo& info, const LossOptions& o) {
  return std::make_unique<Yolov5Loss>(info, o);
}

}  // namespace headroom::losses
