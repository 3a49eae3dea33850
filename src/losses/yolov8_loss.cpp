// YOLOv8 / YOLO11: task-aligned assignment, BCE class loss, CIoU box loss and distribution focal
// loss; YOLO26 (reg_max 1) an L1 loss on the distances in place of DFL, and end to end the same
// loss on both branches (E2E), all over every anchor with masks (no boolean indexing: no device
// sync, fixed shapes).
#include <ATen/ATen.h>

#include "headroom/models/anchors.h"
#include "headroom/losses/assigner.h"
#include "headroom/losses/box_ops.h"
#include "losses_internal.h"

namespace headroom::losses {

namespace {

class Yolov8Loss : public DetectionLoss {
 public:
  // `branch`: the head output it trains ("pred", or an end-to-end head's "one2one").
  Yolov8Loss(const models::DetectorInfo& info, const LossOptions& o, std::string branch = "pred", int64_t topk2 = 0)
      : info_(info), o_(o), branch_(std::move(branch)) {
    assigner_.topk = o.tal_topk();
    assigner_.topk2 = topk2;
    assigner_.alpha = o.tal_alpha();
    assigner_.beta = o.tal_beta();
    assigner_.chunk_elements = o.assigner_chunk();
    assigner_.small_side = double(info.strides[0]);
    assigner_.min_candidate_size = double(info.strides.size() > 1 ? info.strides[1] : info.strides[0]);
  }

  std::vector<std::string> term_names() const override { return {"box", "cls", info_.reg_max > 1 ? "dfl" : "l1"}; }

  // Sums over the part's anchors; the step divides them by its target-score sum (deferred: the
  // assigner's scores depend on the predictions).
  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t, const StepNorm& step) override {
    const auto& feats = outputs.at(branch_);
    const int64_t R = info_.reg_max;
    auto [pred_dist, pred_scores] = models::split_yolov8(feats, R);                 // [B, A, 4R], [B, A, nc]
    const models::AnchorGrid grid = models::make_anchor_grid(feats, info_.strides, 0.5);     // grid units
    const at::Tensor pred_boxes = models::dist_to_bbox(models::dfl_expectation(pred_dist.to(at::kFloat), R), grid.points);  // grid units
    const Assignment a = task_aligned_assign(pred_scores.detach().to(at::kFloat).sigmoid(), pred_boxes.detach() * grid.strides,
                                             grid.points * grid.strides, t.classes, t.boxes.to(at::kFloat), t.mask, assigner_);
    const at::Tensor cls = at::binary_cross_entropy_with_logits(pred_scores.to(at::kFloat), a.target_scores, {}, {},
                                                                at::Reduction::None).sum();
    // Box and DFL (L1) terms weighted by each anchor's target score, on foreground anchors only.
    const at::Tensor target = a.target_bboxes / grid.strides;              // grid units
    const at::Tensor weight = a.target_scores.sum(-1);                       // [B, A]
    const at::Tensor zero = at::zeros({}, weight.options());
    const at::Tensor iou = ciou(pred_boxes, target);
    const at::Tensor box = at::where(a.fg_mask, (1.0 - iou) * weight, zero).sum();
    const at::Tensor target_ltrb = at::cat({grid.points - target.narrow(-1, 0, 2), target.narrow(-1, 2, 2) - grid.points}, -1);  // [B, A, 4]
    const at::Tensor sides = R > 1 ? dfl_sides(pred_dist, target_ltrb, R) : l1_sides(pred_dist, target_ltrb, grid, feats);  // [B, A]
    const at::Tensor dfl = at::where(a.fg_mask, sides * weight, zero).sum();
    const double box_gain = o_.box() >= 0 ? o_.box() : 7.5;
    const at::Tensor lbox = box * box_gain, lcls = cls * o_.cls(), ldfl = dfl * o_.dfl();
    LossTerms out;
    out.total = (lbox + lcls + ldfl) * double(step.images);
    out.items = at::stack({lbox, lcls, ldfl}).detach();
    out.deferred = a.target_scores.sum().detach();
    return out;
  }

