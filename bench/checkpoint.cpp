// bench_checkpoint: the host memory a checkpoint costs. A CenterNet Hourglass-104 run with Adam
// and EMA (the TF OD API user's model: parameters, two moments and the average, ~3 GB) is built
// as `trainer train` builds its run and trains one step (the peak a snapshot must fit beside),
// then saved and loaded back; the process's peak resident memory above what it held
// before each is the cost (target: at most 10% of the file while saving, when the step waits for
// the file). --async writes it behind the training instead (train.async_checkpoints): the step is
// held for the snapshot only (save_held_seconds), and the snapshot costs host memory the size of
// the state. On CUDA (--device cuda) the snapshot also holds the compute stream, which the next
// step queues behind: *_held_device_seconds is the device time between marks on it before and
// after a save (staged: a copy on the device; --unstaged: the copy to the host itself); the
// second save's is the steady state, the first one's includes mapping the pinned buffers. One
// JSON line.
//   bench_checkpoint [--model models/centernet_hg104.yaml] [--dir DIR] [--async] [--device cuda [--unstaged]]
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "headroom/cli/run.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/stream.h"
#include "headroom/core/threads.h"
#include "headroom/data/synth.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/trainer.h"

using namespace headroom;
namespace fs = std::filesystem;

namespace {

// A /proc/self/status field in bytes (VmRSS, VmHWM).
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

// Resets the peak resident size to the current one (Linux clear_refs 5).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"Host memory of saving and loading a big checkpoint"};
  std::string model = std::string(HEADROOM_SOURCE_DIR) + "/models/centernet_hg104.yaml", dir = "build/bench-checkpoint";
  app.add_option("--model", model, "Model file");
  app.add_option("--dir", dir, "Where the data set and the checkpoint are written");
  bool async = false;
  app.add_flag("--async", async, "Write the checkpoint on a thread from a snapshot");
  std::string device_name = "cpu";
  app.add_option("--device", device_name, "cpu or cuda");
  bool unstaged = false;
  app.add_flag("--unstaged", unstaged, "No room for a snapshot beside the step, as under a tight budget (CUDA: unstaged; CPU: the step writes)");
  CLI11_PARSE(app, argc, argv);
  const c10::Device device(device_name);
  set_intra_op_threads(AutoInt{});

  data::SynthOptions so;
  so.out = dir + "/data";
  so.images = 8;
  so.size = 128;
  const std::string yaml = data::synthesize(so).data_yaml;
  const Config c = load_config("", {"model.file=" + model, "data.dataset=" + yaml, "data.imgsz=128", "train.batch=2",
                                    "train.nominal_batch=2", "train.steps=1", "train.optimizer=adam", "train.ema=true",
                                    "data.workers=0", "device=" + device_name});
  cli::RunOptions o;
  o.run_dir = dir;
  o.default_hooks = false;
  o.adjust = [&](train::TrainerParts& parts) {
    parts.options.async_checkpoints(async);
    if (unstaged) parts.options.memory_usable(1);  // no snapshot fits beside the step
  };
  cli::Run run = cli::build_run(c, device, o);
  train::Trainer& t = *run.trainer;
  t.train();
  const std::string path = dir + "/weights/bench.pt";

  const int64_t before_save = status_bytes("VmRSS");
  reset_peak_rss();
  DeviceClock clock(device);
  size_t mark = clock.mark();
  auto t0 = std::chrono::steady_clock::now();
  t.save_checkpoint(path);
  const double held_s = seconds_since(t0);
  clock.mark();
  t.wait_for_checkpoints();
  const double save_s = seconds_since(t0);
  const double held_device_s = clock.seconds(mark, mark + 1);
  const int64_t save_peak = status_bytes("VmHWM") - before_save;
  const int64_t bytes = int64_t(fs::file_size(path));
  // Again, as every later checkpoint of a run is: buffers the first one mapped may be reused.
  mark = clock.mark();
  t0 = std::chrono::steady_clock::now();
  t.save_checkpoint(path);
  const double again_held_s = seconds_since(t0);
  clock.mark();
  t.wait_for_checkpoints();
  const double again_held_device_s = clock.seconds(mark, mark + 1);

  const int64_t before_find = status_bytes("VmRSS");
  reset_peak_rss();
  t0 = std::chrono::steady_clock::now();
  train::checkpoint_meta(path);  // what --resume auto does to each candidate
  const double verify_s = seconds_since(t0);
  const int64_t verify_peak = status_bytes("VmHWM") - before_find;

  const int64_t before_load = status_bytes("VmRSS");
  reset_peak_rss();
  t0 = std::chrono::steady_clock::now();
  t.load_checkpoint(path);
  const double load_s = seconds_since(t0);
  const int64_t load_peak = status_bytes("VmHWM") - before_load;

  Json j = Json::object();
  j["bench"] = "checkpoint";
  j["model"] = fs::path(model).filename().string();
  j["parameters"] = t.model().parameter_count();
  j["checkpoint_bytes"] = bytes;
  j["async"] = async;
  j["device"] = device.str();
  j["unstaged"] = unstaged;
  j["save_held_device_seconds"] = held_device_s;
  j["again_held_device_seconds"] = again_held_device_s;
  j["save_held_seconds"] = held_s;
  j["save_seconds"] = save_s;
  j["again_held_seconds"] = again_held_s;
  j["save_rss_increase_bytes"] = save_peak;
  j["save_rss_increase_share"] = double(save_peak) / double(bytes);
  j["verify_seconds"] = verify_s;
  j["verify_rss_increase_bytes"] = verify_peak;
  j["load_seconds"] = load_s;
  j["load_rss_increase_bytes"] = load_peak;
  j["load_rss_increase_share"] = double(load_peak) / double(bytes);
  std::printf("%s\n", j.dump().c_str());
  fs::remove(path);
  return 0;
}
