// Internal: helpers shared by augment.cpp (parameters, colour, apply) and warp.cpp (images and boxes).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace headroom::augment {

// Column i of the last dimension, e.g. x1 of [.., 4] xyxy boxes.
inline at::Tensor col(const at::Tensor& t, int64_t i) { return t.select(-1, i); }

// Runs fn(b0, n) over the batch in pieces and concatenates the results. On the CPU the pieces
// hold ~16 MB of output, so the temporaries are reused from the heap instead of being fresh
// (page-faulting) mappings; on CUDA the whole batch is one piece.
template <class F>
at::Tensor in_chunks(const at::Tensor& like, int64_t batch, int64_t bytes_per_image, F&& fn) {
  const int64_t chunk = like.is_cuda() ? batch : std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(bytes_per_image, 1));
  if (chunk >= batch) return fn(0, batch);
  std::vector<at::Tensor> parts;
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) parts.push_back(fn(b0, std::min(chunk, batch - b0)));
  return at::cat(parts);
}

}  // namespace headroom::augment
