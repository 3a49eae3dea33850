#include "headroom/models/anchors.h"

#include <ATen/ATen.h>

namespace headroom::models {

AnchorGrid make_anchor_grid(const std::vector<at::Tensor>& feats, const std::vector<int64_t>& strides, double offset) {
  std::vector<at::Tensor> points, stride;
  const auto opt = feats[0].options().dtype(at::kFloat);
  for (size_t i = 0; i < feats.size(); ++i) {
    const int64_t h = feats[i].size(-2), w = feats[i].size(-1);
    const at::Tensor sx = at::arange(w, opt) + offset, sy = at::arange(h, opt) + offset;
    const auto grid = at::meshgrid({sy, sx}, "ij");
    points.push_back(at::stack({grid[1], grid[0]}, -1).view({-1, 2}));
    stride.push_back(at::full({h * w, 1}, double(strides[i]), opt));
  }
  return {at::cat(points), at::cat(stride)};
}

at::Tensor dfl_expectation(const at::Tensor& dist, int64_t reg_max) {
  const auto s = dist.sizes();
  if (reg_max == 1) return dist.view({s[0], s[1], 4});  // YOLO26: the distances themselves
  const at::Tensor proj = at::arange(reg_max, dist.options());
  return dist.view({s[0], s[1], 4, reg_max}).softmax(-1).matmul(proj);  // [B, A, 4]
}

at::Tensor dist_to_bbox(const at::Tensor& ltrb, const at::Tensor& points) {
  return at::cat({points - ltrb.narrow(-1, 0, 2), points + ltrb.narrow(-1, 2, 2)}, -1);
}

std::pair<at::Tensor, at::Tensor> split_yolov8(const std::vector<at::Tensor>& feats, int64_t reg_max) {
  std::vector<at::Tensor> flat;
  const int64_t B = feats[0].size(0), no = feats[0].size(1);
  for (const auto& f : feats) flat.push_back(f.view({B, no, -1}));
  const at::Tensor pred = at::cat(flat, 2).permute({0, 2, 1});  // [B, A, no]
  return {pred.narrow(2, 0, 4 * reg_max).contiguous(), pred.narrow(2, 4 * reg_max, no - 4 * reg_max).contiguous()};
}

}  // namespace headroom::models
