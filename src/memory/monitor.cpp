#include "headroom/memory/monitor.h"

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/memory/cpu_allocator.h"

namespace headroom::memory {

#ifdef HEADROOM_WITH_CUDA
std::unique_ptr<MemoryMonitor> make_cuda_monitor(c10::Device device);  // monitor_cuda.cpp
void set_cuda_allocator_settings(const std::string& settings);
#endif

namespace {

class CpuMonitor final : public MemoryMonitor {
 public:
  CpuMonitor() : MemoryMonitor(c10::Device(c10::kCPU)), alloc_(CachingCpuAllocator::install()) {}
  MemoryStats sample() const override {
    const CpuAllocatorStats a = alloc_.stats();
    MemoryStats s;
    s.allocated = a.allocated;
    s.active = a.active;
    s.reserved = a.reserved();
    s.peak_allocated = a.peak_allocated;
    s.peak_active = a.peak_active;
    s.peak_reserved = a.peak_reserved;
    s.ooms = a.ooms;
    s.limit = a.limit;
    return s;
  }
  void reset_peak() override { alloc_.reset_peak(); }
  int64_t capacity() const override { return host_memory().total; }
  int64_t available() const override { return host_memory().available + alloc_.stats().reserved(); }
  void set_limit(int64_t bytes) override { alloc_.set_limit(bytes); }
  void release_cache() override { alloc_.release_cache(); }
  void phase_ended() override { alloc_.release_cache(); }

 private:
  CachingCpuAllocator& alloc_;
};

}  // namespace

Json memory_stats_json(const MemoryStats& s) {
  return Json::object({{"allocated", s.allocated}, {"reserved", s.reserved}, {"active", s.active},
                       {"peak_allocated", s.peak_allocated}, {"peak_active", s.peak_active}, {"peak_reserved", s.peak_reserved},
                       {"alloc_retries", s.alloc_retries}, {"ooms", s.ooms}, {"limit", s.limit},
                       {"fragmentation", s.fragmentation()}});
}

std::unique_ptr<MemoryMonitor> make_memory_monitor(c10::Device device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) return make_cuda_monitor(device);
#endif
  if (!device.is_cpu()) throw DeviceError("no memory monitor for device " + device.str() + " in this build");
  return std::make_unique<CpuMonitor>();
}

int64_t resolve_budget(const MemoryBudgetSpec& spec, const MemoryMonitor& monitor) {
  const int64_t capacity = monitor.capacity();
  switch (spec.kind) {
    case MemoryBudgetSpec::Kind::automatic: return monitor.available();
    case MemoryBudgetSpec::Kind::fraction: {
      const int64_t bytes = int64_t(spec.value * double(capacity));
      if (bytes < (int64_t(1) << 20))  // 0 would mean no limit at all
        throw InputError("memory.budget " + std::to_string(spec.value) + " of " + monitor.device().str() + "'s " +
                         format_bytes(double(capacity)) + " is under 1 MiB; give a larger share, a size, or auto");
      return bytes;
    }
    case MemoryBudgetSpec::Kind::bytes:
      if (capacity > 0 && spec.value > double(capacity))
        throw InputError("memory.budget " + format_bytes(spec.value) + " is more than " + monitor.device().str() + " has (" +
                         format_bytes(double(capacity)) + "); give a smaller size, a fraction, or auto");
      return int64_t(spec.value);
  }
  return 0;
}

std::string allocator_settings(const MemoryConfig& m) {
  std::string s;
  const auto add = [&](const std::string& kv) { s += (s.empty() ? "" : ",") + kv; };
  if (m.max_split_size_mb > 0) add("max_split_size_mb:" + std::to_string(m.max_split_size_mb));
  if (m.garbage_collection_threshold > 0) add(fmt::format("garbage_collection_threshold:{}", m.garbage_collection_threshold));
  if (m.expandable_segments) add("expandable_segments:True");
  return s;
}

void apply_allocator_settings(const MemoryConfig& m, c10::Device device) {
  const std::string settings = allocator_settings(m);
  if (settings.empty()) return;
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) {
    set_cuda_allocator_settings(settings);
    spdlog::info("CUDA allocator settings: {}", settings);
    return;
  }
#endif
  spdlog::warn("memory: {} are CUDA allocator settings; they do nothing on {}", settings, device.str());
}

}  // namespace headroom::memory
