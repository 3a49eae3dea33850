#include "headroom/models/recompute.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/module.h>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/core/torch_compat.h"

namespace headroom::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;

  static AutocastState capture() {
    AutocastState s;
    s.cpu = compat::autocast_enabled(c10::kCPU);
    s.cuda = compat::autocast_enabled(c10::kCUDA);
    s.cpu_dtype = compat::autocast_dtype(c10::kCPU);
    s.cuda_dtype = compat::autocast_dtype(c10::kCUDA);
    return s;
  }
  void apply() const {
    compat::set_autocast_enabled(c10::kCPU, cpu);
    compat::set_autocast_enabled(c10::kCUDA, cuda);
    compat::set_autocast_dtype(c10::kCPU, cpu_dtype);
    compat::set_autocast_dtype(c10::kCUDA, cuda_dtype);
  }
};

// Puts a saved autocast state in force for a scope (autocast is thread-local and the
// autograd engine runs backward on its own threads, with autocast off).
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& s) : previous_(AutocastState::capture()) {
    s.apply();
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    previous_.apply();
  }

 private:
  AutocastState previous_;
};

// The generators a segment may draw from: the CPU one, and the CUDA one of its device.
std::vector<at::Generator> generators_for(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
  for (const auto& t : inputs)
    if (t.defined() && t.is_cuda()) {
      gens.push_back(at::globalContext().defaultGenerator(t.device()));
      break;
    }
  return gens;
}

// What backward needs besides the saved inputs; lives in the autograd graph (freed with it
// when backward never runs, e.g. after an out-of-memory error).
struct SegmentState : torch::CustomClassHolder {
  SegmentFn fn;
  size_t num_inputs = 0;
  std::vector<at::Tensor> params;   // alive anyway: holding them costs no memory
  std::vector<at::Tensor> buffers;
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> rng_states;
  AutocastState autocast;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs_and_params,
                               c10::intrusive_ptr<SegmentState> state) {
    std::vector<at::Tensor> inputs(inputs_and_params.begin(), inputs_and_params.begin() + long(state->num_inputs));
    state->generators = generators_for(inputs);
    for (auto& g : state->generators) state->rng_states.push_back(g.get_state());
    state->autocast = AutocastState::capture();
    ctx->save_for_backward(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return state->fn(inputs);  // grad mode is off here: no activations are kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (const auto& t : saved) inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);

    // Recompute with the forward's random numbers and autocast, then put everything back.
    std::vector<at::Tensor> rng_now;
    for (auto& g : state->generators) rng_now.push_back(g.get_state());
    for (size_t i = 0; i < state->generators.size(); ++i) state->generators[i].set_state(state->rng_states[i]);
    std::vector<at::Tensor> buffer_copies;
    for (const auto& b : state->buffers) buffer_copies.push_back(b.clone());
    variable_list outputs;
    {
      AutocastScope autocast(state->autocast);
      at::AutoGradMode grad(true);
      outputs = state->fn(inputs);
    }
    for (size_t i = 0; i < state->generators.size(); ++i) state->generators[i].set_state(rng_now[i]);

    // Backward through the recomputed graph: parameter gradients accumulate straight into
    // .grad (returning them instead would hold a copy of all of them at once, as much memory as
    // the segment's activations for a Hourglass stack); the inputs' gradients are returned.
    variable_list outs, grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        outs.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!outs.empty()) torch::autograd::backward(outs, grads);
    variable_list result(inputs.size() + state->params.size() + 1);  // + the state argument
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) result[i] = inputs[i].grad();
    // Only now: BatchNorm's backward reads the running statistics it saved.
    outputs.clear();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffer_copies.size(); ++i) state->buffers[i].copy_(buffer_copies[i]);
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> recompute(const SegmentFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<torch::nn::Module*>& modules) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<SegmentState>();
  state->fn = fn;
  state->num_inputs = inputs.size();
  std::vector<at::Tensor> all = inputs;
  for (torch::nn::Module* m : modules) {
    for (const auto& p : m->parameters()) all.push_back(p), state->params.push_back(p);
    for (const auto& b : m->buffers()) state->buffers.push_back(b);
  }
  return CheckpointFunction::apply(at::TensorList(all), state);
}

namespace {
const std::pair<const char*, RecomputeMode> kRecomputeMode[] = {
    {"off", RecomputeMode::off}, {"stages", RecomputeMode::stages}, {"all", RecomputeMode::all}, {"auto", RecomputeMode::off}};
}  // namespace

RecomputeMode recompute_mode_from(const std::string& word) { return enum_from_word(word, kRecomputeMode); }
const char* to_string(RecomputeMode m) { return enum_word(m, kRecomputeMode); }

}  // namespace headroom::models
