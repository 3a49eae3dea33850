// The hooks of a `trainer train` run. Each owns one concern; the Trainer knows none of them.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/train/metrics.h"
#include "headroom/train/plots.h"
#include "headroom/train/trainer.h"

namespace headroom::train {

namespace fs = std::filesystem;

namespace {

std::string weights_path(Trainer& t, const std::string& file) { return (fs::path(t.run_dir()) / "weights" / file).string(); }

bool last_step(Trainer& t) { return t.state().step >= t.total_steps(); }

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
// keeps producing them (read at the logging interval: one host sync).
class NonFiniteGuard : public Hook {
 public:
  void after_step(Trainer& t) override {
    if (t.state().step % t.config().train.log_every != 0 && !last_step(t)) return;
    const StepCounters& c = t.read_counters();
    if (c.bad_run < t.config().train.max_bad_steps) return;
    t.state().stop = true;
    t.state().exit_code = kExitFailure;
    t.state().stop_reason = std::to_string(int64_t(c.bad_run)) + " optimizer steps in a row had a non-finite loss or gradients (" +
                            std::to_string(int64_t(c.skipped_steps)) + " skipped in all; train.max_bad_steps = " +
                            std::to_string(t.config().train.max_bad_steps) + "): the run diverged. Lower train.lr0, lengthen "
                            "train.warmup_epochs, try train.amp=bf16 or off, and check the labels (trainer data check).";
  }
};

class EvalHook : public Hook {
 public:
  void after_step(Trainer& t) override {
    const int64_t every = t.config().train.val_every_steps;
    if (every > 0 && t.state().step % every == 0 && !last_step(t)) evaluate(t);
  }
  void after_epoch(Trainer& t) override {
    const int every = t.config().train.val_every;
    if ((every > 0 && (t.state().epoch + 1) % every == 0) || last_step(t)) evaluate(t);
  }
  void after_train(Trainer& t) override {
    if (t.state().last_eval_step != t.state().step && t.state().exit_code == 0) evaluate(t);
  }

 private:
  void evaluate(Trainer& t) {
    if (t.state().last_eval_step == t.state().step) return;
    const std::optional<eval::CocoStats> s = t.validate();
    if (!s) return;
    std::printf("%s", eval::format_coco_stats(*s, t.train_split().names).c_str());
    std::fflush(stdout);
    if (s->stats[0] > t.state().best_fitness) {
      t.state().best_fitness = s->stats[0];
      t.state().best_step = t.state().step;
      t.save_checkpoint(weights_path(t, "best.pt"));
    }
  }
};

class CheckpointHook : public Hook {
 public:
  void after_step(Trainer& t) override {
    const int64_t every = t.config().train.save_every_steps;
    if (every <= 0 || t.state().step % every != 0) return;
    char name[64];
    std::snprintf(name, sizeof name, "step_%08lld.pt", (long long)t.state().step);
    t.save_checkpoint(weights_path(t, name));
    prune(t);
  }
  void after_epoch(Trainer& t) override { t.save_checkpoint(weights_path(t, "last.pt")); }
  void after_train(Trainer& t) override {
    if (t.state().stop) t.save_checkpoint(weights_path(t, "last.pt"));  // epoch ends already wrote it otherwise
  }

 private:
  static void prune(Trainer& t) {
    std::vector<std::string> steps;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(fs::path(t.run_dir()) / "weights", ec))
      if (std::regex_match(f.path().filename().string(), std::regex("step_[0-9]+\\.pt"))) steps.push_back(f.path().string());
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + size_t(t.config().train.keep) < steps.size(); ++i) fs::remove(steps[i], ec);
  }
};

