// ONNX export: the graph a model exports computes the model's forward, as ONNX Runtime runs it.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <sstream>


#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/eval/postprocess.h"
#include "headroom/interop/safetensors.h"
#include "headroom/interop/torch_file.h"
#include "headroom/interop/onnx_export.h"
#include "headroom/interop/onnx_proto.h"
#include "headroom/interop/weights_import.h"
#include "headroom/train/trainer.h"
#include "headroom/interop/init_from.h"
#include "interop_util.h"
#include "onnx_util.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::models;
using namespace headroom::interop;
using namespace headroom::test;  // fixture, reference, max_abs, run_onnx, forward_outputs


// Every shipped family through export, run by ONNX Runtime: the fp32 graph (symbolic batch,
// height and width) equals our forward on the same input, at the export size and at a taller
// one, and so does the fp16 one (fp16 input, weights and outputs) within half precision's
// rounding.
namespace {

// Detections [B, k, 6] (box, score, class), best first, against the forward's: the largest gap
// between the two sorted score lists, and for each row of `got` the distance (largest coordinate
// gap) to the nearest box of its class in `want`, sorted. Near-equal scores may come in either
// order (fp16 rounding, scores saturated at 1), so rows are matched, not compared in place.
std::pair<double, std::vector<double>> detections_gap(const at::Tensor& got_, const at::Tensor& want) {
  const at::Tensor got = got_.to(at::kFloat);
  const double scores = (got.select(2, 4) - want.select(2, 4)).abs().max().item<double>();
  std::vector<double> nearest;
  for (int64_t b = 0; b < got.size(0); ++b)
    for (int64_t r = 0; r < got.size(1); ++r) {
      const at::Tensor same = want[b].select(1, 5).eq(got[b][r][5]);
      const double gap = same.any().item<bool>()
                             ? (want[b].index({same}).narrow(1, 0, 4) - got[b][r].narrow(0, 0, 4)).abs().amax(1).min().item<double>()
                             : 1e9;  // a class the forward never gave
      nearest.push_back(gap);
    }
  std::sort(nearest.begin(), nearest.end());
  return {scores, nearest};
}

}  // namespace

