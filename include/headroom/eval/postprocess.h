// From head outputs to detections: per-family decoding and class-aware batched NMS on the
// device the outputs live on (a CUDA kernel where CUDA is built, a CPU kernel otherwise).
// Results are fixed-shape: [B, M] padded rows with a count per image.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "headroom/data/batch.h"
#include "headroom/models/detector.h"

namespace headroom::eval {

struct Detections {
  at::Tensor boxes;    // [B, M, 4] xyxy
  at::Tensor scores;   // [B, M]
  at::Tensor classes;  // [B, M] int64
  at::Tensor counts;   // [B] int64: rows in use per image, best score first
};

struct NmsOptions {
  double conf = 0.25;
  double iou = 0.7;
  int64_t max_det = 300;
  bool agnostic = false;
  bool multi_label = false;       // a box may be kept for every class above conf (validation)
  int64_t max_candidates = 30000; // per image, by score, before NMS
};

// boxes [B, A, 4] xyxy, scores [B, A, C] in [0, 1].
Detections batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const NmsOptions& o);

// An end-to-end head's detections without NMS (YOLO26's one-to-one branch, as Ultralytics
// selects them): the max_det anchors with the best class scores, then the max_det best
// (anchor, class) pairs among them (one class per anchor when agnostic), those above conf kept.
Detections topk_detections(const at::Tensor& boxes, const at::Tensor& scores, const NmsOptions& o);

// Greedy NMS of score-sorted candidates: boxes [B, K, 4], valid [B, K] bool -> keep [B, K] bool.
// A candidate is kept unless a kept, higher-ranked candidate of the same image overlaps it by
// more than `iou` (class separation is the caller's, by offsetting boxes).
at::Tensor nms_keep(const at::Tensor& boxes, const at::Tensor& valid, double iou);

struct DecodeOptions {
  NmsOptions nms;
  int64_t topk = 100;     // CenterNet peaks per image
  bool one_to_one = true; // an end-to-end head: its one-to-one branch, top-k; false: the one-to-many branch, NMS
};

// YOLO's per-anchor predictions before NMS, in the model's input pixels (what an exported ONNX
// graph outputs, as [B, 4 + nc, A] xywh); an end-to-end head's from its one-to-one branch unless
// one_to_one is false.
struct Candidates {
  at::Tensor boxes;   // [B, A, 4] xyxy
  at::Tensor scores;  // [B, A, nc] in [0, 1]
};
Candidates decode_candidates(const models::DetectorInfo& info, const models::HeadOutputs& outputs, bool one_to_one = true);

// Detections in the model's input pixels: NMS, or top-k for an end-to-end head.
Detections decode(const models::DetectorInfo& info, const models::HeadOutputs& outputs, const DecodeOptions& o);
// The model (in eval mode) on `input`, decoded: an end-to-end head decoded by its one-to-one
// branch runs that branch alone.
Detections detect(models::DetectorImpl& model, const at::Tensor& input, const DecodeOptions& o);

// Maps detections from the letterboxed canvas back to original-image pixels (clipped), on the
// host. Returns, per image, rows of (x1, y1, x2, y2, score, class).
std::vector<std::vector<std::array<float, 6>>> to_original_pixels(const Detections& d, const std::vector<data::ImageMeta>& meta);

}  // namespace headroom::eval
