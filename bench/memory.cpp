// bench_memory: for the demo model and small YOLOv8 / Hourglass configurations on the run's
// device (CPU here), under a memory budget: the estimator's predicted peak at the configured
// batch against the measured peak of real training steps, the batch train.batch=auto chooses,
// and the true largest batch found by training at each size in turn, from two below the
// automatic choice, until one does not fit.
// One JSON line per case. Also the optimizer phase of Hourglass-104 with Adam (parameters,
// gradients, state and the update's own extra, in place and fused), and, only when asked for by
// --only centernet_hg104_128 (10 minutes on 2 CPU cores) or centernet_hg104_512 (hours), the
// estimator on Hourglass-104.
//   bench_memory [--data DIR] [--only NAME] [--device cpu] [--set key=value ...]
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>

#include "headroom/core/device.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/threads.h"
#include "headroom/data/dataset.h"
#include "headroom/data/synth.h"
#include "headroom/memory/estimate.h"
#include "headroom/models/detector.h"
#include "headroom/train/optimizer.h"
#include "headroom/train/trainer.h"
#include "headroom/interop/init_from.h"

using namespace headroom;

namespace {

struct Case {
  std::string name, model;
  int imgsz, batch;
  double budget_mib;
};

// Peak of `steps` real training steps at `batch` (after one warm-up step) above what was in use
// before the trainer, loader buffers included; -1 when a step runs out of memory.
int64_t measured_peak(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& m, int64_t budget,
                      int steps) {
  m.release_cache();
  const int64_t base = m.sample().allocated;
  m.set_limit(budget);
  int64_t peak = -1;
  try {
    train::Trainer t(train::make_trainer_parts(c, m.device(), "", split, nullptr));
    t.loader().start(0, 0);
    t.run_step();
    m.reset_peak();
    for (int i = 0; i < steps && t.state().batch < t.loader().batches_per_epoch(); ++i) t.run_step();
    peak = m.sample().peak_allocated - base;
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) throw;
  }
  m.set_limit(0);
  m.release_cache();
  return peak;
}

// Hourglass-104 (191 M parameters) with Adam: the optimizer phase's peak, all of it allocated.
void optimizer_phase(MemoryMonitor& m, c10::Device device) {
  const Config c = load_config("", {"model.file=models/centernet_hg104.yaml", "device=" + device.str()});
  models::Detector model = interop::run_model(c, 1);
  model->to(device);
  for (bool fused : {false, true}) {
    train::Optimizer opt(train::parameter_groups(*model, 5e-4), train::OptimizerOptions().kind(train::OptimizerKind::adam).fused(fused));
    if (fused && !opt.fused()) continue;  // this LibTorch has no fused kernels
    for (auto& p : model->parameters()) p.mutable_grad() = at::randn_like(p);
    const int64_t before = m.sample().allocated;
    m.reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    m.synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t params = 0, largest = 0;
    for (const auto& p : model->parameters()) params += int64_t(p.nbytes()), largest = std::max<int64_t>(largest, int64_t(p.nbytes()));
    Json j = Json::object();
    j["bench"] = "memory";
    j["case"] = fused ? "optimizer_phase_hg104_adam_fused" : "optimizer_phase_hg104_adam_in_place";
    j["device"] = device.str();
    j["parameters"] = params;
    j["largest_parameter"] = largest;
    j["phase_peak"] = m.sample().peak_allocated;  // parameters + gradients + state + the update's extra
    j["update_extra"] = m.sample().peak_allocated - before;
    j["step_seconds"] = seconds;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    opt.zero_grad();
  }
}


struct BenchOptions {
  std::string data_dir = "build/bench-memory-data", only, device_spec = "cpu";
  bool estimate_only = false;
  std::vector<std::string> sets;  // e.g. train.amp=off, memory.activation_checkpointing=all: one precision or plan per run
};

void add_options(CLI::App& app, BenchOptions& o) {
  app.add_option("--data", o.data_dir, "Where the synthetic data set is written (reused when up to date)");
  app.add_option("--only", o.only, "Run only the cases whose name contains this");
  app.add_option("--device", o.device_spec, "cpu | cuda | cuda:N");
  app.add_flag("--estimate-only", o.estimate_only, "Only the estimate and the measured peak at the batch: no automatic batch, no search");
  app.add_option("--set", o.sets, "Config overrides (key=value) for every case after its own");
}

// The synthetic data set every case trains on; returns its data YAML.
std::string synthesize_data(const std::string& dir) {
  data::SynthOptions so;
  so.out = dir;
  so.images = 160;
  so.size = 320;
  so.max_objects = 12;
  so.threads = available_cores();
  return data::synthesize(so).data_yaml;
}

// The case's model, size and batch on the synthetic data, then the --set overrides.
Config case_config(const Case& k, const std::string& data_yaml, const std::vector<std::string>& sets, c10::Device device) {
  std::vector<std::string> overrides = {"model.file=" + k.model, "data.dataset=" + data_yaml, "data.imgsz=" + std::to_string(k.imgsz),
                                        "train.batch=" + std::to_string(k.batch), "train.nominal_batch=64", "data.workers=1",
                                        "augment.mosaic=1.0", "augment.fliplr=0.5", "augment.hsv_s=0.7", "augment.scale=0.5",
                                        "augment.translate=0.1", "train.plots=false", "device=" + device.str()};
  overrides.insert(overrides.end(), sets.begin(), sets.end());
  return load_config("", overrides);
}

