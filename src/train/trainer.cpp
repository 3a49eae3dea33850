#include "headroom/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/memory_errors.h"
#include "headroom/core/text.h"
#include "headroom/models/weights.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/hooks.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

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
      monitor_(std::move(parts.monitor)) {
  TORCH_CHECK(loss_, "TrainerParts without a loss");
  TORCH_CHECK((parts.group ? parts.group->world() : 1) == options_.world(), "TrainerOptions::world differs from the group's");
  if (parts.group)
    exchange_ = std::make_unique<RankExchange>(std::move(parts.group), *model_, options_.sync_bn(), loss_->count_terms(), device_);
  loader_ = std::make_unique<data::Loader>(train_split_, parts.loader);
  const int64_t nb = loader_->batches_per_epoch();
  length_ = run_length(options_, batch(), nb);
  // Ultralytics scales the decay with the images per step relative to the nominal batch.
  const double decay = options_.weight_decay() * double(batch() * options_.world() * length_.accumulate) / double(options_.nominal_batch());
  optimizer_ = std::make_unique<Optimizer>(
      parameter_groups(*model_, decay, options_.optimizer().kind(), musgd_boosted(model_->info())), options_.optimizer());
  std::unordered_map<const void*, std::string> names;
  for (const auto& p : model_->named_parameters()) names[p.value().unsafeGetTensorImpl()] = p.key();
  for (const auto& g : optimizer_->groups())
    for (const auto& p : g.params) param_normaliser_.push_back(loss_->normaliser_of(names[p.unsafeGetTensorImpl()]));
  ScheduleOptions schedule = options_.schedule();
  schedule.total_steps(length_.total_steps);
  if (schedule.warmup_steps() == 0) schedule.warmup_steps(warmup_steps(options_.warmup_epochs(), nb, length_.accumulate));
  schedule_ = std::make_unique<Schedule>(schedule);
  schedule_->apply(*optimizer_, 0);  // valid rates even without the schedule hook
  set_amp(options_.amp());
  if (parts.ema_copy) ema_ = std::make_unique<ModelEma>(*model_, std::move(parts.ema_copy), options_.ema_decay(), options_.ema_tau(),
                                                options_.ema_ramp());
  std::vector<std::string> group_names;
  for (const auto& g : optimizer_->groups()) group_names.push_back(g.name);
  counters_ = std::make_unique<DeviceCounters>(loss_->term_names(), group_names, device_);
  model_->train();
  register_state();
  if (device_.is_cuda()) {
    cudnn_benchmark_before_ = at::globalContext().benchmarkCuDNN();  // process-wide: given back at the end
    at::globalContext().setBenchmarkCuDNN(options_.cudnn_benchmark());
    if (options_.side_stream()) side_stream_ = std::make_unique<SideStream>(device_);
  }
  if (options_.cuda_graphs() != GraphMode::off) {
    optimizer_->set_rates_on_device();
    graph_ = std::make_unique<StepGraph>(device_, options_.cuda_graphs());
  }
}

Trainer::~Trainer() {
  if (cudnn_benchmark_before_) at::globalContext().setBenchmarkCuDNN(*cudnn_benchmark_before_);
}

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
    if (checkpoint_writer_.failed()) checkpoint_writer_.wait();  // throws: the run stops at the failed write, not a checkpoint later
    if (state_.batch >= nb) end_epoch();
  }
  if (!state_.stop && state_.batch > 0) end_epoch();  // train.steps ended inside an epoch
  loader_->stop();  // batches decoded ahead for an epoch the run does not train
  each_hook([&](Hook& h) { h.after_train(*this); });
  checkpoint_writer_.wait();  // the run is not over before its last file is
  if (monitor_) monitor_->phase_ended();
}

