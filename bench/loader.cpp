// bench_loader: images per second for decode + letterbox + collate with 1, 2 and all decode
// threads, decoding JPEGs ("decode") and from the decoded cache ("ram", "disk"; building the
// shard is its own line). One JSON line per measurement on stdout.
//   bench_loader [--out DIR] [--images 256] [--size 640] [--imgsz 640] [--batch 16] [--device auto]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/threads.h"
#include "headroom/data/loader.h"
#include "headroom/data/synth.h"

using namespace headroom;
using namespace headroom::data;

namespace {

struct Measurement {
  double seconds = 0;
  double wait_seconds = 0;
  int64_t images = 0;
};

Measurement run_epoch(const std::shared_ptr<const Split>& split, const LoaderOptions& o) {
  Loader loader(split, o);
  const auto t0 = std::chrono::steady_clock::now();
  loader.start(0);
  Measurement m;
  while (auto b = loader.next()) m.images += b->size();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.wait_seconds = loader.stats().wait_seconds;
  return m;
}

void emit(const std::string& mode, int workers, const LoaderOptions& o, const Measurement& m, bool pinned) {
  Json j = Json::object();
  j["bench"] = "loader";
  j["mode"] = mode;
  j["workers"] = workers;
  j["batch"] = o.batch();
  j["imgsz"] = o.imgsz();
  j["pinned"] = pinned;
  j["images"] = m.images;
  j["seconds"] = m.seconds;
  j["images_per_s"] = m.images / m.seconds;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"Loader throughput benchmark"};
  std::string out = "build/bench-data", device = "auto";
  int images = 256, size = 640, imgsz = 640, batch = 16;
  app.add_option("--out", out, "Folder for the synthetic JPEGs and cache shard");
  app.add_option("--images", images, "Images in the set");
  app.add_option("--size", size, "Long side of the synthetic JPEGs");
  app.add_option("--imgsz", imgsz, "Loader canvas");
  app.add_option("--batch", batch, "Batch size");
  app.add_option("--device", device, "auto | cpu | cuda: pinned batches when CUDA is used");
  CLI11_PARSE(app, argc, argv);
  try {
    const DeviceChoice dev = resolve_device(device, query_cuda());
    const bool pinned = dev.device.is_cuda();
    SynthOptions so;
    so.out = out;
    so.images = images;
    so.size = size;
    so.val_fraction = 0;
    so.max_objects = 8;
    so.threads = available_cores();
    const SynthSummary s = synthesize(so);
    ScanOptions scan;
    scan.threads = available_cores();
    auto split = std::make_shared<const Split>(scan_split(read_data_yaml(s.data_yaml), "train", scan));

    std::set<int> counts = {1, 2, available_cores()};
    const LoaderOptions base = LoaderOptions().batch(batch).imgsz(imgsz).prefetch(4).pin_memory(pinned);
    for (int w : counts) {
      run_epoch(split, LoaderOptions(base).workers(w));  // warm the page cache
      emit("decode", w, base, run_epoch(split, LoaderOptions(base).workers(w)), pinned);
    }
    const std::string shard = (std::filesystem::path(out) / "bench.hrcache").string();
    std::filesystem::remove(shard);
    {
      const auto t0 = std::chrono::steady_clock::now();
      Loader build(split, LoaderOptions(base).workers(available_cores()).cache(CacheMode::disk).shard_path(shard));
      Measurement m;
      m.images = static_cast<int64_t>(split->samples.size());
      m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      emit("disk_build", available_cores(), base, m, pinned);
    }
    for (CacheMode mode : {CacheMode::ram, CacheMode::disk})
      for (int w : counts) {
        const LoaderOptions o = LoaderOptions(base).workers(w).cache(mode).shard_path(shard);
        emit(to_string(mode), w, base, run_epoch(split, o), pinned);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    return dynamic_cast<const InputError*>(&e) || dynamic_cast<const DeviceError*>(&e) ? kExitBadInput : kExitFailure;
  }
  return 0;
}
