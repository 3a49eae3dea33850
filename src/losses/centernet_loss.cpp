#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>

#include "headroom/losses/centernet.h"
#include "losses_internal.h"

namespace headroom::losses {

at::Tensor gaussian_radius(const at::Tensor& height, const at::Tensor& width, double m) {
  const at::Tensor h = height, w = width;
  const at::Tensor b1 = h + w, c1 = w * h * (1 - m) / (1 + m);
  const at::Tensor r1 = (b1 + at::sqrt(b1 * b1 - 4 * c1)) / 2;
  const at::Tensor b2 = 2 * (h + w), c2 = (1 - m) * w * h;
  const at::Tensor r2 = (b2 + at::sqrt(b2 * b2 - 16 * c2)) / 2;
  const at::Tensor b3 = -2 * m * (h + w), c3 = (m - 1) * w * h;
  const at::Tensor r3 = (b3 + at::sqrt(b3 * b3 - 16 * m * c3)) / 2;
  return at::min(r1, at::min(r2, r3));
}

namespace {

// [B, N, 4] pixel boxes -> x1, y1, x2, y2 on the H x W output, clamped to it.
std::array<at::Tensor, 4> output_corners(const at::Tensor& boxes_px, int64_t H, int64_t W, int64_t stride) {
  const at::Tensor b = boxes_px.to(at::kFloat) / double(stride);
  return {b.select(2, 0).clamp(0, W - 1), b.select(2, 1).clamp(0, H - 1), b.select(2, 2).clamp(0, W - 1), b.select(2, 3).clamp(0, H - 1)};
}

// The boxes that keep an area on the output: the objects the loss counts.
at::Tensor objects_on_output(const at::Tensor& mask, const std::array<at::Tensor, 4>& c) {
  return mask.logical_and(c[2].gt(c[0])).logical_and(c[3].gt(c[1]));
}

}  // namespace

at::Tensor centernet_objects(const at::Tensor& boxes_px, const at::Tensor& mask, int64_t H, int64_t W, int64_t stride) {
  at::NoGradGuard no_grad;
  return objects_on_output(mask, output_corners(boxes_px, H, W, stride));
}

CenterNetTargets centernet_targets(const at::Tensor& boxes_px, const at::Tensor& classes, const at::Tensor& mask, int64_t nc,
                                   int64_t H, int64_t W, int64_t stride, double min_overlap, int64_t chunk_elements) {
  at::NoGradGuard no_grad;
  const int64_t B = boxes_px.size(0), N = boxes_px.size(1);
  const auto fopt = boxes_px.options().dtype(at::kFloat);
  const std::array<at::Tensor, 4> c = output_corners(boxes_px, H, W, stride);
  const at::Tensor &x1 = c[0], &y1 = c[1], &x2 = c[2], &y2 = c[3];
  const at::Tensor w = x2 - x1, h = y2 - y1;
  CenterNetTargets t;
  t.mask = objects_on_output(mask, c);
  const at::Tensor radius = gaussian_radius(h.ceil(), w.ceil(), min_overlap).floor().clamp_min(0);  // int(), >= 0
  const at::Tensor cx = (x1 + x2) / 2, cy = (y1 + y2) / 2;
  const at::Tensor ix = cx.floor(), iy = cy.floor();
  t.index = (iy * W + ix).to(at::kLong);
  t.size = at::stack({w, h}, -1);
  t.offset = at::stack({cx - ix, cy - iy}, -1);

  // Peaks: exp(-(dx^2 + dy^2) / (2 sigma^2)) inside the (2r + 1)^2 window, sigma = (2r + 1) / 6.
  t.heatmap = at::zeros({B * nc, H * W}, fopt);
  const at::Tensor gx = at::arange(W, fopt).view({1, 1, W}), gy = at::arange(H, fopt).view({1, H, 1});
  const at::Tensor plane = (at::arange(B, fopt.dtype(at::kLong)).view({B, 1}) * nc + classes.clamp_min(0)).reshape(-1);
  const at::Tensor fx = ix.reshape({-1, 1, 1}), fy = iy.reshape({-1, 1, 1}), fr = radius.reshape({-1, 1, 1});
  const at::Tensor on = t.mask.reshape({-1, 1, 1});
  const int64_t chunk = std::max<int64_t>(1, chunk_elements / std::max<int64_t>(H * W, 1));
  for (int64_t k0 = 0; k0 < B * N; k0 += chunk) {
    const int64_t k = std::min(chunk, B * N - k0);
    const at::Tensor dx = gx - fx.narrow(0, k0, k), dy = gy - fy.narrow(0, k0, k), r = fr.narrow(0, k0, k);
    const at::Tensor sigma = (2 * r + 1) / 6;
    const at::Tensor inside = dx.abs().le(r).logical_and(dy.abs().le(r)).logical_and(on.narrow(0, k0, k));
    const at::Tensor g = at::where(inside, at::exp(-(dx * dx + dy * dy) / (2 * sigma * sigma)), at::zeros({}, fopt));
    t.heatmap.index_reduce_(0, plane.narrow(0, k0, k), g.view({k, H * W}), "amax");
  }
  t.heatmap = t.heatmap.view({B, nc, H, W});
  return t;
}

at::Tensor centernet_focal_sum(const at::Tensor& logits, const at::Tensor& target) {
  const at::Tensor p = logits.to(at::kFloat).sigmoid().clamp(1e-4, 1 - 1e-4);
  const at::Tensor pos = target.eq(1), zero = at::zeros({}, p.options());
  const at::Tensor pos_loss = at::where(pos, at::log(p) * (1 - p).pow(2), zero).sum();
  const at::Tensor neg_loss = at::where(pos, zero, at::log(1 - p) * p.pow(2) * (1 - target).pow(4)).sum();
  return -(pos_loss + neg_loss);
}

at::Tensor centernet_focal_loss(const at::Tensor& logits, const at::Tensor& target) {
  return centernet_focal_sum(logits, target) / target.eq(1).sum().clamp_min(1).to(at::kFloat);
}

namespace {

// L1 of the predictions at the centre cells, summed (the reference divides by 2 x objects).
at::Tensor centre_l1_sum(const at::Tensor& pred, const at::Tensor& index, const at::Tensor& target, const at::Tensor& mask) {
  const int64_t B = pred.size(0), C = pred.size(1);
  const at::Tensor at_centres = pred.to(at::kFloat).view({B, C, -1}).gather(2, index.unsqueeze(1).expand({B, C, index.size(1)}))
                                    .permute({0, 2, 1});  // [B, N, C]
  const at::Tensor m = mask.unsqueeze(-1).to(at::kFloat);
  return (at_centres * m - target * m).abs().sum();
}

class CenterNetLoss : public DetectionLoss {
 public:
  CenterNetLoss(const models::DetectorInfo& info, const LossOptions& o) : info_(info), o_(o) {}