TEST(Interop, OnnxExportRunByOnnxRuntimeEqualsTheForward) {
  const std::string dir = test::temp_dir("onnx");
  for (const auto& [name, weights, imgsz] : std::vector<std::tuple<std::string, std::string, int64_t>>{
           {"ul_yolov8t", "ul_yolov8t.pt", 64}, {"ul_yolo11t", "ul_yolo11t.pt", 64}, {"ul_yolov5tu", "ul_yolov5tu.pt", 64},
           {"yolov5v7_t", "yolov5v7_t.pt", 64}, {"centernet_hg_t", "centernet_hg_t_zip.pth", 128}, {"ul_yolo26t", "ul_yolo26t.pt", 64},
           {"ul_yolo12t", "ul_yolo12t.pt", 64}}) {
    const at::Tensor x = reference(name).at("input");  // [2, 3, S, S]
    LoadedWeights w = load_any_weights(fixture(weights), c10::Device(c10::kCPU));
    w.model->fuse();  // as export does: what the graph computes exactly (fusing itself is tested in Models)
    const auto want = forward_outputs(*w.model, x);
    const std::string fp32 = dir + "/" + name + ".onnx", fp16 = dir + "/" + name + ".half.onnx";
    export_onnx(*w.model, w.info, fp32, OnnxExportOptions().imgsz(imgsz).dynamic(true));
    export_onnx(*w.model, w.info, fp16, OnnxExportOptions().imgsz(imgsz).dynamic(true).half(true));
    const auto got = run_onnx(fp32, x), half = run_onnx(fp16, x);
    // The static graph (the export's default): its grids and anchors are constants, not shapes.
    const std::string fixed = dir + "/" + name + ".static.onnx";
    export_onnx(*w.model, w.info, fixed, OnnxExportOptions().imgsz(imgsz).batch(x.size(0)));
    for (const auto& [out, ours] : run_onnx(fixed, x)) {
      const double scale = std::max(1.0, want.at(out).abs().max().item<double>());
      double e = max_abs(ours, want.at(out));
      if (w.model->info().end2end) {  // ties take either order (above)
        const auto [scores, boxes] = detections_gap(ours, want.at(out));
        e = std::max(scores, boxes.back());
      }
      EXPECT_LT(e, out == "heatmap" ? 1e-2 : 2e-4 * scale) << name << " " << out << " static";
    }
    onnx::ModelProto fixed_proto;
    ASSERT_TRUE(fixed_proto.ParseFromString(test::read_bytes(fixed)));
    std::map<std::string, std::string> meta;
    for (const auto& p : fixed_proto.metadata_props()) meta[p.key()] = p.value();
    EXPECT_EQ(meta["stride"], std::to_string(w.model->info().input_multiple)) << name;  // what Ultralytics' runtimes pad the input to
    // Another height than the export's, and not square: the head's grids follow the input.
    const int64_t multiple = w.model->info().input_multiple, taller = (imgsz / multiple + 1) * multiple;
    const at::Tensor first = x.narrow(0, 0, 1), tall = at::cat({first, first.narrow(2, 0, taller - imgsz)}, 2);  // [1, 3, taller, S]
    for (const auto& [out, ours] : forward_outputs(*w.model, tall)) {
      const auto other = run_onnx(fp32, tall);
      ASSERT_TRUE(other.count(out)) << name << ": no output " << out;
      ASSERT_EQ(other.at(out).sizes(), ours.sizes()) << name << " " << out << " at " << taller << "x" << imgsz;
      double e = max_abs(other.at(out), ours);
      const double scale = std::max(1.0, ours.abs().max().item<double>());
      if (w.model->info().end2end) {  // saturated scores tie at 1 here, and ties take either order
        const auto [scores, boxes] = detections_gap(other.at(out), ours);
        e = std::max(scores, boxes.back());
      }
      // The random Hourglass at twice its fixture's size reaches logits near 1e4, whose fp32
      // rounding moves the sigmoid's steepest probabilities by up to 3e-3.
      EXPECT_LT(e, out == "heatmap" ? 1e-2 : 2e-4 * scale) << name << " " << out << " at " << taller << "x" << imgsz;
      std::printf("%s %s at %lldx%lld: ONNX Runtime vs forward %.3g (outputs up to %.3g)\n", name.c_str(), out.c_str(),
                  (long long)taller, (long long)imgsz, e, scale);
    }
    for (const auto& [out, ours] : want) {
      ASSERT_TRUE(got.count(out) && half.count(out)) << name << ": no output " << out;
      const double scale = std::max(1.0, ours.abs().max().item<double>());
      // The graph writes SiLU as x * sigmoid(x) and sums the DFL bins in another order, and ONNX
      // Runtime's convolutions round otherwise: fp32 rounding, grown by these fixtures' depth and
      // by the box decode (x stride, YOLOv5's (2 sigma)^2 x anchor).
      const double e32 = max_abs(got.at(out), ours);
      EXPECT_LT(e32, 2e-4 * scale) << name << " " << out;
      // fp16: scores and heatmaps within 0.02-0.05; YOLO boxes are decoded from these random
      // fixtures' far-off distances (outputs up to 800 px on a 64 px input), whose fp16 sums and
      // differences lose whole pixels at the extremes, so their median is held; CenterNet's size
      // and offset maps within 1% of their largest value.
      const at::Tensor d = (half.at(out) - ours).abs();
      if (out == "output0" && w.model->info().end2end) {
        const auto [scores, boxes] = detections_gap(half.at(out), ours);
        EXPECT_LT(scores, 0.02) << name;
        EXPECT_LT(boxes[boxes.size() / 2], 1.0) << name;
        std::printf("%s: ONNX Runtime vs forward %.3g (fp32, outputs up to %.3g); fp16: sorted scores %.3g, boxes' median %.3g px\n",
                    name.c_str(), e32, scale, scores, boxes[boxes.size() / 2]);
      } else if (out == "output0") {
        const double boxes = d.narrow(1, 0, 4).median().item<double>(), scores = d.narrow(1, 4, d.size(1) - 4).max().item<double>();
        EXPECT_LT(scores, 0.02) << name;
        EXPECT_LT(boxes, 1.0) << name;
        std::printf("%s: ONNX Runtime vs forward %.3g (fp32, outputs up to %.3g); fp16: scores %.3g, boxes' median %.3g px\n",
                    name.c_str(), e32, scale, scores, boxes);
      } else {
        const double e16 = d.max().item<double>();
        EXPECT_LT(e16, out == "heatmap" ? 0.05 : 0.01 * scale) << name << " " << out;
        std::printf("%s %s: ONNX Runtime vs forward %.3g (fp32), %.3g (fp16); outputs up to %.3g\n", name.c_str(), out.c_str(), e32,
                    e16, scale);
      }
    }
  }
}

