// Small constant tensors (offsets, unit squares, colours) made on a device once: built on the
// host and copied the first time a (values, dtype, device) is asked for, then served from a
// cache, so a training step never copies a host-built tensor (a blocking copy from pageable
// memory on CUDA).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace headroom {

// A 1-D tensor holding `values`; reshape it as needed (a view, no copy).
at::Tensor device_constant(const std::vector<double>& values, at::ScalarType dtype, c10::Device device);

}  // namespace headroom
