// The hooks of a `trainer train` run. Each owns one concern; the Trainer knows none of them.
#include "headroom/train/hooks.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/metrics.h"
#include "headroom/train/plots.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {

std::string weights_path(Trainer& t, const std::string& file) { return (fs::path(t.run_dir()) / "weights" / file).string(); }

bool last_step(Trainer& t) { return t.state().step >= t.total_steps(); }
bool fresh_counters(Trainer& t) { return t.counters().step == t.state().step; }

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2fG", double(b) / double(int64_t(1) << 30));
  else
    std::snprintf(buf, sizeof buf, "%.0fM", double(b) / double(1 << 20));
  return buf;
}

std::string human_seconds(double s) {
  char buf[32];
  const int64_t t = std::llround(std::max(s, 0.0));
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

class ScheduleHook : public Hook {
 public:
  void before_step(Trainer& t) override { t.schedule().apply(t.optimizer(), t.state().step); }
};

class EmaHook : public Hook {
 public:
  void after_step(Trainer& t) override {
    if (t.ema()) t.ema()->update(t.model());
  }
};

// Steps with non-finite loss or gradients are skipped on the device; this stops a run that
// keeps producing them. It looks at each read of the counters: the longest run of bad steps in
// the window, so a burst between two reads is seen even when the last step was fine.
class NonFiniteGuard : public Hook {
 public:
  explicit NonFiniteGuard(int64_t max_bad_steps) : max_(max_bad_steps) {}
  void after_step(Trainer& t) override {
    if (!fresh_counters(t)) return;
    const StepCounters& c = t.counters();
    if (!c.skip_cause.empty())  // once per read of the counters: a burst is one line, not one per step
      spdlog::warn("step {}: {} of the last {} optimizer steps skipped (the first for {}); {} in the run", c.step,
                   c.steps - c.finite_steps, c.steps, c.skip_cause, int64_t(c.skipped_steps));
    if (c.worst_bad_run < double(max_)) return;
    t.state().stop = true;
    t.state().exit_code = kExitFailure;
    t.state().stop_reason = std::to_string(int64_t(c.worst_bad_run)) + " optimizer steps in a row had a non-finite loss or gradients (" +
                            std::to_string(int64_t(c.skipped_steps)) + " skipped in all; train.max_bad_steps = " +
                            std::to_string(max_) + (c.skip_cause.empty() ? "" : "; the window's first for " + c.skip_cause) +
                            "): the run diverged. Lower train.lr0, lengthen train.warmup_epochs, try "
                            "train.amp=bf16 or off, and check the labels (trainer data check).";
  }

 private:
  int64_t max_;
};

class EvalHook : public Hook {
 public:
  EvalHook(int64_t every_epochs, int64_t every_steps) : every_epochs_(every_epochs), every_steps_(every_steps) {}
  void after_step(Trainer& t) override {
    if (every_steps_ > 0 && t.state().step % every_steps_ == 0 && !last_step(t)) evaluate(t);
  }
  void after_epoch(Trainer& t) override {
    if ((every_epochs_ > 0 && (t.state().epoch + 1) % every_epochs_ == 0) || last_step(t)) evaluate(t);
  }
  void after_train(Trainer& t) override {
    if (t.state().last_eval_step != t.state().step && t.state().exit_code == 0) evaluate(t);
  }

 private:
  void evaluate(Trainer& t) {
    if (t.state().last_eval_step == t.state().step) return;
    const std::optional<eval::CocoStats> s = t.validate();
    if (!s) return;
    if (t.rank() == 0) {  // every rank has the gathered result; one prints it
      std::printf("%s", eval::format_coco_stats(*s, t.train_split().names).c_str());
      std::fflush(stdout);
    }
    // Ultralytics' fitness: 0.1 AP50 + 0.9 AP50-95 picks best.pt (against an older checkpoint's
    // AP50-95 best, AP50-95 until it is beaten).
    const double fitness = 0.1 * s->stats[1] + 0.9 * s->stats[0];
    if ((t.state().best_is_ap ? s->stats[0] : fitness) > t.state().best_fitness) {
      t.state().best_fitness = fitness;
      t.state().best_is_ap = false;
      t.state().best_step = t.state().step;  // the checkpoint writer saves best.pt
    }
  }
  int64_t every_epochs_, every_steps_;
};

// Progress (a refreshed line on a terminal, plain lines otherwise), the epoch summary,
// results.csv and TensorBoard. Its state — the epoch's loss sums, the rows and event bytes
// written — is in every checkpoint, so a resumed run writes the same record as one that ran
// through.
class LogHook : public Hook {
 public:
  std::string state_name() const override { return "log"; }
  Json save_state() const override {
    if (!csv_) return resumed_;  // saved before training started: what was loaded, unchanged
    Json j = Json::object();
    j["rows"] = csv_->rows();
    j["events"] = fs::path(tb_->path()).filename().string();
    j["events_bytes"] = tb_->bytes();
    Json sums = Json::object();
    for (const auto& [name, v] : epoch_sums_) sums[name] = v;
    j["epoch_loss_sums"] = std::move(sums);
    j["epoch_finite_steps"] = epoch_finite_;
    return j;
  }
  void load_state(const Json& j) override { resumed_ = j; }

  void before_train(Trainer& t) override {
    tty_ = ::isatty(::fileno(stderr));
    csv_ = std::make_unique<CsvWriter>((fs::path(t.run_dir()) / "results.csv").string());
    if (resumed_.is_object()) {
      csv_->keep_rows(int64_t(resumed_.find("rows")->as_number()));
      tb_ = std::make_unique<TensorBoardWriter>(t.run_dir(), resumed_.find("events")->as_string(),
                                                int64_t(resumed_.find("events_bytes")->as_number()));
      for (const auto& [name, v] : resumed_.find("epoch_loss_sums")->members()) epoch_sums_[name] = v.as_number();
      epoch_finite_ = int64_t(resumed_.find("epoch_finite_steps")->as_number());
    } else {
      tb_ = std::make_unique<TensorBoardWriter>(t.run_dir());
    }
    const TrainerOptions& o = t.options();
    spdlog::info("training {} ({} parameters) on {}: {} images, loader batch {}{} x {} accumulated = {} per step, {} steps per epoch, "
                 "{} epochs = {} steps; {} with lr0 {}, {} schedule; amp {}; EMA {}",
                 t.model().yaml_file(), t.model().parameter_count(), t.device().str(), t.train_split().samples.size(), t.batch(),
                 t.world() > 1 ? fmt::format(" x {} ranks", t.world()) : "", t.accumulate(), t.batch() * t.world() * t.accumulate(),
                 t.steps_per_epoch(), t.epochs(), t.total_steps(),
                 to_string(o.optimizer().kind()), o.schedule().lr0(), to_string(o.schedule().kind()), to_string(t.amp()),
                 t.ema() ? "on" : "off");
    if (const std::string note = bf16_cost_note(t.amp(), t.device()); !note.empty()) spdlog::warn("{}", note);
    epoch_start_ = steps_start_ = steps_end_ = std::chrono::steady_clock::now();
    epoch_first_step_ = t.state().step;
    epoch_first_images_ = t.state().images;
  }

  void before_epoch(Trainer&) override { steps_start_ = steps_end_ = std::chrono::steady_clock::now(); }

  void after_step(Trainer& t) override {
    steps_end_ = std::chrono::steady_clock::now();
    if (const auto& m = t.step_memory()) {
      window_peak_ = std::max(window_peak_, m->peak_allocated);
      epoch_peak_ = std::max(epoch_peak_, m->peak_allocated);
    }
    if (!fresh_counters(t)) return;
    const StepCounters& c = t.counters();
    for (const auto& [name, sum] : c.loss_sums) epoch_sums_[name] += sum;
    epoch_finite_ += c.finite_steps;
    const int64_t in_epoch = t.state().step - t.state().epoch * t.steps_per_epoch();
    const bool epoch_end = t.state().batch >= t.loader().batches_per_epoch();
    const int64_t plain_every = std::max<int64_t>(t.options().read_every(), (t.steps_per_epoch() + 9) / 10);
    if (!(tty_ || epoch_end || last_step(t) || t.state().step - printed_step_ >= plain_every)) return;
    printed_step_ = t.state().step;
    const std::string line = progress(t, c, in_epoch);
    window_peak_ = 0;
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
      if (epoch_end || last_step(t)) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    } else {
      spdlog::info("{}", line);
    }
  }

  void after_epoch(Trainer& t) override {
    // The epoch's wall time, and the part its steps took: validation and the other hooks' epoch
    // end come after them, the last epoch's checkpoint before.
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - epoch_start_).count();
    const double training = std::chrono::duration<double>(steps_end_ - steps_start_).count();
    const double epoch_end = std::chrono::duration<double>(now - steps_end_).count();
    const int64_t images = t.state().images - epoch_first_images_;
    Scalars row = {{"epoch", double(t.state().epoch + 1)}, {"step", double(t.state().step)}};
    std::string losses;
    for (const auto& [name, sum] : epoch_sums_) {
      const double mean = epoch_finite_ > 0 ? sum / double(epoch_finite_) : NAN;
      row.emplace_back("train/" + name, mean);
      losses += fmt::format(" {} {:.4g}", name, mean);
    }
    const bool fresh_eval = t.last_metrics() && t.state().last_eval_step == t.state().step;
    const auto metric = [&](int i) { return fresh_eval ? t.last_metrics()->stats[size_t(i)] : NAN; };
    row.insert(row.end(), {{"metrics/AP50-95", metric(0)}, {"metrics/AP50", metric(1)}, {"metrics/AP75", metric(2)}});
    for (size_t g = 0; g < t.optimizer().groups().size(); ++g) row.emplace_back("lr/pg" + std::to_string(g), t.optimizer().groups()[g].lr);
    const double skipped = t.counters().skipped_steps;  // read at the epoch's last step
    row.insert(row.end(), {{"time/epoch_s", seconds}, {"time/train_s", training}, {"speed/img_s", images / std::max(training, 1e-9)},
                           {"time/data_wait_share", t.data_wait_seconds() / std::max(training, 1e-9)},
                           {"train/skipped_steps", skipped}});
    csv_->append(row);
    tb_->add_scalars(Scalars(row.begin() + 2, row.end()), t.state().step,
                     std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    tb_->flush();
    spdlog::info("epoch {}/{} done: {} steps in {} ({:.1f} img/s, data wait {:.0f}%){},{}{}; {} skipped steps; memory peak {}",
                 t.state().epoch + 1, t.epochs(), t.state().step - epoch_first_step_, human_seconds(training),
                 images / std::max(training, 1e-9), 100 * t.data_wait_seconds() / std::max(training, 1e-9),
                 fresh_eval ? ", validation " + human_seconds(epoch_end) : "", losses,
                 fresh_eval ? fmt::format(" val AP50-95 {:.4f} AP50 {:.4f}", metric(0), metric(1)) : "", int64_t(skipped),
                 t.step_memory() ? format_bytes(double(epoch_peak_)) : std::string("not measured"));
    epoch_sums_.clear();
    epoch_finite_ = 0;
    epoch_peak_ = 0;
    epoch_start_ = std::chrono::steady_clock::now();
    epoch_first_step_ = t.state().step;
    epoch_first_images_ = t.state().images;
  }

  void after_train(Trainer& t) override {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.start_time()).count();
    if (!t.state().stop_reason.empty()) {
      if (t.state().exit_code == kExitInterrupted)
        spdlog::warn("{}", t.state().stop_reason);
      else
        spdlog::error("{}", t.state().stop_reason);
    }
    spdlog::info("{} optimizer steps ({} images) in {}; best fitness (0.1 AP50 + 0.9 AP50-95) {:.4f} at step {}; weights in {}", t.state().step,
                 t.state().images, human_seconds(seconds), std::max(t.state().best_fitness, 0.0), t.state().best_step,
                 (fs::path(t.run_dir()) / "weights").string());
  }

 private:
  std::string progress(Trainer& t, const StepCounters& c, int64_t in_epoch) {
    const double seconds = std::chrono::duration<double>(steps_end_ - steps_start_).count();
    const double steps = double(t.state().step - epoch_first_step_);
    const double its = steps / std::max(seconds, 1e-9);
    const double imgs = double(t.state().images - epoch_first_images_) / std::max(seconds, 1e-9);
    const double eta = its > 0 ? double(t.total_steps() - t.state().step) / its : 0;
    std::string text = fmt::format("{}/{} {:>6}/{} {:.2f}it/s {:.1f}img/s", t.state().epoch + 1, t.epochs(), in_epoch, t.steps_per_epoch(),
                                   its, imgs);
    for (const auto& [name, v] : c.losses()) text += fmt::format(" {} {:.4g}", name, v);
    // The step's memory as the memory governor sees it: allocated / reserved after the step,
    // and the highest step peak since the last line.
    const std::optional<MemoryStats>& m = t.step_memory();
    const ParamGroup& g = t.optimizer().groups().front();  // the schedule's rate: MuSGD's 3x group divided back
    text += fmt::format(" lr {:.3g} mem {} data {:.0f}% eta {}", g.lr / g.lr_scale,
                        m ? human_bytes(m->allocated) + "/" + human_bytes(m->reserved) + "/" + human_bytes(window_peak_) : std::string("-"),
                        100 * t.data_wait_seconds() / std::max(seconds, 1e-9), human_seconds(eta));
    if (c.skipped_steps > 0) text += fmt::format(" skipped {}", int64_t(c.skipped_steps));
    return text;
  }

  bool tty_ = false;
  std::unique_ptr<CsvWriter> csv_;
  std::unique_ptr<TensorBoardWriter> tb_;
  Json resumed_;
  std::map<std::string, double> epoch_sums_;  // per term, over the epoch's finite steps
  int64_t epoch_finite_ = 0;
  int64_t window_peak_ = 0, epoch_peak_ = 0, printed_step_ = 0;
  std::chrono::steady_clock::time_point epoch_start_, steps_start_, steps_end_;
  int64_t epoch_first_step_ = 0, epoch_first_images_ = 0;
};

