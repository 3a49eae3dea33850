// What SideStream, DeviceClock and DeviceGraph (core/stream.h) are on each device: the host's
// version in stream.cpp, CUDA's in stream_cuda.cpp (compiled where the Torch found carries CUDA).
#pragma once

#include "headroom/core/stream.h"

namespace headroom {

struct SideStream::Impl {
  virtual ~Impl() = default;
  virtual void run(const std::function<std::vector<at::Tensor>()>& work) = 0;
  virtual bool separate() const = 0;
};

struct DeviceClock::Impl {
  virtual ~Impl() = default;
  virtual void mark() = 0;
  virtual double seconds(size_t from, size_t to) = 0;
  virtual size_t marks() const = 0;
};

struct DeviceGraph::Impl {
  virtual ~Impl() = default;
  virtual void capture(const std::function<void()>& work) = 0;
  virtual void replay() = 0;
  virtual bool captured() const = 0;
  virtual bool invalidated() const = 0;
  virtual void reset() = 0;
};

#ifdef HEADROOM_WITH_CUDA
std::unique_ptr<SideStream::Impl> make_cuda_side_stream(c10::Device device);
std::unique_ptr<DeviceClock::Impl> make_cuda_clock(c10::Device device);
std::unique_ptr<DeviceGraph::Impl> make_cuda_graph(c10::Device device);
#endif

}  // namespace headroom
