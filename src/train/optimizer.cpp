#include "headroom/train/optimizer.h"

#include <functional>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/core/torch_compat.h"

namespace headroom::train {

namespace {
const std::pair<const char*, OptimizerKind> kOptimizerKind[] = {
    {"sgd", OptimizerKind::sgd}, {"adam", OptimizerKind::adam}, {"adamw", OptimizerKind::adamw}};
}  // namespace

OptimizerKind optimizer_kind_from(const std::string& word) { return enum_from_word(word, kOptimizerKind); }
const char* to_string(OptimizerKind k) { return enum_word(k, kOptimizerKind); }

std::vector<ParamGroup> parameter_groups(torch::nn::Module& model, double weight_decay) {
  ParamGroup weights{"weights", {}, 0, 0, weight_decay, false};
  ParamGroup norm{"norm", {}, 0, 0, 0, false};
  ParamGroup bias{"bias", {}, 0, 0, 0, true};
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const std::string& name = item.key();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
      bias.params.push_back(p);
    else if (p.dim() <= 1)
      norm.params.push_back(p);
    else
      weights.params.push_back(p);
  }
  std::vector<ParamGroup> out;
  for (auto* g : {&weights, &norm, &bias})
    if (!g->params.empty()) out.push_back(std::move(*g));
  return out;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options)
    : groups_(std::move(groups)), options_(options) {
#if HEADROOM_HAS_FUSED_OPTIMIZERS
  fused_ = options_.fused();
#endif
  for (const auto& g : groups_) {
    State s;
    const bool adam = options_.kind() != OptimizerKind::sgd;
    for (const auto& p : g.params) {
      s.buf1.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (adam) s.buf2.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    }
    s.step = at::zeros({}, g.params.front().options().dtype(at::kFloat));
    state_.push_back(std::move(s));
  }
}

std::vector<at::Tensor> Optimizer::grads() const {
  std::vector<at::Tensor> out;
  for (const auto& g : groups_)
    for (const auto& p : g.params)
      if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

std::vector<at::Tensor> Optimizer::state_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& s : state_) {
    out.insert(out.end(), s.buf1.begin(), s.buf1.end());
    out.insert(out.end(), s.buf2.begin(), s.buf2.end());
    out.push_back(s.step);
  }
  return out;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.mutable_grad().reset();
}

void Optimizer::step(const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  if (!fused_ && found_inf.defined() && found_inf.item<float>() != 0) return;  // host check: no fused kernels
  std::vector<std::function<void()>> commits;
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    State& s = state_[i];
    // Parameters without a gradient this step (unused heads) are left alone, as torch.optim does.
    std::vector<at::Tensor> params, grads;
    State active;
    for (size_t j = 0; j < g.params.size(); ++j) {
      if (!g.params[j].grad().defined()) continue;
      params.push_back(g.params[j]);
      grads.push_back(g.params[j].grad());
      active.buf1.push_back(s.buf1[j]);
      if (!s.buf2.empty()) active.buf2.push_back(s.buf2[j]);
    }
    if (params.empty()) continue;
    active.step = s.step;
    if (fused_)
      step_fused(g, active, params, grads, found_inf);  // in-place kernels: nothing to allocate
    else
      commits.push_back(stage_foreach(g, active, params, grads));
  }
  // Every group's allocations are done: an out-of-memory error above left all groups untouched.
  for (const auto& commit : commits) commit();
}

void Optimizer::step_fused(ParamGroup& g, State& s, std::vector<at::Tensor>& params, std::vector<at::Tensor>& grads,
                           const at::Tensor& found_inf) {
#if HEADROOM_HAS_FUSED_OPTIMIZERS
  const c10::optional<at::Tensor> inf = found_inf.defined() ? c10::optional<at::Tensor>(found_inf) : c10::nullopt;
  s.step.add_(1);
  const std::vector<at::Tensor> steps(params.size(), s.step);
  switch (options_.kind()) {
    case OptimizerKind::sgd:
      at::_fused_sgd_(params, grads, g.momentum != 0 ? at::TensorList(s.buf1) : at::TensorList(), g.weight_decay, g.momentum,
                      g.lr, /*dampening=*/0.0, options_.nesterov(), /*maximize=*/false, /*is_first_step=*/false,
                      c10::nullopt, inf);
      break;
    case OptimizerKind::adam:
      at::_fused_adam_(params, grads, s.buf1, s.buf2, {}, steps, g.lr, g.momentum, options_.beta2(), g.weight_decay,
                       options_.eps(), /*amsgrad=*/false, /*maximize=*/false, c10::nullopt, inf);
      break;
    case OptimizerKind::adamw:
      at::_fused_adamw_(params, grads, s.buf1, s.buf2, {}, steps, g.lr, g.momentum, options_.beta2(), g.weight_decay,
                        options_.eps(), /*amsgrad=*/false, /*maximize=*/false, c10::nullopt, inf);
      break;
  }
  if (inf) s.step.sub_(*inf);  // a skipped step does not count
#else
  (void)g, (void)s, (void)params, (void)grads, (void)found_inf;
  throw Error("fused optimizers need LibTorch 2.4 or newer");
#endif
}