class PlotHook : public Hook {
 public:
  void before_train(Trainer& t) override { plot_labels(t.train_split(), path(t, "labels.jpg")); }
  void after_step(Trainer& t) override {
    if (drew_batch_ || !t.first_batch() || t.state().step > 1) return;  // a resumed run's batch is not the first
    drew_batch_ = true;
    plot_batch(*t.first_batch(), t.train_split().names, path(t, "train_batch0.jpg"));
  }
  void after_epoch(Trainer& t) override { results(t); }
  void after_train(Trainer& t) override { results(t); }

 private:
  static std::string path(Trainer& t, const char* file) { return (fs::path(t.run_dir()) / file).string(); }
  static void results(Trainer& t) {
    const std::string csv = path(t, "results.csv");
    if (!fs::exists(csv)) return;
    const auto [header, rows] = read_csv(csv);
    plot_results(header, rows, path(t, "results.png"));
  }
  bool drew_batch_ = false;
};

// Ctrl-C: stop after the current step with a checkpoint and the command that resumes it.
class InterruptHook : public Hook {
 public:
  void after_step(Trainer& t) override {
    if (!t.interrupt_agreed() || t.state().stop) return;
    t.state().stop = true;
    t.state().exit_code = kExitInterrupted;
    const std::string last = weights_path(t, "last.pt");
    t.state().stop_reason = "interrupted after step " + std::to_string(t.state().step) + "; " + last +
                            " holds the run. Resume with: trainer train --resume " + last;
  }
};

