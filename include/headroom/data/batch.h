// The batch the loader hands over: fixed-shape tensors (boxes padded to the batch's largest
// count) so augmentation and target assignment work on whole batches.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "headroom/data/letterbox.h"

namespace headroom::data {

struct ImageMeta {
  int64_t index = 0;   // sample index in the split
  Letterbox geometry;  // maps canvas pixels back to the original image
  // false: the image could not be decoded and was left out (validation, prediction): its slot
  // holds the pad colour and no boxes, and what the model says of it is not the image's.
  bool decoded = true;
};

struct HostBatch {
  at::Tensor images;   // [B, 3, S, S] uint8 RGB; pinned when the run uses CUDA
  at::Tensor boxes;    // [B, N, 4] float32 xyxy canvas pixels; rows >= counts[b] are zero
  at::Tensor classes;  // [B, N] int64; -1 in padding rows
  at::Tensor crowd;    // [B, N] bool; COCO iscrowd (evaluation only)
  at::Tensor counts;   // [B] int64 boxes per image
  at::Tensor sample_ids;  // [B] int64: meta[b].index, as a tensor for the device
  at::Tensor content;     // [B, 4] float xyxy canvas pixels where the image lies (its letterbox)
  at::Tensor scale;       // [B] float canvas pixels per pixel of the original image
  std::vector<ImageMeta> meta;
  int64_t epoch = 0;
  int64_t index = 0;          // batch index within the epoch (of the global batch, on several ranks)
  int64_t global_size = 0;    // images of this batch across all ranks (size() on one process)
  int64_t largest_share = 0;  // the most images any rank has of it (parts are cut alike on every rank)
  double wait_seconds = 0;    // how long the consumer waited for this batch

  int64_t size() const { return static_cast<int64_t>(meta.size()); }
};

// Builds the box tensors from per-image lists (N = the largest count, 0 when none has boxes) and
// the per-image tensors from `meta`, all on the host (pinned for CUDA runs, so the step copies
// them without blocking).
void collate(HostBatch& batch, const std::vector<ItemBoxes>& items, bool pin_memory);

}  // namespace headroom::data
