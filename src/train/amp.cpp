#include "headroom/train/amp.h"

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/core/torch_compat.h"

namespace headroom::train {

namespace {
const std::pair<const char*, AmpMode> kAmpMode[] = {
    {"auto", AmpMode::auto_}, {"off", AmpMode::off}, {"fp16", AmpMode::fp16}, {"bf16", AmpMode::bf16}};
}  // namespace

AmpMode amp_mode_from(const std::string& word) { return enum_from_word(word, kAmpMode); }
const char* to_string(AmpMode m) { return enum_word(m, kAmpMode); }

AmpMode resolve_amp(AmpMode m, c10::Device device, const std::string& where) {
  if (m == AmpMode::auto_) return device.is_cuda() ? AmpMode::fp16 : AmpMode::off;
  if (m == AmpMode::fp16 && !device.is_cuda())
    throw InputError(where + ": fp16 needs CUDA and this run is on " + device.str() + "; use train.amp=bf16 (CPU autocast) or "
                     "train.amp=off");
  return m;
}

AmpMode resolve_amp(const Config& c, c10::Device device) {
  return resolve_amp(amp_mode_from(c.train.amp), device, c.where("train.amp") + ": train.amp");
}

bool cpu_has_native_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return true;  // no cheap check here: assume the best and say nothing
#endif
}

std::string bf16_cost_note(AmpMode m, c10::Device device) {
  if (m != AmpMode::bf16 || !device.is_cpu() || cpu_has_native_bf16()) return "";
  return "bf16 on this CPU (no AVX512-BF16 or AMX) is emulated: it saves activation memory but trains many times slower than "
         "fp32 (Hourglass-104: 12x on an AVX2 CPU); with memory to spare, train.amp=off is faster";
}

at::ScalarType amp_dtype(AmpMode m) {
  switch (m) {
    case AmpMode::fp16: return at::kHalf;
    case AmpMode::bf16: return at::kBFloat16;
    default: return at::ScalarType::Undefined;
  }
}

AutocastGuard::AutocastGuard(c10::DeviceType device, at::ScalarType dtype) : device_(device) {
  if (dtype == at::ScalarType::Undefined) return;
  active_ = true;
  prev_enabled_ = compat::autocast_enabled(device);
  prev_dtype_ = compat::autocast_dtype(device);
  compat::set_autocast_enabled(device, true);
  compat::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, prev_enabled_);
  compat::set_autocast_dtype(device_, prev_dtype_);
}

LossScaler::LossScaler(c10::Device device, LossScalerOptions options) : o_(options) {
  scale_ = at::full({}, o_.init_scale(), at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({}, at::TensorOptions().dtype(at::kInt).device(device));
}

at::Tensor LossScaler::unscale_(const std::vector<at::Tensor>& grads) const {
  at::NoGradGuard no_grad;
  at::Tensor found_inf = at::zeros({}, scale_.options());
  if (grads.empty()) return found_inf;
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  if (scale_.is_cuda()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  } else {
    for (const auto& g : grads) g.mul_(inv_scale);
    found_inf = at::logical_not(at::isfinite(grad_norm(grads))).to(at::kFloat);
  }
  return found_inf;
}

void LossScaler::update(const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf, o_.growth_factor(), o_.backoff_factor(), o_.growth_interval());
    return;
  }
  // The same rule as the fused op: backoff and reset when found; grow when the tracker reaches the interval.
  const at::Tensor found = found_inf > 0;
  const at::Tensor tracker = at::where(found, at::zeros_like(growth_tracker_), growth_tracker_ + 1);
  const at::Tensor grow = tracker >= o_.growth_interval();
  const at::Tensor factor = at::where(found, at::full({}, o_.backoff_factor(), scale_.options()),
                                      at::where(grow, at::full({}, o_.growth_factor(), scale_.options()), at::ones_like(scale_)));
  scale_.mul_(factor);
  growth_tracker_.copy_(at::where(grow, at::zeros_like(tracker), tracker));
}

void LossScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", scale_, /*is_buffer=*/true);
  archive.write("growth_tracker", growth_tracker_, true);
}

void LossScaler::load(torch::serialize::InputArchive& archive) {
  at::Tensor s, g;
  archive.read("scale", s, true);
  archive.read("growth_tracker", g, true);
  scale_.copy_(s);
  growth_tracker_.copy_(g);
}

at::Tensor grad_norm(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  if (grads.empty()) return at::zeros({});
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  // Summed in double: the squares of finite fp32 norms above ~1.8e19 overflow fp32, and a
  // finite step must not be mistaken for an inf one (Hourglass-104 at 128 px starts near 1e18).
  return at::stack(norms).to(at::kDouble).norm(2);
}

void clip_grads_(const std::vector<at::Tensor>& grads, const at::Tensor& norm, double max_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  for (const auto& g : grads) g.mul_(coef.to(g.scalar_type()));
}

}  // namespace headroom::train
