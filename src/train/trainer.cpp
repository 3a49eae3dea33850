#include "headroom/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <functional>
#include <regex>

#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/eval/validate.h"
#include "headroom/memory/monitor.h"
#include "headroom/models/weights.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {
constexpr int kCheckpointFormat = 1;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

at::Tensor scalar_on(c10::Device device) { return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device)); }
}  // namespace

TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir) {
  return make_trainer_parts(c, device, run_dir, std::make_shared<const data::Split>(data::load_split(c, "train")), load_val_split(c));
}

int64_t accumulation_steps(int64_t nominal_batch, int64_t batch) {
  return std::max<int64_t>(std::llround(double(nominal_batch) / double(batch)), 1);
}

std::shared_ptr<const data::Split> load_val_split(const Config& c) {
  if (data::read_data_yaml(c.data.dataset).split("val")) return std::make_shared<const data::Split>(data::load_split(c, "val"));
  spdlog::warn("{}: no val split; the run trains without validation and best.pt", c.data.dataset);
  return nullptr;
}

TrainerParts make_trainer_parts(const Config& c, c10::Device device, const std::string& run_dir,
                                std::shared_ptr<const data::Split> train, std::shared_ptr<const data::Split> val) {
  TrainerParts p;
  p.config = c;
  p.device = device;
  p.run_dir = run_dir;
  p.train_split = std::move(train);
  p.val_split = std::move(val);
  const int64_t nc = int64_t(p.train_split->names.size());
  at::manual_seed(uint64_t(c.seed));  // LibTorch seeds its generators at random per process: initialisation follows `seed`
  p.model = models::build_detector(c, nc);
  if (!c.model.init_from.empty()) {
    const std::vector<std::string> skipped = init_from_weights(*p.model, c.model.init_from);
    spdlog::info("model.init_from {}: {} tensors skipped{}", c.model.init_from, skipped.size(), skipped.empty() ? "" : ":");
    for (const auto& s : skipped) spdlog::info("  {}", s);
  }
  p.model->to(device);
  if (c.train.ema) {
    p.ema_copy = models::build_detector(c, nc);
    p.ema_copy->to(device);
  }
  return p;
}

Trainer::Trainer(TrainerParts parts)
    : config_(std::move(parts.config)),
      device_(parts.device),
      run_dir_(std::move(parts.run_dir)),
      train_split_(std::move(parts.train_split)),
      val_split_(std::move(parts.val_split)),
      model_(std::move(parts.model)) {
  amp_ = resolve_amp(config_, device_);
  loader_ = std::make_unique<data::Loader>(train_split_, data::loader_options(config_, *train_split_, /*training=*/true, device_.is_cuda()));
  const TrainConfig& t = config_.train;
  const int64_t nb = loader_->batches_per_epoch();
  accumulate_ = accumulation_steps(t.nominal_batch, t.batch);
  steps_per_epoch_ = (nb + accumulate_ - 1) / accumulate_;
  total_steps_ = t.steps > 0 ? t.steps : int64_t(t.epochs) * steps_per_epoch_;
  epochs_ = (total_steps_ + steps_per_epoch_ - 1) / steps_per_epoch_;
  // Ultralytics scales the decay with the images per step relative to the nominal batch.
  const double decay = t.weight_decay * double(t.batch * accumulate_) / double(t.nominal_batch);
  optimizer_ = std::make_unique<Optimizer>(parameter_groups(*model_, decay),
                                           OptimizerOptions().kind(t.optimizer).momentum(t.momentum).nesterov(t.nesterov));
  schedule_ = std::make_unique<Schedule>(schedule_options(config_, total_steps_, warmup_steps(t.warmup_epochs, nb, accumulate_)));
  schedule_->apply(*optimizer_, 0);  // valid rates even without the schedule hook
  if (amp_ == AmpMode::fp16) scaler_ = std::make_unique<LossScaler>(device_);
  loss_ = parts.loss ? std::move(parts.loss) : losses::make_loss(model_->info(), losses::loss_options(config_));
  if (parts.ema_copy) ema_ = std::make_unique<ModelEma>(*model_, std::move(parts.ema_copy), t.ema_decay, t.ema_tau);
  skipped_ = scalar_on(device_);
  bad_run_ = scalar_on(device_);
  if (augment::enabled(config_.augment))
    augmenter_ = std::make_unique<augment::Augmenter>(config_.augment, config_.seed, model_->info().input_multiple, epochs_);
  model_->train();
}

