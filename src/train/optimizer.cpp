#include "headroom/train/optimizer.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/core/torch_compat.h"

namespace headroom::train {

namespace {
const std::pair<const char*, OptimizerKind> kOptimizerKind[] = {
    {"sgd", OptimizerKind::sgd}, {"adam", OptimizerKind::adam}, {"adamw", OptimizerKind::adamw},
    {"rmsprop", OptimizerKind::rmsprop}, {"musgd", OptimizerKind::musgd}};

// One group's update: its hyper-parameters and the 0-dim tensors the in-place ops take (a plain
// number operand would be wrapped in a fresh tensor). A step skipped by the device's found_inf
// flag is taken as an update that changes nothing, never read on the host: every factor that
// shrinks a state is 1 then, every rate and every term not made of the gradient (decay from the
// parameter, the momentum buffer's step) 0, and the gradients are zeroed first (inf * 0 is NaN),
// so each state is written with its own value, exactly.
//
// The rate comes from the host or from a device tensor (Optimizer::set_rates_on_device, what a
// captured step reads); either way every factor made of it is computed on the device, in double.
struct GroupStep {
  double wd = 0, m = 0;
  at::Tensor keep;                 // 1, 0 when skipped: the step counter's increment
  at::Tensor momentum, beta2;      // momentum, beta2 (RMSprop's rho): 1 when skipped
  at::Tensor decay;                // 1 - lr wd: 1 when skipped
  at::Tensor wd_term;              // wd (L2 decay taken from p): 0 when skipped
  at::Tensor lr, neg_lr, neg_lr_m; // lr, -lr and -lr m (Nesterov): 0 when skipped
  at::Tensor minus_one;            // RMSprop's p -= mom: 0 when skipped
  at::Tensor muon_rate;            // MuSGD's Muon half, -lr * muon_scale: 0 when skipped
  at::Tensor rate, bc2_sqrt, eps;  // Adam: -lr / (1 - beta1^t) (0 when skipped), sqrt(1 - beta2^t), eps
};

// `step`: the group's step counter; `skip`: bool [] on the parameters' device; `rate`: the
// group's lr on the device, or undefined (g.lr); `device`: the parameters' options (the factors'
// device and dtype).
GroupStep group_step(const ParamGroup& g, const at::Tensor& step, const at::Tensor& skip, const at::Tensor& rate,
                     const OptimizerOptions& o, const at::TensorOptions& device) {
  const auto scalar = [&](double v) { return at::full({}, v, device); };
  const auto gated_t = [&](const at::Tensor& v, double skipped) { return at::where(skip, scalar(skipped), v.to(device.dtype())); };
  const auto gated = [&](double v, double skipped) { return gated_t(scalar(v), skipped); };
  const bool adam = o.kind() == OptimizerKind::adam || o.kind() == OptimizerKind::adamw;
  const at::Tensor base = rate.defined() ? rate.to(at::kDouble) : at::full({}, g.lr, device.dtype(at::kDouble));
  const at::Tensor lr = g.muon ? base * o.sgd_scale() : base;  // a Muon group's SGD half
  GroupStep s;
  s.wd = g.weight_decay, s.m = g.momentum;
  s.keep = at::logical_not(skip).to(step.scalar_type());
  s.momentum = gated(g.momentum, 1);
  s.decay = gated_t(1 - lr * g.weight_decay, 1);
  s.wd_term = gated(g.weight_decay, 0);
  s.lr = gated_t(lr, 0);
  s.neg_lr = gated_t(-lr, 0);
  s.neg_lr_m = gated_t(lr * -g.momentum, 0);
  s.minus_one = gated(-1, 0);
  if (g.muon) s.muon_rate = gated_t(base * -o.muon_scale(), 0);
  if (adam) {
    // The bias corrections from the device's step count, in double as torch.optim computes them.
    const at::Tensor t = step.to(at::kDouble) + 1;
    s.beta2 = gated(o.beta2(), 1);
    s.bc2_sqrt = at::sqrt(1 - at::pow(o.beta2(), t)).to(device.dtype());
    s.eps = scalar(o.eps());
    s.rate = gated_t(-lr / (1 - at::pow(g.momentum, t)), 0);
  } else if (o.kind() == OptimizerKind::rmsprop) {
    s.beta2 = gated(o.rho(), 1);
    s.eps = scalar(o.eps());
  }
  return s;
}

// `mom`: the momentum buffer, `ms`: the mean square; `workspace`: at least p's size.
void rmsprop_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& mom, at::Tensor& ms, const at::Tensor& workspace,
                    const GroupStep& s, const OptimizerOptions& o) {
  // TF has two kernels: ApplyRMSProp (momentum; eps inside the root, the rate inside the
  // buffer) and the plain update (eps outside the root).
  at::Tensor ws = workspace.narrow(0, 0, p.numel()).view(p.sizes());
  ms.mul_(s.beta2).addcmul_(grad, grad, 1 - o.rho());
  if (s.wd != 0) p.mul_(s.decay);
  if (s.m != 0) {
    ws.copy_(ms).add_(s.eps).sqrt_();
    at::div_out(ws, grad, ws);
    mom.mul_(s.momentum).addcmul_(ws, s.lr);
    p.addcmul_(mom, s.minus_one);
  } else {
    at::sqrt_out(ws, ms).add_(s.eps);
    at::div_out(ws, grad, ws);
    p.addcmul_(ws, s.neg_lr);
  }
}

void sgd_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& buf, const GroupStep& s, const OptimizerOptions& o) {
  // buf = m buf + (g + wd p); p -= lr (g + wd p + m buf) [nesterov] or lr buf
  const double wd = s.wd, m = s.m;
  if (m != 0) {
    buf.mul_(s.momentum).add_(grad);
    if (wd != 0) buf.addcmul_(p, s.wd_term);
  }
  const bool nesterov = m != 0 && o.nesterov();
  if (m != 0 && !nesterov) {
    p.addcmul_(buf, s.neg_lr);
    return;
  }
  if (wd != 0) p.mul_(s.decay);
  p.addcmul_(grad, s.neg_lr);
  if (nesterov) p.addcmul_(buf, s.neg_lr_m);
}

