// bench_train: where a training step's time goes. Optimizer steps of a config on synthetic data,
// built as `trainer train` builds its run (cli::build_run: the memory governor's executor, the
// starvation monitor, the default hooks), each step timed by phase: data (the wait for the
// loader), input (to the device, augmentation, targets, the loss normalisers), forward, loss,
// backward, update (unscale, non-finite check, clip, optimizer) and hooks (EMA, logging, the
// governor's bookkeeping). Time outside the steps (an epoch's end: its memory and data lines,
// last.pt) is reported apart, and per epoch boundary: from the end of an epoch's last step to
// the first batch of the next in hand (its loader wait included), the time a device would sit
// idle there. The steps after --warmup are measured.
//
// The device's own view comes from marks on its queue (core/stream.h: CUDA events; the host's
// clock on the CPU) at each measured step's start (its batches in hand) and end (its hooks
// queued): device_busy_pct is the share of the measured window the device spent inside steps,
// and epoch_boundary_device_s the device time between an epoch's last step and the next one's
// first, where it trains nothing (the epoch's end, last.pt's snapshot, the loader's wait). Gaps
// inside a step (the device waiting for the host to launch kernels) count as busy there. A mark
// at the step's input phase gives input_device_s: the device time from a step's start until its
// input (copy, augmentation) is ready on the compute stream, what the side stream did not hide.
//
// With --plain (CPU), the same model and loss first train as a plain LibTorch loop does:
// LibTorch's default allocator, no governor, no hooks, torch::optim::SGD, on one step's batches
// augmented once. The ratio of the two model steps (forward to update), plain over Headroom, is
// what a regression in the allocator, the executor or the step primitives drops below 1.
// One JSON line per runner, then one with the ratios.
//   bench_train [--config C] [--steps 12] [--warmup 3] [--images 256] [--plain] [--data DIR] [key=value ...]
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "headroom/augment/augment.h"
#include "headroom/cli/run.h"
#include "headroom/core/device.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/stream.h"
#include "headroom/core/threads.h"
#include "headroom/data/synth.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/train/amp.h"

using namespace headroom;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// This process's page faults and system time so far: a step that maps fresh memory shows here.
struct Usage {
  int64_t minor_faults = 0;
  double system_seconds = 0;
};
Usage usage() {
  rusage r{};
  ::getrusage(RUSAGE_SELF, &r);
  return {int64_t(r.ru_minflt), double(r.ru_stime.tv_sec) + 1e-6 * double(r.ru_stime.tv_usec)};
}

const char* const kPhases[] = {"data", "input", "forward", "loss", "backward", "update", "hooks"};
constexpr size_t kNumPhases = sizeof kPhases / sizeof kPhases[0];

