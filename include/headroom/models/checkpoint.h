// Activation checkpointing without torch.utils.checkpoint (C++ has none): a segment's forward
// keeps only its inputs; backward recomputes it with grad under the forward's RNG and
// autocast state, then returns the gradients of its inputs and parameters.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "headroom/core/config.h"

namespace torch::nn {
class Module;
}

namespace headroom::models {

using SegmentFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs). When grad mode is on, keeps only `inputs` and recomputes fn in backward.
// `modules` supply the parameters (they get gradients even if no input requires grad) and the
// buffers (restored after the recompute, so BatchNorm statistics are updated once per step).
// fn must capture what it needs by value: it runs again during backward.
std::vector<at::Tensor> checkpoint(const SegmentFn& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<torch::nn::Module*>& modules);

// Convenience for a module with forward(Tensor) -> Tensor held by a ModuleHolder.
template <class Holder>
at::Tensor checkpoint_module(Holder m, const at::Tensor& x) {
  return checkpoint([m](const std::vector<at::Tensor>& in) mutable { return std::vector<at::Tensor>{m->forward(in[0])}; },
                    {x}, {m.ptr().get()})[0];
}

}  // namespace headroom::models
