#include "headroom/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/torch_compat.h"
#include "headroom/models/weights.h"
#include "headroom/models/weights_import.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/hooks.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

TrainerOptions trainer_options(const Config& c, c10::Device device) {
  const TrainConfig& t = c.train;
  return TrainerOptions()
      .batch(t.batch)
      .nominal_batch(t.nominal_batch)
      .epochs(t.epochs)
      .steps(t.steps)
      .weight_decay(t.weight_decay)
      .optimizer(OptimizerOptions().kind(optimizer_kind_from(t.optimizer)).momentum(t.momentum).nesterov(t.nesterov).eps(t.eps).rho(t.rho))
      .schedule(ScheduleOptions()
                    .kind(lr_schedule_from(t.schedule))
                    .lr0(t.lr0)
                    .lrf(t.lrf)
                    .momentum(t.momentum)
                    .lr_steps(t.lr_steps)
                    .lr_values(t.lr_values)
                    .decay_every(t.decay_every)
                    .decay_factor(t.decay_factor)
                    .staircase(t.staircase)
                    .min_lr(t.min_lr)
                    .inverse_time_decay(t.inverse_time_decay)
                    .schedule_steps(t.schedule_steps)
                    .hold_steps(t.hold_steps)
                    .warmup(warmup_kind_from(t.warmup))
                    .warmup_steps(t.warmup_steps)
                    .warmup_lr(t.warmup_lr)
                    .warmup_momentum(t.warmup_momentum)
                    .warmup_bias_lr(t.warmup_bias_lr))
      .warmup_epochs(t.warmup_epochs)
      .amp(resolve_amp(c, device))
      .clip_grad(t.clip_grad)
      .ema_decay(t.ema_decay)
      .ema_tau(t.ema_tau)
      .read_every(t.log_every)
      .keep_first_batch(t.plots)
      .config_yaml(config_to_yaml(c))
      .sync_bn(c.distributed.sync_bn);
}

int64_t accumulation_steps(int64_t nominal_batch, int64_t batch) {
  return std::max<int64_t>(std::llround(double(nominal_batch) / double(batch)), 1);
}

std::vector<std::pair<std::string, double>> StepCounters::losses() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, sum] : loss_sums) out.emplace_back(name, finite_steps > 0 ? sum / double(finite_steps) : NAN);
  return out;
}

RunLength run_length(const TrainerOptions& o, int64_t batches_per_epoch) {
  RunLength r;
  r.accumulate = accumulation_steps(o.nominal_batch(), o.batch() * o.world());
  r.steps_per_epoch = (batches_per_epoch + r.accumulate - 1) / r.accumulate;
  r.total_steps = o.steps() > 0 ? o.steps() : o.epochs() * r.steps_per_epoch;
  r.epochs = (r.total_steps + r.steps_per_epoch - 1) / r.steps_per_epoch;
  return r;
}

TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir) {
  return make_trainer_parts(c, device, run_dir, std::make_shared<const data::Split>(data::load_split(c, "train")), load_val_split(c));
}

std::shared_ptr<const data::Split> load_val_split(const Config& c) {
  if (data::read_data_yaml(c.data.dataset).split("val")) return std::make_shared<const data::Split>(data::load_split(c, "val"));
  spdlog::warn("{}: no val split; the run trains without validation and best.pt", c.data.dataset);
  return nullptr;
}

TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir,
                                std::shared_ptr<const data::Split> train, std::shared_ptr<const data::Split> val,
                                std::shared_ptr<dist::Group> group) {
  TrainerParts p;
  p.options = trainer_options(c, device);
  p.device = device;
  p.run_dir = run_dir;
  p.train_split = std::move(train);
  p.val_split = std::move(val);
  p.group = std::move(group);
  p.loader = data::loader_options(c, *p.train_split, /*training=*/true, device.is_cuda());
  if (p.group) {
    p.options.world(p.group->world());
    p.loader.rank(p.group->rank()).world(p.group->world());
  }
  const int64_t nc = int64_t(p.train_split->names.size());
  at::manual_seed(uint64_t(c.seed));  // LibTorch seeds its generators at random per process: initialisation follows `seed`
  p.model = models::build_detector(c, nc);
  if (!c.model.init_from.empty() && models::carried_model(c.model.init_from))
    spdlog::info("model.init_from {}: the model is the file's own ({}{}), not model.file {}", c.model.init_from,
                 p.model->yaml_file(), p.model->scale().empty() ? "" : " scale " + p.model->scale(), c.model.file);
  if (!c.model.init_from.empty()) {
    const std::vector<std::string> skipped = init_from_weights(*p.model, c.model.init_from, c.model.init_backbone_only);
    spdlog::info("model.init_from {}: {} tensors skipped{}", c.model.init_from, skipped.size(), skipped.empty() ? "" : ":");
    for (const auto& s : skipped) spdlog::info("  {}", s);
  }
  p.model->to(device);
  {
    // The loader leaves out a last batch the model cannot train on, and the governor never
    // shrinks below it: probed at the smallest size the run trains at.
    const int64_t multiple = p.model->info().input_multiple;
    const int64_t least_size =
        augment::enabled(c.augment) ? augment::Augmenter(augment::augmenter_options(c, multiple, 1)).min_output_size(c.data.imgsz)
                                    : c.data.imgsz;
    p.loader.min_batch(models::smallest_trainable_batch(*p.model, least_size));
    if (!c.train.batch_auto && c.train.batch < p.loader.min_batch())
      throw InputError(c.where("train.batch") + ": train.batch " + std::to_string(c.train.batch) + " is below the " +
                       std::to_string(p.loader.min_batch()) + " images per micro-batch " + p.model->yaml_file() + " trains on at " +
                       std::to_string(least_size) + " px (BatchNorm needs 2 values per channel over its 1x1 maps): set "
                       "train.batch to at least " + std::to_string(p.loader.min_batch()) + ", or raise data.imgsz");
    if (p.loader.min_batch() > 1)
      spdlog::info("the model trains on at least {} images per micro-batch at {} px (BatchNorm needs 2 values per channel over "
                   "its 1x1 maps); an epoch's last batch below that is left out",
                   p.loader.min_batch(), least_size);
  }
  if (c.train.ema) {
    p.ema_copy = models::build_detector(c, nc);
    p.ema_copy->to(device);
  }
  if (p.val_split) p.validation = eval::validate_options(c, *p.val_split, p.model->info(), device);
  p.loss = losses::make_loss(p.model->info(), losses::loss_options(c));
  if (augment::enabled(c.augment)) {
    const int64_t W = p.loader.world();
    const int64_t batches = data::Loader::batches_in(int64_t(p.train_split->samples.size()), p.loader.batch() * W,
                                                     p.loader.drop_last(), p.loader.min_batch() * W);
    p.augmenter = std::make_unique<augment::Augmenter>(
        augment::augmenter_options(c, p.model->info().input_multiple, run_length(p.options, batches).epochs));
  }
  return p;
}