// Adam and AdamW; `workspace`: at least p's size.
void adam_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& workspace,
                 const GroupStep& s, const OptimizerOptions& o) {
  // d = g (+ wd p for Adam's L2 decay), in the workspace; then the moments, then
  // denom = sqrt(v) / sqrt(1 - beta2^t) + eps and m / denom, reusing the workspace.
  at::Tensor ws = workspace.narrow(0, 0, p.numel()).view(p.sizes());
  const bool l2 = o.kind() == OptimizerKind::adam && s.wd != 0;
  const at::Tensor& d = l2 ? ws.copy_(grad).addcmul_(p, s.wd_term) : grad;
  exp_avg.mul_(s.momentum).add_(d, 1 - s.m);
  exp_avg_sq.mul_(s.beta2).addcmul_(d, d, 1 - o.beta2());
  at::sqrt_out(ws, exp_avg_sq).div_(s.bc2_sqrt).add_(s.eps);
  if (o.kind() == OptimizerKind::adamw && s.wd != 0) p.mul_(s.decay);
  at::div_out(ws, exp_avg, ws);
  p.addcmul_(ws, s.rate);
}

// Muon's orthogonalisation: five quintic Newton-Schulz steps in bf16, X <- a X + (b A + c A A) X
// with A = X X^T, from X / |X|_F (singular values at most 1), on the wide orientation (A is the
// smaller Gram matrix). [N, rows, cols] in; out the same shape, bf16 values, singular values near 1.
// bf16 is rounded as a GEMM with fp32 sums rounds it, once per product-and-sum: on CUDA that is the
// bf16 kernel itself; on the CPU the sums run in fp32 and each result is rounded to bf16, as torch
// 2.x's CPU kernels do (LibTorch 1.13's round inside the sums, and its updates drifted 13% from
// Ultralytics').
at::Tensor newton_schulz5(const at::Tensor& g) {
  const bool native = g.is_cuda();
  const auto rounded = [native](const at::Tensor& t) { return native ? t : t.to(at::kBFloat16).to(at::kFloat); };
  at::Tensor x = g.to(at::kBFloat16);
  x.div_(at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
  if (!native) x = x.to(at::kFloat);
  const bool tall = x.size(-2) > x.size(-1);
  if (tall) x = x.transpose(-2, -1);
  const double a = 3.4445, b = -4.7750, c = 2.0315;  // Muon's coefficients: the steepest slope at 0
  for (int i = 0; i < 5; ++i) {
    const at::Tensor A = rounded(at::matmul(x, x.transpose(-2, -1)));
    const at::Tensor B = rounded(at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c));
    x = rounded(at::baddbmm(x, B, x, /*beta=*/a));
  }
  return tall ? x.transpose(-2, -1) : x;
}

// MuSGD's Muon half of a Muon group: each parameter's new momentum buffer and its orthogonalised
// update, computed before anything changes (the step stays atomic under OOM).
struct MuonUpdates {
  std::vector<at::Tensor> buffers, updates;
};