void Trainer::begin_epoch() {
  if (state_.stop || state_.step >= total_steps()) return;
  loss_->set_progress(state_.epoch, length_.epochs, device_);
  each_hook([&](Hook& h) { h.before_epoch(*this); });
  // The threads go on into the next epoch's first batches where the run has one.
  const bool next = state_.epoch + 1 < length_.epochs && (state_.epoch + 1) * length_.steps_per_epoch < total_steps();
  loader_->start(state_.epoch, state_.batch, next);
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
  each_hook([&](Hook& h) { h.after_data(*this); });
  if (monitor_) monitor_->reset_peak();
  const bool writing = checkpoint_writer_.writing();  // then the peak may hold a snapshot too
  const int64_t forgotten = peaks_forgotten_;
  {
    struct Disarm {  // also when the executor throws: nothing recorded outlives the step
      Trainer& t;
      ~Disarm() {
        t.graph_armed_ = t.recording_ = false;
        t.recorded_parts_.clear();
        t.recorded_input_ = StepInput();
      }
    } disarm{*this};
    graph_armed_ = graph_ != nullptr;  // the executor's steps may be captured; the memory probes' never are
    graph_ran_ = StepGraph::Ran::eager;
    (executor_ ? *executor_ : static_cast<StepExecutor&>(direct_)).run(*this, batches);
  }
  if (monitor_) {
    step_memory_ = monitor_->sample();  // host-side counters: no sync
    // A capture's allocations are the allocator's too (in the graph's pool); a replay allocates
    // nothing: it is held at the peak of the capture, whose pool it reuses, plus the graph's inputs.
    if (graph_ran_ != StepGraph::Ran::replayed)
      shape_peak_ = step_memory_->peak_allocated;
    else
      step_memory_->peak_allocated = std::max(step_memory_->peak_allocated, shape_peak_ + graph_->held_bytes());
    if (!writing && !checkpoint_writer_.writing() && peaks_forgotten_ == forgotten)
      step_peak_ = std::max(step_peak_, step_memory_->peak_allocated);
  }
  for (const auto& b : batches) state_.images += b.global_size > 0 ? b.global_size : b.size();  // over every rank
  state_.batch += int64_t(batches.size());
  ++state_.step;
  counters_->count_step();
  if (counters_due()) counters_->read(state_.step, scaler_ ? scaler_->scale_tensor() : at::Tensor());
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

void Trainer::notify(StepPhase phase) {
  each_hook([&](Hook& h) { h.after_phase(*this, phase); });
}

bool Trainer::counters_due() const {
  return state_.step % options_.read_every() == 0 || state_.batch >= loader_->batches_per_epoch() ||
         state_.step >= total_steps();
}

std::optional<eval::CocoStats> Trainer::validate() {
  if (!val_split_) return std::nullopt;
  const std::shared_ptr<const data::Split> split = exchange_ ? exchange_->val_shard(*val_split_) : val_split_;
  if (graph_) graph_->release();          // validation's memory would sit on top of the graph's pool
  if (monitor_) monitor_->phase_ended();  // the steps' cached blocks are not validation's sizes
  if (!val_cache_) val_cache_ = data::open_cache(*split, validation_.loader);  // decoded once per run, not per pass
  std::optional<eval::ValidationResult> r;
  while (!r) {
    r = validation_pass(split);
    // A pass is redone on every rank when one failed, at the smallest batch any rank has.
    if (exchange_ && exchange_->agree_validation(!r, state_.val_batch)) r.reset();
  }
  if (monitor_) monitor_->phase_ended();
  if (!exchange_) eval::check_some_decoded(*r, *split);
  if (exchange_) r->stats = exchange_->gather_validation(*r, *val_split_);
  last_metrics_ = r->stats;
  state_.last_eval_step = state_.step;
  return r->stats;
}

std::optional<eval::ValidationResult> Trainer::validation_pass(const std::shared_ptr<const data::Split>& split) {
  eval::ValidateOptions o = validation_;
  o.cache = val_cache_;
  if (state_.val_batch > 0) o.loader.batch(int(std::min<int64_t>(state_.val_batch, o.loader.batch())));
  try {
    if (split->samples.empty()) return eval::ValidationResult();  // more ranks than val images
    return eval::validate(eval_model(), split, o);
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) throw;
    if (state_.val_batch == 0) state_.val_batch = o.loader.batch();
    bool handled = false;
    each_hook([&](Hook& h) { handled = handled || h.on_oom(*this, e, OomSite::validation); });
    if (!handled)
      throw Error((memory_failure(e) == MemoryFailure::library ? "a cuDNN error persists in validation (batch "
                                                                : "out of memory in validation (batch ") +
                  std::to_string(o.loader.batch()) + "); the last checkpoint is intact. " + e.what_without_backtrace());
    return std::nullopt;
  }
}