// Writes the checkpoints, registered last: a file holds every other hook's state for its point.
//   step_N.pt  every save_every steps (the newest `keep`), after the step's other hooks;
//   last.pt    once an epoch's end is done (at the next epoch's start, or at the end of the run),
//              and when a hook stops the run;
//   best.pt    where validation found a better AP: a copy of the file written at that point.
// Files are written behind the training (Trainer::save_checkpoint); the copy to best.pt and the
// pruning of old step files follow their file's write on the writer's thread, in order.
class CheckpointHook : public Hook {
 public:
  CheckpointHook(int64_t save_every, int64_t keep) : save_every_(save_every), keep_(keep) {}
  // Killed between a checkpoint and its copy as best.pt: the run resumes from the best model.
  void before_train(Trainer& t) override {
    // A process killed while it wrote left its temporary file (up to the state's size) behind.
    if (const int n = remove_abandoned_temporaries((fs::path(t.run_dir()) / "weights").string()))
      spdlog::info("checkpoints: removed {} temporary file(s) a killed run left in {}/weights", n, t.run_dir());
    if (t.state().step == 0 || t.state().best_step != t.state().step) return;
    const std::string best = weights_path(t, "best.pt");
    try {
      if (int64_t(checkpoint_meta(best).find("step")->as_number()) == t.state().step) return;
    } catch (const InputError&) {  // missing or damaged: written again below
    }
    t.save_checkpoint(best);
    best_saved_step_ = t.state().step;
  }
  void after_step(Trainer& t) override {
    const std::string best = best_due(t) ? weights_path(t, "best.pt") : "";  // validation inside the epoch found a better model
    if (save_every_ > 0 && t.state().step % save_every_ == 0) {
      char name[64];
      std::snprintf(name, sizeof name, "step_%08lld.pt", (long long)t.state().step);
      const std::string written = weights_path(t, name);
      t.save_checkpoint(written, [this, written, best, dir = t.run_dir(), step = t.state().step] {
        if (!best.empty()) copy_file_atomic(written, best);
        prune(dir, step);
      });
    } else if (!best.empty()) {
      t.save_checkpoint(best);
    }
    if (!best.empty()) best_saved_step_ = t.state().step;
  }
  void after_epoch(Trainer&) override { epoch_ended_ = true; }
  void before_epoch(Trainer& t) override {
    if (epoch_ended_) write_last(t);
  }
  void after_train(Trainer& t) override {
    if (epoch_ended_ || t.state().stop) write_last(t);  // Trainer::train waits for it
  }

