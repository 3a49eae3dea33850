// bench_models: per model and size, the forward time (inference) and the training step
// (forward + backward) time and memory on the CPU, measured with the CPU allocator:
// parameters + gradients (the baseline) and the activation peak above it, for each
// recompute mode asked for (activation checkpointing). One JSON line per measurement.
//   bench_models [--only NAME] [--repeat 2]
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>

#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/threads.h"
#include "headroom/memory/cpu_allocator.h"
#include "headroom/memory/measure.h"
#include "headroom/models/detector.h"

using namespace headroom;
using namespace headroom::models;

namespace {

struct Case {
  std::string name, file;
  int64_t imgsz, batch;
  std::vector<RecomputeMode> modes;
};

at::Tensor loss_of(const HeadOutputs& o) {
  at::Tensor l = at::zeros({});
  for (const auto& [name, list] : o)
    for (const auto& t : list) l = l + t.to(at::kFloat).pow(2).mean();
  return l;
}

double seconds_of(const std::function<void()>& fn, int repeat) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"Model speed and memory benchmark (CPU)"};
  std::string only;
  int repeat = 2;
  app.add_option("--only", only, "Run only the cases whose name contains this");
  app.add_option("--repeat", repeat, "Timed repetitions (the best is reported)");
  CLI11_PARSE(app, argc, argv);
  set_intra_op_threads(AutoInt{});
  auto& alloc = memory::CachingCpuAllocator::install();

  const std::string dir = std::string(HEADROOM_SOURCE_DIR) + "/models/";
  const std::vector<RecomputeMode> off = {RecomputeMode::off};
  const std::vector<RecomputeMode> every = {RecomputeMode::off, RecomputeMode::stages, RecomputeMode::all};
  const std::vector<Case> cases = {
      {"yolov8n", "yolov8n.yaml", 320, 1, off},      {"yolov8n", "yolov8n.yaml", 640, 1, every},
      {"yolov8s", "yolov8s.yaml", 640, 1, off},      {"yolov5s", "yolov5s.yaml", 640, 1, off},
      {"yolo26n", "yolo26n.yaml", 640, 1, off},
      {"centernet_csp_s", "centernet_csp_s.yaml", 512, 1, off},
      {"centernet_hg52", "centernet_hg52.yaml", 256, 2, off},
      {"centernet_hg52", "centernet_hg52.yaml", 512, 1, off},
      {"centernet_hg104", "centernet_hg104.yaml", 256, 2, every},
  };
  for (const Case& c : cases) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    ModelSpec spec;
    spec.file = dir + c.file;
    spec.nc = 80;
    Detector d(spec);
    const at::Tensor x = at::rand({c.batch, 3, c.imgsz, c.imgsz});
    const int64_t param_bytes = d->parameter_count() * 4;
    d->eval();
    double forward_s, one_to_one_s = 0;
    {
      at::NoGradGuard no_grad;
      d->forward(x);  // warm-up
      forward_s = seconds_of([&] { d->forward(x); }, repeat);
      if (d->info().end2end) {  // what validation and predict run: the one-to-one branch alone
        d->head().set_one_to_one_only(true);
        one_to_one_s = seconds_of([&] { d->forward(x); }, repeat);
        d->head().set_one_to_one_only(false);
      }
    }
    d->train();
    double off_step = 0;
    int64_t off_peak = 0;
    for (RecomputeMode mode : c.modes) {
      d->set_recompute(mode);
      loss_of(d->forward(x)).backward();  // warm-up; allocates the gradients
      d->zero_grad(/*set_to_none=*/false);
      const memory::StepMemory m = memory::measure_cpu_step([&] { loss_of(d->forward(x)).backward(); });
      const double step_s = std::min(m.seconds, seconds_of([&] { loss_of(d->forward(x)).backward(); }, repeat - 1 > 0 ? repeat - 1 : 0) );
      if (mode == RecomputeMode::off) off_step = step_s, off_peak = m.above_baseline();
      Json j = Json::object();
      j["bench"] = "models";
      j["model"] = c.name;
      j["imgsz"] = c.imgsz;
      j["batch"] = c.batch;
      j["recompute"] = to_string(mode);
      j["params"] = d->parameter_count();
      j["forward_s"] = forward_s;
      if (one_to_one_s > 0) j["forward_one_to_one_s"] = one_to_one_s;
      j["train_step_s"] = step_s;
      j["param_and_grad_bytes"] = 2 * param_bytes;
      j["baseline_bytes"] = m.baseline;
      j["activation_peak_bytes"] = m.above_baseline();
      if (mode != RecomputeMode::off) {
        j["activation_drop"] = 1.0 - double(m.above_baseline()) / double(off_peak);
        j["step_time_ratio"] = step_s / off_step;
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    (void)alloc;
  }
  return 0;
}
