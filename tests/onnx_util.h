// The ONNX graph a test exported, run by ONNX Runtime, and the model's own outputs in the
// graph's output names.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>

#include "headroom/interop/onnx_proto.h"  // first: it fixes the ONNX namespace
#include "headroom/eval/postprocess.h"
#include "headroom/interop/safetensors.h"
#include "headroom/models/detector.h"
#include "test_util.h"

namespace headroom::test {

// Runs an exported graph with ONNX Runtime (tests/onnxruntime_run.py, in the Python that
// `make onnxruntime` sets up): its outputs by name, as float32. An fp16 graph runs in fp16.
inline std::map<std::string, at::Tensor> run_onnx(const std::string& path, const at::Tensor& images) {
  const std::string python = HEADROOM_ONNXRUNTIME_PYTHON;
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no ONNX Runtime to check the export with: " << python << " is missing (make onnxruntime)";
    return {};
  }
  const std::string in = path + ".input.safetensors", out = path + ".onnxruntime.safetensors";
  interop::SafeTensors x;
  x.tensors.emplace_back("images", images.to(at::kFloat).contiguous());
  interop::write_safetensors(in, x);
  const test::RunResult r = test::run_command(python + " " + HEADROOM_SOURCE_DIR + "/tests/onnxruntime_run.py " + path + " " + in + " " + out);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "ONNX Runtime failed on " << path << ":\n" << r.output;
    return {};
  }
  std::map<std::string, at::Tensor> outputs;
  for (auto& [name, t] : interop::read_safetensors(out).tensors) outputs[name] = t;
  return outputs;
}

// What the graph should output, from our forward: YOLO [B, 4 + nc, A] xywh + scores (end-to-end
// heads: every top-k detection [B, k, 6]; with end2end false their one-to-many branch per anchor),
// CenterNet the last stack's sigmoid heatmap, size and offset.
inline std::map<std::string, at::Tensor> forward_outputs(models::DetectorImpl& model, const at::Tensor& x, bool end2end = true) {
  model.eval();
  at::NoGradGuard no_grad;
  const models::HeadOutputs out = model.forward(x);
  if (model.info().family == "centernet")
    return {{"heatmap", out.at("heatmap").back().sigmoid()}, {"size", out.at("size").back()}, {"offset", out.at("offset").back()}};
  const eval::Candidates c = eval::decode_candidates(model.info(), out, end2end);
  if (model.info().end2end && end2end) {
    eval::NmsOptions every;
    every.conf = -1;
    const eval::Detections d = eval::topk_detections(c.boxes, c.scores, every);
    return {{"output0", at::cat({d.boxes, d.scores.unsqueeze(2), d.classes.unsqueeze(2).to(at::kFloat)}, 2)}};
  }
  const at::Tensor xy = (c.boxes.narrow(2, 0, 2) + c.boxes.narrow(2, 2, 2)) / 2, wh = c.boxes.narrow(2, 2, 2) - c.boxes.narrow(2, 0, 2);
  return {{"output0", at::cat({xy, wh, c.scores}, 2).transpose(1, 2)}};
}

}  // namespace headroom::test
