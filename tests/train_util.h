// Helpers for tests that train: a tiny YOLOv8 run on the small synthetic set, test losses,
// a hook that freezes BatchNorm, parameter snapshots, trainer processes and their files.
#pragma once

#include <ATen/ATen.h>

#include <sys/wait.h>
#include <torch/serialize/input-archive.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "headroom/cli/run.h"
#include "headroom/core/config.h"
#include "headroom/losses/loss.h"
#include "headroom/memory/monitor.h"
#include "headroom/models/weights.h"
#include "headroom/train/trainer.h"
#include "test_util.h"

namespace headroom::test {

// Overrides of a tiny CPU run (64 px, batch 4 of nominal 8, one decode thread) plus `extra`.
inline std::vector<std::string> tiny_run(std::vector<std::string> extra, const std::string& model = "yolov8.yaml") {
  std::vector<std::string> o = tiny_model(model);
  for (const char* k : {"data.imgsz=64", "data.workers=1", "threads=1", "train.batch=4", "train.nominal_batch=8", "train.plots=false",
                        "train.log_every=1", "device=cpu"})
    o.push_back(k);
  o.push_back("data.dataset=" + small_synth());
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// A loss that is a sum over images of the predictions' squares: parts of a batch add up exactly.
class PerImageSumLoss : public losses::DetectionLoss {
 public:
  std::vector<std::string> term_names() const override { return {"sq"}; }
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&, const losses::StepNorm&) override {
    at::Tensor total = at::zeros({});
    for (const auto& level : outputs.at("pred")) total = total + level.pow(2).mean({1, 2, 3}).sum();
    return {total, total.detach().reshape({1}), {}};
  }
};

class NanLoss : public losses::DetectionLoss {
 public:
  std::vector<std::string> term_names() const override { return {"nan"}; }
  losses::LossTerms operator()(const models::HeadOutputs& outputs, const losses::Targets&, const losses::StepNorm&) override {
    const at::Tensor total = outputs.at("pred")[0].sum() * NAN;
    return {total, total.detach().reshape({1}), {}};
  }
};

// Keeps BatchNorm in eval mode, so batch statistics do not depend on how a step is cut.
class EvalModeBatchNorm : public train::Hook {
 public:
  void before_step(train::Trainer& t) override { t.model().eval(); }
};

inline std::vector<at::Tensor> params_of(models::DetectorImpl& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// The largest difference between two parameter lists, relative to the largest value of `b`.
// Infinite when either holds a non-finite value or `b` is all zeros (nothing to compare).
inline double relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::isfinite(a[i]).all().item<bool>() || !at::isfinite(b[i]).all().item<bool>()) return INFINITY;
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    largest = std::max(largest, b[i].abs().max().item<double>());
  }
  return largest > 0 ? worst / largest : INFINITY;
}

// The run's parts on the CPU, with the CPU memory monitor (the memory governor needs one).
inline train::TrainerParts parts_for(const Config& c, const std::string& dir) {
  at::manual_seed(0);
  train::TrainerParts p = train::make_trainer_parts(c, c10::Device(c10::kCPU), dir);
  p.monitor = memory::make_memory_monitor(c10::Device(c10::kCPU));
  return p;
}

// The run `trainer train` builds from `c` (cli::build_run: the governor runs its steps, the
// default hooks), in `dir`; `adjust` changes its parts (a test's loss).
inline cli::Run run_for(const Config& c, const std::string& dir, std::function<void(train::TrainerParts&)> adjust = {}) {
  cli::RunOptions o;
  o.run_dir = dir;
  o.adjust = std::move(adjust);
  return cli::build_run(c, c10::Device(c10::kCPU), o);
}

// A config file holding `overrides` (what `trainer train --config` reads).
inline std::string config_file(const std::string& dir, const std::vector<std::string>& overrides) {
  const std::string path = dir + "/run.yaml";
  write_bytes(path, config_to_yaml(load_config("", overrides)));
  return path;
}

// Starts `trainer args` in the background with its output in `log`.
inline pid_t spawn_trainer(const std::string& args, const std::string& log) {
  const std::string cmd = "exec " + std::string(HEADROOM_TRAINER) + " " + args + " >> " + log + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

inline bool wait_until(const std::function<bool()>& done, double seconds, std::chrono::milliseconds poll) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return false;
}

inline bool wait_for_file(const std::string& path, double seconds) {
  return wait_until([&] { return std::filesystem::exists(path); }, seconds, std::chrono::milliseconds(5));
}

// Polled every millisecond: a test reacts to what a process says while it is still at that point.
inline bool wait_for_text(const std::string& path, const std::string& text, double seconds) {
  return wait_until([&] { return read_bytes(path).find(text) != std::string::npos; }, seconds, std::chrono::milliseconds(1));
}

inline int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The raw (non-EMA) model and the EMA model of a checkpoint.
inline std::pair<models::Detector, models::Detector> checkpoint_models(const std::string& path) {
  models::LoadedWeights w = models::load_weights(path, c10::Device(c10::kCPU));
  models::ModelSpec spec;
  spec.file = w.model->yaml_file();
  spec.text = w.model->yaml_text();
  spec.scale = w.model->scale();
  spec.nc = w.model->info().nc;
  models::Detector raw(spec);
  torch::serialize::InputArchive root, ck, m;
  models::load_archive_verified(root, path, c10::Device(c10::kCPU), "checkpoint");
  root.read("checkpoint", ck);
  ck.read("model", m);
  raw->load(m);
  return {raw, w.model};
}

inline bool same_tensors(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  if (pa.size() != pb.size() || ba.size() != bb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i)
    if (!at::equal(pa[i].value(), pb[i].value())) return false;
  for (size_t i = 0; i < ba.size(); ++i)
    if (!at::equal(ba[i].value(), bb[i].value())) return false;
  return true;
}

// results.csv without the columns that measure time.
inline std::vector<std::vector<std::string>> record_of(const std::string& csv) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(read_bytes(csv));
  std::string line;
  std::vector<bool> keep;
  while (std::getline(in, line)) {
    std::vector<std::string> cells, kept;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (keep.empty())
      for (const auto& c : cells) keep.push_back(c.rfind("time/", 0) != 0 && c.rfind("speed/", 0) != 0);
    for (size_t i = 0; i < cells.size(); ++i)
      if (i < keep.size() && keep[i]) kept.push_back(cells[i]);
    rows.push_back(kept);
  }
  return rows;
}

}  // namespace headroom::test