Trainer::Trainer(TrainerParts parts)
    : options_(std::move(parts.options)),
      device_(parts.device),
      run_dir_(std::move(parts.run_dir)),
      train_split_(std::move(parts.train_split)),
      val_split_(std::move(parts.val_split)),
      validation_(std::move(parts.validation)),
      model_(std::move(parts.model)),
      loss_(std::move(parts.loss)),
      augmenter_(std::move(parts.augmenter)),
      monitor_(std::move(parts.monitor)),
      group_(std::move(parts.group)) {
  TORCH_CHECK(loss_, "TrainerParts without a loss");
  TORCH_CHECK((group_ ? group_->world() : 1) == options_.world(), "TrainerOptions::world differs from the group's");
  if (group_) {
    // Every rank starts from rank 0's weights and statistics (its init_from or its seed).
    std::vector<at::Tensor> state = model_->parameters();
    for (const auto& b : model_->buffers()) state.push_back(b);
    {
      at::NoGradGuard no_grad;
      group_->broadcast(state, "rank 0's initial weights");
    }
    if (options_.sync_bn()) model_->set_batchnorm_sync(dist::differentiable_sum(*group_));
  }
  loader_ = std::make_unique<data::Loader>(train_split_, parts.loader);
  const int64_t nb = loader_->batches_per_epoch();
  length_ = run_length(options_, nb);
  // Ultralytics scales the decay with the images per step relative to the nominal batch.
  const double decay =
      options_.weight_decay() * double(options_.batch() * options_.world() * length_.accumulate) / double(options_.nominal_batch());
  optimizer_ = std::make_unique<Optimizer>(parameter_groups(*model_, decay), options_.optimizer());
  ScheduleOptions schedule = options_.schedule();
  schedule.total_steps(length_.total_steps);
  if (schedule.warmup_steps() == 0) schedule.warmup_steps(warmup_steps(options_.warmup_epochs(), nb, length_.accumulate));
  schedule_ = std::make_unique<Schedule>(schedule);
  schedule_->apply(*optimizer_, 0);  // valid rates even without the schedule hook
  set_amp(options_.amp());
  if (parts.ema_copy) ema_ = std::make_unique<ModelEma>(*model_, std::move(parts.ema_copy), options_.ema_decay(), options_.ema_tau());
  loss_names_ = loss_->term_names();
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
  window_loss_ = at::zeros({int64_t(loss_names_.size())}, fopt);
  window_finite_ = at::zeros({}, fopt);
  skipped_ = at::zeros({}, fopt);
  bad_run_ = at::zeros({}, fopt);
  worst_run_ = at::zeros({}, fopt);
  window_cause_ = at::zeros({}, fopt);
  // The skip causes in the order they are judged: loss terms first (a non-finite term makes every
  // gradient non-finite), then the parameter groups; ranked K..1 so the max picks the first.
  for (const auto& name : loss_names_) cause_names_.push_back("a non-finite loss term '" + name + "'");
  for (const auto& g : optimizer_->groups()) cause_names_.push_back("non-finite gradients in parameter group '" + g.name + "'");
  cause_rank_ = at::arange(int64_t(cause_names_.size()), 0, -1, fopt);
  readback_ = at::zeros({6 + int64_t(loss_names_.size())}, fopt);
  count_terms_ = loss_->count_terms();
  if (group_) {
    int64_t numel = 0, largest = 0;
    for (const auto& p : model_->parameters())
      if (p.requires_grad()) {
        numel += p.numel();
        largest = std::max(largest, p.numel());
      }
    for (const auto& b : model_->buffers()) largest = std::max(largest, b.numel());
    // 16 MiB (or the largest parameter), made before any step: the exchange allocates nothing.
    grad_bucket_ = at::empty({std::min(numel, std::max<int64_t>(largest, int64_t(1) << 22))}, fopt);
  }
  model_->train();
  register_state();
}