Trainer::~Trainer() = default;

void Trainer::train() {
  start_ = std::chrono::steady_clock::now();
  const int64_t nb = loader_->batches_per_epoch();
  if (state_.batch >= nb) {  // saved after the epoch's last step: its epoch-end hooks already ran
    ++state_.epoch;
    state_.batch = 0;
  }
  each_hook([&](Hook& h) { h.before_train(*this); });
  const int64_t first_step = state_.step;
  if (state_.step < total_steps_ && !state_.stop) loader_->start(state_.epoch, state_.batch);
  while (!state_.stop && state_.step < total_steps_) {
    run_step();
    each_hook([&](Hook& h) { h.after_step(*this); });
    if (state_.batch >= nb) end_epoch();
  }
  if (!state_.stop && state_.batch > 0 && state_.step > first_step) end_epoch();  // train.steps ended inside an epoch
  each_hook([&](Hook& h) { h.after_train(*this); });
}

void Trainer::end_epoch() {
  each_hook([&](Hook& h) { h.after_epoch(*this); });
  ++state_.epoch;
  state_.batch = 0;
  data_wait_ = 0;
  if (state_.step < total_steps_ && !state_.stop) loader_->start(state_.epoch, 0);
}

void Trainer::run_step() {
  const auto t0 = std::chrono::steady_clock::now();
  each_hook([&](Hook& h) { h.before_step(*this); });
  const int64_t nb = loader_->batches_per_epoch();
  std::vector<data::HostBatch> batches;  // kept until the step succeeds: an OOM re-runs the same images
  for (int64_t k = 0; k < accumulate_ && state_.batch + k < nb; ++k) {
    std::optional<data::HostBatch> batch = loader_->next();
    if (!batch)
      throw Error("the loader ended epoch " + std::to_string(state_.epoch) + " early at batch " + std::to_string(state_.batch + k));
    data_wait_ += batch->wait_seconds;
    batches.push_back(std::move(*batch));
  }
  // What an attempt changes besides the gradients: BatchNorm statistics and the loss sums.
  std::vector<at::Tensor> buffers;
  const at::Tensor loss_sum = loss_sum_;
  const int64_t micro_since_read = micro_since_read_;
  for (;;) {
    try {
      if (buffers.empty()) {  // inside the try: the snapshot itself may hit the budget
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> snapshot;
        for (const auto& b : model_->buffers()) snapshot.push_back(b.clone());
        buffers = std::move(snapshot);
      }
      step_on(batches);
      break;
    } catch (const c10::Error& e) {
      if (!memory::is_out_of_memory(e)) throw;
      undo_attempt(buffers, loss_sum, micro_since_read);
      bool handled = false;
      each_hook([&](Hook& h) { handled = handled || h.on_oom(*this, e, OomSite::train_step); });
      if (!handled)
        throw Error("out of memory in optimizer step " + std::to_string(state_.step + 1) + " (micro-batch " +
                    std::to_string(micro_batch()) + " at " + std::to_string(config_.data.imgsz) +
                    " px); the last checkpoint is intact. Lower train.batch (accumulation keeps train.nominal_batch), "
                    "use train.amp, memory.activation_checkpointing=stages, or leave memory.governor on. " +
                    e.what_without_backtrace());
    }
  }
  for (const auto& b : batches) state_.images += b.size();
  state_.batch += int64_t(batches.size());
  ++state_.step;
  step_seconds_ = seconds_since(t0);
}

