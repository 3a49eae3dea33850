// Optimizers over parameter groups: the fused ATen kernels (_fused_sgd_ / _fused_adam_ /
// _fused_adamw_, CPU and CUDA) where this LibTorch has them, in-place per-tensor updates
// otherwise (and for RMSprop and MuSGD, which have no fused kernel). Both are atomic without staging a copy of the model: the fused kernels allocate
// nothing, the in-place path allocates at most one workspace the size of the largest parameter (Adam, RMSprop; SGD none) before it
// changes anything; MuSGD computes all its Muon updates (new buffers and orthogonalised updates, the
// size of its matrices twice over) before it changes anything. A step can be skipped by a device flag (found_inf) without a host sync on
// either path, which is what the loss scaler and the non-finite guard rely on: the fused kernels take the flag, the in-place updates
// are gated by it on the device (a skipped step writes every state with its own value).
#pragma once

#include <ATen/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <string>
#include <vector>

namespace headroom::train {

// rmsprop is TensorFlow's (tf.keras' legacy RMSprop, which the TF OD API's rms_prop_optimizer
// builds): ms = rho ms + (1 - rho) g^2; with momentum, buf = momentum buf + lr g / sqrt(ms + eps)
// and p -= buf (TF's ApplyRMSProp kernel); without, p -= lr g / (sqrt(ms) + eps). Its weight decay
// is decoupled (p *= 1 - lr wd), as AdamW's; TF adds none.
// musgd is Ultralytics' MuSGD (YOLO26's optimizer for long runs): the Muon groups' 2-D and 4-D
// tensors take Muon's update (momentum buf = m buf + (1 - m) g, Nesterov u = m buf + (1 - m) g,
// orthogonalised by five Newton-Schulz steps in bf16 on the tensor flattened to [out, in * k * k],
// times sqrt(max(1, size(-2) / size(-1))), at muon_scale * lr) and then SGD's (its own buffer, the
// decay, Nesterov, at sgd_scale * lr); other groups take SGD's alone.
enum class OptimizerKind { sgd, adam, adamw, rmsprop, musgd };
OptimizerKind optimizer_kind_from(const std::string& word);  // train.optimizer
const char* to_string(OptimizerKind k);

struct OptimizerOptions {
  TORCH_ARG(OptimizerKind, kind) = OptimizerKind::sgd;
  TORCH_ARG(double, momentum) = 0.937;  // SGD and RMSprop momentum; Adam beta1
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, rho) = 0.9;         // RMSprop: the squared gradients' moving-average factor
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(bool, fused) = true;        // use the fused kernels when available
  TORCH_ARG(double, muon_scale) = 0.2;  // MuSGD: the Muon update's share of lr (Ultralytics' muon=0.2)
  TORCH_ARG(double, sgd_scale) = 1.0;   // MuSGD: the SGD update's share in Muon groups (sgd=1.0)
};

// One group: its parameters and hyper-parameters (the schedule sets lr and momentum per step).
struct ParamGroup {
  std::string name;                  // "weights" | "norm" | "bias"
  std::vector<at::Tensor> params;
  double lr = 0.01;
  double momentum = 0.937;
  double weight_decay = 0;
  bool is_bias = false;              // warmup starts biases at warmup_bias_lr
  bool muon = false;                 // MuSGD: Muon's update, then SGD's
  double lr_scale = 1;               // the schedule's rate times this (MuSGD: 3 for the class branch)
};

// Ultralytics' split: convolution / linear weights (and YOLO12's gamma) with decay; BatchNorm weights and
// biases without. For MuSGD (as Ultralytics' build_optimizer): every 2-D and 4-D tensor in a Muon
// group with decay, and each group split in two, the `boosted` tensors (the head's class branch)
// learning at 3x lr.
using ParamFilter = std::function<bool(const std::string& name)>;
std::vector<ParamGroup> parameter_groups(torch::nn::Module& model, double weight_decay, OptimizerKind kind = OptimizerKind::sgd,
                                         const ParamFilter& boosted = {});

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options);

  // found_inf: undefined, or a float [] tensor on the parameters' device; 1 skips the update.
  void step(const at::Tensor& found_inf = {});
  void zero_grad();  // gradients to undefined (accumulation starts from nothing)

  std::vector<ParamGroup>& groups() { return groups_; }
  const OptimizerOptions& options() const { return options_; }
  bool fused() const { return fused_; }
  // Bytes an update allocates beside the state (the estimator counts them): on the in-place path
  // Adam's, AdamW's and RMSprop's one workspace the size of the largest parameter, SGD's none,
  // MuSGD's new buffers and updates of its Muon matrices (Newton-Schulz's bf16 batches come on
  // top); the fused kernels none.
  int64_t update_workspace_bytes() const;
  // Updates then read each group's lr from a device tensor that load_rates fills from the groups
  // (queued before the update, outside a captured graph), so that a graph replayed at every step
  // (train/step_graph.h) follows the schedule.
  void set_rates_on_device();
  void load_rates();
  std::vector<at::Tensor> grads() const;  // defined gradients of every group
  std::vector<at::Tensor> state_tensors() const;  // momentum / moment buffers and step counters

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  struct State {
    std::vector<at::Tensor> buf1, buf2;  // SGD momentum | Adam exp_avg, exp_avg_sq | RMSprop momentum, ms | MuSGD Muon's, SGD's (Muon groups)
    at::Tensor step;                     // float [] on the device: optimizer steps taken
  };
  // A group's parameters with a gradient this step, with their state.
  struct Active {
    ParamGroup* group;
    std::vector<at::Tensor> params, grads, buf1, buf2;
    at::Tensor step;
  };
  void step_fused(ParamGroup& g, Active& s, const at::Tensor& found_inf, const at::Tensor& one);
  // Without fused kernels: one workspace of `largest` elements, then in-place updates.
  void step_in_place(std::vector<Active>& active, int64_t largest, const at::Tensor& found_inf);

  std::vector<ParamGroup> groups_;
  std::vector<State> state_;
  std::vector<at::Tensor> rates_;  // per group, [] float on the device: empty = lr from the host
  OptimizerOptions options_;
  bool fused_ = false;
};

}  // namespace headroom::train
