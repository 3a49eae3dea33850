#include "headroom/train/parts.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/data/cache.h"
#include "headroom/interop/init_from.h"
#include "headroom/interop/weights_import.h"

namespace headroom::train {

namespace {

// Validation scores the model's class k as the val split's class k: both splits must name the
// same classes in the same order (COCO files and label maps each carry their own list; their
// ids may differ, as validation reports the val split's).
void check_same_classes(const data::Split& train, const data::Split& val) {
  if (train.names == val.names) return;
  const auto classes = [](const data::Split& s) {
    std::string out;
    for (size_t k = 0; k < s.names.size() && k < 12; ++k)
      out += (k ? ", " : "") + (s.category_ids.empty() ? "" : std::to_string(s.category_ids[k]) + ":") + s.names[k];
    return out + (s.names.size() > 12 ? ", ..." : "");
  };
  throw InputError(val.source.where + ": split 'val' has the classes [" + classes(val) + "], split 'train' (" + train.source.where +
                   ") [" + classes(train) + "]: validation would score one class as another. Give both splits the same "
                   "category names, in the same order");
}

}  // namespace

TrainerOptions trainer_options(const Config& c, c10::Device device) {
  const TrainConfig& t = c.train;
  TORCH_CHECK(t.optimizer != "auto", "train.optimizer auto reached trainer_options unresolved (with_chosen_optimizer)");
  return TrainerOptions()
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
      .ema_ramp(t.ema_ramp == "tf" ? EmaRamp::tf : EmaRamp::ultralytics)
      .read_every(t.log_every)
      .keep_first_batch(t.plots)
      .config_yaml(config_to_yaml(c))
      .sync_bn(c.distributed.sync_bn)
      .async_checkpoints(t.async_checkpoints)
      .cudnn_benchmark(cudnn_benchmark(c, device))
      .side_stream(c.data.side_stream);
}

bool cudnn_benchmark(const Config& c, c10::Device device) {
  if (c.train.cudnn_benchmark != "auto") return c.train.cudnn_benchmark == "on";
  return device.is_cuda() && c.augment.multi_scale <= 0;
}

Config with_chosen_optimizer(const Config& c, int64_t images, int64_t nc, int64_t world) {
  if (c.train.optimizer != "auto") return c;
  Config out = c;
  TrainConfig& t = out.train;
  const int64_t per_step = std::max<int64_t>(int64_t(t.batch) * world, t.nominal_batch);
  const int64_t iterations = t.steps > 0 ? t.steps : (images + per_step - 1) / per_step * t.epochs;
  const bool musgd = iterations > 10000;
  t.optimizer = musgd ? "musgd" : "adamw";
  t.lr0 = musgd ? 0.01 : std::round(0.002 * 5 / double(4 + nc) * 1e6) / 1e6;
  // Ultralytics builds both with momentum 0.9, and its warmup then moves MuSGD's (not AdamW's
  // betas) from warmup_momentum to train.momentum, where it stays.
  const bool warmup = t.warmup_steps > 0 || t.warmup_epochs > 0;
  if (!musgd || !warmup) t.momentum = 0.9;
  t.warmup_bias_lr = 0;
  spdlog::info("train.optimizer auto: {} iterations {} 10000, so {} with lr0 {} and momentum {}, biases warmed up from 0 "
               "(Ultralytics' choice; it sets train.lr0{} and train.warmup_bias_lr)",
               iterations, musgd ? ">" : "<=", t.optimizer, t.lr0, t.momentum, musgd && warmup ? "" : ", train.momentum");
  return out;
}

ParamFilter musgd_boosted(const models::DetectorInfo& info) {
  if (info.family != "yolov8") return {};
  return [info](const std::string& name) { return models::in_class_branch(info, name); };
}

int64_t accumulation_steps(int64_t nominal_batch, int64_t batch) {
  // Python's round, as Ultralytics: halves to even (nominal 100 over 40 is 2 steps, not 3).
  return std::max<int64_t>(int64_t(std::nearbyint(double(nominal_batch) / double(batch))), 1);
}

RunLength run_length(const TrainerOptions& o, int64_t batch, int64_t batches_per_epoch) {
  RunLength r;
  r.accumulate = accumulation_steps(o.nominal_batch(), batch * o.world());
  r.steps_per_epoch = (batches_per_epoch + r.accumulate - 1) / r.accumulate;
  r.total_steps = o.steps() > 0 ? o.steps() : o.epochs() * r.steps_per_epoch;
  r.epochs = (r.total_steps + r.steps_per_epoch - 1) / r.steps_per_epoch;
  return r;
}

int64_t run_epochs(const Config& c, const data::LoaderOptions& loader, int64_t images) {
  const int64_t W = loader.world();
  const int64_t batches = data::Loader::batches_in(images, loader.batch() * W, loader.drop_last(), loader.min_batch() * W);
  const TrainerOptions o = TrainerOptions().nominal_batch(c.train.nominal_batch).epochs(c.train.epochs).steps(c.train.steps).world(W);
  return run_length(o, loader.batch(), batches).epochs;
}

TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir) {
  return make_trainer_parts(c, device, run_dir, std::make_shared<const data::Split>(data::load_split(c, "train")), load_val_split(c));
}

