// YOLOv8's task-aligned assigner (Feng et al. 2021, TOOD; Ultralytics' TaskAlignedAssigner):
// an anchor whose centre lies in a ground-truth box is a candidate (a box side shorter than
// `small_side`, the finest stride, becomes `min_candidate_size` about the centre, as Ultralytics
// 8.4 does, so that tiny objects still get anchors; longer sides stay); alignment =
// score^alpha * CIoU^beta; each box takes its top-k candidates; an anchor claimed by several
// boxes goes to the one it overlaps most; with topk2 < topk each box then keeps only its topk2
// best-aligned anchors (YOLO26's one-to-one branch: topk 7, topk2 1). Ground truth is processed in chunks so that an image
// with thousands of boxes needs bounded memory; the result does not depend on the chunk size.
#pragma once

#include <ATen/Tensor.h>

namespace headroom::losses {

struct Assignment {
  at::Tensor target_bboxes;  // [B, A, 4] xyxy, the units of gt_bboxes
  at::Tensor target_scores;  // [B, A, nc] normalised alignment at the assigned class, else 0
  at::Tensor fg_mask;        // [B, A] bool
  at::Tensor target_gt_idx;  // [B, A] int64
};

struct AssignerOptions {
  int64_t topk = 10;
  int64_t topk2 = 0;  // 0: topk
  double alpha = 0.5;
  double beta = 6.0;
  double eps = 1e-9;
  int64_t chunk_elements = 1 << 23;  // B x gts x anchors per pass
  double small_side = 0;             // pixels; Ultralytics: the finest stride (8)
  double min_candidate_size = 0;     // pixels: what a side under small_side becomes; Ultralytics: the middle stride (16)
};

// pd_scores [B, A, nc] probabilities, pd_bboxes [B, A, 4] xyxy, anchors [A, 2] (x, y), all in
// pixels; gt_labels [B, N] int64, gt_bboxes [B, N, 4], gt_mask [B, N] bool. No gradients.
Assignment task_aligned_assign(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anchors,
                               const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& gt_mask,
                               const AssignerOptions& o = {});

}  // namespace headroom::losses
