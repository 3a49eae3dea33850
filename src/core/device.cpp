#include "headroom/core/device.h"

#include <cstdio>
#include <fstream>
#ifdef __GLIBC__  // defined by <cstdio>'s <features.h>
#include <malloc.h>
#endif

#include "headroom/core/errors.h"
#include "headroom/core/text.h"

namespace headroom {

#ifdef HEADROOM_WITH_CUDA
DeviceMemory cuda_device_memory(int index);  // device_cuda.cpp
void set_cuda_device(int index);             // device_cuda.cpp
#endif

HostMemory host_memory() {
  HostMemory h;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") h.total = kb * 1024;
    if (key == "MemAvailable:") h.available = kb * 1024;
  }
  return h;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kb) == 1) m.rss = kb * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kb) == 1) m.peak_rss = kb * 1024;
  }
  return m;
}

void return_free_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

DeviceMemory device_memory(c10::Device device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) return cuda_device_memory(device.has_index() ? device.index() : 0);
#endif
  (void)device;
  DeviceMemory m;
  const ProcessMemory p = process_memory();
  m.allocated = m.reserved = p.rss;
  m.peak = p.peak_rss;
  return m;
}

void set_current_device(c10::Device device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda() && device.has_index()) set_cuda_device(device.index());
#endif
  (void)device;
}

#ifndef HEADROOM_WITH_CUDA
CudaStatus query_cuda() {
  CudaStatus s;
  s.reason =
      "this build links a CPU-only LibTorch; build against a CUDA LibTorch (make test-cuda "
      "shows how: -DCMAKE_PREFIX_PATH=<libtorch with CUDA>)";
  return s;
}
#endif

DeviceChoice resolve_device(const std::string& spec, const CudaStatus& cuda) {
  DeviceChoice choice;
  if (spec == "cpu") return choice;
  if (spec == "auto") {
    if (cuda.available) {
      choice.device = c10::Device(c10::kCUDA, 0);
    } else {
      choice.warning = "device auto: NO GPU, running on the CPU because " + cuda.reason +
                       ". Set device: cpu to silence this, or fix CUDA to train on the GPU.";
    }
    return choice;
  }
  int index = 0;
  if (spec != "cuda") {
    const auto n = spec.rfind("cuda:", 0) == 0 ? parse_int(spec.substr(5)) : std::nullopt;
    if (!n || *n < 0) throw DeviceError("device '" + spec + "' is not valid; use auto, cpu, cuda or cuda:N");
    index = static_cast<int>(*n);
  }
  if (!cuda.available)
    throw DeviceError("device " + spec + " requested, but CUDA is not usable: " + cuda.reason +
                      ". Use device: cpu (or auto) to run on the CPU.");
  if (index >= static_cast<int>(cuda.devices.size())) {
    std::string list;
    for (const auto& d : cuda.devices)
      list += (list.empty() ? "" : ", ") + ("cuda:" + std::to_string(d.index) + " (" + d.name + ")");
    throw DeviceError("device " + spec + " requested, but this machine has " +
                      std::to_string(cuda.devices.size()) + " CUDA device(s): " + list +
                      ". Pick one of those (CUDA_VISIBLE_DEVICES renumbers them from 0).");
  }
  choice.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  return choice;
}

Json cuda_status_json(const CudaStatus& s) {
  Json::Members m = {{"built", s.built}, {"available", s.available}};
  if (!s.reason.empty()) m.emplace_back("reason", s.reason);
  Json devices = Json::array();
  for (const auto& d : s.devices)
    devices.push_back(Json::object({{"index", d.index}, {"name", d.name}, {"total_memory", d.total_memory},
                                    {"compute_capability", std::to_string(d.major) + "." + std::to_string(d.minor)}}));
  m.insert(m.end(), {{"runtime_version", s.runtime_version}, {"cudnn", s.cudnn}, {"cudnn_version", s.cudnn_version},
                     {"devices", std::move(devices)}});
  return Json::object(std::move(m));
}

}  // namespace headroom