 private:
  bool best_due(Trainer& t) const { return t.state().best_step == t.state().step && best_saved_step_ != t.state().step; }
  void write_last(Trainer& t) {
    const std::string last = weights_path(t, "last.pt"), best = best_due(t) ? weights_path(t, "best.pt") : "";
    epoch_ended_ = false;
    t.save_checkpoint(last, [last, best] {
      if (!best.empty()) copy_file_atomic(last, best);
    });
    if (!best.empty()) best_saved_step_ = t.state().step;
  }
  // Keeps the newest `keep` step files up to `step`. Later ones are a run this one resumed before
  // the end of (from best.pt, an older step file): left alone, as they were, until this run
  // writes over them; counting them would delete the file just written.
  void prune(const std::string& run_dir, int64_t step) const {
    static const std::regex kStepFile("step_([0-9]+)\\.pt");
    std::vector<std::string> steps;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(fs::path(run_dir) / "weights", ec)) {
      std::smatch m;
      const std::string name = f.path().filename().string();
      if (std::regex_match(name, m, kStepFile) && std::stoll(m[1].str()) <= step) steps.push_back(f.path().string());
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + size_t(keep_) < steps.size(); ++i) fs::remove(steps[i], ec);
  }
  int64_t save_every_, keep_;
  bool epoch_ended_ = false;
  int64_t best_saved_step_ = -1;
};