void Trainer::undo_attempt(const std::vector<at::Tensor>& buffers, const at::Tensor& loss_sum, int64_t micro_since_read) {
  at::NoGradGuard no_grad;
  optimizer_->zero_grad();
  const std::vector<at::Tensor> live = model_->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) live[i].copy_(buffers[i]);  // empty: the attempt failed before it changed any
  loss_sum_ = loss_sum;
  micro_since_read_ = micro_since_read;
}

int64_t Trainer::micro_batch() const {
  const int64_t b = config_.train.batch;
  return state_.micro_batch > 0 ? std::min(state_.micro_batch, b) : b;
}

void Trainer::set_activation_checkpointing(CheckpointMode mode) { model_->set_activation_checkpointing(mode); }

bool Trainer::enable_amp() {
  if (amp_ != AmpMode::off) return false;
  Config c = config_;
  c.train.amp = AmpMode::auto_;
  const AmpMode m = device_.is_cuda() ? resolve_amp(c, device_) : AmpMode::bf16;
  amp_ = m == AmpMode::off ? AmpMode::bf16 : m;
  if (amp_ == AmpMode::fp16 && !scaler_) scaler_ = std::make_unique<LossScaler>(device_);
  return true;
}

void Trainer::record_memory_decision(std::string action, std::string reason) {
  spdlog::warn("memory governor, step {}: {} ({})", state_.step + 1, action, reason);
  state_.memory_decisions.push_back(MemoryDecision{state_.step + 1, std::move(action), std::move(reason)});
}

void Trainer::step_on(const std::vector<data::HostBatch>& batches) {
  for (const data::HostBatch& batch : batches) {
    // Host -> device without blocking (the loader pins batches for CUDA runs), then on-device
    // augmentation with per-image parameters drawn there (the same draws on a re-run).
    at::Tensor x;  // [B, 3, S, S] float in [0, 1]
    losses::Targets targets;
    if (augmenter_) {
      const augment::Batch a = (*augmenter_)(batch, device_);
      x = a.images;
      targets = losses::make_targets(a.boxes, a.classes, a.crowd);
      if (!first_batch_) first_batch_ = augment::to_host_batch(a, batch);  // one host copy per process
    } else {
      x = eval::model_input(batch.images, device_);
      targets = losses::make_targets(batch.boxes.to(device_, true), batch.classes.to(device_, true), batch.crowd.to(device_, true));
      if (!first_batch_) first_batch_ = batch;
    }
    phase("input");
    if (x.device() != device_ || targets.boxes.device() != device_)  // metadata only: no sync
      throw DeviceError("the batch is on " + x.device().str() + ", the run trains on " + device_.str());
    const int64_t n = x.size(0), m = micro_batch();
    if (planner_ && model_->activation_checkpointing() != CheckpointMode::all) {
      std::vector<bool> plan = planner_(x.size(2), std::min(m, n));
      if (plan != plan_) {
        model_->set_checkpointed_stages(plan);
        plan_ = std::move(plan);
      }
    }
    for (int64_t start = 0; start < n; start += m) {
      const int64_t len = std::min(m, n - start);
      const double weight = loss_->sums_over_images() ? 1.0 : double(len) / double(n);
      if (len == n) {
        forward_backward(x, targets, weight);
      } else {
        const losses::Targets part{targets.boxes.narrow(0, start, len), targets.classes.narrow(0, start, len),
                                   targets.mask.narrow(0, start, len)};
        forward_backward(x.narrow(0, start, len), part, weight);
      }
    }
  }
  optimizer_step();
  phase("optimizer");
}

