// The exchanges between the ranks of a run on several processes (c10d): rank 0's initial
// weights, each step attempt's loss normalisers and agreement, the update's gradients and
// BatchNorm statistics, and validation's shards and detections. Every rank makes the same
// exchanges in the same order, in each attempt, so no rank waits on a collective another skipped.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "headroom/data/dataset.h"
#include "headroom/dist/group.h"
#include "headroom/eval/coco_eval.h"
#include "headroom/eval/validate.h"
#include "headroom/models/detector.h"
#include "headroom/train/optimizer.h"

namespace headroom::train {

// What the ranks agreed before a step's update (Trainer::agree_step).
struct StepAgreement {
  std::vector<int> failed;   // ranks whose part of the step failed (an out-of-memory error)
  std::vector<int> pressed;  // ranks whose memory asks for a smaller micro-batch
  bool interrupt = false;    // a rank was asked to stop (Ctrl-C): every rank stops after this step
};

class RankExchange {
 public:
  // Gives every rank rank 0's weights and statistics (its init_from or its seed); with sync_bn,
  // BatchNorm's statistics are summed over the ranks' images. count_terms: K of the loss's counts.
  RankExchange(std::shared_ptr<dist::Group> group, models::DetectorImpl& model, bool sync_bn, int64_t count_terms,
               c10::Device device);
  int rank() const { return group_->rank(); }
  int world() const { return group_->world(); }

  // A step attempt begins (prepare_step); its normalisers are not exchanged yet.
  void begin_attempt() { counts_exchanged_ = false; }
  // The step's loss normalisers summed over the ranks, in place (before any backward).
  void sum_normalisers(at::Tensor& counts, int64_t step);
  // A rank whose attempt failed before that exchange makes it with zeros.
  void abandon(int64_t step);
  StepAgreement agree(bool failed, bool pressed, bool stop, int64_t step);
  bool interrupt_agreed() const { return interrupt_agreed_; }
  // Each rank's gradients are of its images' share of a loss normalised over the whole step, so
  // the step's gradient is their sum; prediction-dependent normalisers (`deferred`, [D] or
  // undefined) are summed too and each rank's gradients brought from its own to the total, per
  // normaliser (the loss's `normalisers`; `normaliser_of`: one per parameter of `groups`, in order).
  // `items` [T]: the step's loss terms, summed. BatchNorm statistics are averaged unless synced.
  void reduce(std::vector<ParamGroup>& groups, int64_t normalisers, const std::vector<int64_t>& normaliser_of,
              models::DetectorImpl& model, at::Tensor& items, at::Tensor& deferred, int64_t step);

  // Rank r validates images r, r + world, ... (the image ids stay those of the whole split).
  std::shared_ptr<const data::Split> val_shard(const data::Split& val);
  // True when a rank's pass failed: every rank redoes it at the smallest batch any rank has.
  bool agree_validation(bool failed, int64_t& val_batch);
  // Every rank's detections scored together against the whole split.
  eval::CocoStats gather_validation(const eval::ValidationResult& mine, const data::Split& val);

 private:
  // Sums `tensors` in place through bucket_, each bucket times scale_in before and scale_out
  // after (undefined = 1).
  void sum_in_buckets(const std::vector<at::Tensor>& tensors, const at::Tensor& scale_in, const at::Tensor& scale_out,
                      const std::string& what);

  std::shared_ptr<dist::Group> group_;
  bool sync_bn_;
  int64_t count_terms_;
  c10::Device device_;
  at::Tensor bucket_;                           // [<= 4M] float, made once: the exchange allocates nothing
  bool counts_exchanged_ = false;               // this attempt's normalisers went through the group
  bool interrupt_agreed_ = false;
  std::shared_ptr<const data::Split> val_shard_;
};

}  // namespace headroom::train
