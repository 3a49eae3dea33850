// Every LibTorch API difference between Debian's 1.13 and 2.x that Headroom meets, behind one
// header; the TorchCompat tests hold each wrapper to its behaviour on the build's version.
#pragma once

#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdint>
#include <string>

#define HEADROOM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate is const in 1.13 and not from 2.3 on, which also made copy_data
// pure virtual. An allocator declares `c10::DataPtr allocate(size_t n) HEADROOM_ALLOCATE_CONST
// override;` and puts HEADROOM_ALLOCATOR_COPY_DATA in its class body.
#if HEADROOM_TORCH_AT_LEAST(2, 3)
#define HEADROOM_ALLOCATE_CONST
#define HEADROOM_ALLOCATOR_COPY_DATA                                              \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                          \
  }
#else
#define HEADROOM_ALLOCATE_CONST const
#define HEADROOM_ALLOCATOR_COPY_DATA
#endif

// Fused optimizer kernels (_fused_sgd_, _fused_adam_, _fused_adamw_ with found_inf) on CPU and
// CUDA arrived in 2.4; before that the optimizers update one parameter at a time, in place.
#define HEADROOM_HAS_FUSED_OPTIMIZERS HEADROOM_TORCH_AT_LEAST(2, 4)

namespace headroom::compat {

// Autocast state per device type: 1.13 has separate CPU / GPU functions, 2.4+ takes the
// device type (the old names remain but warn at run time).
inline bool autocast_enabled(c10::DeviceType device) {
#if HEADROOM_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if HEADROOM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::kCPU)
    at::autocast::set_cpu_enabled(enabled);
  else
    at::autocast::set_enabled(enabled);
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if HEADROOM_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
#if HEADROOM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::kCPU)
    at::autocast::set_autocast_cpu_dtype(dtype);
  else
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

// Multiplies every tensor in place by a one-element tensor on their device, without reading it
// on the host: one multi-tensor kernel from 2.1 on, a loop before (1.13 here is CPU only).
inline void foreach_mul_(at::TensorList tensors, const at::Tensor& factor) {
#if HEADROOM_TORCH_AT_LEAST(2, 1)
  at::_foreach_mul_(tensors, factor);
#else
  for (const auto& t : tensors) t.mul_(factor);
#endif
}

// A c10 warning handler that passes each warning's message and LibTorch source line to
// `take`: 1.13 calls process(location, message, verbatim) and installs it through
// c10::Warning, 2.x calls process(const c10::Warning&) and installs it through
// c10::WarningUtils.
class WarningHandler : public c10::WarningHandler {
 public:
  virtual void take(const std::string& message, const char* file, uint32_t line) = 0;
#if HEADROOM_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& w) override { take(w.msg(), w.source_location().file, w.source_location().line); }
#else
  void process(const c10::SourceLocation& at, const std::string& message, const bool /*verbatim*/) override {
    take(message, at.file, at.line);
  }
#endif
};

inline void set_warning_handler(c10::WarningHandler* handler) {
#if HEADROOM_TORCH_AT_LEAST(2, 0)
  c10::WarningUtils::set_warning_handler(handler);
#else
  c10::Warning::set_warning_handler(handler);
#endif
}

}  // namespace headroom::compat