TEST(Interop, OnnxExportHalfAndStaticBatch) {
  const std::string dir = test::temp_dir("onnx-half");
  LoadedWeights w = load_any_weights(fixture("ul_yolo11t.pt"), c10::Device(c10::kCPU));
  w.model->fuse();
  const at::Tensor x = reference("ul_yolo11t").at("input").narrow(0, 0, 1);
  const auto want = forward_outputs(*w.model, x).at("output0");
  export_onnx(*w.model, w.info, dir + "/s.onnx", OnnxExportOptions().imgsz(64));
  export_onnx(*w.model, w.info, dir + "/h.onnx", OnnxExportOptions().imgsz(64).half(true));
  onnx::ModelProto s, h;
  ASSERT_TRUE(s.ParseFromString(test::read_bytes(dir + "/s.onnx")));
  ASSERT_TRUE(h.ParseFromString(test::read_bytes(dir + "/h.onnx")));
  EXPECT_EQ(s.graph().input(0).type().tensor_type().shape().dim(0).dim_value(), 1);  // static batch
  EXPECT_EQ(h.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
  EXPECT_EQ(h.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
  EXPECT_LT(test::read_bytes(dir + "/h.onnx").size(), test::read_bytes(dir + "/s.onnx").size() * 6 / 10);
  std::map<std::string, std::string> meta;
  for (const auto& p : s.metadata_props()) meta[p.key()] = p.value();
  EXPECT_EQ(meta.at("imgsz"), "[64, 64]");
  EXPECT_EQ(meta.at("stride"), "32");
  EXPECT_EQ(meta.at("names").substr(0, 4), "{0: ");
  // Ultralytics' AutoBackend reads `dynamic` from args (a Python literal): without it a dynamic
  // graph is fed one export batch at a time.
  EXPECT_EQ(meta.at("args"), "{'batch': 1, 'dynamic': False, 'half': False, 'imgsz': 64, 'nms': False}");
  EXPECT_EQ(meta.at("channels"), "3");
  export_onnx(*w.model, w.info, dir + "/d.onnx", OnnxExportOptions().imgsz(64).dynamic(true).half(true));
  onnx::ModelProto d;
  ASSERT_TRUE(d.ParseFromString(test::read_bytes(dir + "/d.onnx")));
  for (const auto& p : d.metadata_props())
    if (p.key() == "args") EXPECT_EQ(p.value(), "{'batch': 1, 'dynamic': True, 'half': True, 'imgsz': 64, 'nms': False}");
  EXPECT_LT(max_abs(run_onnx(dir + "/s.onnx", x).at("output0"), want), 1e-4 * want.abs().max().item<double>());
  // fp16 through and through: the scores within half precision's rounding
  const at::Tensor half = run_onnx(dir + "/h.onnx", x).at("output0");
  EXPECT_LT(max_abs(half.narrow(1, 4, 3), want.narrow(1, 4, 3)), 0.01);
}

// An end-to-end graph at a static size keeps max_det rows (fewer than the 84 anchors here), the
// best first, as the forward's top-k does, and says end2end in its metadata as Ultralytics does
// when it exports with nms=False.
TEST(Interop, OnnxExportOfAnEndToEndHeadKeepsMaxDetRows) {
  const std::string dir = test::temp_dir("onnx-e2e");
  LoadedWeights w = load_any_weights(fixture("ul_yolo26t.pt"), c10::Device(c10::kCPU));
  w.model->fuse();
  const at::Tensor x = reference("ul_yolo26t").at("input");  // [2, 3, 64, 64]
  export_onnx(*w.model, w.info, dir + "/e.onnx", OnnxExportOptions().imgsz(64).batch(2).max_det(20));
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(test::read_bytes(dir + "/e.onnx")));
  const auto& dims = m.graph().output(0).type().tensor_type().shape();
  ASSERT_EQ(dims.dim_size(), 3);
  EXPECT_EQ(dims.dim(0).dim_value(), 2);
  EXPECT_EQ(dims.dim(1).dim_value(), 20);
  EXPECT_EQ(dims.dim(2).dim_value(), 6);
  std::map<std::string, std::string> meta;
  for (const auto& p : m.metadata_props()) meta[p.key()] = p.value();
  EXPECT_EQ(meta.at("end2end"), "True");
  w.model->eval();
  at::NoGradGuard no_grad;
  const eval::Candidates c = eval::decode_candidates(w.model->info(), w.model->forward(x));
  eval::NmsOptions o;
  o.conf = -1;
  o.max_det = 20;
  const eval::Detections d = eval::topk_detections(c.boxes, c.scores, o);
  const at::Tensor got = run_onnx(dir + "/e.onnx", x).at("output0");
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{2, 20, 6}));
  EXPECT_LT(max_abs(got.narrow(2, 0, 4), d.boxes), 1e-2);
  EXPECT_LT(max_abs(got.select(2, 4), d.scores), 1e-5);
  EXPECT_TRUE(at::equal(got.select(2, 5).to(at::kLong), d.classes));
  EXPECT_THROW(export_onnx(*w.model, w.info, dir + "/bad.onnx", OnnxExportOptions().imgsz(64).max_det(0)), InputError);
  // end2end false: the one-to-many branch per anchor, [B, 4 + nc, A] as the other YOLO heads, for
  // the runtime's NMS (Ultralytics' own default export of YOLO26, nms=None); its metadata says so.
  export_onnx(*w.model, w.info, dir + "/m.onnx", OnnxExportOptions().imgsz(64).dynamic(true).end2end(false));
  onnx::ModelProto many;
  ASSERT_TRUE(many.ParseFromString(test::read_bytes(dir + "/m.onnx")));
  meta.clear();
  for (const auto& p : many.metadata_props()) meta[p.key()] = p.value();
  EXPECT_EQ(meta.at("end2end"), "False");
  const at::Tensor want = forward_outputs(*w.model, x, /*end2end=*/false).at("output0");
  const at::Tensor per_anchor = run_onnx(dir + "/m.onnx", x).at("output0");
  ASSERT_EQ(per_anchor.sizes(), (at::IntArrayRef{2, 4 + w.model->info().nc, 84}));
  EXPECT_LT(max_abs(per_anchor, want), 2e-4 * std::max(1.0, want.abs().max().item<double>()));
}

// The full Hourglass-104 (191,284,008 parameters) under the CenterNet name map: exactly the
// tensors of xingyizhou's network (ctdet_coco_hg.pth), with the same shapes.
