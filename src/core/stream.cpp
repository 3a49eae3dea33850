// SideStream, DeviceClock and DeviceGraph: the host's versions, and the choice of CUDA's
// (stream_cuda.cpp).
#include "headroom/core/stream.h"

#include <chrono>

#include "headroom/core/errors.h"
#include "stream_internal.h"

namespace headroom {

namespace {

struct InPlace final : SideStream::Impl {
  void run(const std::function<std::vector<at::Tensor>()>& work) override { work(); }
  bool separate() const override { return false; }
};

struct HostClock final : DeviceClock::Impl {
  void mark() override { at.push_back(std::chrono::steady_clock::now()); }
  double seconds(size_t from, size_t to) override { return std::chrono::duration<double>(at.at(to) - at.at(from)).count(); }
  size_t marks() const override { return at.size(); }
  std::vector<std::chrono::steady_clock::time_point> at;
};

}  // namespace

SideStream::SideStream(c10::Device device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) impl_ = make_cuda_side_stream(device);
#endif
  if (!impl_) impl_ = std::make_unique<InPlace>();
}

SideStream::~SideStream() = default;

void SideStream::run(const std::function<std::vector<at::Tensor>()>& work) { impl_->run(work); }

bool SideStream::separate() const { return impl_->separate(); }

DeviceClock::DeviceClock(c10::Device device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) impl_ = make_cuda_clock(device);
#endif
  if (!impl_) impl_ = std::make_unique<HostClock>();
}

DeviceClock::~DeviceClock() = default;

size_t DeviceClock::mark() {
  impl_->mark();
  return impl_->marks() - 1;
}

double DeviceClock::seconds(size_t from, size_t to) { return impl_->seconds(from, to); }

size_t DeviceClock::marks() const { return impl_->marks(); }

DeviceGraph::DeviceGraph(c10::Device device) : device_(device) {
#ifdef HEADROOM_WITH_CUDA
  if (device.is_cuda()) impl_ = make_cuda_graph(device);
#endif
}

DeviceGraph::~DeviceGraph() = default;

std::string DeviceGraph::unavailable(c10::Device device) {
  if (!device.is_cuda()) return "the run is on " + device.str() + " (graphs are CUDA's)";
#ifdef HEADROOM_WITH_CUDA
  return "";
#else
  return "this build's LibTorch has no CUDA";
#endif
}

void DeviceGraph::capture(const std::function<void()>& work) {
  if (!impl_) throw Error("no graph can be captured: " + unavailable(device_));
  impl_->capture(work);
}

void DeviceGraph::replay() {
  TORCH_CHECK(captured(), "DeviceGraph::replay before a capture");
  impl_->replay();
}

bool DeviceGraph::captured() const { return impl_ && impl_->captured(); }

bool DeviceGraph::invalidated() const { return impl_ && impl_->invalidated(); }

void DeviceGraph::reset() {
  if (impl_) impl_->reset();
}

}  // namespace headroom