// `keep_beta`: beta, or 1 where the step is skipped (the buffer stays as it was).
MuonUpdates muon_updates(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& buffers, double beta,
                         const at::Tensor& keep_beta, bool nesterov) {
  MuonUpdates out;
  // Matrices with the same columns and scale go through Newton-Schulz as one batch, zero rows
  // padding the shorter (they stay zero and leave the others alone), in runs whose row counts span
  // at most 16x: as Ultralytics batches them, so that bf16 rounds as there.
  struct Item {
    size_t index;
    at::Tensor m;  // [rows, cols]: the update in its own memory order
    bool nhwc;     // channels-last: written back with the update's strides
  };
  std::map<std::pair<int64_t, double>, std::vector<Item>> buckets;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    at::Tensor buf = buffers[i].mul(keep_beta).add_(g, 1 - beta);
    at::Tensor u = nesterov ? buf.mul(beta).add_(g, 1 - beta) : buf;
    out.buffers.push_back(std::move(buf));
    out.updates.push_back(u);
    // Flattened in the update's own order ([out, in * k * k] for NCHW, [out, k * k * in] for NHWC):
    // permuting columns permutes the orthogonalised columns alike.
    const bool nhwc = !u.is_contiguous() && u.dim() == 4 && u.is_contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor m = nhwc ? u.permute({0, 2, 3, 1}).flatten(1) : (u.dim() > 2 ? u.flatten(1) : u.contiguous());
    const double scale = std::sqrt(std::max(1.0, double(g.size(-2)) / double(g.size(-1))));
    buckets[{m.size(1), scale}].push_back(Item{i, std::move(m), nhwc});
  }
  for (auto& [key, items] : buckets) {
    std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.m.size(0) > y.m.size(0); });
    for (size_t start = 0, j = 1; j <= items.size(); ++j) {
      if (j < items.size() && items[start].m.size(0) <= 16 * items[j].m.size(0)) continue;
      const int64_t n = int64_t(j - start), rows = items[start].m.size(0);
      at::Tensor X = at::zeros({n, rows, key.first}, items[start].m.options());
      for (int64_t k = 0; k < n; ++k) X[k].narrow(0, 0, items[start + k].m.size(0)).copy_(items[start + k].m);
      X = newton_schulz5(X).contiguous().to(X.scalar_type()).mul_(key.second);
      for (int64_t k = 0; k < n; ++k) {
        const Item& it = items[start + k];
        const at::Tensor x = X[k].narrow(0, 0, it.m.size(0));
        const at::Tensor& g = grads[it.index];
        out.updates[it.index] = it.nhwc ? x.as_strided(g.sizes(), out.updates[it.index].strides()) : x.reshape(g.sizes());
      }
      start = j;
    }
  }
  return out;
}

// Adam's, AdamW's and RMSprop's in-place update needs one workspace; SGD's and MuSGD's SGD part none.
bool needs_workspace(OptimizerKind kind) {
  return kind == OptimizerKind::adam || kind == OptimizerKind::adamw || kind == OptimizerKind::rmsprop;
}

}  // namespace

OptimizerKind optimizer_kind_from(const std::string& word) { return enum_from_word(word, kOptimizerKind); }
const char* to_string(OptimizerKind k) { return enum_word(k, kOptimizerKind); }

std::vector<ParamGroup> parameter_groups(torch::nn::Module& model, double weight_decay, OptimizerKind kind, const ParamFilter& boosted) {
  const bool musgd = kind == OptimizerKind::musgd;
  enum { kWeights, kNorm, kBias, kMuon };
  std::array<ParamGroup, 4> groups = {ParamGroup{"weights", {}, 0, 0, weight_decay, false}, ParamGroup{"norm", {}, 0, 0, 0, false},
                                      ParamGroup{"bias", {}, 0, 0, 0, true},
                                      ParamGroup{"muon", {}, 0, 0, weight_decay, false, /*muon=*/true}};
  std::array<std::vector<std::string>, 4> names;  // of each group's parameters
  // As Ultralytics: by the owning module's type, not the tensor's rank (YOLO12's 1-D gamma decays).
  const auto add = [&](const std::string& prefix, torch::nn::Module& owner) {
    const bool norm = owner.as<torch::nn::BatchNorm2d>() != nullptr;
    for (const auto& item : owner.named_parameters(/*recurse=*/false)) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      const std::string name = prefix.empty() ? item.key() : prefix + "." + item.key();
      const size_t g = musgd && (p.dim() == 2 || p.dim() == 4) ? kMuon  // matrices and convolution filters: Muon orthogonalises them
                       : item.key() == "bias"                   ? kBias
                       : norm                                   ? kNorm
                                                                : kWeights;
      groups[g].params.push_back(p);
      names[g].push_back(name);
    }
  };
  add("", model);
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) add(item.key(), *item.value());
  std::vector<ParamGroup> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (musgd && boosted) {
      // Ultralytics' MuSGD trains the head's class branch at 3x lr: a group of its own, first.
      ParamGroup fast = groups[g], rest = groups[g];
      fast.name += " (class branch, 3x lr)", fast.lr_scale = 3, fast.params.clear(), rest.params.clear();
      for (size_t i = 0; i < groups[g].params.size(); ++i) (boosted(names[g][i]) ? fast : rest).params.push_back(groups[g].params[i]);
      for (auto* part : {&fast, &rest})
        if (!part->params.empty()) out.push_back(std::move(*part));
    } else if (!groups[g].params.empty()) {
      out.push_back(std::move(groups[g]));
    }
  }
  return out;
}