std::shared_ptr<const data::Split> load_val_split(const Config& c) {
  if (data::read_data_yaml(c.data.dataset).split("val")) return std::make_shared<const data::Split>(data::load_split(c, "val"));
  spdlog::warn("{}: no val split; the run trains without validation and best.pt", c.data.dataset);
  return nullptr;
}

TrainerParts make_trainer_parts(const Config& config, c10::Device device, const std::string& run_dir,
                                std::shared_ptr<const data::Split> train, std::shared_ptr<const data::Split> val,
                                std::shared_ptr<dist::Group> group) {
  // The run's config holds the optimizer auto chose: a resume rebuilds that choice.
  const Config c = with_chosen_optimizer(config, int64_t(train->samples.size()), int64_t(train->names.size()),
                                         group ? group->world() : 1);
  if (val) check_same_classes(*train, *val);
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
  p.options.cuda_graphs(resolve_graph_mode(c, device, p.options.world()));
  const int64_t nc = int64_t(p.train_split->names.size());
  at::manual_seed(uint64_t(c.seed));  // LibTorch seeds its generators at random per process: initialisation follows `seed`
  p.model = interop::run_model(c, nc);
  if (!c.model.init_from.empty() && interop::carried_model(c.model.init_from))
    spdlog::info("model.init_from {}: the model is the file's own ({}{}), not model.file {}", c.model.init_from,
                 p.model->yaml_file(), p.model->scale().empty() ? "" : " scale " + p.model->scale(), c.model.file);
  if (!c.model.init_from.empty()) {
    const std::vector<std::string> skipped = interop::init_from_weights(*p.model, c.model.init_from, c.model.init_backbone_only);
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
  {
    // Fewer images than one batch takes would make epochs of no step.
    const int64_t W = p.loader.world(), images = int64_t(p.train_split->samples.size());
    const int64_t per_rank = p.loader.drop_last() ? p.loader.batch() : p.loader.min_batch();
    if (data::Loader::batches_in(images, p.loader.batch() * W, p.loader.drop_last(), p.loader.min_batch() * W) == 0)
      throw InputError(p.train_split->source.where + ": split 'train' holds " + std::to_string(images) + " image" +
                       (images == 1 ? "" : "s") + ", too few for one training batch: it needs at least " +
                       std::to_string(per_rank * W) + (W > 1 ? " (" + std::to_string(per_rank) + " on each of " + std::to_string(W) + " ranks)" : "") +
                       ". Add images, or train on fewer ranks");
  }
  if (c.train.ema) {
    p.ema_copy = interop::run_model(c, nc);
    p.ema_copy->to(device);
  }
  if (p.val_split) {
    p.validation = eval::validate_options(c, *p.val_split, p.model->info(), device);
    // Each rank validates its share (RankExchange::val_shard): a disk cache of its own, or the
    // ranks would rebuild one file over each other's at every run.
    if (p.group && p.group->world() > 1)
      p.validation.loader.shard_path(data::share_shard_path(p.validation.loader.shard_path(), p.group->rank(), p.group->world()));
  }
  p.loss = losses::make_loss(p.model->info(), losses::loss_options(c));
  if (augment::enabled(c.augment))
    p.augmenter = std::make_unique<augment::Augmenter>(
        augment::augmenter_options(c, p.model->info().input_multiple, run_epochs(c, p.loader, int64_t(p.train_split->samples.size()))));
  return p;
}

}  // namespace headroom::train
