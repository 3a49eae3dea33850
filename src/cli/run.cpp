#include "headroom/cli/run.h"

#include "headroom/core/logging.h"
#include "headroom/core/run_dir.h"
#include "headroom/core/text.h"
#include "headroom/data/letterbox.h"
#include "headroom/memory/estimate.h"
#include "headroom/memory/monitor.h"
#include "headroom/memory/starvation.h"
#include "headroom/train/hooks.h"

namespace headroom::cli {

namespace {

// train.batch auto: the micro-batch and the loader batch (a whole step), the smallest any rank
// chose; logs the choice and what was weighed.
memory::AutoBatch automatic_batch(const Config& c, const std::shared_ptr<const data::Split>& train_split, MemoryMonitor& monitor,
                                  int64_t budget, dist::Group* group) {
  memory::AutoBatch a = memory::choose_batch(c, train_split, monitor, budget, group ? group->world() : 1);
  if (group) {
    // The smallest choice of any rank; each loads its share of the step's images.
    for (const auto& v : group->all_gather({double(a.batch)}, "the ranks' train.batch auto choice"))
      a.batch = std::min<int64_t>(a.batch, int64_t(v[0]));
    a.batch = std::min(a.batch, a.step_batch);  // step_batch: each rank's share, sized as such
  }
  std::string tried;
  for (const memory::BatchProbe& t : a.tried)
    tried += fmt::format("{}{}{}: {} (predicted {}{})", tried.empty() ? "" : ", ", t.batch, t.every_stage ? " every stage" : "",
                         t.peak < 0 ? std::string("out of memory") : format_bytes(double(t.peak)), format_bytes(double(t.predicted)),
                         t.images_per_second > 0 ? fmt::format("; timed {:.2f} img/s", t.images_per_second) : std::string());
  // The step is every rank's loader batch: the nominal batch, rounded up to a whole share per
  // rank, or the training images where they are fewer.
  const int64_t W = group ? group->world() : 1, step = a.step_batch * W, nominal = c.train.nominal_batch;
  spdlog::info("train.batch auto: micro-batch {} under {} of the {} budget ({}; steps tried: {}); loader batches of {} images{}, "
               "each one optimizer step{}. The choices weighed:{}",
               a.batch, format_bytes(double(a.estimate.usable)), format_bytes(double(budget)),
               a.planner ? "memory.prefer " + c.memory.prefer : std::string("the largest that fits"), tried, a.step_batch,
               W > 1 ? fmt::format(" on each of {} ranks", W) : std::string(),
               nominal > int64_t(train_split->samples.size())
                   ? fmt::format(" (train.nominal_batch {} is more than the {} training images)", nominal, train_split->samples.size())
               : step == nominal ? fmt::format(" of exactly train.nominal_batch {}", nominal)
                                 : fmt::format(" of {} images (train.nominal_batch {} rounded up to a whole share per rank)", step, nominal),
               memory::format_batch_options(a));
  return a;
}

}  // namespace

// On the CPU memory.budget bounds the process, and data.cache=ram's decoded images live in it:
// the training images' bytes come off the tensors' share before the automatic batch and the
// governor see it (the validation images' cache, made at the first validation, is the process's
// growth, which the governor takes off the limit then). A cache over half the budget is not made
// (the loader reads the images from disk instead) so that the model keeps room to train. On CUDA
// the cache is host memory, checked against the available memory when it is made.
int64_t budget_beside_ram_cache(Config& c, int64_t budget, const data::Split& train, const data::Split* val, c10::Device device) {
  if (c.data.cache != "ram" || !device.is_cpu() || budget <= 0) return budget;
  const int64_t image = data::canvas_bytes(c.data.imgsz);
  const int64_t bytes = int64_t(train.samples.size()) * image;
  const int64_t all = bytes + (val ? int64_t(val->samples.size()) * image : 0);
  if (2 * all > budget) {
    spdlog::warn("data.cache=ram: not caching: the decoded images need {}, more than half of memory.budget {} (on the CPU the "
                 "cache shares the budget with the tensors); reading images from disk instead (data.cache=disk keeps a "
                 "memory-mapped shard outside the budget, or raise memory.budget)",
                 format_bytes(double(all)), format_bytes(double(budget)));
    c.data.cache = "none";
    return budget;
  }
  spdlog::info("data.cache=ram: the decoded training images take {} of memory.budget {}; the tensors get the other {}{}",
               format_bytes(double(bytes)), format_bytes(double(budget)), format_bytes(double(budget - bytes)),
               all > bytes ? fmt::format(" (the validation images' {}, cached at the first validation, then come off it too)",
                                         format_bytes(double(all - bytes)))
                           : std::string());
  return budget - bytes;
}

Run build_run(Config c, c10::Device device, RunOptions o) {
  Run run;
  run.device = device;
  run.monitor = memory::make_memory_monitor(device);  // before the model: counts it
  run.budget = memory::resolve_budget(c.memory.budget, *run.monitor);
  std::shared_ptr<const data::Split> train_split = o.train, val_split = o.val;
  if (!train_split) {
    train_split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    val_split = train::load_val_split(c);
  }
  run.budget = budget_beside_ram_cache(c, run.budget, *train_split, val_split.get(), device);
  // Before the prober builds the run's optimizer and the run folder records the config.
  c = train::with_chosen_optimizer(c, int64_t(train_split->samples.size()), int64_t(train_split->names.size()),
                                   o.group ? o.group->world() : 1);
  // A recomputed stage runs SyncBatchNorm's exchanges again in its backward, so every rank must
  // recompute the same stages; auto plans them from each rank's own probes (bytes and timings),
  // which differ between ranks.
  if (o.group && o.group->world() > 1 && c.distributed.sync_bn && c.memory.activation_checkpointing == "auto")
    throw InputError(c.where("memory.activation_checkpointing") + ": memory.activation_checkpointing auto plans the recomputed stages "
                     "on each rank from its own probes, and with distributed.sync_bn (" + c.where("distributed.sync_bn") +
                     ") every rank must recompute the same ones: set activation_checkpointing to stages or all, or "
                     "distributed.sync_bn to false");
  std::shared_ptr<memory::RecomputePlanner> planner;
  int64_t micro = 0;  // train.batch auto: the micro-batch the governor starts at
  if (c.train.batch_auto) {
    const memory::AutoBatch a = automatic_batch(c, train_split, *run.monitor, run.budget, o.group.get());
    c.train.batch = int(a.step_batch);
    c.train.batch_auto = false;  // the run's config and checkpoints record the size chosen, so resume keeps it
    micro = a.batch;
    planner = a.planner;
  }
  if (c.memory.activation_checkpointing == "auto" && !planner)
    planner = memory::make_recompute_planner(c, train_split, *run.monitor, run.budget, o.group ? o.group->world() : 1);
  // The parts first: what they refuse (model.init_from, the splits' classes) leaves no run
  // directory behind, nor an existing one's config.yaml rewritten (exist_ok).
  train::TrainerParts parts = train::make_trainer_parts(c, device, "", train_split, val_split, o.group);
  std::string run_dir = o.run_dir;
  const int rank = o.group ? o.group->rank() : 0;
  run.run_dir_lock = o.run_dir_lock;
  if (run_dir.empty() && rank == 0) {
    std::unique_ptr<RunDirLock> lock;
    run_dir = open_run_dir(c, lock);
    run.run_dir_lock = std::move(lock);
  }
  if (o.group) run_dir = o.group->broadcast_text(run_dir, "run_dir");  // rank 0's, new or resumed
  parts.run_dir = run_dir;
  parts.monitor = run.monitor;
  parts.options.memory_usable(memory::usable_budget(run.budget, c.memory.headroom)).memory_headroom(c.memory.headroom);
  if (o.adjust) o.adjust(parts);
  run.trainer = std::make_unique<train::Trainer>(std::move(parts));
  train::Trainer& trainer = *run.trainer;
  run.monitor->set_limit(run.budget);  // enforced with or without recovery
  // The governor first: it runs the steps, and its after_step judges the step's own peak.
  auto governor = std::make_unique<memory::Governor>(memory::governor_options(c, run.budget), planner);
  run.governor = governor.get();
  if (micro > 0) {
    governor->set_micro_batch(micro);
    trainer.state().val_batch = micro;  // validation at the size training fits (a resume restores its own)
  }
  const int64_t per_step = trainer.batch() * trainer.world() * trainer.accumulate();
  if (per_step != c.train.nominal_batch && micro == 0)  // train.batch auto has said what its step is
    spdlog::info("train.batch {}{} with accumulation {}: {} images per optimizer step, not train.nominal_batch {} ({})",
                 trainer.batch(), trainer.world() > 1 ? fmt::format(" on each of {} ranks", trainer.world()) : "",
                 trainer.accumulate(), per_step, c.train.nominal_batch,
                 c.train.nominal_batch % trainer.world() != 0
                     ? fmt::format("a nominal batch that is a multiple of the {} ranks can be exact", trainer.world())
                     : std::string("a batch that divides it, or train.batch=auto, makes it exact"));
  trainer.set_executor(run.governor);
  trainer.register_hook(std::move(governor));
  trainer.register_hook(std::make_unique<memory::StarvationHook>(memory::starvation_options(c)));
  if (o.default_hooks) train::register_default_hooks(trainer, c);
  if (!o.checkpoint.empty()) trainer.load_checkpoint(o.checkpoint);
  run.config = std::move(c);
  return run;
}

}  // namespace headroom::cli