int64_t Optimizer::update_workspace_bytes() const {
  if (fused_) return 0;
  int64_t bytes = 0;
  for (const ParamGroup& g : groups_)
    for (const at::Tensor& p : g.params) {
      if (needs_workspace(options_.kind()))
        bytes = std::max<int64_t>(bytes, int64_t(p.nbytes()));
      else if (options_.kind() == OptimizerKind::musgd && g.muon)
        bytes += 2 * int64_t(p.nbytes());
    }
  return bytes;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options)
    : groups_(std::move(groups)), options_(options) {
#if HEADROOM_HAS_FUSED_OPTIMIZERS
  fused_ = options_.fused() && options_.kind() != OptimizerKind::rmsprop && options_.kind() != OptimizerKind::musgd;
#endif
  for (const auto& g : groups_) {
    State s;
    const bool two_buffers = options_.kind() == OptimizerKind::musgd ? g.muon : options_.kind() != OptimizerKind::sgd;
    for (const auto& p : g.params) {
      s.buf1.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (two_buffers) s.buf2.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
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

void Optimizer::set_rates_on_device() {
  rates_.clear();
  for (const auto& g : groups_) rates_.push_back(at::full({}, g.lr, g.params.front().options().dtype(at::kFloat)));
}

void Optimizer::load_rates() {
  for (size_t i = 0; i < rates_.size(); ++i) rates_[i].fill_(groups_[i].lr);
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.mutable_grad().reset();
}

void Optimizer::step(const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  std::vector<Active> active;
  int64_t largest = 0;  // elements of the largest parameter with a gradient
  for (size_t i = 0; i < groups_.size(); ++i) {
    ParamGroup& g = groups_[i];
    State& s = state_[i];
    // Parameters without a gradient this step (unused heads) are left alone, as torch.optim does.
    Active a{&g, {}, {}, {}, {}, s.step};
    for (size_t j = 0; j < g.params.size(); ++j) {
      if (!g.params[j].grad().defined()) continue;
      a.params.push_back(g.params[j]);
      a.grads.push_back(g.params[j].grad());
      a.buf1.push_back(s.buf1[j]);
      if (!s.buf2.empty()) a.buf2.push_back(s.buf2[j]);
      largest = std::max<int64_t>(largest, g.params[j].numel());
    }
    if (!a.params.empty()) active.push_back(std::move(a));
  }
  if (active.empty()) return;
  if (fused_) {
    // In-place kernels. The step count's increment is a tensor made before the first group is
    // written (a plain 1 would be wrapped in a fresh tensor for each group): an out-of-memory error
    // leaves every group untouched, and the governor's re-run applies the update once.
    const at::Tensor one = at::ones({}, active.front().step.options());
    for (auto& a : active) step_fused(*a.group, a, found_inf, one);
    return;
  }
  step_in_place(active, largest, found_inf);
}

void Optimizer::step_in_place(std::vector<Active>& active, int64_t largest, const at::Tensor& found_inf) {
  // Atomic without a copy of the model: everything the update allocates — Adam's and RMSprop's one
  // workspace the size of the largest parameter, MuSGD's Muon buffers and updates, and the 0-dim
  // factors — is made before the first parameter changes;
  // after that every op writes in place and allocates nothing (no plain-number operands, which
  // LibTorch wraps in fresh tensors). An out-of-memory error leaves parameters and state untouched
  // and the governor can re-run the step; the extra memory is bounded by that one workspace (MuSGD:
  // twice its matrices, and Newton-Schulz's bf16 batches).
  const OptimizerKind kind = options_.kind();
  const at::Tensor& p0 = active.front().params.front();
  const at::Tensor workspace = needs_workspace(kind) ? at::empty({largest}, p0.options()) : at::Tensor();  // SGD updates in place without one
  // Skipped by the device's flag without reading it (GroupStep): the gradients zeroed where it is
  // set, before anything reads them.
  const at::Tensor skip = found_inf.defined() ? found_inf.gt(0) : at::zeros({}, p0.options().dtype(at::kBool));
  if (found_inf.defined())
    for (Active& a : active)
      for (at::Tensor& g : a.grads) g.masked_fill_(skip, 0);
  std::vector<GroupStep> group_steps;
  std::vector<MuonUpdates> muon(active.size());
  for (size_t i = 0; i < active.size(); ++i) {
    const Active& a = active[i];
    const at::Tensor rate = rates_.empty() ? at::Tensor() : rates_.at(size_t(a.group - groups_.data()));
    group_steps.push_back(group_step(*a.group, a.step, skip, rate, options_, p0.options()));
    if (a.group->muon) muon[i] = muon_updates(a.grads, a.buf1, a.group->momentum, group_steps[i].momentum, options_.nesterov());
  }
  for (size_t i = 0; i < active.size(); ++i) {
    Active& a = active[i];
    const GroupStep& s = group_steps[i];
    for (size_t j = 0; j < a.params.size(); ++j) {
      if (a.group->muon) {  // Muon's update, then SGD's on its own buffer (its decay sees the new p)
        a.buf1[j].copy_(muon[i].buffers[j]);
        a.params[j].addcmul_(muon[i].updates[j], s.muon_rate);
        sgd_update(a.params[j], a.grads[j], a.buf2[j], s, options_);
      } else if (kind == OptimizerKind::rmsprop) {
        rmsprop_update(a.params[j], a.grads[j], a.buf1[j], a.buf2[j], workspace, s, options_);
      } else if (kind == OptimizerKind::sgd || kind == OptimizerKind::musgd) {
        sgd_update(a.params[j], a.grads[j], a.buf1[j], s, options_);
      } else {
        adam_update(a.params[j], a.grads[j], a.buf1[j], a.buf2[j], workspace, s, options_);
      }
    }
    a.step.add_(s.keep);
  }
}

void Optimizer::step_fused(ParamGroup& g, Active& s, const at::Tensor& found_inf, const at::Tensor& one) {
  std::vector<at::Tensor>& params = s.params;
  std::vector<at::Tensor>& grads = s.grads;
#if HEADROOM_HAS_FUSED_OPTIMIZERS
  const c10::optional<at::Tensor> inf = found_inf.defined() ? c10::optional<at::Tensor>(found_inf) : c10::nullopt;
  s.step.add_(one);
  const std::vector<at::Tensor> steps(params.size(), s.step);
  // The same kernels with lr as a host number or as the group's device tensor.
  const auto update = [&](const auto& lr) {
    switch (options_.kind()) {
      case OptimizerKind::sgd:
        at::_fused_sgd_(params, grads, g.momentum != 0 ? at::TensorList(s.buf1) : at::TensorList(), g.weight_decay, g.momentum,
                        lr, /*dampening=*/0.0, options_.nesterov(), /*maximize=*/false, /*is_first_step=*/false, c10::nullopt, inf);
        break;
      case OptimizerKind::adam:
        at::_fused_adam_(params, grads, s.buf1, s.buf2, {}, steps, lr, g.momentum, options_.beta2(), g.weight_decay, options_.eps(),
                         /*amsgrad=*/false, /*maximize=*/false, c10::nullopt, inf);
        break;
      case OptimizerKind::adamw:
        at::_fused_adamw_(params, grads, s.buf1, s.buf2, {}, steps, lr, g.momentum, options_.beta2(), g.weight_decay, options_.eps(),
                          /*amsgrad=*/false, /*maximize=*/false, c10::nullopt, inf);
        break;
      case OptimizerKind::rmsprop:
      case OptimizerKind::musgd:
        TORCH_INTERNAL_ASSERT(false, "RMSprop and MuSGD have no fused kernel (the constructor keeps them in place)");
    }
  };
  if (rates_.empty())
    update(g.lr);
  else
    update(rates_.at(size_t(&g - groups_.data())));
  if (inf) s.step.sub_(*inf);  // a skipped step does not count
#else
  (void)g, (void)params, (void)grads, (void)found_inf, (void)one;
  throw Error("fused optimizers need LibTorch 2.4 or newer");
#endif
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
