// Mixed precision: an autocast guard (clears the cast cache when it ends), a dynamic loss scaler
// for fp16 (fused ATen ops on CUDA, tensor ops on the CPU), and the gradient norm that doubles
// as the non-finite check. Everything stays on the device: no host sync per step.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

#include "headroom/core/config.h"

namespace headroom::train {

// auto: fp16 on CUDA, off on the CPU.
enum class AmpMode { auto_, off, fp16, bf16 };
AmpMode amp_mode_from(const std::string& word);  // train.amp
const char* to_string(AmpMode m);

// train.amp with auto resolved for the device; fp16 on the CPU is refused (InputError naming the key).
AmpMode resolve_amp(const Config& c, c10::Device device);
// A mode on a device: auto resolved, fp16 refused on the CPU (`where` names the setting).
AmpMode resolve_amp(AmpMode m, c10::Device device, const std::string& where);
// Whether this CPU computes bf16 natively (x86 AVX512-BF16 or AMX-BF16). Without it LibTorch
// emulates bf16 matrix products and convolutions: on an AVX2 CPU a 3x3 convolution ran 10x
// (channels-last) to 260x (NCHW) slower than in fp32, and Hourglass-104 trained 12x slower.
bool cpu_has_native_bf16();
// "" where bf16 on `device` is native; otherwise a sentence saying what it costs, for the logs.
std::string bf16_cost_note(AmpMode m, c10::Device device);
// The autocast dtype of a mode (Undefined for off).
at::ScalarType amp_dtype(AmpMode m);

// Enables autocast for the device type with `dtype` (no-op for Undefined) and restores the
// previous state on exit, clearing the cast cache so no fp16 weight copies outlive the step.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

struct LossScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

// torch.cuda.amp.GradScaler's algorithm: scale the loss, unscale the gradients while looking for
// inf/NaN, then back off (found) or grow (after growth_interval clean steps).
class LossScaler {
 public:
  LossScaler(c10::Device device, LossScalerOptions options = {});
  at::Tensor scale(const at::Tensor& loss) const { return loss * scale_; }
  // Divides the gradients by the scale in place; returns found_inf, a float [] tensor (0 or 1).
  at::Tensor unscale_(const std::vector<at::Tensor>& grads) const;
  void update(const at::Tensor& found_inf);
  const at::Tensor& scale_tensor() const { return scale_; }
  const at::Tensor& growth_tracker() const { return growth_tracker_; }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  LossScalerOptions o_;
  at::Tensor scale_;           // float [] on the device
  at::Tensor growth_tracker_;  // int32 [] clean steps since the last change
};

// The L2 norm of all gradients together, a double [] tensor (inf or NaN when any is non-finite).
at::Tensor grad_norm(const std::vector<at::Tensor>& grads);
// Scales the gradients so their norm is at most `max_norm` (given the norm from grad_norm).
void clip_grads_(const std::vector<at::Tensor>& grads, const at::Tensor& norm, double max_norm);

}  // namespace headroom::train
