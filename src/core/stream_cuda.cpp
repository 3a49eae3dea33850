// SideStream, DeviceClock and DeviceGraph on CUDA; compiled only when the Torch found carries CUDA.
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <memory>

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

// ATen's CUDAGraph, captured on a stream of its own (a capture cannot run on the legacy default
// stream; one stream for every capture, so that cuBLAS keeps one workspace for them, apart from the
// side stream's), ordered after everything queued before on the compute stream, and replayed on the
// current one. Thread-local capture mode: the loader's threads may pin memory meanwhile, which a
// global mode would refuse; the work itself (the autograd engine's thread included) must make no
// call that syncs, as the step never does.
struct CudaGraph final : DeviceGraph::Impl {
  using Pool = decltype(at::cuda::graph_pool_handle());
  explicit CudaGraph(c10::Device device) : device(device), stream(c10::cuda::getStreamFromPool(false, device.index())) {}
  void capture(const std::function<void()>& work) override {
    reset();
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
    // Once per capture: the eager steps' cached blocks go back before the graph's pool is filled,
    // or the step's memory would be held twice.
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    at::cuda::CUDAEvent ready, done;
    ready.record(compute);
    ready.block(stream);
    auto g = std::make_unique<at::cuda::CUDAGraph>();
    const auto pool = at::cuda::graph_pool_handle();  // ours: given back by hand if CUDA invalidates the capture
    {
      c10::cuda::CUDAStreamGuard on_stream(stream);
      g->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      try {
        work();
      } catch (...) {
        end_failed(*g, pool);
        throw;
      }
      try {
        g->capture_end();
      } catch (const c10::Error&) {
        cleanup_invalidated(pool);
        throw;
      }
    }
    done.record(stream);
    done.block(compute);
    graph = std::move(g);
  }
  // The work threw (an out-of-memory error, most often, raised before anything reached CUDA): the
  // capture still ends cleanly, and its graph and pool go with it.
  void end_failed(at::cuda::CUDAGraph& g, Pool pool) {
    try {
      g.capture_end();
    } catch (const c10::Error&) {
      cleanup_invalidated(pool);
    }
  }
  // CUDA refused a call inside the capture and invalidated it: ATen's capture_end threw before it
  // closed the allocator's routing to the pool, which is done here. The CUDA generators' capture
  // state is not restored: the caller must stop using the device (StepGraph ends the run).
  void cleanup_invalidated(Pool pool) {
    broken = true;
    (void)cudaGetLastError();  // the invalidated capture's error, which the next launch check would report
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool);
    c10::cuda::CUDACachingAllocator::releasePool(device.index(), pool);
  }
  void replay() override { graph->replay(); }
  bool captured() const override { return graph != nullptr; }
  bool invalidated() const override { return broken; }
  // No wait for a replay still running: CUDA frees an executable graph in flight when it ends, and
  // the allocator gives a released pool's blocks back only through cudaFree, which waits for it.
  void reset() override { graph.reset(); }
  c10::Device device;
  c10::cuda::CUDAStream stream;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  bool broken = false;
};

}  // namespace

std::unique_ptr<SideStream::Impl> make_cuda_side_stream(c10::Device device) { return std::make_unique<CudaSideStream>(device); }
std::unique_ptr<DeviceClock::Impl> make_cuda_clock(c10::Device device) { return std::make_unique<CudaClock>(device); }

std::unique_ptr<DeviceGraph::Impl> make_cuda_graph(c10::Device device) { return std::make_unique<CudaGraph>(device); }

}  // namespace headroom
