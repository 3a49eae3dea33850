#include "headroom/data/batch.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace headroom::data {

void collate(HostBatch& batch, const std::vector<ItemBoxes>& items, bool pin_memory) {
  const int64_t B = static_cast<int64_t>(items.size());
  int64_t N = 0;
  for (const auto& it : items) N = std::max<int64_t>(N, static_cast<int64_t>(it.classes.size()));
  const auto opt = at::TensorOptions().pinned_memory(pin_memory);
  batch.boxes = at::zeros({B, N, 4}, opt.dtype(at::kFloat));
  batch.classes = at::full({B, N}, -1, opt.dtype(at::kLong));
  batch.crowd = at::zeros({B, N}, opt.dtype(at::kBool));
  batch.counts = at::empty({B}, opt.dtype(at::kLong));
  batch.sample_ids = at::empty({B}, opt.dtype(at::kLong));
  batch.content = at::empty({B, 4}, opt.dtype(at::kFloat));
  batch.scale = at::empty({B}, opt.dtype(at::kFloat));
  float* boxes = batch.boxes.data_ptr<float>();
  int64_t* classes = batch.classes.data_ptr<int64_t>();
  bool* crowd = batch.crowd.data_ptr<bool>();
  int64_t* counts = batch.counts.data_ptr<int64_t>();
  int64_t* ids = batch.sample_ids.data_ptr<int64_t>();
  float* content = batch.content.data_ptr<float>();
  float* scale = batch.scale.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const ImageMeta& m = batch.meta[size_t(b)];
    ids[b] = m.index;
    const float x0 = float(m.geometry.pad_x), y0 = float(m.geometry.pad_y);
    const float c[4] = {x0, y0, x0 + float(m.geometry.resized_w), y0 + float(m.geometry.resized_h)};
    std::copy(c, c + 4, content + 4 * b);
    scale[b] = m.geometry.orig_w > 0 ? float(m.geometry.resized_w) / float(m.geometry.orig_w) : 1.0f;
    const ItemBoxes& it = items[static_cast<size_t>(b)];
    counts[b] = static_cast<int64_t>(it.classes.size());
    for (size_t j = 0; j < it.classes.size(); ++j) {
      std::copy(it.xyxy[j].begin(), it.xyxy[j].end(), boxes + (b * N + int64_t(j)) * 4);
      classes[b * N + int64_t(j)] = it.classes[j];
      crowd[b * N + int64_t(j)] = it.crowd[j];
    }
  }
}

}  // namespace headroom::data
