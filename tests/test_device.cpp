#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <thread>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/stream.h"

#ifdef HEADROOM_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#endif

using namespace headroom;

namespace {

CudaStatus no_cuda(const std::string& reason) {
  CudaStatus s;
  s.reason = reason;
  return s;
}

CudaStatus one_gpu() {
  CudaStatus s;
  s.built = s.available = true;
  s.devices.push_back(GpuInfo{0, "NVIDIA H200", int64_t{141} << 30, 9, 0});
  return s;
}

std::string device_error(const std::string& spec, const CudaStatus& s) {
  try {
    resolve_device(spec, s);
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Device, CpuIsAlwaysAvailable) {
  const DeviceChoice c = resolve_device("cpu", no_cuda("x"));
  EXPECT_TRUE(c.device.is_cpu());
  EXPECT_TRUE(c.warning.empty());
}

TEST(Device, AutoFallsBackToTheCpuLoudlyWithTheReason) {
  const DeviceChoice c = resolve_device("auto", no_cuda("no usable NVIDIA driver"));
  EXPECT_TRUE(c.device.is_cpu());
  EXPECT_NE(c.warning.find("NO GPU"), std::string::npos);
  EXPECT_NE(c.warning.find("no usable NVIDIA driver"), std::string::npos);
}

TEST(Device, AutoTakesTheFirstGpu) {
  const DeviceChoice c = resolve_device("auto", one_gpu());
  EXPECT_TRUE(c.device.is_cuda());
  EXPECT_EQ(c.device.index(), 0);
  EXPECT_TRUE(c.warning.empty());
}

TEST(Device, CudaWithoutCudaSaysWhyAndHowToFix) {
  const std::string err = device_error("cuda", no_cuda("this build links a CPU-only LibTorch"));
  EXPECT_NE(err.find("CPU-only LibTorch"), std::string::npos) << err;
  EXPECT_NE(err.find("Use device: cpu"), std::string::npos) << err;
  EXPECT_NE(device_error("cuda:0", no_cuda("no usable NVIDIA driver")).find("no usable NVIDIA driver"), std::string::npos);
}

TEST(Device, IndexOutOfRangeListsTheDevices) {
  const std::string err = device_error("cuda:2", one_gpu());
  EXPECT_NE(err.find("1 CUDA device(s): cuda:0 (NVIDIA H200)"), std::string::npos) << err;
  EXPECT_EQ(resolve_device("cuda:0", one_gpu()).device.index(), 0);
}

TEST(Device, ThisBuildReportsItsCuda) {
  const CudaStatus s = query_cuda();
#ifdef HEADROOM_WITH_CUDA
  EXPECT_TRUE(s.built);
  EXPECT_FALSE(s.runtime_version.empty());
#else
  EXPECT_FALSE(s.built);
  EXPECT_NE(s.reason.find("CPU-only"), std::string::npos);
#endif
  if (!s.available) {
    EXPECT_FALSE(s.reason.empty());
    EXPECT_THROW(resolve_device("cuda", s), DeviceError);
  }
  const Json j = cuda_status_json(s);
  EXPECT_EQ(j.find("built")->as_bool(), s.built);
}

// On the CPU the device's marks are the host's clock, and the side stream's work runs in place.
TEST(Device, TheCpuClockAndSideStreamAreTheHosts) {
  DeviceClock clock(c10::Device(c10::kCPU));
  const size_t a = clock.mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const size_t b = clock.mark();
  EXPECT_EQ(clock.marks(), 2u);
  EXPECT_GE(clock.seconds(a, b), 0.02);
  EXPECT_LT(clock.seconds(a, b), 5.0);
  SideStream side(c10::Device(c10::kCPU));
  EXPECT_FALSE(side.separate());
  at::Tensor made;
  side.run([&] {
    made = at::arange(6).mul(2);
    return std::vector<at::Tensor>{made};
  });
  EXPECT_TRUE(at::equal(made, at::arange(0, 12, 2)));
}

#ifdef HEADROOM_WITH_CUDA
// On CUDA the work runs on a stream of its own and the compute stream waits for it: a work slowed
// down on the device (a sleep kernel before its copy) is still what the compute stream reads.
TEST(Device, CudaSideStreamWorkIsReadyForTheComputeStream) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  SideStream side(cuda);
  EXPECT_TRUE(side.separate());
  DeviceClock clock(cuda);
  const at::Tensor host = at::arange(1 << 22, at::kFloat).pin_memory();
  const auto compute = c10::cuda::getCurrentCUDAStream().id();
  const size_t a = clock.mark();
  at::Tensor made;
  bool elsewhere = false;
  side.run([&] {
    elsewhere = c10::cuda::getCurrentCUDAStream().id() != compute;
    at::cuda::sleep(int64_t(1) << 28);  // ~0.1 s of the side stream before the copy
    made = host.to(cuda, /*non_blocking=*/true).mul_(3);
    return std::vector<at::Tensor>{made};
  });
  EXPECT_TRUE(elsewhere);
  EXPECT_EQ(c10::cuda::getCurrentCUDAStream().id(), compute);
  const at::Tensor back = made.add(1);  // queued on the compute stream behind the event
  const size_t b = clock.mark();
  EXPECT_TRUE(at::equal(back.cpu(), host.mul(3).add(1)));
  EXPECT_GT(clock.seconds(a, b), 0.0);
}

// What the work hands over is recorded as used on the compute stream: freed while the compute
// stream still has work queued on it, its memory is not given to the next work.
TEST(Device, CudaSideStreamMemoryWaitsForTheComputeStream) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  SideStream side(cuda);
  const auto opt = at::TensorOptions().device(cuda);
  const void* first = nullptr;
  {
    at::Tensor made;
    side.run([&] {
      made = at::ones({1 << 20}, opt);
      return std::vector<at::Tensor>{made};
    });
    at::cuda::sleep(int64_t(1) << 30);  // the compute stream busy for a while...
    made.add_(1);                        // ...then using the handed-over tensor
    first = made.data_ptr();
  }  // freed on the host while the compute stream still has it queued
  const void* second = nullptr;
  side.run([&] {
    const at::Tensor again = at::empty({1 << 20}, opt);
    second = again.data_ptr();
    return std::vector<at::Tensor>{again};
  });
  EXPECT_NE(first, second);
  c10::cuda::getCurrentCUDAStream().synchronize();
}
#endif
