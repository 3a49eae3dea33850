// SideStream and DeviceClock on CUDA; compiled only when the Torch found carries CUDA.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>

#include "stream_internal.h"

namespace headroom {

namespace {

// Work on a pool stream. Its allocations are made while the side stream is current, so the
// allocator orders their reuse after the side stream's work; what the work hands over is recorded
// as used on the compute stream too.
struct CudaSideStream final : SideStream::Impl {
  explicit CudaSideStream(c10::Device device) : device(device), side(c10::cuda::getStreamFromPool(false, device.index())) {}
  void run(const std::function<std::vector<at::Tensor>()>& work) override {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
    // The side stream does not wait for the compute stream: the work reads the host's tensors,
    // its own and constants made before (a step's input does not depend on the step before).
    std::vector<at::Tensor> handed;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      handed = work();
    }
    done.record(side);
    done.block(compute);
    for (const at::Tensor& t : handed)
      if (t.defined() && t.is_cuda()) t.record_stream(compute);
  }
  bool separate() const override { return true; }
  c10::Device device;
  c10::cuda::CUDAStream side;
  at::cuda::CUDAEvent done;  // recorded again for each run: a wait takes the event as it is then
};

// Timing events recorded on the current stream; a deque keeps them in place as it grows.
struct CudaClock final : DeviceClock::Impl {
  explicit CudaClock(c10::Device device) : device(device) {}
  void mark() override {
    events.emplace_back(cudaEventDefault);  // timing on (ATen's default disables it)
    events.back().record(c10::cuda::getCurrentCUDAStream(device.index()));
  }
  double seconds(size_t from, size_t to) override {
    TORCH_CHECK(from <= to, "DeviceClock::seconds: mark ", from, " is after mark ", to);
    events.at(from).synchronize();  // elapsed_time needs both done
    events.at(to).synchronize();
    return 1e-3 * double(events.at(from).elapsed_time(events.at(to)));
  }
  size_t marks() const override { return events.size(); }
  c10::Device device;
  std::deque<at::cuda::CUDAEvent> events;
};

}  // namespace

std::unique_ptr<SideStream::Impl> make_cuda_side_stream(c10::Device device) { return std::make_unique<CudaSideStream>(device); }
std::unique_ptr<DeviceClock::Impl> make_cuda_clock(c10::Device device) { return std::make_unique<CudaClock>(device); }

}  // namespace headroom