void Trainer::forward_backward(const at::Tensor& x, const losses::Targets& targets, double weight) {
  losses::LossTerms terms;
  {
    AutocastGuard autocast(device_.type(), amp_dtype(amp_));
    models::HeadOutputs out = model_->forward(x);
    phase("forward");
    for (auto& [name, levels] : out)  // the loss works in fp32 on the (autocast) head outputs
      for (auto& level : levels) level = level.to(at::kFloat);
    terms = (*loss_)(out, targets);
  }
  phase("loss");
  at::Tensor total = terms.total.to(at::kFloat);
  if (weight != 1.0) total = total * weight;
  (scaler_ ? scaler_->scale(total) : total).backward();
  phase("backward");

  at::NoGradGuard no_grad;
  std::vector<at::Tensor> items;
  if (loss_names_.empty())
    for (const auto& [name, v] : terms.items) loss_names_.push_back(name);
  for (const auto& [name, v] : terms.items) items.push_back(v.detach().to(at::kFloat).reshape({}));
  const at::Tensor stacked = at::stack(items);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + stacked : stacked;
  ++micro_since_read_;
}

void Trainer::optimizer_step() {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = optimizer_->grads();
  at::Tensor found = scaler_ ? scaler_->unscale_(grads) : scalar_on(device_);
  const at::Tensor norm = grad_norm(grads);
  found = at::maximum(found, at::logical_not(at::isfinite(norm)).to(at::kFloat).to(device_));
  if (config_.train.clip_grad > 0) clip_grads_(grads, norm, config_.train.clip_grad);
  optimizer_->step(found);
  if (scaler_) scaler_->update(found);
  optimizer_->zero_grad();
  skipped_.add_(found);
  bad_run_.add_(found).mul_(found);
}

StepCounters& Trainer::read_counters() {
  if (counters_step_ == state_.step) return counters_;
  counters_step_ = state_.step;
  std::vector<at::Tensor> parts = {skipped_.reshape({1}), bad_run_.reshape({1}),
                                   scaler_ ? scaler_->scale_tensor().reshape({1}) : scalar_on(device_).reshape({1})};
  if (loss_sum_.defined()) parts.push_back(loss_sum_ / double(std::max<int64_t>(micro_since_read_, 1)));
  const at::Tensor host = at::cat(parts).cpu();  // the one host sync
  const float* v = host.data_ptr<float>();
  counters_.skipped_steps = v[0];
  counters_.bad_run = v[1];
  counters_.loss_scale = v[2];
  counters_.micro_batches = micro_since_read_;
  counters_.losses.clear();
  if (loss_sum_.defined())
    for (size_t i = 0; i < loss_names_.size(); ++i) counters_.losses.emplace_back(loss_names_[i], v[3 + i]);
  loss_sum_ = at::Tensor();
  micro_since_read_ = 0;
  return counters_;
}

std::optional<eval::CocoStats> Trainer::validate() {
  if (!val_split_) return std::nullopt;
  models::DetectorImpl& m = eval_model();
  std::optional<eval::ValidationResult> r;
  while (!r) {
    eval::ValidateOptions o = eval::validate_options(config_, *val_split_, m.info(), device_);
    if (state_.val_batch > 0) o.loader.batch(int(std::min<int64_t>(state_.val_batch, o.loader.batch())));
    try {
      r = eval::validate(m, val_split_, o);
    } catch (const c10::Error& e) {
      if (!memory::is_out_of_memory(e)) throw;
      if (state_.val_batch == 0) state_.val_batch = o.loader.batch();
      bool handled = false;
      each_hook([&](Hook& h) { handled = handled || h.on_oom(*this, e, OomSite::validation); });
      if (!handled)
        throw Error("out of memory in validation (batch " + std::to_string(o.loader.batch()) + "); the last checkpoint is intact. " +
                    e.what_without_backtrace());
    }
  }
  last_metrics_ = r->stats;
  state_.last_eval_step = state_.step;
  return r->stats;
}

