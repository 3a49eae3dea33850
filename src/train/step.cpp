// The step primitives executors compose (train/step.h), and the direct executor.
#include "headroom/train/step.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/torch_compat.h"
#include "headroom/train/trainer.h"

namespace headroom::train {

StepInput Trainer::prepare_step(const std::vector<data::HostBatch>& batches) {
  if (exchange_) exchange_->begin_attempt();
  recording_ = graph_armed_ && graph_->active();
  recorded_parts_.clear();
  StepInput in;
  std::vector<at::Tensor> counts;
  for (const data::HostBatch& batch : batches) {
    // Host -> device without blocking (the loader pins batches for CUDA runs), then on-device
    // augmentation with per-image parameters drawn there (the same draws on a re-run); on CUDA
    // both on the side stream, beside the step before.
    StepInput::Batch b;
    auto input = [&]() -> std::vector<at::Tensor> {
      if (augmenter_) {
        const augment::Batch a = (*augmenter_)(batch, device_);
        b.images = a.images;
        b.targets = losses::make_targets(a.boxes, a.classes, a.crowd);
        if (options_.keep_first_batch() && !first_batch_) first_batch_ = augment::to_host_batch(a, batch);  // one host copy per process
      } else {
        b.images = eval::model_input(batch.images, device_);
        b.targets = losses::make_targets(batch.boxes.to(device_, true), batch.classes.to(device_, true), batch.crowd.to(device_, true));
        if (options_.keep_first_batch() && !first_batch_) first_batch_ = batch;
      }
      if (recording_) b.targets = b.targets.padded(graph_->padded_boxes(b.targets.boxes.size(1)));  // one shape for the graph
      std::vector<at::Tensor> made = b.targets.tensors();
      made.push_back(b.images);
      return made;
    };
    if (side_stream_)
      side_stream_->run(input);
    else
      input();
    if (b.images.device() != device_ || b.targets.boxes.device() != device_)  // metadata only: no sync
      throw DeviceError("the batch is on " + b.images.device().str() + ", the run trains on " + device_.str());
    const at::Tensor c = loss_->counts(b.targets, b.images.size(2), b.images.size(3));
    if (c.defined()) counts.push_back(c);
    in.images += b.images.size(0);
    in.batches.push_back(std::move(b));
  }
  if (!counts.empty()) in.norm.counts = at::stack(counts).sum(0);  // the whole step's, before any backward
  if (exchange_) exchange_->sum_normalisers(in.norm.counts, state_.step);
  in.norm.images = 0;  // over every rank: the loader knows each batch's whole size
  for (const data::HostBatch& batch : batches) in.norm.images += batch.global_size > 0 ? batch.global_size : batch.size();
  step_items_ = at::Tensor();
  step_deferred_ = at::Tensor();
  notify(StepPhase::input);
  return in;
}

void Trainer::forward_backward(const StepInput& in, size_t batch, int64_t start, int64_t length) {
  if (recording_) {
    if (recorded_parts_.empty()) recorded_input_ = in;  // the executor's copy may be gone by update
    recorded_parts_.push_back({batch, start, length, model_->recompute_setting()});
    return;
  }
  const StepInput::Batch& b = in.batches.at(batch);
  const bool whole = start == 0 && length == b.images.size(0);
  const at::Tensor x = whole ? b.images : b.images.narrow(0, start, length);
  const losses::Targets targets = whole ? b.targets : b.targets.narrow(start, length);
  losses::LossTerms terms;
  {
    AutocastGuard autocast(device_.type(), amp_dtype(amp_));
    models::HeadOutputs out = model_->forward(x);
    notify(StepPhase::forward);
    for (auto& [name, levels] : out)  // the loss works in fp32 on the (autocast) head outputs
      for (auto& level : levels) level = level.to(at::kFloat);
    terms = (*loss_)(out, targets, in.norm);
  }
  notify(StepPhase::loss);
  at::Tensor total = terms.total.to(at::kFloat);
  if (terms.deferred.defined()) {
    // Normalisers that need the predictions: the accumulated gradients are kept divided by the
    // step's totals so far, and rescaled as this part adds to them (exact whatever the cut);
    // each normaliser's gradients are its own parameters' (DetectionLoss::normaliser_of).
    const at::Tensor before = step_deferred_.defined() ? step_deferred_.clamp_min(1) : at::Tensor();
    step_deferred_ = step_deferred_.defined() ? step_deferred_ + terms.deferred.reshape({-1}) : terms.deferred.reshape({-1});
    if (before.defined()) {
      at::NoGradGuard no_grad;
      const at::Tensor rescale = before / step_deferred_.clamp_min(1);  // [D], detached: constants of the loss
      const std::vector<std::vector<at::Tensor>> grads = grads_by_normaliser();
      for (size_t d = 0; d < grads.size(); ++d)
        if (!grads[d].empty()) compat::foreach_mul_(grads[d], rescale[int64_t(d)]);
    }
    total = losses::normalised_total(terms, step_deferred_).to(at::kFloat);
  }
  (scaler_ ? scaler_->scale(total) : total).backward();
  notify(StepPhase::backward);
  step_items_ = step_items_.defined() ? step_items_ + terms.items : terms.items;
}

std::vector<std::vector<at::Tensor>> Trainer::grads_by_normaliser() const {
  std::vector<std::vector<at::Tensor>> out(size_t(loss_->normalisers()));
  size_t i = 0;
  for (const auto& g : optimizer_->groups())
    for (const auto& p : g.params) {
      const int64_t d = param_normaliser_[i++];
      if (p.grad().defined()) out[size_t(d)].push_back(p.grad());
    }
  return out;
}

void Trainer::update() {
  if (recording_ && !recorded_parts_.empty()) {
    run_graphed();
    return;
  }
  recording_ = false;
  optimizer_->load_rates();
  apply_update();
}

void Trainer::run_graphed() {
  recording_ = false;  // the parts below run, or are captured, as they are
  const StepInput in = std::move(recorded_input_);
  const std::vector<RecordedPart> parts = std::move(recorded_parts_);
  recorded_input_ = StepInput();
  recorded_parts_.clear();
  optimizer_->load_rates();  // outside the graph: it reads them
  // What the graph bakes in, and the tensors that change between steps.
  std::string key =
      std::string("amp ") + to_string(amp_) + ", images " + std::to_string(in.images) + " of " + std::to_string(in.norm.images);
  std::vector<at::Tensor> inputs;
  for (const StepInput::Batch& b : in.batches) {
    key += ", batch " + c10::str(b.images.sizes(), " ", b.images.scalar_type(), " boxes ", b.targets.boxes.size(1));
    inputs.push_back(b.images);
    for (const at::Tensor& t : b.targets.tensors()) inputs.push_back(t);
  }
  if (in.norm.counts.defined()) inputs.push_back(in.norm.counts);
  for (const RecordedPart& p : parts) {
    key += c10::str(", part ", p.batch, ":", p.start, "+", p.length, " recompute ", int(p.recompute.mode), ":");
    for (bool on : p.recompute.stages) key += on ? '1' : '0';
  }
  for (const ParamGroup& g : optimizer_->groups()) key += fmt::format(", momentum {:.17g} decay {:.17g}", g.momentum, g.weight_decay);
  const bool recomputes =
      std::any_of(parts.begin(), parts.end(), [](const RecordedPart& p) { return p.recompute.mode != models::RecomputeMode::off; });
  graph_ran_ = graph_->run(
      key, inputs,
      [&] {
        discard_gradients();  // where every step starts; a capture that failed may have left some
        for (const RecordedPart& p : parts) {
          model_->restore(p.recompute);
          forward_backward(in, p.batch, p.start, p.length);
        }
        apply_update();
      },
      recomputes ? "activations are recomputed (the recomputation saves and sets the random generators' state, which a capture "
                   "cannot)"
                 : "");
}

void Trainer::apply_update() {
  at::NoGradGuard no_grad;
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
  if (exchange_) {
    if (!step_items_.defined()) step_items_ = at::zeros({int64_t(counters_->loss_names().size())}, fopt);
    exchange_->reduce(optimizer_->groups(), loss_->normalisers(), param_normaliser_, *model_, step_items_, step_deferred_, state_.step);
  }
  const std::vector<at::Tensor> grads = optimizer_->grads();
  at::Tensor found = scaler_ ? scaler_->unscale_(grads) : at::zeros({}, fopt);
  std::vector<at::Tensor> group_norms;  // [G] double: which group went non-finite, when one did
  for (const auto& g : optimizer_->groups()) {
    std::vector<at::Tensor> gg;
    for (const auto& p : g.params)
      if (p.grad().defined()) gg.push_back(p.grad());
    group_norms.push_back(gg.empty() ? at::zeros({}, fopt.dtype(at::kDouble)) : grad_norm(gg));
  }
  const at::Tensor norms = at::stack(group_norms);
  const at::Tensor norm = norms.norm(2);
  found = at::maximum(found, at::logical_not(at::isfinite(norm)).to(at::kFloat));
  if (options_.clip_grad() > 0) clip_grads_(grads, norm, options_.clip_grad());
  // The step's counters are made before anything is committed: an out-of-memory error up to the
  // optimizer's commit leaves the run as it was, and the commits below allocate nothing.
  const at::Tensor terms = step_items_.defined() && step_deferred_.defined() ? step_items_ / step_deferred_[0].clamp_min(1) : step_items_;
  const DeviceCounters::Tally tally = counters_->tally(terms, found, norms);
  optimizer_->step(found);  // atomic: an out-of-memory error inside leaves every group untouched
  if (scaler_) scaler_->update(found);
  optimizer_->zero_grad();
  counters_->commit(tally);
  notify(StepPhase::update);
}

void Trainer::discard_gradients() {
  optimizer_->zero_grad();
  step_items_ = at::Tensor();
  step_deferred_ = at::Tensor();
}

StepAgreement Trainer::agree_step(bool failed, bool pressed) {
  if (exchange_) return exchange_->agree(failed, pressed, interrupt_requested(), state_.step);
  StepAgreement a;
  if (failed) a.failed.push_back(0);
  if (pressed) a.pressed.push_back(0);
  a.interrupt = interrupt_requested();
  return a;
}

bool Trainer::syncs_batchnorm() const {
  if (!exchange_ || !options_.sync_bn()) return false;
  for (const auto& m : model_->modules(/*include_self=*/false))
    if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m.get()); bn && bn->is_training()) return true;
  return false;
}

void Trainer::abandon_step() {
  if (!exchange_) return;
  // SyncBatchNorm exchanges inside the forward and backward: the other ranks wait in one this
  // rank cannot join, so no rank can undo the attempt. Stopping ends the wait (the launcher
  // stops the others; on Gloo a lost peer ends their exchange) where going on would hang until
  // the timeout.
  if (syncs_batchnorm())
    throw Error("rank " + std::to_string(rank()) + ": out of memory in step " + std::to_string(state_.step + 1) +
                " with SyncBatchNorm (distributed.sync_bn: true): the other ranks wait in its exchanges inside the forward and "
                "backward, which this rank cannot join, so the step cannot be undone on every rank and the run stops; the last "
                "checkpoint is intact. Lower train.batch, or set distributed.sync_bn: false, with which an out-of-memory error "
                "on one rank shrinks the micro-batch of every rank");
  exchange_->abandon(state_.step);
}

void DirectExecutor::run(Trainer& t, const std::vector<data::HostBatch>& batches) {
  const StepInput in = t.prepare_step(batches);
  for (size_t b = 0; b < in.batches.size(); ++b) t.forward_backward(in, b, 0, in.batches[b].images.size(0));
  t.update();
}

}  // namespace headroom::train
