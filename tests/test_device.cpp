#include <gtest/gtest.h>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"

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