Trainer::~Trainer() = default;

void Trainer::register_hook(std::unique_ptr<Hook> hook) {
  Hook* h = hook.get();
  hooks_.push_back(std::move(hook));
  const std::string name = h->state_name();
  if (name.empty()) return;
  registry_.add(
      name, [h](torch::serialize::OutputArchive& a) { write_json(a, h->save_state()); },
      [h, name](torch::serialize::InputArchive& a) { h->load_state(read_json(a, "checkpoint entry " + name)); },
      /*required=*/false);
}

void Trainer::set_amp(AmpMode m) {
  amp_ = m;
  if (amp_ != AmpMode::fp16)
    scaler_.reset();  // only fp16 scales its loss
  else if (!scaler_)
    scaler_ = std::make_unique<LossScaler>(device_);
}

bool Trainer::enable_amp() {
  if (amp_ != AmpMode::off) return false;
  set_amp(device_.is_cuda() ? AmpMode::fp16 : AmpMode::bf16);  // what train.amp: auto takes on CUDA
  return true;
}

void Trainer::train() {
  start_ = std::chrono::steady_clock::now();
  each_hook([&](Hook& h) { h.before_train(*this); });
  const int64_t nb = loader_->batches_per_epoch();
  if (state_.batch >= nb)
    end_epoch();  // the checkpoint was written after the epoch's last step, before its end
  else
    begin_epoch();
  while (!state_.stop && state_.step < total_steps()) {
    run_step();
    each_hook([&](Hook& h) { h.after_step(*this); });
    if (state_.batch >= nb) end_epoch();
  }
  if (!state_.stop && state_.batch > 0) end_epoch();  // train.steps ended inside an epoch
  each_hook([&](Hook& h) { h.after_train(*this); });
  if (monitor_) monitor_->phase_ended();
}

void Trainer::begin_epoch() {
  if (state_.stop || state_.step >= total_steps()) return;
  each_hook([&](Hook& h) { h.before_epoch(*this); });
  loader_->start(state_.epoch, state_.batch);
}

void Trainer::end_epoch() {
  each_hook([&](Hook& h) { h.after_epoch(*this); });
  ++state_.epoch;
  state_.batch = 0;  // the epoch's end is done
  data_wait_ = 0;
  begin_epoch();
}

void Trainer::run_step() {
  const auto t0 = std::chrono::steady_clock::now();
  each_hook([&](Hook& h) { h.before_step(*this); });
  const std::vector<data::HostBatch> batches = next_batches();
  if (monitor_) monitor_->reset_peak();
  (executor_ ? *executor_ : static_cast<StepExecutor&>(direct_)).run(*this, batches);
  if (monitor_) step_memory_ = monitor_->sample();  // host-side counters: no sync
  for (const auto& b : batches) state_.images += b.global_size > 0 ? b.global_size : b.size();  // over every rank
  state_.batch += int64_t(batches.size());
  ++state_.step;
  ++window_steps_;
  if (counters_due()) read_counters();
  step_seconds_ = seconds_since(t0);
}

std::vector<data::HostBatch> Trainer::next_batches() {
  const int64_t nb = loader_->batches_per_epoch();
  std::vector<data::HostBatch> batches;  // kept until the step succeeds: a retry re-runs the same images
  while (int64_t(batches.size()) < length_.accumulate && state_.batch + int64_t(batches.size()) < nb) {
    std::optional<data::HostBatch> batch;
    try {
      batch = loader_->next();
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e)) throw;
      bool handled = false;
      each_hook([&](Hook& h) { handled = handled || h.on_oom(*this, e, OomSite::data); });
      if (!handled)
        throw Error("out of memory while the loader filled a batch (its prefetched batches count against the budget); the last "
                    "checkpoint is intact. Lower data.prefetch or train.batch, or raise memory.budget. " +
                    std::string(e.what_without_backtrace()));
      continue;  // the loader queued the failed images again
    }
    if (!batch)
      throw Error("the loader ended epoch " + std::to_string(state_.epoch) + " early at batch " +
                  std::to_string(state_.batch + int64_t(batches.size())));
    data_wait_ += batch->wait_seconds;
    batches.push_back(std::move(*batch));
  }
  return batches;
}