  std::vector<std::string> term_names() const override { return {"heatmap", "size", "offset"}; }

  // The objects: TF's normaliser of all three terms (the focal sum, and each L1 sum over a box's
  // two coordinates), over the step, not over each part. xingyizhou's CenterNet divides the
  // heatmap by its peaks and the L1 terms by 2 x objects: its wh_weight 0.1 is 0.05 here.
  at::Tensor counts(const Targets& t, int64_t height, int64_t width) const override {
    const int64_t stride = info_.strides[0];
    return centernet_objects(t.boxes, t.mask, height / stride, width / stride, stride).sum().to(at::kFloat).view({1});
  }

  int64_t count_terms() const override { return 1; }

  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t, const StepNorm& step) override {
    const auto& heat = outputs.at("heatmap");
    const auto& size = outputs.at("size");
    const auto& off = outputs.at("offset");
    const CenterNetTargets ct = targets(t, heat[0].size(2), heat[0].size(3));
    const auto fopt = heat[0].options().dtype(at::kFloat);
    at::Tensor lh = at::zeros({}, fopt), ls = at::zeros({}, fopt), lo = at::zeros({}, fopt);
    for (size_t s = 0; s < heat.size(); ++s) {  // every stack, averaged
      lh = lh + centernet_focal_sum(heat[s], ct.heatmap);
      ls = ls + centre_l1_sum(size[s], ct.index, ct.size, ct.mask);
      lo = lo + centre_l1_sum(off[s], ct.index, ct.offset, ct.mask);
    }
    const at::Tensor objects = step.counts[0].clamp_min(1);  // TF: at least 1
    const double stacks = double(heat.size());
    lh = lh / objects / stacks * o_.heatmap_weight();
    ls = ls / objects / stacks * o_.size_weight();
    lo = lo / objects / stacks * o_.offset_weight();
    LossTerms out;
    out.total = lh + ls + lo;
    out.items = at::stack({lh, ls, lo}).detach();
    return out;
  }

 private:
  CenterNetTargets targets(const Targets& t, int64_t H, int64_t W) const {
    return centernet_targets(t.boxes, t.classes, t.mask, info_.nc, H, W, info_.strides[0], o_.min_overlap(), o_.assigner_chunk());
  }

  models::DetectorInfo info_;
  LossOptions o_;
};

}  // namespace

std::unique_ptr<DetectionLoss> make_centernet_loss(const models::DetectorInfo& info, const LossOptions& o) {
  return std::make_unique<CenterNetLoss>(info, o);
}

}  // namespace headroom::losses
