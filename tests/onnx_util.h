// The ONNX graph a test exported, run: a reference evaluator with ATen for the ops the exporter
// writes (held to ONNX Runtime's results on the stored exports), and the model's own outputs in
// the graph's output names.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>

#include <map>
#include <string>

#include "headroom/interop/onnx_proto.h"  // first: it fixes the ONNX namespace
#include "headroom/eval/postprocess.h"
#include "headroom/models/detector.h"
#include "test_util.h"

namespace headroom::test {

// Runs an ONNX graph with ATen, for the ops the exporter writes (a reference evaluator: its
// results are held to ONNX Runtime's on the stored exports). Half-precision graphs run in fp32.
inline std::map<std::string, at::Tensor> run_onnx(const std::string& path, const at::Tensor& images) {
  onnx::ModelProto m;
  const std::string bytes = test::read_bytes(path);
  EXPECT_TRUE(m.ParseFromString(bytes)) << path;
  std::map<std::string, at::Tensor> v;
  for (const auto& t : m.graph().initializer()) {
    std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
    const at::ScalarType type = t.data_type() == onnx::TensorProto::INT64 ? at::kLong
                                : t.data_type() == onnx::TensorProto::FLOAT16 ? at::kHalf
                                                                              : at::kFloat;
    at::Tensor x = at::empty(dims, type);
    std::memcpy(x.data_ptr(), t.raw_data().data(), t.raw_data().size());
    v[t.name()] = type == at::kHalf ? x.to(at::kFloat) : x;
  }
  v[m.graph().input(0).name()] = images.to(at::kFloat);
  const auto ints = [](const onnx::NodeProto& n, const std::string& name) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    return std::vector<int64_t>{};
  };
  const auto integer = [](const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return int64_t(a.i());
    return fallback;
  };
  const auto list = [](const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); };
  for (const auto& n : m.graph().node()) {
    const auto in = [&](int i) { return v.at(n.input(i)); };
    const std::string& op = n.op_type();
    std::vector<at::Tensor> out;
    if (op == "Conv") {
      const auto p = ints(n, "pads");
      out = {at::conv2d(in(0), in(1), n.input_size() > 2 ? in(2) : at::Tensor(), ints(n, "strides"), {p[0], p[1]},
                        ints(n, "dilations"), integer(n, "group", 1))};
    } else if (op == "Sigmoid") {
      out = {in(0).sigmoid()};
    } else if (op == "Relu") {
      out = {in(0).relu()};
    } else if (op == "Mul") {
      out = {in(0) * in(1)};
    } else if (op == "Add") {
      out = {in(0) + in(1)};
    } else if (op == "Sub") {
      out = {in(0) - in(1)};
    } else if (op == "MatMul") {
      out = {at::matmul(in(0), in(1))};
    } else if (op == "Softmax") {
      out = {in(0).softmax(integer(n, "axis", -1))};
    } else if (op == "Concat") {
      std::vector<at::Tensor> xs;
      for (int i = 0; i < n.input_size(); ++i) xs.push_back(in(i));
      out = {at::cat(xs, integer(n, "axis", 0))};
    } else if (op == "Split") {
      out = in(0).split_with_sizes(list(in(1)), integer(n, "axis", 0));
    } else if (op == "Slice") {
      out = {in(0).slice(list(in(3))[0], list(in(1))[0], list(in(2))[0])};
    } else if (op == "Reshape") {
      std::vector<int64_t> shape = list(in(1));
      for (size_t i = 0; i < shape.size(); ++i)
        if (shape[i] == 0) shape[i] = in(0).size(int64_t(i));
      out = {in(0).reshape(shape)};
    } else if (op == "Transpose") {
      out = {in(0).permute(ints(n, "perm"))};
    } else if (op == "Shape") {
      out = {at::tensor(in(0).sizes().vec(), at::kLong)};
    } else if (op == "MaxPool") {
      const auto p = ints(n, "pads");
      out = {at::max_pool2d(in(0), ints(n, "kernel_shape"), ints(n, "strides"), {p[0], p[1]})};
    } else if (op == "Resize") {  // nearest, asymmetric, floor: PyTorch's nearest
      const at::Tensor s = in(2);
      out = {at::upsample_nearest2d(in(0), {int64_t(double(in(0).size(2)) * s[2].item<double>()), int64_t(double(in(0).size(3)) * s[3].item<double>())})};
    } else if (op == "Gather") {
      out = {in(0).index_select(integer(n, "axis", 0), in(1))};
    } else if (op == "ReduceSum") {
      out = {in(0).sum(list(in(1)), integer(n, "keepdims", 1) != 0)};
    } else {
      ADD_FAILURE() << "evaluator: op " << op;
      return v;
    }
    for (int i = 0; i < n.output_size(); ++i) v[n.output(i)] = out.at(size_t(i));
  }
  return v;
}

// What the graph should output, from our forward: YOLO [B, 4 + nc, A] xywh + scores, CenterNet
// the last stack's sigmoid heatmap, size and offset.
inline std::map<std::string, at::Tensor> forward_outputs(models::DetectorImpl& model, const at::Tensor& x) {
  model.eval();
  at::NoGradGuard no_grad;
  const models::HeadOutputs out = model.forward(x);
  if (model.info().family == "centernet")
    return {{"heatmap", out.at("heatmap").back().sigmoid()}, {"size", out.at("size").back()}, {"offset", out.at("offset").back()}};
  const eval::Candidates c = eval::decode_candidates(model.info(), out);
  const at::Tensor xy = (c.boxes.narrow(2, 0, 2) + c.boxes.narrow(2, 2, 2)) / 2, wh = c.boxes.narrow(2, 2, 2) - c.boxes.narrow(2, 0, 2);
  return {{"output0", at::cat({xy, wh, c.scores}, 2).transpose(1, 2)}};
}

}  // namespace headroom::test