void Trainer::save_checkpoint(const std::string& path) {
  at::NoGradGuard no_grad;
  fs::create_directories(fs::path(path).parent_path());
  torch::serialize::OutputArchive root;
  models::write_weights(eval_model(), models::WeightsInfo{train_split_->names, train_split_->category_ids}, root);
  torch::serialize::OutputArchive ck, model, optim;
  model_->save(model);
  ck.write("model", model);
  optimizer_->save(optim);
  ck.write("optimizer", optim);
  if (ema_) {
    torch::serialize::OutputArchive e;
    ema_->save(e);
    ck.write("ema", e);
  }
  if (scaler_) {
    torch::serialize::OutputArchive s;
    scaler_->save(s);
    ck.write("scaler", s);
  }
  ck.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  if (device_.is_cuda()) ck.write("rng_cuda", at::globalContext().defaultGenerator(device_).get_state(), true);
  ck.write("counters", at::stack({skipped_, bad_run_}), true);
  Json meta = Json::object();
  meta["format"] = kCheckpointFormat;
  meta["epoch"] = state_.epoch;
  meta["batch"] = state_.batch;
  meta["step"] = state_.step;
  meta["images"] = state_.images;
  meta["best_fitness"] = state_.best_fitness;
  meta["best_step"] = state_.best_step;
  meta["last_eval_step"] = state_.last_eval_step;
  meta["total_steps"] = total_steps_;
  meta["shuffle_seed"] = config_.seed;
  meta["config"] = config_to_yaml(config_);
  Json mem = Json::object();
  mem["micro_batch"] = state_.micro_batch;
  mem["val_batch"] = state_.val_batch;
  mem["activation_checkpointing"] = to_string(model_->activation_checkpointing());
  mem["amp"] = to_string(amp_);
  Json decisions = Json::array();
  for (const auto& d : state_.memory_decisions) {
    Json j = Json::object();
    j["step"] = d.step;
    j["action"] = d.action;
    j["reason"] = d.reason;
    decisions.push_back(std::move(j));
  }
  mem["decisions"] = std::move(decisions);
  meta["memory"] = std::move(mem);
  ck.write("meta", c10::IValue(meta.dump()));
  root.write("checkpoint", ck);
  models::save_archive_atomic(root, path);
}

namespace {

// Opens a checkpoint and returns its training part; InputError naming the file otherwise.
torch::serialize::InputArchive open_checkpoint(const std::string& path, c10::Device device, torch::serialize::InputArchive& root,
                                               Json& meta) {
  models::load_archive_verified(root, path, device, "checkpoint");
  torch::serialize::InputArchive ck;
  try {
    if (!root.try_read("checkpoint", ck))
      throw InputError(path + ": a weights file without training state; start a new run from it with model.init_from=" + path);
    c10::IValue m;
    ck.read("meta", m);
    meta = Json::parse(m.toStringRef(), path);
  } catch (const c10::Error& e) {
    throw InputError(path + ": cannot read the checkpoint: " + e.what_without_backtrace());
  }
  const Json* format = meta.find("format");
  if (!format || format->as_number() != kCheckpointFormat)
    throw InputError(path + ": checkpoint format not supported by this Headroom");
  return ck;
}

int64_t meta_int(const Json& meta, const char* key) { return static_cast<int64_t>(meta.find(key)->as_number()); }

}  // namespace

void Trainer::load_checkpoint(const std::string& path) {
  at::NoGradGuard no_grad;
  torch::serialize::InputArchive root;
  Json meta;
  torch::serialize::InputArchive ck = open_checkpoint(path, device_, root, meta);
  if (const Json* mem = meta.find("memory")) restore_memory_state(*mem);
  try {
    torch::serialize::InputArchive model, optim;
    ck.read("model", model);
    model_->load(model);
    ck.read("optimizer", optim);
    optimizer_->load(optim);
    torch::serialize::InputArchive e, s;
    if (ema_ && ck.try_read("ema", e)) ema_->load(e);
    if (scaler_ && ck.try_read("scaler", s)) scaler_->load(s);
    at::Tensor rng, counters;
    ck.read("rng_cpu", rng, true);
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();  // a handle on the global generator
    cpu_gen.set_state(rng.cpu());
    if (device_.is_cuda() && ck.try_read("rng_cuda", rng, true)) {
      at::Generator cuda_gen = at::globalContext().defaultGenerator(device_);
      cuda_gen.set_state(rng.cpu());
    }
    ck.read("counters", counters, true);
    skipped_.copy_(counters[0]);
    bad_run_.copy_(counters[1]);
  } catch (const c10::Error& e) {
    throw InputError(path + ": the checkpoint does not fit this model and optimizer (another architecture, class count or "
                     "optimizer?): " + e.what_without_backtrace());
  }
  state_.epoch = meta_int(meta, "epoch");
  state_.batch = meta_int(meta, "batch");
  state_.step = meta_int(meta, "step");
  state_.images = meta_int(meta, "images");
  state_.best_fitness = meta.find("best_fitness")->as_number();
  state_.best_step = meta_int(meta, "best_step");
  state_.last_eval_step = meta_int(meta, "last_eval_step");
  model_->train();
  spdlog::info("resumed from {}: epoch {}, step {} of {}", path, state_.epoch + 1, state_.step, total_steps_);
}

