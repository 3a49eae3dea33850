// YOLOv8: task-aligned assignment, BCE class loss, CIoU box loss and distribution focal loss,
// all over every anchor with masks (no boolean indexing: no device sync, fixed shapes).
#include <ATen/ATen.h>

#include "headroom/models/anchors.h"
#include "headroom/losses/assigner.h"
#include "headroom/losses/box_ops.h"
#include "losses_internal.h"

namespace headroom::losses {

namespace {

class Yolov8Loss : public DetectionLoss {
 public:
  Yolov8Loss(const models::DetectorInfo& info, const LossOptions& o) : info_(info), o_(o) {
    assigner_.topk = o.tal_topk();
    assigner_.alpha = o.tal_alpha();
    assigner_.beta = o.tal_beta();
    assigner_.chunk_elements = o.assigner_chunk();
    assigner_.min_candidate_size = double(info.strides.size() > 1 ? info.strides[1] : info.strides[0]);
  }

  std::vector<std::string> term_names() const override { return {"box", "cls", "dfl"}; }

  // Sums over the part's anchors; the step divides them by its target-score sum (deferred: the
  // assigner's scores depend on the predictions).
  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t, const StepNorm& step) override {
    const auto& feats = outputs.at("pred");
    const int64_t R = info_.reg_max, B = feats[0].size(0);
    auto [pred_dist, pred_scores] = models::split_yolov8(feats, R);                 // [B, A, 4R], [B, A, nc]
    const models::AnchorGrid grid = models::make_anchor_grid(feats, info_.strides, 0.5);     // grid units
    const at::Tensor pred_boxes = models::dist_to_bbox(models::dfl_expectation(pred_dist.to(at::kFloat), R), grid.points);  // grid units
    const Assignment a = task_aligned_assign(pred_scores.detach().to(at::kFloat).sigmoid(), pred_boxes.detach() * grid.strides,
                                             grid.points * grid.strides, t.classes, t.boxes.to(at::kFloat), t.mask, assigner_);
    const at::Tensor cls = at::binary_cross_entropy_with_logits(pred_scores.to(at::kFloat), a.target_scores, {}, {},
                                                                at::Reduction::None).sum();
    // Box and DFL terms weighted by each anchor's target score, on foreground anchors only.
    const at::Tensor target = a.target_bboxes / grid.strides;              // grid units
    const at::Tensor weight = a.target_scores.sum(-1);                       // [B, A]
    const at::Tensor zero = at::zeros({}, weight.options());
    const at::Tensor iou = ciou(pred_boxes, target);
    const at::Tensor box = at::where(a.fg_mask, (1.0 - iou) * weight, zero).sum();
    const at::Tensor ltrb = at::cat({grid.points - target.narrow(-1, 0, 2), target.narrow(-1, 2, 2) - grid.points}, -1)
                                .clamp(0, double(R - 1) - 0.01);             // [B, A, 4]
    const at::Tensor left = ltrb.floor().to(at::kLong), right = left + 1;
    const at::Tensor wl = right.to(at::kFloat) - ltrb, wr = 1 - wl;
    const at::Tensor logp = pred_dist.to(at::kFloat).view({B, -1, 4, R}).log_softmax(-1);
    const at::Tensor dfl_side = -(logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * wl +
                                  logp.gather(-1, right.unsqueeze(-1)).squeeze(-1) * wr);
    const at::Tensor dfl = at::where(a.fg_mask, dfl_side.mean(-1) * weight, zero).sum();

    const double box_gain = o_.box() >= 0 ? o_.box() : 7.5;
    const at::Tensor lbox = box * box_gain, lcls = cls * o_.cls(), ldfl = dfl * o_.dfl();
    LossTerms out;
    out.total = (lbox + lcls + ldfl) * double(step.images);
    out.items = at::stack({lbox, lcls, ldfl}).detach();
    out.deferred = a.target_scores.sum().detach();
    return out;
  }

 private:
  models::DetectorInfo info_;
  LossOptions o_;
  AssignerOptions assigner_;
};

}  // namespace

std::unique_ptr<DetectionLoss> make_yolov8_loss(const models::DetectorInfo& info, const LossOptions& o) {
  return std::make_unique<Yolov8Loss>(info, o);
}

}  // namespace headroom::losses