  // DFL: cross-entropy of each side's bins against the two bins around the target distance,
  // averaged over the sides, [B, A].
  static at::Tensor dfl_sides(const at::Tensor& pred_dist, const at::Tensor& target_ltrb, int64_t R) {
    const int64_t B = pred_dist.size(0);
    const at::Tensor ltrb = target_ltrb.clamp(0, double(R - 1) - 0.01);
    const at::Tensor left = ltrb.floor().to(at::kLong), right = left + 1;
    const at::Tensor wl = right.to(at::kFloat) - ltrb, wr = 1 - wl;
    const at::Tensor logp = pred_dist.to(at::kFloat).view({B, -1, 4, R}).log_softmax(-1);
    return (-(logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * wl + logp.gather(-1, right.unsqueeze(-1)).squeeze(-1) * wr)).mean(-1);
  }
  // YOLO26: L1 between predicted and target distances, each as a fraction of the image's width
  // (left, right) or height (top, bottom), averaged over the sides, [B, A].
  static at::Tensor l1_sides(const at::Tensor& pred_dist, const at::Tensor& target_ltrb, const models::AnchorGrid& grid,
                             const std::vector<at::Tensor>& feats) {
    const double h = double(feats[0].size(2)), w = double(feats[0].size(3));
    // (w, h, w, h) in cells of the first level, made on the device: no host copy in the step
    const at::TensorOptions opt = grid.strides.options();
    const at::Tensor extent = at::where(at::arange(4, opt).remainder(2).eq(0), at::full({}, w, opt), at::full({}, h, opt));
    const at::Tensor scale = grid.strides / (extent * grid.strides[0]);            // [A, 4]: stride / image side
    return ((pred_dist.to(at::kFloat) - target_ltrb).abs() * scale).mean(-1);
  }

 private:
  models::DetectorInfo info_;
  LossOptions o_;
  std::string branch_;
  AssignerOptions assigner_;
};

// YOLO26's end-to-end loss (Ultralytics' E2ELoss): the one-to-many branch as YOLOv8's loss
// (top-10 assignment) and the one-to-one branch with each box's single best anchor (top-7, then
// top-1), weighted w and 1 - w, w decaying linearly from 0.8 in the first epoch to 0.1 in the
// last. Each branch has its own target-score normaliser; the one-to-one branch is fed detached
// features, so each normaliser's gradients reach their own parameters only (normaliser_of).
// The reported terms are the one-to-one branch's, as Ultralytics reports them.
class EndToEndLoss : public DetectionLoss {
 public:
  EndToEndLoss(const models::DetectorInfo& info, const LossOptions& o)
      : one2one_(info, LossOptions(o).tal_topk(7), "one2one", 1), one2many_(info, o, "pred") {}

  std::vector<std::string> term_names() const override { return one2one_.term_names(); }
  int64_t normalisers() const override { return 2; }
  int64_t normaliser_of(const std::string& parameter) const override { return parameter.find("one2one_") != std::string::npos ? 0 : 1; }
  void set_progress(int64_t epoch, int64_t epochs, c10::Device device) override {
    many_weight_ = std::max(1.0 - double(epoch) / double(std::max<int64_t>(epochs - 1, 1)), 0.0) * (0.8 - 0.1) + 0.1;
    if (!weights_.defined() || weights_.device() != device) weights_ = at::empty({2}, at::TensorOptions(at::kFloat).device(device));
    weights_[0].fill_(1.0 - many_weight_);  // kernels with the value as an argument: no copy, no sync
    weights_[1].fill_(many_weight_);
  }

  LossTerms operator()(const models::HeadOutputs& outputs, const Targets& t, const StepNorm& step) override {
    const LossTerms one = one2one_(outputs, t, step), many = one2many_(outputs, t, step);
    LossTerms out;
    // Before any set_progress (a loss called on its own, a memory probe), the host's weights: a
    // tensor made here would be a copy from the host, a sync.
    const bool filled = weights_.defined() && weights_.device() == one.total.device();
    out.total = filled ? at::stack({one.total, many.total}) * weights_
                       : at::stack({one.total * (1.0 - many_weight_), many.total * many_weight_});  // [2]
    out.items = one.items;
    out.deferred = at::stack({one.deferred, many.deferred});
    return out;
  }

 private:
  Yolov8Loss one2one_, one2many_;
  double many_weight_ = 0.8;
  at::Tensor weights_;  // [2] float: 1 - many_weight_, many_weight_, on the training device
};

}  // namespace

std::unique_ptr<DetectionLoss> make_yolov8_loss(const models::DetectorInfo& info, const LossOptions& o) {
  if (info.end2end) return std::make_unique<EndToEndLoss>(info, o);
  return std::make_unique<Yolov8Loss>(info, o);
}

}  // namespace headroom::losses