std::atomic<bool> g_interrupt{false};
bool g_announce = false;
extern "C" void on_sigint(int) {
  g_interrupt.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
  // write(2) is async-signal-safe where the logger is not; the step may run for seconds yet.
  static const char kSaid[] = "\nCtrl-C: stopping after this step and writing last.pt; press Ctrl-C again to stop at once\n";
  if (g_announce) {
    const ssize_t written = ::write(STDERR_FILENO, kSaid, sizeof(kSaid) - 1);
    (void)written;  // nothing to do where stderr is gone
  }
}

}  // namespace

void register_default_hooks(Trainer& t, const Config& c) {
  const TrainConfig& o = c.train;
  t.register_hook(std::make_unique<ScheduleHook>());
  t.register_hook(std::make_unique<EmaHook>());
  t.register_hook(std::make_unique<NonFiniteGuard>(o.max_bad_steps));
  t.register_hook(std::make_unique<InterruptHook>());
  t.register_hook(std::make_unique<EvalHook>(o.val_every, o.val_every_steps));
  if (t.rank() > 0) return;  // rank 0 alone writes logs, results.csv, TensorBoard, plots and checkpoints
  t.register_hook(std::make_unique<LogHook>());
  if (o.plots) t.register_hook(std::make_unique<PlotHook>());
  t.register_hook(std::make_unique<CheckpointHook>(o.save_every_steps, o.keep));
}

void install_interrupt_handler(bool announce) {
  g_announce = announce;
  std::signal(SIGINT, on_sigint);
}
bool interrupt_requested() { return g_interrupt.load(); }

}  // namespace headroom::train