// Seconds per phase, summed over the measured steps.
struct Timing {
  double phase[kNumPhases] = {};
  double steps_seconds = 0, wall_seconds = 0, boundary_seconds = 0, boundary_data_seconds = 0;
  double device_window = 0, device_steps = 0, device_boundary = 0, device_input = 0;  // from the device's marks
  int64_t device_boundaries = 0;
  int64_t steps = 0, images = 0, boundaries = 0;
  Usage start, end;  // at the first measured step and after the last
  Json json(const std::string& runner, const Config& c, c10::Device device) const {
    Json j = Json::object();
    j["bench"] = "train";
    j["runner"] = runner;
    j["model"] = c.model.file;
    j["device"] = device.str();
    j["threads"] = at::get_num_threads();
    j["imgsz"] = c.data.imgsz;
    j["amp"] = c.train.amp;
    j["steps"] = steps;
    j["images"] = images;
    j["img_per_s"] = steps_seconds > 0 ? double(images) / steps_seconds : 0.0;
    j["step_s"] = steps > 0 ? steps_seconds / double(steps) : 0.0;
    j["model_step_s"] = model_step() / double(std::max<int64_t>(steps, 1));
    Json p = Json::object();
    for (size_t i = 0; i < kNumPhases; ++i) p[kPhases[i]] = phase[i] / double(std::max<int64_t>(steps, 1));
    j["phase_s"] = std::move(p);
    j["outside_steps_s"] = std::max(0.0, wall_seconds - steps_seconds);
    j["img_per_s_end_to_end"] = wall_seconds > 0 ? double(images) / wall_seconds : 0.0;  // the epochs' ends included
    j["epoch_boundaries"] = boundaries;
    j["epoch_boundary_s"] = boundaries > 0 ? boundary_seconds / double(boundaries) : 0.0;
    j["epoch_boundary_data_s"] = boundaries > 0 ? boundary_data_seconds / double(boundaries) : 0.0;  // of which the loader's wait
    if (device_window > 0) {
      j["device_busy_pct"] = 100.0 * device_steps / device_window;
      j["epoch_boundary_device_s"] = device_boundaries > 0 ? device_boundary / double(device_boundaries) : 0.0;
      j["input_device_s"] = device_input / double(std::max<int64_t>(steps, 1));
    }
    j["minor_faults_per_step"] = double(end.minor_faults - start.minor_faults) / double(std::max<int64_t>(steps, 1));
    j["system_s_per_step"] = (end.system_seconds - start.system_seconds) / double(std::max<int64_t>(steps, 1));
    return j;
  }
  double model_step() const { return phase[2] + phase[3] + phase[4] + phase[5]; }  // forward .. update
};

// Times the trainer's steps by phase. Registered last: its after_step follows the other hooks'.
class PhaseTimer : public train::Hook {
 public:
  PhaseTimer(Timing& t, int64_t warmup, c10::Device device) : t_(t), warmup_(warmup), clock_(device) {}
  void before_train(train::Trainer&) override { start_ = Clock::now(); }
  void after_epoch(train::Trainer&) override { boundary_ = true; }
  void before_step(train::Trainer& tr) override {
    step_start_ = last_ = Clock::now();
    if (boundary_) gap_ = std::chrono::duration<double>(step_start_ - step_end_).count();
    wait_ = tr.data_wait_seconds();
    std::fill(std::begin(now_), std::end(now_), 0.0);
  }
  void after_data(train::Trainer& tr) override {
    if (tr.state().step >= warmup_) marks_.push_back({clock_.mark(), 0, 0, boundary_});
  }
  void after_phase(train::Trainer& tr, train::StepPhase p) override {
    if (p == train::StepPhase::input && tr.state().step >= warmup_ && marks_.back().input == 0) marks_.back().input = clock_.mark();
    const double dt = since(last_);
    last_ = Clock::now();
    if (p == train::StepPhase::input && now_[0] == 0 && now_[1] == 0) {
      now_[0] = tr.data_wait_seconds() - wait_;  // the loader's wait, inside the time to the input's end
      now_[1] += dt - now_[0];
      return;
    }
    now_[size_t(p) + 1] += dt;
  }
  // The device's figures, from the marks of the measured steps (waits for the device).
  void after_train(train::Trainer&) override {
    if (marks_.empty()) return;
    t_.device_window = clock_.seconds(marks_.front().start, marks_.back().end);
    for (size_t i = 0; i < marks_.size(); ++i) {
      t_.device_steps += clock_.seconds(marks_[i].start, marks_[i].end);
      t_.device_input += clock_.seconds(marks_[i].start, marks_[i].input);
      if (i > 0 && marks_[i].after_boundary) {
        t_.device_boundary += clock_.seconds(marks_[i - 1].end, marks_[i].start);
        ++t_.device_boundaries;
      }
    }
  }
  void after_step(train::Trainer& tr) override {
    now_[6] = since(last_);
    step_end_ = Clock::now();
    const bool after_boundary = std::exchange(boundary_, false);
    if (tr.state().step <= warmup_) {
      if (tr.state().step == warmup_) start_ = Clock::now(), t_.start = usage();
      return;
    }
    marks_.back().end = clock_.mark();
    t_.end = usage();
    for (size_t i = 0; i < kNumPhases; ++i) t_.phase[i] += now_[i];
    t_.steps_seconds += since(step_start_);
    if (after_boundary) t_.boundary_seconds += gap_ + now_[0], t_.boundary_data_seconds += now_[0], ++t_.boundaries;
    t_.wall_seconds = since(start_);
    ++t_.steps;
    t_.images += tr.batch() * tr.accumulate();
  }

