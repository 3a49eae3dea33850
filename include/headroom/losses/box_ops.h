// Box arithmetic on tensors (functional, batched, any leading dimensions).
#pragma once

#include <ATen/Tensor.h>

namespace headroom::losses {

// [..., 4] xyxy <-> xywh (centre, size).
at::Tensor xyxy_to_xywh(const at::Tensor& b);
at::Tensor xywh_to_xyxy(const at::Tensor& b);

// Pairwise IoU: a [..., N, 4], b [..., M, 4] xyxy -> [..., N, M].
at::Tensor box_iou(const at::Tensor& a, const at::Tensor& b);

// Element-wise Complete IoU (Zheng et al. 2020, as Ultralytics' bbox_iou(CIoU=True)):
// a, b [..., 4] xyxy -> [...]. 1 - CIoU is the box loss.
at::Tensor ciou(const at::Tensor& a, const at::Tensor& b, double eps = 1e-7);

}  // namespace headroom::losses
