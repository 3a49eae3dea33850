// Precompiled header for the TUs that use tensors. ATen alone: a TU then compiles in ~1.5 s
// instead of ~9 s; a PCH of all of <torch/torch.h> costs ~7 s a TU just to load.
#pragma once

#include <ATen/ATen.h>
#include <torch/arg.h>