StepInput Trainer::prepare_step(const std::vector<data::HostBatch>& batches) {
  counts_exchanged_ = false;
  StepInput in;
  std::vector<at::Tensor> counts;
  for (const data::HostBatch& batch : batches) {
    // Host -> device without blocking (the loader pins batches for CUDA runs), then on-device
    // augmentation with per-image parameters drawn there (the same draws on a re-run).
    StepInput::Batch b;
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
    if (b.images.device() != device_ || b.targets.boxes.device() != device_)  // metadata only: no sync
      throw DeviceError("the batch is on " + b.images.device().str() + ", the run trains on " + device_.str());
    const at::Tensor c = loss_->counts(b.targets, b.images.size(2), b.images.size(3));
    if (c.defined()) counts.push_back(c);
    in.images += b.images.size(0);
    in.batches.push_back(std::move(b));
  }
  if (!counts.empty()) in.norm.counts = at::stack(counts).sum(0);  // the whole step's, before any backward
  if (group_ && count_terms_ > 0) {
    TORCH_CHECK(in.norm.counts.defined() && in.norm.counts.numel() == count_terms_, "the loss's counts have ", count_terms_, " terms");
    group_->all_reduce_sum(in.norm.counts, "the loss normalisers of step " + std::to_string(state_.step + 1));
  }
  counts_exchanged_ = true;
  in.norm.images = 0;  // over every rank: the loader knows each batch's whole size
  for (const data::HostBatch& batch : batches) in.norm.images += batch.global_size > 0 ? batch.global_size : batch.size();
  step_items_ = at::Tensor();
  step_deferred_ = at::Tensor();
  notify(StepPhase::input);
  return in;
}

void Trainer::forward_backward(const StepInput& in, size_t batch, int64_t start, int64_t length) {
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
    // A normaliser that needs the predictions: the accumulated gradients are kept divided by
    // the step's total so far, and rescaled as this part adds to it (exact whatever the cut).
    const at::Tensor before = step_deferred_.defined() ? step_deferred_.clamp_min(1) : at::Tensor();
    step_deferred_ = step_deferred_.defined() ? step_deferred_ + terms.deferred : terms.deferred;
    const at::Tensor now = step_deferred_.clamp_min(1);  // detached: a constant of the loss
    const std::vector<at::Tensor> grads = optimizer_->grads();
    if (before.defined() && !grads.empty()) {
      at::NoGradGuard no_grad;
      compat::foreach_mul_(grads, before / now);
    }
    total = total / now;
  }
  (scaler_ ? scaler_->scale(total) : total).backward();
  notify(StepPhase::backward);
  step_items_ = step_items_.defined() ? step_items_ + terms.items : terms.items;
}

void Trainer::update() {
  at::NoGradGuard no_grad;
  if (group_) reduce_gradients();
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
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
  at::Tensor terms = step_items_.defined() ? step_items_ : at::zeros({int64_t(loss_names_.size())}, fopt);
  if (step_deferred_.defined()) terms = terms / step_deferred_.clamp_min(1);
  const at::Tensor skipped = found > 0;
  // The window's first skipped step keeps its cause (a rank, 0 = none): reported once per read.
  const at::Tensor flags = at::cat({at::logical_not(at::isfinite(terms)), at::logical_not(at::isfinite(norms))}).to(at::kFloat);
  const at::Tensor cause = at::where(at::logical_and(skipped, window_cause_ == 0), (flags * cause_rank_).max(), window_cause_);
  const at::Tensor loss_add = at::where(skipped, at::zeros({}, fopt), terms);  // a skipped step's losses are not counted
  const at::Tensor finite = 1 - found;
  const at::Tensor bad = (bad_run_ + found) * found;
  const at::Tensor worst = at::maximum(worst_run_, bad);
  optimizer_->step(found);  // atomic: an out-of-memory error inside leaves every group untouched
  if (scaler_) scaler_->update(found);
  optimizer_->zero_grad();
  window_loss_.add_(loss_add);
  window_finite_.add_(finite);
  skipped_.add_(found);
  bad_run_.copy_(bad);
  worst_run_.copy_(worst);
  window_cause_.copy_(cause);
  notify(StepPhase::update);
}

std::string Trainer::skip_cause(double rank) const {
  const int64_t k = int64_t(cause_names_.size()), r = std::llround(rank);
  if (r <= 0) return {};
  return r <= k ? cause_names_[size_t(k - r)] : "an unknown cause";
}

void Trainer::discard_gradients() {
  optimizer_->zero_grad();
  step_items_ = at::Tensor();
  step_deferred_ = at::Tensor();
}

StepAgreement Trainer::agree_step(bool failed, bool pressed) {
  StepAgreement a;
  const bool stop = interrupt_requested();
  if (!group_) {
    if (failed) a.failed.push_back(0);
    if (pressed) a.pressed.push_back(0);
    a.interrupt = stop;
    return a;
  }
  const auto all = group_->all_gather({failed ? 1.0 : 0.0, pressed ? 1.0 : 0.0, stop ? 1.0 : 0.0},
                                      "the ranks' agreement before step " + std::to_string(state_.step + 1) + "'s update");
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] > 0) a.failed.push_back(int(r));
    if (all[r][1] > 0) a.pressed.push_back(int(r));
    a.interrupt = a.interrupt || all[r][2] > 0;
  }
  interrupt_agreed_ = a.interrupt;  // every rank stops after the same step
  counts_exchanged_ = false;         // the next attempt exchanges again
  return a;
}

void Trainer::abandon_step() {
  if (!group_ || counts_exchanged_ || count_terms_ == 0) return;
  at::Tensor zeros = at::zeros({count_terms_}, at::TensorOptions().dtype(at::kFloat).device(device_));
  group_->all_reduce_sum(zeros, "the loss normalisers of step " + std::to_string(state_.step + 1) + " (an attempt this rank abandoned)");
  counts_exchanged_ = true;
}

