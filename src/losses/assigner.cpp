#include "headroom/losses/assigner.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "headroom/losses/box_ops.h"

namespace headroom::losses {

namespace {

// Foreground anchors that rank below k by alignment among their box's: anchors sorted by
// alignment (best first), then stably by box, so that each box's anchors keep that order; an
// anchor's rank is its position minus its box's first. Background sorts last. fg, tgi, align
// [B, A]; N boxes.
at::Tensor keep_best_of_each_box(const at::Tensor& fg, const at::Tensor& tgi, const at::Tensor& align, int64_t N, int64_t k) {
  const int64_t B = fg.size(0), A = fg.size(1);
  const at::Tensor group = at::where(fg, tgi, at::full({}, N, tgi.options()));
  const c10::optional<bool> stable = true;  // a plain `true` would bind to sort(dim, descending)
  const at::Tensor by_align = std::get<1>(align.sort(stable, 1, /*descending=*/true));
  const at::Tensor order = by_align.gather(1, std::get<1>(group.gather(1, by_align).sort(stable, 1, /*descending=*/false)));
  const at::Tensor sorted_group = group.gather(1, order);
  const at::Tensor position = at::arange(A, tgi.options()).expand({B, A});
  const at::Tensor start = at::full({B, N + 1}, A, tgi.options()).scatter_reduce(1, sorted_group, position, "amin", true);
  const at::Tensor rank = at::empty_like(position).scatter_(1, order, position - start.gather(1, sorted_group));
  return fg.logical_and(rank.lt(k));
}

}  // namespace

Assignment task_aligned_assign(const at::Tensor& pd_scores, const at::Tensor& pd_bboxes, const at::Tensor& anchors,
                               const at::Tensor& gt_labels, const at::Tensor& gt_bboxes, const at::Tensor& gt_mask,
                               const AssignerOptions& o) {
  at::NoGradGuard no_grad;
  const int64_t B = pd_scores.size(0), A = pd_scores.size(1), C = pd_scores.size(2), N = gt_bboxes.size(1);
  const auto fopt = pd_bboxes.options();
  Assignment out;
  if (N == 0) {
    out.target_bboxes = at::zeros({B, A, 4}, fopt);
    out.target_scores = at::zeros({B, A, C}, fopt);
    out.fg_mask = at::zeros({B, A}, fopt.dtype(at::kBool));
    out.target_gt_idx = at::zeros({B, A}, fopt.dtype(at::kLong));
    return out;
  }
  const int64_t topk = std::min(o.topk, A);
  const int64_t K = std::clamp<int64_t>(o.chunk_elements / std::max<int64_t>(B * A, 1), 1, N);
  const at::Tensor scores_t = pd_scores.transpose(1, 2);  // [B, C, A]
  const at::Tensor xy = anchors.view({1, 1, A, 2});

  // Per anchor, over all boxes: how many claim it, the box it overlaps most (first on ties, as
  // argmax), and the first box that claims it.
  at::Tensor fg_count = at::zeros({B, A}, fopt.dtype(at::kLong));
  at::Tensor best_overlap = at::full({B, A}, -1.0, fopt);
  at::Tensor best_idx = at::zeros({B, A}, fopt.dtype(at::kLong));
  at::Tensor first_pos = at::full({B, A}, N, fopt.dtype(at::kLong));
  for (int64_t g0 = 0; g0 < N; g0 += K) {
    const int64_t k = std::min(K, N - g0);
    const at::Tensor gb = gt_bboxes.narrow(1, g0, k);                       // [B, k, 4]
    const at::Tensor gl = gt_labels.narrow(1, g0, k).clamp_min(0);          // [B, k]
    const at::Tensor gm = gt_mask.narrow(1, g0, k);                         // [B, k]
    // Candidate region: the box, a side under small_side made min_candidate_size about its centre.
    const at::Tensor centre = (gb.narrow(2, 0, 2) + gb.narrow(2, 2, 2)) / 2;
    const at::Tensor side = gb.narrow(2, 2, 2) - gb.narrow(2, 0, 2);
    const at::Tensor half = at::where(side.lt(o.small_side), at::full({}, o.min_candidate_size / 2, fopt), side / 2);
    const at::Tensor lt = (centre - half).unsqueeze(2), rb = (centre + half).unsqueeze(2);
    const at::Tensor inside = at::cat({xy - lt, rb - xy}, -1).amin(-1).gt(o.eps);  // [B, k, A]
    const at::Tensor valid = inside.logical_and(gm.unsqueeze(-1));
    const at::Tensor score = scores_t.gather(1, gl.unsqueeze(-1).expand({B, k, A}));
    const at::Tensor overlap =
        at::where(valid, ciou(gb.unsqueeze(2).expand({B, k, A, 4}), pd_bboxes.unsqueeze(1).expand({B, k, A, 4})).clamp_min(0),
                  at::zeros({}, fopt));
    const at::Tensor align = at::where(valid, score, at::zeros({}, fopt)).pow(o.alpha) * overlap.pow(o.beta);
    const at::Tensor top = std::get<1>(align.topk(topk, -1));                    // [B, k, topk]
    const at::Tensor positive = at::zeros({B, k, A}, fopt.dtype(at::kBool)).scatter_(-1, top, true).logical_and(valid);

    fg_count += positive.sum(1);
    // Among the boxes the anchor is a candidate of: with every overlap 0 (early in training), a
    // masked row (a crowd box, padding) would otherwise win the tie as row 0.
    const auto [chunk_best, chunk_arg] = at::where(valid, overlap, at::full({}, -1.0, fopt)).max(1);  // [B, A]
    const at::Tensor better = chunk_best.gt(best_overlap);
    best_overlap = at::where(better, chunk_best, best_overlap);
    best_idx = at::where(better, chunk_arg + g0, best_idx);
    const at::Tensor first = positive.to(at::kByte).argmax(1) + g0;
    first_pos = at::where(positive.any(1).logical_and(first_pos.eq(N)), first, first_pos);
  }
  at::Tensor fg = fg_count.gt(0);
  const at::Tensor tgi = at::where(fg_count.gt(1), best_idx, at::where(fg, first_pos, at::zeros_like(first_pos)));

  const at::Tensor labels = gt_labels.gather(1, tgi).clamp_min(0);                          // [B, A]
  const at::Tensor boxes = gt_bboxes.gather(1, tgi.unsqueeze(-1).expand({B, A, 4}));         // [B, A, 4]
  // Alignment and overlap of every anchor with its box, normalised per box so that the
  // best-aligned anchor of each box scores that box's best overlap.
  const at::Tensor zero = at::zeros({}, fopt);
  at::Tensor iou = at::where(fg, ciou(boxes, pd_bboxes).clamp_min(0), zero);
  at::Tensor align = at::where(fg, pd_scores.gather(2, labels.unsqueeze(-1)).squeeze(-1).pow(o.alpha) * iou.pow(o.beta), zero);
  if (o.topk2 > 0 && o.topk2 < topk) {
    fg = keep_best_of_each_box(fg, tgi, align, N, o.topk2);
    iou = at::where(fg, iou, zero);
    align = at::where(fg, align, zero);
  }
  const at::Tensor box_align = at::zeros({B, N}, fopt).scatter_reduce(1, tgi, align, "amax", /*include_self=*/true);
  const at::Tensor box_iou_max = at::zeros({B, N}, fopt).scatter_reduce(1, tgi, iou, "amax", /*include_self=*/true);
  const at::Tensor norm = align * box_iou_max.gather(1, tgi) / (box_align.gather(1, tgi) + o.eps);

  out.target_gt_idx = tgi;
  out.fg_mask = fg;
  out.target_bboxes = boxes;
  out.target_scores = at::zeros({B, A, C}, fopt).scatter_(2, labels.unsqueeze(-1), norm.unsqueeze(-1));
  return out;
}

}  // namespace headroom::losses
