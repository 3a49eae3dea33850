#include "headroom/memory/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "headroom/core/text.h"

namespace headroom::memory {

namespace {
// Every block starts with a header: the bytes asked for and the block's own size (0 = malloc'd),
// so the deleter needs no table. 64 bytes keep the data 64-byte aligned, like LibTorch's default.
constexpr size_t kHeader = 64;
struct Header {
  size_t requested;
  size_t block;
};
// A block is the request rounded up to whole pages; a request takes the smallest cached block
// that is at least its size and at most an eighth larger (the same tensor of the last step,
// or one of nearly its size in a multi-scale step), never a larger one, which a later large
// tensor will want: a fixed-shape step finds every block it needs, and holds no more than its
// tensors do.
constexpr size_t kFitNum = 9, kFitDen = 8;
// The cache holds at most twice the largest working set seen since it was last emptied: a step's
// blocks over its whole timeline (the forward's activations, the backward's temporaries of other
// sizes) are more than its peak in use (YOLOv5n at 320 px, batch 16: 1.24x), and a step that finds
// them all maps nothing. It is always allowed kMinCache, however small the working set so far.
constexpr int64_t kCacheOverWorkingSet = 2;
constexpr int64_t kMinCache = int64_t(64) << 20;

CachingCpuAllocator* g_instance = nullptr;

size_t page_size() {
  static const size_t p = size_t(::sysconf(_SC_PAGESIZE));
  return p;
}
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void raise(std::atomic<int64_t>& peak, int64_t value) {
  int64_t p = peak.load();
  while (value > p && !peak.compare_exchange_weak(p, value)) {
  }
}
}  // namespace

CachingCpuAllocator& CachingCpuAllocator::install() {
  static CachingCpuAllocator* instance = [] {
    auto* a = new CachingCpuAllocator();  // never freed: tensors may outlive static destructors
    g_instance = a;
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *instance;
}

void CachingCpuAllocator::inject_oom_after(int64_t n, bool other_threads) {
  inject_thread_.store(std::this_thread::get_id());
  inject_other_.store(other_threads);
  inject_countdown_.store(n);
}

void CachingCpuAllocator::out_of_memory(size_t n, const char* why) const {
  ooms_.fetch_add(1);
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", format_bytes(double(n)), " with ",
                   format_bytes(double(allocated_.load())), " in use", why, " (Headroom's CPU allocator)");
}

c10::DataPtr CachingCpuAllocator::allocate(size_t n) HEADROOM_ALLOCATE_CONST {
  if (inject_countdown_.load() > 0 && (std::this_thread::get_id() == inject_thread_.load()) != inject_other_.load() &&
      inject_countdown_.fetch_sub(1) == 1) {
    ooms_.fetch_add(1);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: injected failure of a ", format_bytes(double(n)),
                     " allocation (Headroom's CPU allocator)");
  }
  void* base = nullptr;
  size_t block = 0;
  if (n + kHeader < kCachedFrom) {
    const size_t bytes = n + kHeader;
    reserve(bytes, n, /*locked=*/false);
    try {
      base = c10::alloc_cpu(bytes);
    } catch (...) {
      active_.fetch_sub(int64_t(bytes));
      throw;
    }
  } else {
    base = allocate_block(round_up(n + kHeader, page_size()), n, &block);
  }
  const Header h{n, block};
  std::memcpy(base, &h, sizeof h);
  raise(peak_allocated_, allocated_.fetch_add(int64_t(n)) + int64_t(n));
  raise_peaks();
  void* data = static_cast<uint8_t*>(base) + kHeader;
  return {data, data, &CachingCpuAllocator::release, c10::Device(c10::kCPU)};
}