 private:
  struct StepMarks {
    size_t start, end, input;  // input: the first input phase's (a retried step prepares again); 0 = none yet
    bool after_boundary;
  };
  Timing& t_;
  int64_t warmup_;
  DeviceClock clock_;
  std::vector<StepMarks> marks_;
  Clock::time_point start_, step_start_, step_end_, last_;
  double wait_ = 0, gap_ = 0, now_[kNumPhases] = {};
  bool boundary_ = false;  // an epoch ended since the last step
};

// The model and loss of the run trained by a plain LibTorch loop, on one step's batches
// augmented once: forward, loss and backward per batch, then torch::optim::SGD.
Timing plain_steps(const Config& c, c10::Device device, const std::shared_ptr<const data::Split>& split, int64_t warmup,
                   int64_t steps) {
  train::TrainerParts parts = train::make_trainer_parts(c, device, "", split, nullptr);
  const int64_t accumulate = train::run_length(parts.options, parts.loader.batch(), data::Loader(split, parts.loader).batches_per_epoch()).accumulate;
  struct Prepared {
    at::Tensor images;
    losses::Targets targets;
  };
  std::vector<Prepared> batches;
  {
    data::Loader loader(split, parts.loader);
    loader.start(0, 0);
    for (int64_t i = 0; i < accumulate; ++i) {
      const data::HostBatch h = *loader.next();
      const augment::Batch a = parts.augmenter ? (*parts.augmenter)(h, device)
                                               : augment::Batch{h.images.to(device).to(at::kFloat).div_(255), h.boxes, h.classes, h.crowd};
      batches.push_back({a.images, losses::make_targets(a.boxes, a.classes, a.crowd)});
    }
  }
  losses::StepNorm norm;
  std::vector<at::Tensor> counts;
  for (const auto& b : batches) {
    const at::Tensor k = parts.loss->counts(b.targets, b.images.size(2), b.images.size(3));
    if (k.defined()) counts.push_back(k);
    norm.images += b.images.size(0);
  }
  if (!counts.empty()) norm.counts = at::stack(counts).sum(0);
  models::DetectorImpl& model = *parts.model;
  model.train();
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(c.train.lr0).momentum(c.train.momentum).nesterov(true).weight_decay(
                                                c.train.weight_decay));
  const train::AmpMode amp = train::resolve_amp(c, device);
  Timing t;
  Clock::time_point start;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup) start = Clock::now(), t.start = usage();
    const auto step_start = Clock::now();
    double phase[kNumPhases] = {};
    for (const auto& b : batches) {
      auto t0 = Clock::now();
      train::AutocastGuard autocast(device.type(), train::amp_dtype(amp));
      models::HeadOutputs out = model.forward(b.images);
      phase[2] += since(t0);
      t0 = Clock::now();
      for (auto& [name, levels] : out)
        for (auto& level : levels) level = level.to(at::kFloat);
      const losses::LossTerms terms = (*parts.loss)(out, b.targets, norm);
      const at::Tensor total = losses::normalised_total(terms, terms.deferred);
      phase[3] += since(t0);
      t0 = Clock::now();
      total.backward();
      phase[4] += since(t0);
    }
    const auto t0 = Clock::now();
    sgd.step();
    sgd.zero_grad();
    phase[5] += since(t0);
    if (s < warmup) continue;
    for (size_t i = 0; i < kNumPhases; ++i) t.phase[i] += phase[i];
    t.steps_seconds += since(step_start);
    ++t.steps;
    t.images += norm.images;
  }
  t.wall_seconds = since(start);
  t.end = usage();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"Training step benchmark: img/s and the step's time by phase"};
  std::string config = std::string(HEADROOM_SOURCE_DIR) + "/configs/demo.yaml", data_dir = "build/bench-train-data";
  int64_t steps = 12, warmup = 3;
  int images = 256;
  bool plain = false;
  std::vector<std::string> overrides;
  app.add_option("--config", config, "Run config (default: configs/demo.yaml)");
  app.add_option("--steps", steps, "Optimizer steps measured")->check(CLI::Range(1, 1 << 20));
  app.add_option("--warmup", warmup, "Optimizer steps run first, not measured")->check(CLI::Range(0, 1 << 20));
  app.add_option("--images", images, "Synthetic training images (epochs wrap around them)")->check(CLI::Range(8, 1 << 20));
  app.add_option("--data", data_dir, "Where the synthetic data set is written (reused when up to date)");
  app.add_flag("--plain", plain, "Also train the model with a plain LibTorch loop (CPU): the ratio of the two");
  app.add_option("overrides", overrides, "key=value config overrides");
  CLI11_PARSE(app, argc, argv);
  set_intra_op_threads(AutoInt{});
  try {
    overrides.insert(overrides.begin(), "data.dataset=''");  // the config's own data need not exist: the synthetic set replaces it
    Config c = load_config(config, overrides);
    set_intra_op_threads(c.threads);
    const c10::Device device = resolve_device(c.device, query_cuda()).device;
    data::SynthOptions so;
    so.out = (std::filesystem::path(data_dir) / ("imgsz" + std::to_string(c.data.imgsz))).string();
    so.images = int(double(images) / (1.0 - so.val_fraction) + 0.5);
    so.size = int(c.data.imgsz);
    so.threads = available_cores();
    c.data.dataset = data::synthesize(so).data_yaml;
    const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
    Json ratios = Json::object();
    double plain_model_step = 0;
    if (plain) {
      if (!device.is_cpu()) throw InputError("--plain compares against LibTorch's default CPU allocator: run it with device=cpu");
      const Timing t = plain_steps(c, device, split, warmup, steps);  // before build_run installs Headroom's allocator
      plain_model_step = t.model_step() / double(t.steps);
      std::printf("%s\n", t.json("plain", c, device).dump().c_str());
      std::fflush(stdout);
    }
    const std::filesystem::path project = std::filesystem::temp_directory_path() / ("headroom-bench-train-" + std::to_string(::getpid()));
    c.project = project.string();  // the run's logs and last.pt, removed at the end
    c.name = "run";
    c.train.steps = warmup + steps;
    c.train.plots = false;
    cli::RunOptions o;
    o.train = split;  // no val split: no validation
    cli::Run run = cli::build_run(c, device, o);
    Timing t;
    run.trainer->register_hook(std::make_unique<PhaseTimer>(t, warmup, device));
    run.trainer->train();
    Json j = t.json("headroom", run.config, device);
    if (const train::StepGraph* g = run.trainer->step_graph()) {  // replayed steps fire no forward .. update phases
      j["graph_captures"] = g->captures();
      j["graph_replays_last"] = g->replays();
      j["graphs_kept"] = g->active();
    }
    const MemoryStats m = run.monitor->sample();
    j["reserved_bytes"] = m.reserved;
    j["alloc_retries"] = m.alloc_retries;
    if (device.is_cpu()) {
      const memory::CpuAllocatorStats a = memory::CachingCpuAllocator::install().stats();
      j["cpu_mappings"] = a.mappings;    // fresh blocks mapped in the whole run: the first step's, ideally
      j["cpu_evictions"] = a.evictions;  // allocations that returned cached blocks for the budget
    }
    j["peak_rss_bytes"] = process_memory().peak_rss;
    std::printf("%s\n", j.dump().c_str());
    if (plain) {
      ratios["bench"] = "train";
      ratios["plain_over_headroom_model_step"] = plain_model_step / (t.model_step() / double(t.steps));
      std::printf("%s\n", ratios.dump().c_str());
    }
    std::fflush(stdout);
    std::filesystem::remove_all(project);
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 2;
  }
  return 0;
}