void Trainer::reduce_gradients() {
  // Each rank's gradients are of its images' share of a loss normalised over the whole step
  // (prepare_step's exchange), so the step's gradient is their sum. A prediction-dependent
  // normaliser is summed here, each rank's gradients brought from its own to the total.
  const std::string step = " of step " + std::to_string(state_.step + 1);
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
  const int64_t T = int64_t(loss_names_.size());
  const bool deferred = step_deferred_.defined();
  at::Tensor sums = at::zeros({T + 1}, fopt);  // [T + 1] the step's loss terms, then its deferred normaliser
  if (step_items_.defined()) sums.narrow(0, 0, T).copy_(step_items_);
  if (deferred) sums.narrow(0, T, 1).copy_(step_deferred_.reshape({1}));
  const at::Tensor own = deferred ? step_deferred_.clamp_min(1) : at::Tensor();
  group_->all_reduce_sum(sums, "the loss terms" + step);
  step_items_ = sums.narrow(0, 0, T);
  if (deferred) step_deferred_ = sums.narrow(0, T, 1).reshape({});
  const at::Tensor rescale_in = own, rescale_out = deferred ? step_deferred_.clamp_min(1).reciprocal() : at::Tensor();
  // Every trainable parameter takes part, in the same order on every rank, gradient or not.
  std::vector<at::Tensor> grads;
  for (const auto& g : optimizer_->groups())
    for (const auto& p : g.params) {
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
  sum_in_buckets(grads, rescale_in, rescale_out, "the gradients" + step);
  if (!options_.sync_bn()) {
    // Each rank's BatchNorm ran on its own images: the running statistics are averaged, so that
    // every rank (and its EMA, which validates a shard) holds the same ones.
    std::vector<at::Tensor> stats;
    for (const auto& b : model_->buffers())
      if (b.is_floating_point()) stats.push_back(b);
    if (!stats.empty())
      sum_in_buckets(stats, at::Tensor(), at::full({}, 1.0 / double(group_->world()), fopt), "the BatchNorm statistics" + step);
  }
}

void Trainer::sum_in_buckets(const std::vector<at::Tensor>& tensors, const at::Tensor& scale_in, const at::Tensor& scale_out,
                             const std::string& what) {
  // Through the bucket made at construction: nothing is allocated on the device here.
  const int64_t cap = grad_bucket_.numel();
  size_t first = 0;
  while (first < tensors.size()) {
    size_t last = first;
    int64_t used = 0;
    while (last < tensors.size() && used + tensors[last].numel() <= cap) used += tensors[last++].numel();
    TORCH_CHECK(last > first, "a tensor of ", tensors[first].numel(), " elements is larger than the exchange bucket");
    at::Tensor bucket = grad_bucket_.narrow(0, 0, used);
    int64_t at = 0;
    for (size_t i = first; i < last; ++i) {
      bucket.narrow(0, at, tensors[i].numel()).view(tensors[i].sizes()).copy_(tensors[i]);
      at += tensors[i].numel();
    }
    if (scale_in.defined()) bucket.mul_(scale_in);
    group_->all_reduce_sum(bucket, what);
    if (scale_out.defined()) bucket.mul_(scale_out);
    at = 0;
    for (size_t i = first; i < last; ++i) {
      tensors[i].copy_(bucket.narrow(0, at, tensors[i].numel()).view(tensors[i].sizes()));
      at += tensors[i].numel();
    }
    first = last;
  }
}

void Trainer::notify(StepPhase phase) {
  each_hook([&](Hook& h) { h.after_phase(*this, phase); });
}

bool Trainer::counters_due() const {
  return state_.step % options_.read_every() == 0 || state_.batch >= loader_->batches_per_epoch() ||
         state_.step >= total_steps();
}

void Trainer::read_counters() {
  // Gathered in place into a buffer made once: nothing is allocated on the device after the
  // step has committed (an out-of-memory error here could not be undone).
  readback_.narrow(0, 0, 1).copy_(skipped_.reshape({1}));
  readback_.narrow(0, 1, 1).copy_(bad_run_.reshape({1}));
  readback_.narrow(0, 2, 1).copy_(worst_run_.reshape({1}));
  if (scaler_)
    readback_.narrow(0, 3, 1).copy_(scaler_->scale_tensor().reshape({1}));
  else
    readback_.narrow(0, 3, 1).zero_();
  readback_.narrow(0, 4, 1).copy_(window_finite_.reshape({1}));
  readback_.narrow(0, 5, 1).copy_(window_cause_.reshape({1}));
  readback_.narrow(0, 6, window_loss_.size(0)).copy_(window_loss_);
  const at::Tensor host = readback_.cpu();  // the one host sync of the window
  const float* v = host.data_ptr<float>();
  StepCounters c;
  c.step = state_.step;
  c.steps = window_steps_;
  c.skipped_steps = v[0];
  c.bad_run = v[1];
  c.worst_bad_run = v[2];
  c.loss_scale = v[3];
  c.finite_steps = std::llround(v[4]);
  c.skip_cause = skip_cause(v[5]);
  for (size_t i = 0; i < loss_names_.size(); ++i) c.loss_sums.emplace_back(loss_names_[i], double(v[6 + i]));
  counters_ = std::move(c);
  window_loss_.zero_();
  window_finite_.zero_();
  window_cause_.zero_();
  worst_run_.copy_(bad_run_);  // a run of bad steps that goes on counts whole in the next window
  window_steps_ = 0;
}

std::optional<eval::CocoStats> Trainer::validate() {
  if (!val_split_) return std::nullopt;
  if (group_ && !val_shard_) {
    // Rank r scores images r, r + world, ...; the image ids stay those of the whole split.
    auto shard = std::make_shared<data::Split>(*val_split_);
    shard->samples.clear();
    for (size_t i = size_t(group_->rank()); i < val_split_->samples.size(); i += size_t(group_->world())) {
      shard->samples.push_back(val_split_->samples[i]);
      if (shard->samples.back().image_id < 0) shard->samples.back().image_id = int64_t(i);
    }
    val_shard_ = std::move(shard);
  }
  const std::shared_ptr<const data::Split>& split = group_ ? val_shard_ : val_split_;
  if (monitor_) monitor_->phase_ended();  // the steps' cached blocks are not validation's sizes
  if (!val_cache_) val_cache_ = data::open_cache(*split, validation_.loader);  // decoded once per run, not per pass
  std::optional<eval::ValidationResult> r;
  while (!r) {
    eval::ValidateOptions o = validation_;
    o.cache = val_cache_;
    if (state_.val_batch > 0) o.loader.batch(int(std::min<int64_t>(state_.val_batch, o.loader.batch())));
    bool failed = false;
    try {
      if (!split->samples.empty()) r = eval::validate(eval_model(), split, o);
      else r.emplace();  // more ranks than val images
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e)) throw;
      if (state_.val_batch == 0) state_.val_batch = o.loader.batch();
      bool handled = false;
      each_hook([&](Hook& h) { handled = handled || h.on_oom(*this, e, OomSite::validation); });
      if (!handled)
        throw Error((memory_failure(e) == MemoryFailure::library ? "a cuDNN error persists in validation (batch "
                                                                  : "out of memory in validation (batch ") +
                    std::to_string(o.loader.batch()) + "); the last checkpoint is intact. " + e.what_without_backtrace());
      failed = true;
    }
    if (group_) {
      // A pass is redone on every rank when one failed, at the smallest batch any rank has.
      const auto all = group_->all_gather({failed ? 1.0 : 0.0, double(state_.val_batch)}, "the ranks' validation outcome");
      bool any = false;
      for (const auto& v : all) {
        any = any || v[0] > 0;
        if (v[1] > 0 && (state_.val_batch == 0 || v[1] < double(state_.val_batch))) state_.val_batch = int64_t(v[1]);
      }
      if (any) r.reset();
    }
  }
  if (monitor_) monitor_->phase_ended();
  if (group_) r->stats = gather_validation(*r);
  last_metrics_ = r->stats;
  state_.last_eval_step = state_.step;
  return r->stats;
}

