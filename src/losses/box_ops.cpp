#include "headroom/losses/box_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace headroom::losses {

at::Tensor xyxy_to_xywh(const at::Tensor& b) {
  const auto p = b.unbind(-1);
  return at::stack({(p[0] + p[2]) / 2, (p[1] + p[3]) / 2, p[2] - p[0], p[3] - p[1]}, -1);
}

at::Tensor xywh_to_xyxy(const at::Tensor& b) {
  const auto p = b.unbind(-1);
  return at::stack({p[0] - p[2] / 2, p[1] - p[3] / 2, p[0] + p[2] / 2, p[1] + p[3] / 2}, -1);
}

at::Tensor box_iou(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a1 = a.unsqueeze(-2), b1 = b.unsqueeze(-3);  // [..., N, 1, 4], [..., 1, M, 4]
  const at::Tensor lt = at::max(a1.narrow(-1, 0, 2), b1.narrow(-1, 0, 2));
  const at::Tensor rb = at::min(a1.narrow(-1, 2, 2), b1.narrow(-1, 2, 2));
  const at::Tensor wh = (rb - lt).clamp_min(0);
  const at::Tensor inter = wh.select(-1, 0) * wh.select(-1, 1);
  const auto area = [](const at::Tensor& x) { return (x.select(-1, 2) - x.select(-1, 0)) * (x.select(-1, 3) - x.select(-1, 1)); };
  return inter / (area(a1) + area(b1) - inter + 1e-9);
}

at::Tensor ciou(const at::Tensor& a, const at::Tensor& b, double eps) {
  const auto p = a.unbind(-1), q = b.unbind(-1);
  const at::Tensor w1 = p[2] - p[0], h1 = p[3] - p[1] + eps, w2 = q[2] - q[0], h2 = q[3] - q[1] + eps;
  const at::Tensor inter = (at::min(p[2], q[2]) - at::max(p[0], q[0])).clamp_min(0) *
                           (at::min(p[3], q[3]) - at::max(p[1], q[1])).clamp_min(0);
  const at::Tensor uni = w1 * h1 + w2 * h2 - inter + eps;
  const at::Tensor iou = inter / uni;
  const at::Tensor cw = at::max(p[2], q[2]) - at::min(p[0], q[0]);  // enclosing box
  const at::Tensor ch = at::max(p[3], q[3]) - at::min(p[1], q[1]);
  const at::Tensor c2 = cw.pow(2) + ch.pow(2) + eps;                   // its squared diagonal
  const at::Tensor rho2 = ((q[0] + q[2] - p[0] - p[2]).pow(2) + (q[1] + q[3] - p[1] - p[3]).pow(2)) / 4;
  const at::Tensor v = (4 / (M_PI * M_PI)) * (at::atan(w2 / h2) - at::atan(w1 / h1)).pow(2);
  at::Tensor alpha;
  {
    at::NoGradGuard no_grad;  // as the reference: alpha is a weight, not differentiated
    alpha = v / (v - iou + (1 + eps));
  }
  return iou - (rho2 / c2 + v * alpha);
}

}  // namespace headroom::losses
