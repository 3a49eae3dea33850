#include "headroom/train/ema.h"

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace headroom::train {

std::vector<at::Tensor> model_state(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p);
  for (const auto& b : m.buffers()) out.push_back(b);
  return out;
}

namespace {
void split_state(const std::vector<at::Tensor>& all, std::vector<at::Tensor>& floats, std::vector<at::Tensor>& others) {
  floats.clear();
  others.clear();
  for (const auto& t : all) (at::isFloatingType(t.scalar_type()) ? floats : others).push_back(t);
}
}  // namespace

ModelEma::ModelEma(models::DetectorImpl& model, models::Detector copy, double decay, double tau, EmaRamp ramp)
    : ema_(std::move(copy)), decay_(decay), tau_(tau), ramp_(ramp) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> src = model_state(model), dst = model_state(*ema_);
  TORCH_CHECK(src.size() == dst.size(), "EMA: the copy has another architecture");
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_->eval();
  split_state(dst, ema_float_, ema_other_);
}

double ModelEma::decay_now() const {
  const double u = double(updates_ + 1);
  return ramp_ == EmaRamp::tf ? std::min(decay_, (1 + u) / (10 + u)) : decay_ * (1 - std::exp(-u / tau_));
}

void ModelEma::update(models::DetectorImpl& model) {
  at::NoGradGuard no_grad;
  const double d = decay_now();
  std::vector<at::Tensor> floats, others;
  split_state(model_state(model), floats, others);
  if (!ema_float_.empty() && ema_float_.front().is_cpu()) {
    // On the CPU LibTorch's _foreach_ ops run tensor by tensor and wrap a plain-number factor in a
    // fresh tensor for each, from the budgeted allocator: an out-of-memory error there (after the
    // optimizer's update, where nothing recovers it) would leave the average half decayed. The
    // factors are made first, one per dtype (another dtype would be cast into a copy); the sum's
    // alpha is not wrapped.
    std::map<at::ScalarType, at::Tensor> decay;
    for (const at::Tensor& t : ema_float_)
      if (!decay.count(t.scalar_type())) decay[t.scalar_type()] = at::full({}, d, t.options());
    for (size_t i = 0; i < ema_float_.size(); ++i) ema_float_[i].mul_(decay.at(ema_float_[i].scalar_type())).add_(floats[i], 1 - d);
  } else {
    at::_foreach_mul_(ema_float_, d);  // on CUDA one kernel for every tensor; the factors are arguments
    at::_foreach_add_(ema_float_, floats, 1 - d);
  }
  for (size_t i = 0; i < others.size(); ++i) ema_other_[i].copy_(others[i]);
  ++updates_;
}

void ModelEma::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive weights;
  ema_->save(weights);
  archive.write("weights", weights);
  archive.write("updates", c10::IValue(updates_));
}

void ModelEma::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive weights;
  archive.read("weights", weights);
  ema_->load(weights);
  c10::IValue u;
  archive.read("updates", u);
  updates_ = u.toInt();
  ema_->eval();
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  split_state(model_state(*ema_), ema_float_, ema_other_);
}

}  // namespace headroom::train
