// CenterNet targets (xingyizhou/CenterNet ctdet): a Gaussian peak per object at its integer
// centre on the stride-4 heatmap of its class (radius from CornerNet's gaussian_radius with
// min_overlap 0.7, overlapping peaks merged by max), and size / offset regression targets at
// the centre cell. Built for the whole batch at once, boxes in chunks to bound memory.
#pragma once

#include <ATen/Tensor.h>

namespace headroom::losses {

// CornerNet's radius (as the reference computes it, including its r1 formula) for a box of
// `height` x `width` output cells; tensors of any shape.
at::Tensor gaussian_radius(const at::Tensor& height, const at::Tensor& width, double min_overlap);

struct CenterNetTargets {
  at::Tensor heatmap;  // [B, nc, H, W] in [0, 1], exactly 1 at object centres
  at::Tensor index;    // [B, N] int64: centre cell y * W + x
  at::Tensor size;     // [B, N, 2] (w, h) in output cells
  at::Tensor offset;   // [B, N, 2] centre minus its integer cell
  at::Tensor mask;     // [B, N] bool: objects with a positive size
};

// The objects the loss counts, [B, N] bool: mask and an area left on the H x W output. What
// centernet_targets' mask is, without drawing the heatmap.
at::Tensor centernet_objects(const at::Tensor& boxes, const at::Tensor& mask, int64_t H, int64_t W, int64_t stride);

// boxes [B, N, 4] xyxy in input pixels, classes [B, N], mask [B, N]; output H x W at `stride`.
CenterNetTargets centernet_targets(const at::Tensor& boxes, const at::Tensor& classes, const at::Tensor& mask, int64_t nc,
                                   int64_t height, int64_t width, int64_t stride, double min_overlap,
                                   int64_t chunk_elements = 1 << 24);

// Penalty-reduced pixel-wise focal loss (alpha 2, beta 4) of heatmap logits, summed; and the
// same normalised by the number of centres (1 when there are none), as the reference.
at::Tensor centernet_focal_sum(const at::Tensor& logits, const at::Tensor& target);
at::Tensor centernet_focal_loss(const at::Tensor& logits, const at::Tensor& target);

}  // namespace headroom::losses
