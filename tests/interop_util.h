// Helpers of the interop tests: the committed fixtures, the outputs the reference libraries
// computed for them, and the largest difference of two tensors.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "headroom/interop/safetensors.h"

namespace headroom::test {

inline std::string fixture(const std::string& name) { return std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/interop/" + name; }
inline double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>(); }

// The outputs the reference library computed for fixture `name` (its .ref.safetensors).
inline std::map<std::string, at::Tensor> reference(const std::string& name) {
  std::map<std::string, at::Tensor> out;
  for (auto& [k, t] : interop::read_safetensors(fixture(name + ".ref.safetensors")).tensors) out[k] = t;
  return out;
}

}  // namespace headroom::test
