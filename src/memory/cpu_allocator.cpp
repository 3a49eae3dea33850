#include "headroom/memory/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <malloc.h>

#include <cstring>

#include "headroom/core/text.h"

namespace headroom::memory {

namespace {
// The size lives in a header before the data: the deleter finds it without a lock or table.
// 64 bytes keep the data 64-byte aligned, like LibTorch's default allocator.
constexpr size_t kHeader = 64;
CountingCpuAllocator* g_instance = nullptr;
}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install() {
  static CountingCpuAllocator* instance = [] {
    // A fixed mmap threshold: glibc otherwise raises it after large blocks are freed, and later
    // tensors come from heap arenas that keep their pages — the process then holds gigabytes
    // more than the tensors the budget counts (Hourglass-104: 12.6 GB resident for 7.8 GB of
    // steps). Fixed, every block of 1 MiB or more is its own mapping, returned on free.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
    auto* a = new CountingCpuAllocator();  // never freed: tensors may outlive static destructors
    g_instance = a;
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *instance;
}

void CountingCpuAllocator::inject_oom_after(int64_t n, bool other_threads) {
  inject_thread_.store(std::this_thread::get_id());
  inject_other_.store(other_threads);
  inject_countdown_.store(n);
}

c10::DataPtr CountingCpuAllocator::allocate(size_t n) HEADROOM_ALLOCATE_CONST {
  if (inject_countdown_.load() > 0 && (std::this_thread::get_id() == inject_thread_.load()) != inject_other_.load() &&
      inject_countdown_.fetch_sub(1) == 1) {
    ooms_.fetch_add(1);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: injected failure of a ", format_bytes(double(n)),
                     " allocation (Headroom's counting CPU allocator)");
  }
  const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  const int64_t limit = limit_.load();
  if (limit > 0 && now > limit) {
    current_.fetch_sub(static_cast<int64_t>(n));
    ooms_.fetch_add(1);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", format_bytes(double(n)),
                     " with ", format_bytes(double(now - int64_t(n))), " in use under a budget of ",
                     format_bytes(double(limit)), " (Headroom's counting CPU allocator)");
  }
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  auto* base = static_cast<uint8_t*>(c10::alloc_cpu(n + kHeader));
  std::memcpy(base, &n, sizeof n);
  void* data = base + kHeader;
  return {data, data, &CountingCpuAllocator::release, c10::Device(c10::kCPU)};
}

void CountingCpuAllocator::release(void* ptr) {
  if (!ptr) return;
  auto* base = static_cast<uint8_t*>(ptr) - kHeader;
  size_t n = 0;
  std::memcpy(&n, base, sizeof n);
  g_instance->current_.fetch_sub(static_cast<int64_t>(n));
  c10::free_cpu(base);
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const { return &CountingCpuAllocator::release; }

}  // namespace headroom::memory