eval::CocoStats Trainer::gather_validation(const eval::ValidationResult& mine) {
  // [n, 7]: image id, category id, x, y, w, h, score of this rank's detections
  at::Tensor rows = at::empty({int64_t(mine.detections.size()), 7}, at::kDouble);
  double* v = rows.data_ptr<double>();
  for (const auto& d : mine.detections) {
    for (double x : {double(d.image_id), double(d.category_id), d.x, d.y, d.w, d.h, d.score}) *v++ = x;
  }
  const at::Tensor all = group_->all_gather_rows(rows, "the validation detections");
  std::vector<eval::CocoBox> detections(size_t(all.size(0)));
  const double* a = all.data_ptr<double>();
  for (auto& d : detections) {
    d.image_id = int64_t(a[0]);
    d.category_id = int64_t(a[1]);
    d.x = a[2], d.y = a[3], d.w = a[4], d.h = a[5], d.score = a[6];
    d.area = d.w * d.h;
    a += 7;
  }
  std::vector<int64_t> image_ids, category_ids;
  const std::vector<eval::CocoBox> truth = eval::ground_truth_boxes(*val_split_, &image_ids, &category_ids);
  return eval::coco_evaluate(truth, detections, image_ids, category_ids);
}

void Trainer::register_state() {
  registry_.add(
      "progress",
      [this](torch::serialize::OutputArchive& a) {
        Json j = Json::object();
        j["epoch"] = state_.epoch;
        j["batch"] = state_.batch;
        j["step"] = state_.step;
        j["images"] = state_.images;
        j["best_fitness"] = state_.best_fitness;
        j["best_step"] = state_.best_step;
        j["last_eval_step"] = state_.last_eval_step;
        j["val_batch"] = state_.val_batch;
        j["world"] = options_.world();
        j["amp"] = to_string(amp_);
        Json metrics = Json::array();  // the latest validation: an epoch end still to do reports it
        if (last_metrics_)
          for (double v : last_metrics_->stats) metrics.push_back(v);
        j["last_metrics"] = std::move(metrics);
        write_json(a, j);
      },
      [this](torch::serialize::InputArchive& a) {
        const Json j = read_json(a, "checkpoint entry progress");
        const auto num = [&](const char* k) { return int64_t(j.find(k)->as_number()); };
        state_.epoch = num("epoch");
        state_.batch = num("batch");
        // Another world size: the position moves by images (loader batches are batch x world).
        const int64_t saved_world = j.find("world") ? num("world") : 1;
        if (saved_world != options_.world()) {
          const int64_t nb_saved = data::Loader::batches_in(int64_t(train_split_->samples.size()), options_.batch() * saved_world,
                                                            loader_->options().drop_last(), loader_->options().min_batch() * saved_world);
          const int64_t done = state_.batch * options_.batch() * saved_world, per = options_.batch() * options_.world();
          const int64_t moved = state_.batch >= nb_saved ? loader_->batches_per_epoch() : done / per;
          if (state_.batch < nb_saved && done % per != 0)
            spdlog::warn("resume on {} processes (the checkpoint ran on {}): epoch {} continues at image {}, not {} ({} images of it "
                         "train again)", options_.world(), saved_world, state_.epoch + 1, moved * per, done, done - moved * per);
          spdlog::info("resume on {} processes (the checkpoint ran on {}): loader batch {} of {} images is batch {} of {}", options_.world(),
                       saved_world, state_.batch, options_.batch() * saved_world, moved, per);
          state_.batch = moved;
        }
        state_.step = num("step");
        state_.images = num("images");
        state_.best_fitness = j.find("best_fitness")->as_number();
        state_.best_step = num("best_step");
        state_.last_eval_step = num("last_eval_step");
        state_.val_batch = num("val_batch");
        const std::vector<Json>& metrics = j.find("last_metrics")->items();
        last_metrics_.reset();
        if (!metrics.empty()) {
          last_metrics_.emplace();
          for (size_t i = 0; i < metrics.size() && i < last_metrics_->stats.size(); ++i)
            last_metrics_->stats[i] = metrics[i].is_number() ? metrics[i].as_number() : NAN;
        }
        // The rates of the last step taken, as a run that went through still has them (an epoch
        // end that resumes first reports them).
        schedule_->apply(*optimizer_, std::max<int64_t>(state_.step - 1, 0));
        // The precision the run resolved (or the governor switched on) is part of the run: a
        // resume on another device keeps it, or refuses when that device cannot run it.
        set_amp(resolve_amp(amp_mode_from(j.find("amp")->as_string()), device_,
                            "the checkpoint's run trains with amp " + j.find("amp")->as_string() + ", which it keeps on resume"));
      });
  registry_.add(
      "model", [this](torch::serialize::OutputArchive& a) { model_->save(a); },
      [this](torch::serialize::InputArchive& a) {
        at::NoGradGuard no_grad;
        model_->load(a);
        model_->train();
      });
  registry_.add(
      "optimizer", [this](torch::serialize::OutputArchive& a) { optimizer_->save(a); },
      [this](torch::serialize::InputArchive& a) { optimizer_->load(a); });
  if (ema_)
    registry_.add(
        "ema", [this](torch::serialize::OutputArchive& a) { ema_->save(a); }, [this](torch::serialize::InputArchive& a) { ema_->load(a); });
  registry_.add(
      "scaler",
      [this](torch::serialize::OutputArchive& a) {
        if (scaler_) scaler_->save(a);
      },
      [this](torch::serialize::InputArchive& a) {
        at::Tensor probe;
        if (scaler_ && a.try_read("scale", probe, /*is_buffer=*/true)) scaler_->load(a);
      });
  registry_.add(
      "rng",
      [this](torch::serialize::OutputArchive& a) {
        a.write("cpu", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
        if (device_.is_cuda()) a.write("cuda", at::globalContext().defaultGenerator(device_).get_state(), true);
      },
      [this](torch::serialize::InputArchive& a) {
        at::Tensor rng;
        a.read("cpu", rng, true);
        at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();  // a handle on the global generator
        cpu_gen.set_state(rng.cpu());
        if (device_.is_cuda() && a.try_read("cuda", rng, true)) {
          at::Generator cuda_gen = at::globalContext().defaultGenerator(device_);
          cuda_gen.set_state(rng.cpu());
        }
      });
  registry_.add(
      "counters",
      [this](torch::serialize::OutputArchive& a) {
        a.write("window_loss", window_loss_, true);
        a.write("window_finite", window_finite_, true);
        a.write("skipped", skipped_, true);
        a.write("bad_run", bad_run_, true);
        a.write("worst_run", worst_run_, true);
        a.write("window_cause", window_cause_, true);
        Json j = Json::object();
        j["window_steps"] = window_steps_;
        Json last = Json::object();  // the latest read: what hooks report until the next one
        last["step"] = counters_.step;
        last["steps"] = counters_.steps;
        last["finite_steps"] = counters_.finite_steps;
        last["skipped_steps"] = counters_.skipped_steps;
        last["bad_run"] = counters_.bad_run;
        last["worst_bad_run"] = counters_.worst_bad_run;
        last["loss_scale"] = counters_.loss_scale;
        last["skip_cause"] = counters_.skip_cause;
        Json sums = Json::array();
        for (const auto& [name, v] : counters_.loss_sums) sums.push_back(v);
        last["loss_sums"] = std::move(sums);
        j["last_read"] = std::move(last);
        write_json(a, j);
      },
      [this](torch::serialize::InputArchive& a) {
        at::NoGradGuard no_grad;
        for (auto& [key, into] : std::vector<std::pair<const char*, at::Tensor*>>{{"window_loss", &window_loss_},
                                                                                   {"window_finite", &window_finite_},
                                                                                   {"skipped", &skipped_},
                                                                                   {"bad_run", &bad_run_},
                                                                                   {"worst_run", &worst_run_}}) {
          at::Tensor t;
          a.read(key, t, true);
          into->copy_(t);
        }
        at::Tensor cause;
        if (a.try_read("window_cause", cause, true))  // absent from checkpoints before skip causes were kept
          window_cause_.copy_(cause);
        else
          window_cause_.zero_();
        const Json j = read_json(a, "checkpoint entry counters");
        window_steps_ = int64_t(j.find("window_steps")->as_number());
        const Json& last = *j.find("last_read");
        StepCounters c;
        c.step = int64_t(last.find("step")->as_number());
        c.steps = int64_t(last.find("steps")->as_number());
        c.finite_steps = int64_t(last.find("finite_steps")->as_number());
        c.skipped_steps = last.find("skipped_steps")->as_number();
        c.bad_run = last.find("bad_run")->as_number();
        c.worst_bad_run = last.find("worst_bad_run")->as_number();
        c.loss_scale = last.find("loss_scale")->as_number();
        if (const Json* cause_text = last.find("skip_cause")) c.skip_cause = cause_text->as_string();
        const std::vector<Json>& sums = last.find("loss_sums")->items();
        for (size_t i = 0; i < sums.size() && i < loss_names_.size(); ++i) c.loss_sums.emplace_back(loss_names_[i], sums[i].as_number());
        counters_ = std::move(c);
      });
}

void Trainer::save_checkpoint(const std::string& path) {
  at::NoGradGuard no_grad;
  fs::create_directories(fs::path(path).parent_path());
  torch::serialize::OutputArchive root, state;
  models::write_weights(eval_model(), models::WeightsInfo{train_split_->names, train_split_->category_ids}, root);
  registry_.save(state);
  root.write("checkpoint", state);
  Json meta = Json::object();
  meta["format"] = kCheckpointFormat;
  meta["epoch"] = state_.epoch;
  meta["batch"] = state_.batch;
  meta["step"] = state_.step;
  meta["total_steps"] = total_steps();
  meta["config"] = options_.config_yaml();
  models::save_archive_atomic(root, path, meta.dump());  // streamed: no copy of the archive in memory
}

void Trainer::load_checkpoint(const std::string& path) {
  at::NoGradGuard no_grad;
  torch::serialize::InputArchive root, state;
  load_checkpoint_archive(path, device_, root);
  if (!root.try_read("checkpoint", state))
    throw InputError(path + ": a weights file without training state; start a new run from it with model.init_from=" + path);
  registry_.load(state, path);
  spdlog::info("resumed from {}: epoch {}, step {} of {}", path, state_.epoch + 1, state_.step, total_steps());
}

std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path, bool backbone_only) {
  if (!models::has_headroom_trailer(path)) {  // another trainer's weights
    const models::ImportReport r = models::import_weights(model, models::read_imported_weights(path), /*new_head=*/true, backbone_only);
    return r.reinitialised;
  }
  torch::serialize::InputArchive archive;
  models::load_archive_verified(archive, path, c10::Device(c10::kCPU), "weights file (model.init_from)");
  at::NoGradGuard no_grad;
  std::vector<std::string> skipped;
  int64_t loaded = 0;
  // Module::save nests one archive per child module, so the walk follows the module tree.
  std::function<void(torch::nn::Module&, torch::serialize::InputArchive&, const std::string&)> walk =
      [&](torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& prefix) {
        const auto take = [&](const std::string& name, at::Tensor& into, bool is_buffer) {
          at::Tensor t;
          if (!a.try_read(name, t, is_buffer)) {
            skipped.push_back(prefix + name + ": not in the file");
          } else if (!t.sizes().equals(into.sizes())) {
            skipped.push_back(prefix + name + ": shape " + c10::str(t.sizes()) + " in the file, " + c10::str(into.sizes()) + " here");
          } else {
            into.copy_(t);
            ++loaded;
          }
        };
        for (auto& p : m.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
        for (auto& b : m.named_buffers(/*recurse=*/false)) take(b.key(), b.value(), true);
        for (auto& c : m.named_children()) {
          torch::serialize::InputArchive sub;
          if (backbone_only && prefix.empty() && c.key() == "head")
            skipped.push_back("head: keeps its initialisation (model.init_backbone_only)");
          else if (a.try_read(c.key(), sub))
            walk(*c.value(), sub, prefix + c.key() + ".");
          else if (!c.value()->parameters().empty())
            skipped.push_back(prefix + c.key() + ": not in the file");
        }
      };
  walk(model, archive, "");
  if (loaded == 0) throw InputError(path + ": model.init_from: no tensor of this model is in the file (another architecture?)");
  return skipped;
}

}  // namespace headroom::train