// Progress (a refreshed line on a terminal, plain lines otherwise), the epoch summary,
// results.csv and TensorBoard.
class LogHook : public Hook {
 public:
  void before_train(Trainer& t) override {
    tty_ = ::isatty(::fileno(stderr));
    csv_ = std::make_unique<CsvWriter>((fs::path(t.run_dir()) / "results.csv").string());
    tb_ = std::make_unique<TensorBoardWriter>(t.run_dir());
    const TrainConfig& c = t.config().train;
    spdlog::info("training {} ({} parameters) on {}: {} images, micro-batch {} x {} accumulated = {} per step, {} steps per epoch, "
                 "{} epochs = {} steps; {} with lr0 {}, {} schedule; amp {}; EMA {}",
                 t.model().yaml_file(), t.model().parameter_count(), t.device().str(), t.train_split().samples.size(), c.batch,
                 t.accumulate(), c.batch * t.accumulate(), t.steps_per_epoch(), t.epochs(), t.total_steps(), to_string(c.optimizer),
                 c.lr0, to_string(c.schedule), to_string(t.amp()), c.ema ? "on" : "off");
    epoch_start_ = std::chrono::steady_clock::now();
    epoch_first_step_ = t.state().step;
    epoch_first_images_ = t.state().images;
  }

  void after_step(Trainer& t) override {
    const int64_t in_epoch = t.state().step - (t.state().epoch * t.steps_per_epoch());
    const bool epoch_end = t.state().batch >= t.loader().batches_per_epoch();
    const int64_t plain_every = std::max<int64_t>(t.config().train.log_every, (t.steps_per_epoch() + 9) / 10);
    const bool refresh = t.state().step % t.config().train.log_every == 0;
    if (!(epoch_end || last_step(t) || (tty_ ? refresh : in_epoch % plain_every == 0))) return;
    const StepCounters& c = t.read_counters();
    for (const auto& [name, v] : c.losses) {
      auto& [sum, n] = epoch_losses_[name];
      sum += v * double(c.micro_batches);
      n += c.micro_batches;
    }
    const std::string line = progress(t, c, in_epoch);
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
      if (epoch_end || last_step(t)) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    } else {
      spdlog::info("{}", line);
    }
  }

  void after_epoch(Trainer& t) override {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
    const int64_t images = t.state().images - epoch_first_images_;
    Scalars row = {{"epoch", double(t.state().epoch + 1)}, {"step", double(t.state().step)}};
    std::string losses;
    for (const auto& [name, sn] : epoch_losses_) {
      const double mean = sn.second ? sn.first / double(sn.second) : NAN;
      row.emplace_back("train/" + name, mean);
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.4g", name.c_str(), mean);
      losses += buf;
    }
    const bool fresh_eval = t.last_metrics() && t.state().last_eval_step == t.state().step;
    const auto metric = [&](int i) { return fresh_eval ? t.last_metrics()->stats[size_t(i)] : NAN; };
    row.insert(row.end(), {{"metrics/AP50-95", metric(0)}, {"metrics/AP50", metric(1)}, {"metrics/AP75", metric(2)}});
    for (size_t g = 0; g < t.optimizer().groups().size(); ++g) row.emplace_back("lr/pg" + std::to_string(g), t.optimizer().groups()[g].lr);
    const StepCounters& c = t.read_counters();
    row.insert(row.end(), {{"time/epoch_s", seconds}, {"speed/img_s", images / std::max(seconds, 1e-9)},
                           {"time/data_wait_share", t.data_wait_seconds() / std::max(seconds, 1e-9)},
                           {"train/skipped_steps", c.skipped_steps}});
    csv_->append(row);
    tb_->add_scalars(Scalars(row.begin() + 2, row.end()), t.state().step,
                     std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    tb_->flush();
    const DeviceMemory m = device_memory(t.device());
    spdlog::info("epoch {}/{} done: {} steps in {} ({:.1f} img/s, data wait {:.0f}%),{}{}; {} skipped steps; memory peak {}", t.state().epoch + 1,
                 t.epochs(), t.state().step - epoch_first_step_, human_seconds(seconds), images / std::max(seconds, 1e-9),
                 100 * t.data_wait_seconds() / std::max(seconds, 1e-9), losses,
                 fresh_eval ? fmt::format(", val AP50-95 {:.4f} AP50 {:.4f}", metric(0), metric(1)) : "", int64_t(c.skipped_steps),
                 human_bytes(m.peak));
    epoch_losses_.clear();
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
    spdlog::info("{} optimizer steps ({} images) in {}; best AP50-95 {:.4f} at step {}; weights in {}", t.state().step,
                 t.state().images, human_seconds(seconds), std::max(t.state().best_fitness, 0.0), t.state().best_step,
                 (fs::path(t.run_dir()) / "weights").string());
  }

 private:
  std::string progress(Trainer& t, const StepCounters& c, int64_t in_epoch) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
    const double steps = double(t.state().step - epoch_first_step_);
    const double its = steps / std::max(seconds, 1e-9);
    const double imgs = double(t.state().images - epoch_first_images_) / std::max(seconds, 1e-9);
    const double eta = its > 0 ? double(t.total_steps() - t.state().step) / its : 0;
    std::string text = fmt::format("{}/{} {:>6}/{} {:.2f}it/s {:.1f}img/s", t.state().epoch + 1, t.epochs(), in_epoch, t.steps_per_epoch(),
                                   its, imgs);
    for (const auto& [name, v] : c.losses) text += fmt::format(" {} {:.4g}", name, v);
    const DeviceMemory m = device_memory(t.device());
    text += fmt::format(" lr {:.3g} mem {}/{}/{} data {:.0f}% eta {}", t.optimizer().groups().front().lr, human_bytes(m.allocated),
                        human_bytes(m.reserved), human_bytes(m.peak), 100 * t.data_wait_seconds() / std::max(seconds, 1e-9),
                        human_seconds(eta));
    if (c.skipped_steps > 0) text += fmt::format(" skipped {}", int64_t(c.skipped_steps));
    return text;
  }

  bool tty_ = false;
  std::unique_ptr<CsvWriter> csv_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::map<std::string, std::pair<double, int64_t>> epoch_losses_;
  std::chrono::steady_clock::time_point epoch_start_;
  int64_t epoch_first_step_ = 0, epoch_first_images_ = 0;
};

