// Recompute in backward (what Python calls activation checkpointing; the config key keeps that
// name, the code says recompute, so that "checkpoint" means a file): a segment's forward keeps
// only its inputs; backward recomputes it with grad under the forward's RNG and autocast state,
// then returns the gradients of its inputs and parameters.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <string>
#include <vector>


namespace torch::nn {
class Module;
}

namespace headroom::models {

// Which segments recompute in backward (memory.activation_checkpointing):
//   stages: coarse (YOLO: backbone and neck stages; Hourglass: one segment per stack)
//   all:    fine (YOLO: every layer with parameters; Hourglass: every block sequence of every level)
// The config's `auto` is the memory planner's choice of stages, made per input size.
enum class RecomputeMode { off, stages, all };
RecomputeMode recompute_mode_from(const std::string& word);  // off | stages | all ("auto": off until planned)
const char* to_string(RecomputeMode m);

using SegmentFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs). When grad mode is on, keeps only `inputs` and recomputes fn in backward.
// `modules` supply the parameters (they get gradients even if no input requires grad) and the
// buffers (restored after the recompute, so BatchNorm statistics are updated once per step).
// fn must capture what it needs by value: it runs again during backward.
std::vector<at::Tensor> recompute(const SegmentFn& fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<torch::nn::Module*>& modules);

// Convenience for a module with forward(Tensor) -> Tensor held by a ModuleHolder.
template <class Holder>
at::Tensor recompute_module(Holder m, const at::Tensor& x) {
  return recompute([m](const std::vector<at::Tensor>& in) mutable { return std::vector<at::Tensor>{m->forward(in[0])}; },
                   {x}, {m.ptr().get()})[0];
}

}  // namespace headroom::models