std::function<void()> Optimizer::stage_foreach(ParamGroup& g, State& s, std::vector<at::Tensor>& params,
                                               std::vector<at::Tensor>& grads) {
  // Everything that allocates happens here; the returned commit only writes in place and
  // allocates nothing, so an out-of-memory error leaves parameters and state untouched and the
  // governor can re-run the step.
  const double lr = g.lr, wd = g.weight_decay, m = g.momentum;
  const at::Tensor step = s.step;
  // In-place ops with a plain number wrap it in a fresh tensor (an allocation): the commit uses
  // tensors made here instead.
  const at::Tensor one = at::ones({}, s.step.options());
  if (options_.kind() == OptimizerKind::sgd) {
    std::vector<at::Tensor> d = wd != 0 ? at::_foreach_add(grads, params, wd) : grads;
    std::vector<at::Tensor> buf;
    if (m != 0) {
      buf = at::_foreach_mul(s.buf1, m);
      at::_foreach_add_(buf, d);
      d = options_.nesterov() ? at::_foreach_add(d, buf, m) : buf;
    }
    return [params, d, buf, state = s.buf1, step, one, lr]() mutable {
      for (size_t j = 0; j < buf.size(); ++j) state[j].copy_(buf[j]);
      at::_foreach_add_(params, d, -lr);
      step.add_(one);
    };
  }
  const double t = s.step.item<double>() + 1;
  const double beta2 = options_.beta2();
  const bool decoupled = options_.kind() == OptimizerKind::adamw;
  const std::vector<at::Tensor> d = (!decoupled && wd != 0) ? at::_foreach_add(grads, params, wd) : grads;
  std::vector<at::Tensor> b1 = at::_foreach_mul(s.buf1, m);
  at::_foreach_add_(b1, d, 1 - m);
  std::vector<at::Tensor> b2 = at::_foreach_mul(s.buf2, beta2);
  at::_foreach_addcmul_(b2, d, d, 1 - beta2);
  const double bc1 = 1 - std::pow(m, t), bc2 = 1 - std::pow(beta2, t);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(b2);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, options_.eps());
  const bool decays = decoupled && wd != 0;
  const at::Tensor decay = at::full({}, 1 - lr * wd, params.front().options());
  const double rate = -lr / bc1;
  return [params, b1, b2, denom, m1 = s.buf1, m2 = s.buf2, step, one, decays, decay, rate]() mutable {
    for (size_t j = 0; j < b1.size(); ++j) m1[j].copy_(b1[j]), m2[j].copy_(b2[j]);
    if (decays)
      for (auto& p : params) p.mul_(decay);
    at::_foreach_addcdiv_(params, b1, denom, rate);
    step.add_(one);
  };
}

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  for (size_t i = 0; i < state_.size(); ++i) {
    const std::string prefix = "g" + std::to_string(i) + ".";
    archive.write(prefix + "step", state_[i].step, /*is_buffer=*/true);
    for (size_t j = 0; j < state_[i].buf1.size(); ++j) archive.write(prefix + "buf1." + std::to_string(j), state_[i].buf1[j], true);
    for (size_t j = 0; j < state_[i].buf2.size(); ++j) archive.write(prefix + "buf2." + std::to_string(j), state_[i].buf2[j], true);
  }
}

void Optimizer::load(torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  const auto read = [&](const std::string& key, at::Tensor& into) {
    at::Tensor t;
    archive.read(key, t, /*is_buffer=*/true);
    if (!t.sizes().equals(into.sizes()))
      throw InputError("optimizer state '" + key + "' has shape " + c10::str(t.sizes()) + ", the model needs " +
                       c10::str(into.sizes()) + " (a checkpoint of another model or optimizer)");
    into.copy_(t);
  };
  for (size_t i = 0; i < state_.size(); ++i) {
    const std::string prefix = "g" + std::to_string(i) + ".";
    read(prefix + "step", state_[i].step);
    for (size_t j = 0; j < state_[i].buf1.size(); ++j) read(prefix + "buf1." + std::to_string(j), state_[i].buf1[j]);
    for (size_t j = 0; j < state_[i].buf2.size(); ++j) read(prefix + "buf2." + std::to_string(j), state_[i].buf2[j]);
  }
}

}  // namespace headroom::train