void Trainer::restore_memory_state(const Json& mem) {
  state_.micro_batch = int64_t(mem.find("micro_batch")->as_number());
  state_.val_batch = int64_t(mem.find("val_batch")->as_number());
  const std::string ckpt = mem.find("activation_checkpointing")->as_string(), amp = mem.find("amp")->as_string();
  for (CheckpointMode m : {CheckpointMode::off, CheckpointMode::stages, CheckpointMode::all})
    if (ckpt == to_string(m) && m != model_->activation_checkpointing()) model_->set_activation_checkpointing(m);
  if (amp != to_string(amp_)) enable_amp();
  state_.memory_decisions.clear();
  for (const Json& d : mem.find("decisions")->items())
    state_.memory_decisions.push_back(
        MemoryDecision{int64_t(d.find("step")->as_number()), d.find("action")->as_string(), d.find("reason")->as_string()});
  if (!state_.memory_decisions.empty())
    spdlog::info("resume keeps the memory governor's {} decisions: micro-batch {}, activation checkpointing {}, amp {}",
                 state_.memory_decisions.size(), micro_batch(), ckpt, to_string(amp_));
}

std::string checkpoint_config_yaml(const std::string& path) {
  torch::serialize::InputArchive root;
  Json meta;
  open_checkpoint(path, c10::Device(c10::kCPU), root, meta);
  return meta.find("config")->as_string();
}

std::string find_resume_checkpoint(const std::string& project, const std::string& name) {
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec;
  const std::regex run_name(std::regex_replace(name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") + "[0-9]*");
  for (const auto& dir : fs::directory_iterator(project, ec)) {
    if (!dir.is_directory() || !std::regex_match(dir.path().filename().string(), run_name)) continue;
    for (const auto& f : fs::directory_iterator(dir.path() / "weights", ec)) {
      const std::string file = f.path().filename().string();
      if (file == "last.pt" || (file.rfind("step_", 0) == 0 && f.path().extension() == ".pt"))
        found.emplace_back(fs::last_write_time(f.path()), f.path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [time, path] : found) {
    try {
      torch::serialize::InputArchive root;
      Json meta;
      open_checkpoint(path, c10::Device(c10::kCPU), root, meta);
      return path;
    } catch (const InputError& e) {
      spdlog::warn("resume: refusing {}", e.what());
    }
  }
  return "";
}

std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path) {
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
          if (a.try_read(c.key(), sub))
            walk(*c.value(), sub, prefix + c.key() + ".");
          else if (!c.value()->parameters().empty())
            skipped.push_back(prefix + c.key() + ": not in the file");
        }
      };
  walk(model, archive, "");
  if (loaded == 0) throw InputError(path + ": model.init_from: no tensor of this model is in the file (another architecture?)");
  return skipped;
}

namespace {
std::atomic<bool> g_interrupt{false};
extern "C" void on_sigint(int) {
  g_interrupt.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}
}  // namespace

void install_interrupt_handler() { std::signal(SIGINT, on_sigint); }
bool interrupt_requested() { return g_interrupt.load(); }
void request_interrupt() { g_interrupt.store(true); }

}  // namespace headroom::train