// The true largest batch: real training steps at each size until one does not fit. `tried` gets
// each size's measured peak.
int64_t true_largest_batch(const Config& c, const std::shared_ptr<const data::Split>& split, MemoryMonitor& m, int64_t budget,
                           const memory::MemoryEstimate& e, int64_t auto_batch, Json& tried) {
  int64_t largest = 0;
  // from two below the automatic choice (each size that fits continues the search)
  for (int64_t b = std::max<int64_t>(e.min_batch, auto_batch - 2); b <= 64; ++b) {
    Config cb = c;
    cb.train.batch = int(b);
    const int64_t peak = measured_peak(cb, split, m, budget, 1);
    tried.push_back(Json(peak));
    if (peak < 0 || peak > e.usable) break;
    largest = b;
  }
  return largest;
}

// One case: the estimate against the measured peak, the automatic batch and the true largest
// batch, as one JSON line.
void run_case(const Case& k, const Config& c, MemoryMonitor& monitor, bool estimate_only, c10::Device device) {
  const auto split = std::make_shared<const data::Split>(data::load_split(c, "train"));
  const int64_t budget = int64_t(k.budget_mib * 1048576.0);
  const auto t0 = std::chrono::steady_clock::now();
  const memory::MemoryEstimate e =
      memory::estimate_memory(c, split, monitor, budget, memory::EstimateOptions().all_modes(false));
  const double estimate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t predicted = e.predicted_peak(k.batch);
  const int64_t measured = measured_peak(c, split, monitor, 0, 2);
  const auto t1 = std::chrono::steady_clock::now();
  const memory::AutoBatch a = estimate_only ? memory::AutoBatch{} : memory::choose_batch(c, split, monitor, budget);
  const double auto_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  Json tried = Json::array();
  const int64_t largest = estimate_only ? 0 : true_largest_batch(c, split, monitor, budget, e, a.batch, tried);
  Json j = Json::object();
  j["bench"] = "memory";
  j["case"] = k.name;
  j["device"] = device.str();
  j["amp"] = c.train.amp;
  j["recompute"] = c.memory.activation_checkpointing;
  j["imgsz_max"] = e.imgsz;
  j["label_rows"] = e.max_boxes;
  j["batch"] = k.batch;
  j["predicted_peak"] = predicted;
  j["measured_peak"] = measured;
  j["error"] = measured > 0 ? double(predicted - measured) / double(measured) : 0.0;
  j["budget"] = budget;
  j["usable"] = e.usable;
  j["estimate_largest"] = e.largest_batch(e.configured());
  Json predicted_by_batch = Json::array();  // predicted_peak(b) for b = 1 .. 32, to hold against any measurement
  for (int64_t b = 1; b <= 32; ++b) predicted_by_batch.push_back(Json(e.predicted_peak(b)));
  j["predicted_peaks"] = std::move(predicted_by_batch);
  j["auto_batch"] = a.batch;  // the micro-batch, in steps of nominal_batch images
  j["auto_step_batch"] = a.step_batch;
  j["auto_batch_probes"] = int64_t(a.tried.size());
  j["true_largest"] = largest;
  j["true_largest_peaks"] = std::move(tried);
  j["estimate_seconds"] = estimate_s;
  j["estimate"] = memory::memory_estimate_json(e);  // the table's parts: what an error comes from
  j["auto_batch_seconds"] = auto_s;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"Memory estimator, automatic batch and true largest batch"};
  BenchOptions o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  set_intra_op_threads(AutoInt{});
  const c10::Device device = resolve_device(o.device_spec, query_cuda()).device;
  std::shared_ptr<MemoryMonitor> monitor = memory::make_memory_monitor(device);
  const std::string data_yaml = synthesize_data(o.data_dir);

  if (o.only.empty() || std::string("optimizer_phase_hg104").find(o.only) != std::string::npos) optimizer_phase(*monitor, device);
  const std::vector<Case> cases = {
      {"demo_yolov8n_160", "models/yolov8n.yaml", 160, 16, 384},
      {"yolov8n_320", "models/yolov8n.yaml", 320, 8, 768},
      {"centernet_hg10_256", "models/centernet_hg10.yaml", 256, 8, 768},
      {"centernet_hg104_128", "models/centernet_hg104.yaml", 128, 7, 5120},
      {"centernet_hg104_512", "models/centernet_hg104.yaml", 512, 7, 8192},
  };
  for (const Case& k : cases) {
    if (!o.only.empty() && k.name.find(o.only) == std::string::npos) continue;
    if (o.only.empty() && k.name.rfind("centernet_hg104", 0) == 0) continue;  // 10 min / hours on 2 cores: only when asked
    run_case(k, case_config(k, data_yaml, o.sets, device), *monitor, o.estimate_only, device);
  }
  return 0;
}