void Trainer::register_state() {
  registry_.add(
      "progress", [this](torch::serialize::OutputArchive& a) { write_json(a, save_progress()); },
      [this](torch::serialize::InputArchive& a) { load_progress(read_json(a, "checkpoint entry progress")); });
  registry_.add(
      "model", [this](torch::serialize::OutputArchive& a) { model_->save(a); },
      [this](torch::serialize::InputArchive& a) {
        at::NoGradGuard no_grad;
        model_->load(a);
        model_->train();
      });
  registry_.add("optimizer", *optimizer_);
  if (ema_) registry_.add("ema", *ema_);
  registry_.add(
      "scaler",  // the entry is there in every run: the precision may change (enable_amp)
      [this](torch::serialize::OutputArchive& a) {
        if (scaler_) scaler_->save(a);
      },
      [this](torch::serialize::InputArchive& a) {
        at::Tensor probe;
        if (scaler_ && a.try_read("scale", probe, /*is_buffer=*/true)) scaler_->load(a);
      });
  add_generator_state(registry_, device_);
  registry_.add("counters", *counters_);
}

Json Trainer::save_progress() const {
  Json metrics = Json::array();  // the latest validation: an epoch end still to do reports it
  if (last_metrics_)
    for (double v : last_metrics_->stats) metrics.push_back(v);
  return Json::object({{"epoch", state_.epoch}, {"batch", state_.batch}, {"step", state_.step}, {"images", state_.images},
                       {"best_fitness", state_.best_fitness}, {"best_step", state_.best_step},
                       {"last_eval_step", state_.last_eval_step}, {"val_batch", state_.val_batch}, {"world", options_.world()},
                       {"steps_per_epoch", length_.steps_per_epoch}, {"best_is_ap", state_.best_is_ap},
                       {"amp", to_string(amp_)}, {"last_metrics", std::move(metrics)}});
}

void Trainer::load_progress(const Json& j) {
  const auto num = [&](const char* k) { return int64_t(j.find(k)->as_number()); };
  state_.epoch = num("epoch");
  state_.batch = num("batch");
  // Another world size: the position moves by images (loader batches are batch x world).
  const int64_t saved_world = j.find("world") ? num("world") : 1;
  if (saved_world != options_.world()) {
    const int64_t nb_saved = data::Loader::batches_in(int64_t(train_split_->samples.size()), batch() * saved_world,
                                                      loader_->options().drop_last(), loader_->options().min_batch() * saved_world);
    const int64_t done = state_.batch * batch() * saved_world, per = batch() * options_.world();
    // A step starts at a multiple of accumulate loader batches: so the epoch keeps its steps.
    const int64_t whole = done / per, moved = state_.batch >= nb_saved ? loader_->batches_per_epoch() : whole - whole % accumulate();
    if (state_.batch < nb_saved && done != moved * per)
      spdlog::warn("resume on {} processes (the checkpoint ran on {}): epoch {} continues at image {}, not {} ({} images of it "
                   "train again)", options_.world(), saved_world, state_.epoch + 1, moved * per, done, done - moved * per);
    spdlog::info("resume on {} processes (the checkpoint ran on {}): loader batch {} of {} images is batch {} of {}", options_.world(),
                 saved_world, state_.batch, batch() * saved_world, moved, per);
    state_.batch = moved;
  }
  state_.step = num("step");
  state_.images = num("images");
  state_.best_fitness = j.find("best_fitness")->as_number();
  // Before Ultralytics' fitness (no best_is_ap key) the best was AP50-95 alone: the fitness of a
  // later validation is at least its AP50-95, so it would replace best.pt however it scored.
  state_.best_is_ap = j.find("best_is_ap") ? j.find("best_is_ap")->as_bool() : true;
  state_.best_step = num("best_step");
  state_.last_eval_step = num("last_eval_step");
  // Another world size can change the steps per epoch (a step of train.batch x world images
  // beyond nominal_batch): the run's steps are renumbered by epoch, or the schedule, the warmup
  // and the run's length would count the old steps against the new total.
  // Checkpoints before the key: the saved world's steps per epoch, as run_length counts them.
  int64_t saved_spe = length_.steps_per_epoch;
  if (j.find("steps_per_epoch")) {
    saved_spe = num("steps_per_epoch");
  } else if (saved_world != options_.world()) {
    const int64_t nb = data::Loader::batches_in(int64_t(train_split_->samples.size()), batch() * saved_world,
                                                loader_->options().drop_last(), loader_->options().min_batch() * saved_world);
    const int64_t acc = accumulation_steps(options_.nominal_batch(), batch() * saved_world);
    saved_spe = (nb + acc - 1) / acc;
  }
  if (saved_spe != length_.steps_per_epoch) {
    const int64_t spe = length_.steps_per_epoch, saved_step = state_.step;
    const int64_t now = state_.epoch * spe + (state_.batch + accumulate() - 1) / accumulate();
    const auto renumber = [&](int64_t s) {  // -1: never (no validation yet)
      return s < 0 ? s : s == saved_step ? now : (s / saved_spe) * spe + (s % saved_spe) * spe / saved_spe;
    };
    state_.best_step = renumber(state_.best_step);
    state_.last_eval_step = renumber(state_.last_eval_step);
    state_.step = now;
    spdlog::info("resume: an epoch is {} steps here, {} in the checkpoint's run: its step {} is step {} of {}", spe, saved_spe,
                 saved_step, now, total_steps());
  }
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
}