void* CachingCpuAllocator::allocate_block(size_t bytes, size_t n, size_t* block) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_size_.lower_bound(bytes);
  if (it != by_size_.end() && it->first * kFitDen <= bytes * kFitNum) {
    *block = it->first;
    void* base = it->second.base;
    by_age_.erase(it->second.age);
    by_size_.erase(it);
    // Up before down: a reader between the two (reserve's check, without the lock) over-counts.
    active_.fetch_add(int64_t(*block));
    cached_.fetch_sub(int64_t(*block));
    working_set_ = std::max(working_set_, active_.load());
    return base;
  }
  *block = bytes;
  reserve(bytes, n, /*locked=*/true);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    active_.fetch_sub(int64_t(bytes));
    out_of_memory(n, ": the system refused the mapping");
  }
  working_set_ = std::max(working_set_, active_.load());
  mappings_.fetch_add(1);
  return base;
}

void CachingCpuAllocator::reserve(size_t bytes, size_t n, bool locked) const {
  active_.fetch_add(int64_t(bytes));
  const int64_t limit = limit_.load();
  if (limit <= 0 || active_.load() + cached_.load() <= limit) return;
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);  // the cache is touched only near the limit
  if (!locked) lock.lock();
  bool evicted = false;
  while (active_.load() + cached_.load() > limit && !by_age_.empty()) evict_oldest(), evicted = true;
  if (evicted) evictions_.fetch_add(1);
  if (active_.load() + cached_.load() > limit) {
    active_.fetch_sub(int64_t(bytes));
    out_of_memory(n, (" under a budget of " + format_bytes(double(limit))).c_str());
  }
}

void CachingCpuAllocator::evict_oldest() const {
  auto oldest = by_age_.begin();
  const auto it = oldest->second;
  ::munmap(it->second.base, it->first);
  cached_.fetch_sub(int64_t(it->first));
  by_size_.erase(it);
  by_age_.erase(oldest);
}

void CachingCpuAllocator::free_block(void* base, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  cached_.fetch_add(int64_t(bytes));  // up before down, as in allocate_block
  active_.fetch_sub(int64_t(bytes));
  const uint64_t age = clock_++;
  by_age_.emplace(age, by_size_.emplace(bytes, Cached{base, age}));
  // More cached than the largest working set so far is memory no step has needed at once.
  while (cached_.load() > std::max(kCacheOverWorkingSet * working_set_, kMinCache)) evict_oldest();
}

void CachingCpuAllocator::release(void* ptr) {
  if (!ptr) return;
  void* base = static_cast<uint8_t*>(ptr) - kHeader;
  Header h;
  std::memcpy(&h, base, sizeof h);
  CachingCpuAllocator& a = *g_instance;
  a.allocated_.fetch_sub(int64_t(h.requested));
  if (h.block == 0) {
    a.active_.fetch_sub(int64_t(h.requested + kHeader));
    c10::free_cpu(base);
  } else {
    a.free_block(base, h.block);
  }
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const { return &CachingCpuAllocator::release; }

void CachingCpuAllocator::raise_peaks() const {
  raise(peak_active_, active_.load());
  raise(peak_reserved_, active_.load() + cached_.load());
}

CpuAllocatorStats CachingCpuAllocator::stats() const {
  CpuAllocatorStats s;
  s.allocated = allocated_.load();
  s.active = active_.load();
  s.cached = cached_.load();
  s.peak_allocated = peak_allocated_.load();
  s.peak_active = peak_active_.load();
  s.peak_reserved = peak_reserved_.load();
  s.evictions = evictions_.load();
  s.mappings = mappings_.load();
  s.ooms = ooms_.load();
  s.limit = limit_.load();
  return s;
}

void CachingCpuAllocator::reset_peak() {
  peak_allocated_.store(allocated_.load());
  peak_active_.store(active_.load());
  peak_reserved_.store(active_.load() + cached_.load());
}

void CachingCpuAllocator::set_limit(int64_t bytes) {
  limit_.store(bytes);
  if (bytes <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);  // a lower limit takes effect on the cache at once
  while (active_.load() + cached_.load() > bytes && !by_age_.empty()) evict_oldest();
}

int64_t CachingCpuAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t before = cached_.load();
  while (!by_age_.empty()) evict_oldest();
  working_set_ = active_.load();
  return before;
}

}  // namespace headroom::memory
