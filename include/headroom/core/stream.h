// The device's queue, as the training step sees it: work on a stream of its own beside the
// compute stream, marks that time what the device did between two points of the host's program,
// and a graph that queues a whole piece of the program again with one launch.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace headroom {

// A stream beside the compute stream (CUDA). The host is usually ahead of the device, so work
// queued here (the next step's copy to the device and its augmentation) runs while the step
// before it still runs on the compute stream. `run` makes the compute stream (current when it is
// called) wait for the work by an event, no host sync, and records the tensors the work returns
// as used on the compute stream, so the caching allocator does not hand their memory out again
// before the compute stream is done with them (the work's own temporaries are ordered on the side
// stream). Elsewhere (the CPU, a build without CUDA) the work runs as it is.
class SideStream {
 public:
  explicit SideStream(c10::Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Runs `work` with the side stream current; it returns every tensor it made that the compute
  // stream will read (views share their base's memory: the base, or the view, is enough).
  void run(const std::function<std::vector<at::Tensor>()>& work);
  bool separate() const;  // the work has a stream of its own (CUDA)

  struct Impl;  // each device's version (src/core/stream_internal.h)

 private:
  std::unique_ptr<Impl> impl_;
};

// Marks on the device's current stream: when the device reached each (CUDA events, recorded
// without a sync); on the CPU, which runs ops as they are called, the host's clock.
class DeviceClock {
 public:
  explicit DeviceClock(c10::Device device);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  size_t mark();  // the new mark's index
  // Device seconds from mark `from` to mark `to`; waits until the device reached `to`.
  double seconds(size_t from, size_t to);
  size_t marks() const;

  struct Impl;  // each device's version (src/core/stream_internal.h)

 private:
  std::unique_ptr<Impl> impl_;
};

// A CUDA graph of the device work that a piece of the host's program queues: `capture` records
// it once (nothing runs), `replay` queues all of it again on the current stream with one launch,
// on the same memory: what changes between replays must be written into the tensors the work
// read when it was captured. The work's temporaries come from a memory pool of the graph's own,
// held until reset. When the work throws, capture throws it with nothing kept. The work must not
// sync the host nor make it wait for a value: CUDA then invalidates the capture, capture throws,
// and invalidated() is true for good: CUDA's random generators are left mid-capture, so the
// device must not be used further. Only CUDA has graphs: unavailable() says why not.
class DeviceGraph {
 public:
  explicit DeviceGraph(c10::Device device);
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  static std::string unavailable(c10::Device device);  // "" where graphs can be captured
  void capture(const std::function<void()>& work);    // replaces what was captured before
  void replay();
  bool captured() const;
  bool invalidated() const;  // a capture was invalidated by CUDA
  void reset();  // the graph and its pool given back

  struct Impl;  // CUDA's (src/core/stream_cuda.cpp); none elsewhere

 private:
  std::unique_ptr<Impl> impl_;
  c10::Device device_;
};

}  // namespace headroom