void Trainer::save_checkpoint(const std::string& path, std::function<void()> then) {
  at::NoGradGuard no_grad;
  fs::create_directories(fs::path(path).parent_path());
  torch::serialize::OutputArchive root, state;
  models::write_weights(eval_model(), models::WeightsInfo{train_split_->names, train_split_->category_ids, /*framework=*/""}, root);
  registry_.save(state);
  root.write("checkpoint", state);
  Json meta = Json::object();
  meta["format"] = kCheckpointFormat;
  meta["epoch"] = state_.epoch;
  meta["batch"] = state_.batch;
  meta["step"] = state_.step;
  meta["total_steps"] = total_steps();
  meta["config"] = options_.config_yaml();
  // A CPU snapshot, and a CUDA one staged on the device, is memory beside the next steps: it must
  // fit under the budget with the largest step seen, or the governor would take it for the step's
  // own and shrink the batch. Where it does not fit or nothing says it would (no step seen: a
  // resume's first write; on CUDA also no budget), a CUDA snapshot goes to the host unstaged and
  // a CPU one is written while the training waits.
  // The usable share of the limit now: on the CPU the governor lowers it as the process's other
  // memory grows, and a clone past it would fail outside any step, where nothing recovers.
  const int64_t limit = monitor_ ? monitor_->sample().limit : 0;
  const int64_t usable = limit > 0 && options_.memory_usable() > 0
                             ? std::min(options_.memory_usable(), int64_t(double(limit) * (1.0 - options_.memory_headroom())))
                             : options_.memory_usable();
  const int64_t bytes = archive_tensor_bytes(root);
  const bool fits = device_.is_cuda() ? usable > 0 && step_peak_ > 0 && step_peak_ + bytes <= usable
                                      : usable == 0 || (step_peak_ > 0 && step_peak_ + bytes <= usable);
  if (options_.async_checkpoints() && !fits && step_peak_ > 0 && !said_sync_) {
    said_sync_ = true;
    spdlog::info("{}: a snapshot of {} does not fit beside the step's peak of {} in the {} the budget leaves",
                 device_.is_cuda() ? "checkpoints go to the host on the step's stream, which waits for the copy"
                                   : "checkpoints are written while the training waits",
                 format_bytes(double(bytes)), format_bytes(double(step_peak_)), format_bytes(double(usable)));
  }
  if (options_.async_checkpoints() && (fits || device_.is_cuda())) {
    checkpoint_writer_.write(std::move(root), path, meta.dump(), std::move(then), /*stage=*/fits);
    return;
  }
  checkpoint_writer_.wait();  // in order, after the write in flight
  models::save_archive_atomic(root, path, meta.dump());  // streamed: no copy of the archive in memory
  if (then) then();
}

void Trainer::load_checkpoint(const std::string& path) {
  at::NoGradGuard no_grad;
  torch::serialize::InputArchive root, state;
  load_checkpoint_archive(path, device_, root);
  if (!root.try_read("checkpoint", state))
    throw InputError(path + ": a weights file without training state; start a new run from it with model.init_from=" + path);
  // The model is rebuilt from the config's model file: one edited since would take the saved
  // tensors where their shapes allow (a pooling size, an activation), and train another network.
  const models::ModelSpec stored = models::stored_model(root, path);
  if (!models::same_model(stored, *model_))
    throw InputError(path + ": the run trained the model " + stored.file + (stored.scale.empty() ? "" : " scale " + stored.scale) +
                     ", and " + model_->yaml_file() + (model_->scale().empty() ? "" : " scale " + model_->scale()) +
                     " now describes another (edited since?): a resumed run continues the model it trained. Restore that "
                     "file, or start a new run from these weights with model.init_from=" + path);
  registry_.load(state, path);
  spdlog::info("resumed from {}: epoch {}, step {} of {}", path, state_.epoch + 1, state_.step, total_steps());
}

}  // namespace headroom::train
