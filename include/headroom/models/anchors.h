// The anchor-free YOLO head's geometry (YOLOv8, YOLO11, YOLOv5u): where its outputs sit and how
// they become boxes. The loss, the decoder and the ONNX export read the head through it.
#pragma once

#include <ATen/Tensor.h>

#include <utility>
#include <vector>

namespace headroom::models {

// Cell centres of every level, flattened level after level: points [A, 2] (x, y) in grid
// units of their level, strides [A, 1].
struct AnchorGrid {
  at::Tensor points;
  at::Tensor strides;
};
AnchorGrid make_anchor_grid(const std::vector<at::Tensor>& feats, const std::vector<int64_t>& strides, double offset);

// YOLOv8 head output -> box distributions [B, A, 4 * reg_max] and class logits [B, A, nc].
std::pair<at::Tensor, at::Tensor> split_yolov8(const std::vector<at::Tensor>& feats, int64_t reg_max);
// DFL: the expected bin of each side's distribution, [B, A, 4] (l, t, r, b); with one bin
// (YOLO26) the outputs are the distances.
at::Tensor dfl_expectation(const at::Tensor& dist, int64_t reg_max);
// (l, t, r, b) distances around points -> xyxy.
at::Tensor dist_to_bbox(const at::Tensor& ltrb, const at::Tensor& points);

}  // namespace headroom::models
