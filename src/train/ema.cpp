#include "headroom/train/ema.h"

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cmath>

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
  ++updates_;
  std::vector<at::Tensor> floats, others;
  split_state(model_state(model), floats, others);
  at::_foreach_mul_(ema_float_, d);
  at::_foreach_add_(ema_float_, floats, 1 - d);
  for (size_t i = 0; i < others.size(); ++i) ema_other_[i].copy_(others[i]);
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