class PlotHook : public Hook {
 public:
  void before_train(Trainer& t) override {
    if (!enabled(t)) return;
    plot_labels(t.train_split(), path(t, "labels.jpg"));
  }
  void after_step(Trainer& t) override {
    if (!enabled(t) || drew_batch_ || !t.first_batch()) return;
    drew_batch_ = true;
    plot_batch(*t.first_batch(), t.train_split().names, path(t, "train_batch0.jpg"));
  }
  void after_epoch(Trainer& t) override { results(t); }
  void after_train(Trainer& t) override { results(t); }

 private:
  static bool enabled(Trainer& t) { return t.config().train.plots; }
  static std::string path(Trainer& t, const char* file) { return (fs::path(t.run_dir()) / file).string(); }
  static void results(Trainer& t) {
    const std::string csv = path(t, "results.csv");
    if (!enabled(t) || !fs::exists(csv)) return;
    const auto [header, rows] = read_csv(csv);
    plot_results(header, rows, path(t, "results.png"));
  }
  bool drew_batch_ = false;
};

// Ctrl-C: stop after the current step with a checkpoint and the command that resumes it.
class InterruptHook : public Hook {
 public:
  void after_step(Trainer& t) override {
    if (!interrupt_requested() || t.state().stop) return;
    t.state().stop = true;
    t.state().exit_code = kExitInterrupted;
    const std::string last = weights_path(t, "last.pt");
    t.state().stop_reason = "interrupted after step " + std::to_string(t.state().step) + "; " + last +
                            " holds the run. Resume with: trainer train --resume " + last;
  }
};

}  // namespace

void register_default_hooks(Trainer& t) {
  t.register_hook(std::make_unique<ScheduleHook>());
  t.register_hook(std::make_unique<EmaHook>());
  t.register_hook(std::make_unique<NonFiniteGuard>());
  t.register_hook(std::make_unique<InterruptHook>());
  t.register_hook(std::make_unique<EvalHook>());
  t.register_hook(std::make_unique<CheckpointHook>());
  t.register_hook(std::make_unique<LogHook>());
  t.register_hook(std::make_unique<PlotHook>());
}

}  // namespace headroom::train
