#include <ATen/Context.h>
#include <torch/version.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "headroom/core/device.h"
#include "headroom/core/text.h"
#include "headroom/core/threads.h"

namespace headroom::cli {

namespace {

// The BLAS LibTorch's matrix products run on: MKL when LibTorch carries it (the PyPI wheel),
// else the libblas.so.3 the process mapped (Debian's alternatives pick the reference BLAS or
// OpenBLAS), read from /proc/self/maps.
std::string blas_in_use() {
  if (at::hasMKL()) return "MKL (in LibTorch)";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = std::filesystem::path(path).filename().string();
    if (name.rfind("libblas.so", 0) == 0 || name.rfind("libopenblas", 0) == 0) {
      const bool openblas = path.find("openblas") != std::string::npos;
      return std::string(openblas ? "OpenBLAS" : "reference BLAS (slow: apt-get install libopenblas0-pthread)") + ", " + path;
    }
  }
  return "none found";
}

}  // namespace

void add_version_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("version", "Headroom and LibTorch versions, CUDA / cuDNN, devices");
  static bool json = false;
  cmd->add_flag("--json", json, "Print JSON");
  cmd->callback([&exit_code] {
    const CudaStatus cuda = query_cuda();
    const DeviceChoice automatic = resolve_device("auto", cuda);
    if (json) {
      Json j = Json::object();
      j["headroom"] = HEADROOM_VERSION;
      j["libtorch"] = TORCH_VERSION;
      j["cpu_threads"] = available_cores();
      j["blas"] = blas_in_use();
      j["cuda"] = cuda_status_json(cuda);
      j["auto_device"] = automatic.device.str();
      print_json(j);
    } else {
      std::printf("Headroom %s\n", HEADROOM_VERSION);
      std::printf("LibTorch %s (%s)\n", TORCH_VERSION, cuda.built ? ("built with CUDA " + cuda.runtime_version).c_str() : "CPU only");
      std::printf("CUDA     %s\n", cuda.available ? "available" : ("not available: " + cuda.reason).c_str());
      std::printf("cuDNN    %s\n", cuda.cudnn ? ("available, version " + std::to_string(cuda.cudnn_version)).c_str() : "not available");
      std::printf("cpu      %d threads\n", available_cores());
      std::printf("BLAS     %s\n", blas_in_use().c_str());
      for (const auto& d : cuda.devices)
        std::printf("cuda:%d   %s, %s, compute capability %d.%d\n", d.index, d.name.c_str(),
                    format_bytes(double(d.total_memory)).c_str(), d.major, d.minor);
      std::printf("device auto -> %s\n", automatic.device.str().c_str());
    }
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
