// ONNX export (opset 17) through the ONNX library's own protobuf classes, checker and shape
// inference: the model's modules are walked and written as ONNX nodes, BatchNorm folded into
// the convolutions. YOLO graphs end with the decode, as Ultralytics exports them:
//   output0 [B, 4 + nc, A]: per anchor point box centre x, y, width, height in input pixels,
//           then the class scores in [0, 1] (YOLOv5 anchored heads: objectness x class)
//   end-to-end heads (YOLO26) need no NMS, and the graph ends with their detections:
//   output0 [B, min(max_det, A), 6]: x1, y1, x2, y2 in input pixels, score, class, best first
//           (rows under the caller's confidence threshold are the caller's to drop)
// CenterNet graphs output the last stack's maps (docs/models.md gives the decode):
//   heatmap [B, nc, H/4, W/4] class probabilities, size [B, 2, H/4, W/4] box w, h and
//   offset [B, 2, H/4, W/4] centre offsets, both in output cells.
// The input `images` is [B, 3, S, S] RGB in [0, 1]; B is symbolic ("batch") with `dynamic`.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>

#include "headroom/models/detector.h"
#include "headroom/models/weights.h"

namespace headroom::interop {

struct OnnxExportOptions {
  TORCH_ARG(int64_t, imgsz) = 640;   // square input side, a multiple of the model's stride
  TORCH_ARG(int64_t, batch) = 1;     // the static batch (ignored with dynamic)
  TORCH_ARG(bool, dynamic) = false;  // symbolic batch dimension
  TORCH_ARG(bool, half) = false;     // fp16 weights, input and outputs
  TORCH_ARG(int64_t, max_det) = 300; // end-to-end heads: detections per image
  // An end-to-end head (YOLO26): its one-to-one detections [B, k, 6]; false, its one-to-many
  // branch per anchor [B, 4 + nc, A] for the runtime's NMS, as the other YOLO heads.
  TORCH_ARG(bool, end2end) = true;
};

// Folds the model's BatchNorms (it is changed in place), writes the graph, checks it with the
// ONNX checker and shape inference, then writes the file whole or not at all. Metadata:
// names, stride, imgsz, batch, task as Ultralytics writes them. Error on a module it cannot
// write.
void export_onnx(models::DetectorImpl& model, const models::WeightsInfo& info, const std::string& path, const OnnxExportOptions& o);

}  // namespace headroom::interop
