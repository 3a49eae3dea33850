#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/models/blocks.h"
#include "headroom/models/detector.h"
#include "headroom/models/layers.h"
#include "headroom/interop/init_from.h"
#include "interop_util.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::models;

namespace {

std::string model_path(const std::string& name) { return std::string(HEADROOM_SOURCE_DIR) + "/models/" + name; }

Detector build(const std::string& name, int64_t nc = -1, const std::string& scale = "") {
  ModelSpec s;
  s.file = model_path(name);
  s.nc = nc;
  s.scale = scale;
  return Detector(s);
}

std::string model_error(const std::string& yaml) {
  const std::string path = test::temp_dir("model") + "/m.yaml";
  test::write_bytes(path, yaml);
  try {
    ModelSpec s;
    s.file = path;
    Detector d(s);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

double max_abs_diff(const HeadOutputs& a, const HeadOutputs& b) {
  double m = 0;
  for (const auto& [name, list] : a)
    for (size_t i = 0; i < list.size(); ++i) m = std::max(m, (list[i] - b.at(name)[i]).abs().max().item<double>());
  return m;
}

const char* kTinyYolo = R"(nc: 3
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 2, Conv, [8, 3, 1]]
  - [-1, 1, Bottleneck, [8]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, SPP, [16, [3, 5]]]
head:
  - [-1, 1, nn.Upsample, [None, 2, 'nearest']]
  - [[-1, 2], 1, Concat, [1]]
  - [-1, 1, C3, [8, False]]
  - [[7, 4], 1, Detect, [nc]]
)";

}  // namespace

TEST(Models, ParameterCountsEqualTheReference) {
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"yolov5n.yaml", 1872157},  {"yolov5s.yaml", 7235389},  {"yolov5m.yaml", 21190557},
      {"yolov5l.yaml", 46563709}, {"yolov5x.yaml", 86749405}, {"yolov8n.yaml", 3157200},
      {"yolov8s.yaml", 11166560}, {"yolov8m.yaml", 25902640}, {"yolov8l.yaml", 43691520},
      {"yolov8x.yaml", 68229648}, {"yolo11n.yaml", 2624080},  {"yolo11s.yaml", 9458752},
      {"yolo11m.yaml", 20114688}, {"yolo11l.yaml", 25372160}, {"yolo11x.yaml", 56966176},
      {"yolo26n.yaml", 2572280},  {"yolo26s.yaml", 10009784}, {"yolo26m.yaml", 21896248},
      {"yolo26l.yaml", 26299704}, {"yolo26x.yaml", 58993368}, {"yolo12n.yaml", 2602288},  {"yolo12s.yaml", 9284096},
      {"yolo12m.yaml", 20199168}, {"yolo12l.yaml", 26450784}, {"yolo12x.yaml", 59210784}, {"centernet_hg104.yaml", 191284008}};
  for (const auto& [file, params] : expected) {
    Detector d = build(file, 80);
    EXPECT_EQ(d->parameter_count(), params) << file;
  }
  EXPECT_EQ(build("yolov8n.yaml", 80)->parameter_count(true), 3157200 - 16);  // the frozen DFL projection
}

// Ultralytics 8.4 scales every row's width, one as wide as the class count included: yolov8n
// for 64 classes has its 16-channel stem (8.3 kept 64 there, as ultralytics/yolov5 keeps a row
// as wide as its Detect's output).
TEST(Models, WidthScalingDoesNotSpareARowAsWideAsTheClassCount) {
  const Detector d = build("yolov8n.yaml", 64);
  ASSERT_FALSE(d->layers().empty());
  EXPECT_EQ(d->layers()[0].args.rfind("[3, 16, 3, 2", 0), 0u) << d->layers()[0].args;
  const Detector eighty = build("yolov8n.yaml", 80);
  ASSERT_EQ(d->layers().size(), eighty->layers().size());
  for (size_t i = 0; i + 1 < d->layers().size(); ++i)  // every row but Detect is the 80-class model's
    EXPECT_EQ(d->layers()[i].args, eighty->layers()[i].args) << "row " << i;
}

// Ultralytics' autopad pads an even kernel by half of it (a 2x2 convolution keeps one more row and
// column), and C2PSA narrower than one 64-channel head builds with one head, as Ultralytics builds it.
TEST(Models, EvenKernelsAndNarrowAttentionBuildAsUltralyticsBuildsThem) {
  Conv two(ConvOptions(3, 8, 2));
  EXPECT_EQ(two->forward(at::zeros({1, 3, 8, 8})).sizes(), (at::IntArrayRef{1, 8, 9, 9}));
  Conv three(ConvOptions(3, 8, 3));
  EXPECT_EQ(three->forward(at::zeros({1, 3, 8, 8})).sizes(), (at::IntArrayRef{1, 8, 8, 8}));
  C2PSA narrow(64, 1, 0.5);  // 32 channels inside
  EXPECT_EQ(narrow->forward(at::randn({1, 64, 4, 4})).sizes(), (at::IntArrayRef{1, 64, 4, 4}));
}

TEST(Models, GflopsAsUltralyticsReportsThem) {
  const std::vector<std::pair<std::string, double>> expected = {
      {"n", 8.9}, {"s", 28.8}, {"m", 79.3}, {"l", 165.7}, {"x", 258.5}};
  for (const auto& [scale, gflops] : expected)
    EXPECT_NEAR(build("yolov8.yaml", 80, scale)->gflops(640), gflops, 0.05) << scale;
  // YOLO26 as its YAML's summaries print them.
  const std::vector<std::pair<std::string, double>> yolo26 = {{"n", 6.1}, {"s", 22.8}, {"m", 75.4}, {"l", 93.8}, {"x", 209.5}};
  for (const auto& [scale, gflops] : yolo26)
    EXPECT_NEAR(build("yolo26.yaml", 80, scale)->gflops(640), gflops, 0.05) << "yolo26" << scale;
  // YOLO12's too (thop counts convolutions, not the attention's products, and neither do we).
  const std::vector<std::pair<std::string, double>> yolo12 = {{"n", 6.7}, {"s", 21.7}, {"m", 68.1}, {"l", 89.7}, {"x", 200.3}};
  for (const auto& [scale, gflops] : yolo12)
    EXPECT_NEAR(build("yolo12.yaml", 80, scale)->gflops(640), gflops, 0.05) << "yolo12" << scale;
}

// YOLO26's head: no DFL (four distances), and a one-to-one branch that starts as a copy of the
// first and trains on detached features.
TEST(Models, Yolo26HasTwoBranchesAndNoDfl) {
  Detector d = build("yolo26n.yaml", 4);
  EXPECT_EQ(d->info().reg_max, 1);
  EXPECT_TRUE(d->info().end2end);
  d->train();
  const at::Tensor x = at::rand({2, 3, 64, 64});
  const HeadOutputs o = d->forward(x);
  ASSERT_EQ(o.at("one2one").size(), 3u);
  EXPECT_EQ(o.at("pred")[0].sizes(), (at::IntArrayRef{2, 4 + 4, 8, 8}));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(o.at("pred")[i], o.at("one2one")[i])) << i;  // the same weights at first
  // Box bias 2 (distances of two cells), the class prior as YOLOv8's.
  auto& head = dynamic_cast<DetectV8Impl&>(d->head());
  EXPECT_TRUE(at::all(DetectV8Impl::last_conv(head.one2one_cv2[0])->bias.eq(2.0)).item<bool>());
  EXPECT_FALSE(head.dfl);
  // The one-to-one branch's loss reaches its own weights only.
  at::Tensor one = at::zeros({});
  for (const auto& t : o.at("one2one")) one = one + t.square().mean();
  one.backward();
  for (const auto& p : d->named_parameters()) {
    const bool own = p.key().find("one2one_") != std::string::npos;
    EXPECT_EQ(p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0, own) << p.key();
  }
}

TEST(Models, YoloOutputsStridesAndPriors) {
  Detector v8 = build("yolov8n.yaml", 4);
  EXPECT_EQ(v8->info().family, "yolov8");
  EXPECT_EQ(v8->info().strides, (std::vector<int64_t>{8, 16, 32}));
  EXPECT_EQ(v8->info().reg_max, 16);
  const HeadOutputs o = v8->forward(at::rand({2, 3, 64, 96}));
  ASSERT_EQ(o.at("pred").size(), 3u);
  EXPECT_EQ(o.at("pred")[0].sizes(), (at::IntArrayRef{2, 64 + 4, 8, 12}));
  EXPECT_EQ(o.at("pred")[2].sizes(), (at::IntArrayRef{2, 64 + 4, 2, 3}));
  // Class prior: log(5 / nc / (640 / stride)^2); box branch starts at 1.
  for (const auto& p : v8->named_parameters()) {
    if (p.key() == "head.cv3.0.2.conv.bias") {
      EXPECT_NEAR(p.value()[0].item<float>(), std::log(5.0 / 4 / std::pow(640.0 / 8, 2)), 1e-5);
    }
    if (p.key() == "head.cv2.2.2.conv.bias") {
      EXPECT_FLOAT_EQ(p.value()[5].item<float>(), 1.0f);
    }
  }

  Detector v5 = build("yolov5n.yaml", 4);
  EXPECT_EQ(v5->info().family, "yolov5");
  EXPECT_EQ(v5->info().anchors.sizes(), (at::IntArrayRef{3, 3, 2}));
  EXPECT_FLOAT_EQ(v5->info().anchors[2][2][1].item<float>(), 326.f);
  // Objectness prior: log(8 / (640 / stride)^2) on top of the default init, which draws each
  // bias from U(-1/sqrt(fan_in), 1/sqrt(fan_in)): so is the mean of any of them.
  const at::Tensor w5 = v5->named_parameters()["head.m.0.conv.weight"];
  const double init_bound = 1.0 / std::sqrt(static_cast<double>(w5[0].numel()));
  const at::Tensor b5 = v5->named_parameters()["head.m.0.conv.bias"].view({3, -1});
  EXPECT_NEAR(b5.select(1, 4).mean().item<float>(), std::log(8.0 / std::pow(640.0 / 8, 2)),
              init_bound);
  EXPECT_NEAR(b5.narrow(1, 5, 4).mean().item<float>(), std::log(0.6 / (4 - 0.99999)), init_bound);
  const HeadOutputs p = v5->forward(at::rand({1, 3, 64, 64}));
  EXPECT_EQ(p.at("pred")[0].sizes(), (at::IntArrayRef{1, 3, 8, 8, 9}));
}

TEST(Models, CenterNetOutputsOnEveryStack) {
  Detector hg = build("centernet_hg10.yaml", 3);
  EXPECT_EQ(hg->info().family, "centernet");
  EXPECT_EQ(hg->info().strides, (std::vector<int64_t>{4}));
  EXPECT_EQ(hg->info().input_multiple, 8);
  HeadOutputs o = hg->forward(at::rand({2, 3, 64, 64}));
  EXPECT_EQ(o.at("heatmap")[0].sizes(), (at::IntArrayRef{2, 3, 16, 16}));
  EXPECT_EQ(o.at("size")[0].sizes(), (at::IntArrayRef{2, 2, 16, 16}));
  EXPECT_EQ(o.at("offset")[0].sizes(), (at::IntArrayRef{2, 2, 16, 16}));
  // Heatmap logits start near sigmoid^-1(0.1): the bias is -2.19.
  EXPECT_NEAR(at::sigmoid(o.at("heatmap")[0]).mean().item<float>(), 0.1, 0.08);

  Detector hg104 = build("centernet_hg104.yaml", 80);
  EXPECT_EQ(hg104->info().stacks, 2);
  EXPECT_EQ(hg104->info().strides, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(hg104->info().input_multiple, 128);

  Detector csp = build("centernet_csp_n.yaml", 5);
  EXPECT_EQ(csp->scale(), "n");
  o = csp->forward(at::rand({1, 3, 64, 64}));
  EXPECT_EQ(o.at("heatmap").size(), 1u);
  EXPECT_EQ(o.at("heatmap")[0].sizes(), (at::IntArrayRef{1, 5, 16, 16}));
}

TEST(Models, FilesInTheUltralyticsFormatLoadUnchanged) {
  const std::string path = test::temp_dir("model") + "/tiny.yaml";
  test::write_bytes(path, kTinyYolo);
  ModelSpec s;
  s.file = path;
  Detector d(s);
  EXPECT_EQ(d->info().nc, 3);
  EXPECT_EQ(d->layers().size(), 9u);
  EXPECT_EQ(d->layers()[1].repeats, 2);
  EXPECT_EQ(d->layers()[4].module, "SPP");
  EXPECT_EQ(d->info().strides, (std::vector<int64_t>{2, 4}));
  const HeadOutputs o = d->forward(at::rand({1, 3, 32, 32}));
  EXPECT_EQ(o.at("pred")[0].sizes(), (at::IntArrayRef{1, 64 + 3, 16, 16}));
}

TEST(Models, BadModelFilesNameTheRowAndTheReason) {
  std::string e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [-1, 1, Convv, [8]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("m.yaml:4:5: row 1"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown module 'Convv' (did you mean Conv?)"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("a row is [from, repeats, module, args]"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [5, 1, Conv, [8]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("'from' 5 does not name an earlier row"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [-1, 1, Conv, [8]]\n");
  EXPECT_NE(e.find("the last row must be a head"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [x, 3, 2]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("argument 1 must be an integer, got 'x'"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [-1, 3, Conv, [16, 3, 1]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("needs equal input and output channels"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone: [[-1, 1, Conv, [8, 3, 2]], [-1, 1, Conv, [8, 3, 2]], [[-1, 0], 1, Concat, [1]]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("Concat inputs have different strides"), std::string::npos) << e;
  e = model_error("backbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [-1, 1, Detect, [nc]]\n");
  EXPECT_NE(e.find("nc is missing"), std::string::npos) << e;
  try {
    build("yolov8.yaml", 80, "q");
    FAIL();
  } catch (const InputError& ex) {
    EXPECT_NE(std::string(ex.what()).find("no scale 'q'; this file has n, s, m, l, x"), std::string::npos) << ex.what();
  }
  EXPECT_THROW(build("yolov9z.yaml"), InputError);
  EXPECT_THROW(build("yolov8s.yaml", 80, "m"), InputError);
}

// What Headroom cannot build is refused naming the file, line and key, never built as another
// model: typos in top-level keys, values end2end and reg_max cannot take, arguments past those a
// module reads.
TEST(Models, AModelFileIsRefusedRatherThanBuiltAsAnotherModel) {
  const std::string detect = "head:\n  - [-1, 1, Detect, [nc]]\n";
  const std::string rows = "backbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [-1, 1, SPPF, [8, 5]]\n" + detect;
  std::string e = model_error("nc: 3\nbackbon:\n  - [-1, 1, Conv, [8, 3, 2]]\n" + detect);
  EXPECT_NE(e.find("m.yaml:2:1: unknown key 'backbon' (did you mean backbone?)"), std::string::npos) << e;
  e = model_error("nc: 3\nactivation: nn.ReLU()\n" + rows);
  EXPECT_NE(e.find("m.yaml:2:1: unknown key 'activation'"), std::string::npos) << e;
  e = model_error("nc: 3\nend2end: yes\n" + rows);
  EXPECT_NE(e.find("m.yaml:2:10: end2end must be True or False"), std::string::npos) << e;
  e = model_error("nc: 3\nreg_max: 0\n" + rows);
  EXPECT_NE(e.find("m.yaml:2:10: reg_max must be a positive integer"), std::string::npos) << e;
  e = model_error("nc: 3\nend2end: True\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [-1, 1, Detect, [nc, [[10, 13, 16, 30]]]]\n");
  EXPECT_NE(e.find("end2end and reg_max belong to the anchor-free Detect"), std::string::npos) << e;
  // Arguments a module does not read.
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [-1, 1, SPPF, [8, 5, 3, True, 2]]\n" + detect);
  EXPECT_NE(e.find("m.yaml:4:5: row 1"), std::string::npos) << e;
  EXPECT_NE(e.find("SPPF reads 4 arguments; argument 5 (2) is not one Headroom's SPPF takes"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\n  - [-1, 1, C3k2, [8, True, 0.5, True, 1, True, 3]]\n" + detect);
  EXPECT_NE(e.find("C3k2 reads 6 arguments; argument 7 (3) is not one"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2, 1, 1, 1, True, 7]]\n" + detect);
  EXPECT_NE(e.find("argument 8 (7)"), std::string::npos) << e;
  // Ultralytics' values of those keys that Headroom's Detect has build the same model.
  EXPECT_EQ(model_error("nc: 3\nend2end: False\nreg_max: 16\n" + rows), "");
}

// YOLO12's A2C2f as Ultralytics builds it: the residual and its mlp_ratio of 1.2 in scales l and
// x only, hidden channels in heads of 32 (its assert, with or without attention), and a map that
// splits into the areas (even sides at P4 for 4 areas).
TEST(Models, Yolo12AreaAttentionRowsAsUltralyticsBuildsThem) {
  const auto gammas = [](Detector d) {
    int n = 0;
    for (const auto& p : d->named_parameters())
      n += p.key().size() >= 6 && p.key().compare(p.key().size() - 6, 6, ".gamma") == 0;
    return n;
  };
  Detector n = build("yolo12n.yaml", 3);
  EXPECT_EQ(gammas(n), 0);
  EXPECT_EQ(n->layers()[6].module, "A2C2f");
  EXPECT_EQ(n->info().input_multiple, 32);
  const ModelSpec large = [] {
    ModelSpec s;
    s.file = test::fixture("ul_yolo12t.yaml");  // row 6 given the residual, as l and x get it
    return s;
  }();
  EXPECT_EQ(gammas(Detector(large)), 1);
  const std::string head = "head:\n  - [-1, 1, Detect, [nc]]\n";
  std::string e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [32, 3, 2]]\n  - [-1, 1, A2C2f, [32, True, 1]]\n" + head);
  EXPECT_NE(e.find("m.yaml:4:5: row 1"), std::string::npos) << e;
  EXPECT_NE(e.find("A2C2f needs hidden channels (c2 x e = 16) in a multiple of 32"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [32, 3, 2]]\n  - [-1, 1, A2C2f, [64, True, 1, True]]\n" + head);
  EXPECT_NE(e.find("input 32 and output 64 channels differ"), std::string::npos) << e;
  e = model_error("nc: 3\nbackbone:\n  - [-1, 1, Conv, [64, 3, 2]]\n  - [-1, 1, A2C2f, [64, True, 1, False, 2.0, 0.5, 1, True, 3]]\n" + head);
  EXPECT_NE(e.find("A2C2f reads 8 arguments; argument 9 (3) is not one"), std::string::npos) << e;
  // Nine areas need sides in multiples of 3 (3 x 3 = 9): with a stride of 2, inputs in multiples of 6.
  const std::string path = test::temp_dir("model") + "/areas.yaml";
  test::write_bytes(path, "nc: 3\nbackbone:\n  - [-1, 1, Conv, [64, 3, 2]]\n  - [-1, 1, A2C2f, [64, True, 9]]\n" + head);
  ModelSpec s;
  s.file = path;
  Detector areas(s);
  EXPECT_EQ(areas->info().input_multiple, 6);
  EXPECT_EQ(areas->forward(at::rand({1, 3, 12, 18})).at("pred")[0].size(3), 9);
  EXPECT_GT(areas->gflops(640), 0);  // probed at 36 px, the least multiple of 6 from 32
  // In scales l and x Ultralytics appends (True, 1.2) to the row: only [c2, a2, area] reads right.
  e = model_error("nc: 3\nscales:\n  l: [1.00, 1.00, 512]\nbackbone:\n  - [-1, 1, Conv, [64, 3, 2]]\n  - [-1, 1, A2C2f, [64, True]]\n" + head);
  EXPECT_NE(e.find("in scale l Ultralytics appends residual True and mlp_ratio 1.2 to A2C2f's arguments: give exactly [c2, a2, area] (2 given)"),
            std::string::npos) << e;
  // ABlocks start from N(0, 0.02), as Ultralytics' trunc_normal_ (12,288 weights here).
  ABlock block(64, 2, 2.0, 1);
  EXPECT_NEAR(block->attn->qkv->cb->conv->weight.std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(block->mlp->parameters().front().std().item<double>(), 0.02, 0.001);
}

// A malformed scales entry names its file and line (it used to escape as a yaml-cpp conversion
// error, exit code 1); the command line exits with 2.
TEST(Models, AMalformedScaleNamesItsLine) {
  const std::string rows = "backbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [-1, 1, Detect, [nc]]\n";
  std::string e = model_error("nc: 3\nscales:\n  n: [0.33, abc, 1024]\n" + rows);
  EXPECT_NE(e.find("m.yaml:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("scale 'n': width must be a positive number, got 'abc'"), std::string::npos) << e;
  e = model_error("nc: 3\nscales:\n  n: [0.33, 0.25]\n" + rows);
  EXPECT_NE(e.find("m.yaml:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("must be [depth, width, max_channels]"), std::string::npos) << e;
  e = model_error("nc: 3\nscales:\n  n: [0.33, 0.25, 10.5]\n" + rows);
  EXPECT_NE(e.find("max_channels must be a positive integer"), std::string::npos) << e;
  e = model_error("nc: 3\nscales: [1, 2]\n" + rows);
  EXPECT_NE(e.find("m.yaml:2:"), std::string::npos) << e;
  e = model_error("nc: three\n" + rows);
  EXPECT_NE(e.find("m.yaml:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("nc must be a positive integer"), std::string::npos) << e;
  const std::string path = test::temp_dir("model-cli") + "/bad.yaml";
  test::write_bytes(path, "nc: 3\nscales:\n  n: [0.33, -1, 1024]\n" + rows);
  const test::RunResult r = test::run_trainer("model --model " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:3:"), std::string::npos) << r.output;
}

TEST(Models, FusionKeepsOutputsAndDropsTheBatchNorms) {
  at::manual_seed(0);
  for (const char* name : {"yolov8n.yaml", "yolov5n.yaml", "centernet_hg10.yaml"}) {
    Detector d = build(name, 4);
    // Non-trivial BatchNorm statistics: a few training-mode passes.
    for (int i = 0; i < 3; ++i) d->forward(at::rand({2, 3, 64, 64}));
    d->eval();
    at::NoGradGuard no_grad;
    const at::Tensor x = at::rand({2, 3, 64, 64});
    const HeadOutputs before = d->forward(x);
    const int64_t params = d->parameter_count();
    d->fuse();
    EXPECT_LT(max_abs_diff(before, d->forward(x)), 1e-5) << name;
    EXPECT_LT(d->parameter_count(), params) << name;
  }
}

TEST(Models, ChannelsLastGivesTheSameOutputs) {
  at::manual_seed(0);
  Detector d = build("yolov8n.yaml", 4);
  d->eval();
  at::NoGradGuard no_grad;
  const at::Tensor x = at::rand({1, 3, 64, 64});
  const HeadOutputs a = d->forward(x);
  d->set_channels_last(true);
  EXPECT_TRUE(d->named_parameters()["model.0.m.0.cb.conv.weight"].is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_LT(max_abs_diff(a, d->forward(x)), 1e-4);
}

TEST(Models, InputSizeMustFitTheStrides) {
  Detector d = build("yolov8n.yaml", 4);
  EXPECT_THROW(d->forward(at::rand({1, 3, 60, 64})), c10::Error);
}

TEST(Models, TheConfigSelectsTheModel) {
  const Config c = load_config("", {"model.file=" + model_path("centernet_csp_s.yaml"), "memory.activation_checkpointing=stages"});
  Detector d = interop::run_model(c, 7);
  EXPECT_EQ(d->info().family, "centernet");
  EXPECT_EQ(d->info().nc, 7);
  EXPECT_EQ(d->scale(), "s");
  EXPECT_EQ(d->recompute_mode(), RecomputeMode::stages);
  try {
    interop::run_model(load_config("", {"model.file=/nope/x.yaml"}), 3);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model file not found (looked for /nope/x.yaml)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("command line 'model.file=/nope/x.yaml'"), std::string::npos) << e.what();
  }
  // A name only: found beside the config file before the shipped models.
  const std::string dir = test::temp_dir("model-beside-config");
  test::write_bytes(dir + "/mine.yaml", kTinyYolo);
  test::write_bytes(dir + "/run.yaml", "model: {file: mine.yaml}\n");
  EXPECT_EQ(interop::run_model(load_config(dir + "/run.yaml"), 3)->yaml_file(), dir + "/mine.yaml");
  // and a shipped name from anywhere: the source tree's models/ (the installed ones first, see Cli)
  EXPECT_EQ(interop::run_model(load_config(dir + "/run.yaml", {"model.file=yolo11s.yaml"}), 3)->parameter_count(), build("yolo11s.yaml", 3)->parameter_count());
}

// SyncBatchNorm's arithmetic: with the statistics of one process it is BatchNorm2d in training
// mode (outputs, input and parameter gradients, running statistics); two halves whose sums are
// added give the whole batch's (the sums the ranks' all-reduce computes: the mean's, then the
// squared differences').
TEST(Models, SyncBatchNormIsBatchNormOverEveryRanksImages) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({6, 5, 4, 3}) * 2 + 1;
  const at::Tensor up = at::randn({6, 5, 4, 3});
  torch::nn::BatchNorm2d ref(torch::nn::BatchNormOptions(5).momentum(0.03));
  torch::nn::BatchNorm2d syn(torch::nn::BatchNormOptions(5).momentum(0.03));
  {
    at::NoGradGuard no_grad;
    ref->weight.uniform_(0.5, 1.5);
    ref->bias.uniform_(-1, 1);
    syn->weight.copy_(ref->weight);
    syn->bias.copy_(ref->bias);
  }
  const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  const at::Tensor ya = ref->forward(xa);
  (ya * up).sum().backward();
  // The two halves: the second's sums stand in for another rank's, added as the all-reduce would.
  const at::Tensor first = xb.narrow(0, 0, 2), second = xb.narrow(0, 2, 4).detach();
  const at::Tensor mean = x.mean({0, 2, 3});
  const at::Tensor other_first = at::cat({second.sum({0, 2, 3}), at::full({1}, double(second.numel() / 5))});
  const at::Tensor other_second = (second - mean.view({1, -1, 1, 1})).square().sum({0, 2, 3});
  int calls = 0;
  const StatsSum plus_other = [&](const at::Tensor& mine) { return mine + (calls++ == 0 ? other_first : other_second); };
  const at::Tensor y1 = sync_batch_norm(first, *syn, plus_other);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(at::allclose(y1, ya.narrow(0, 0, 2), 1e-5, 1e-5));
  // With the whole batch on one rank (a sum over one process), everything matches.
  torch::nn::BatchNorm2d one(torch::nn::BatchNormOptions(5).momentum(0.03));
  {
    at::NoGradGuard no_grad;
    one->weight.copy_(ref->weight);
    one->bias.copy_(ref->bias);
  }
  const at::Tensor xc = x.clone().requires_grad_();
  const at::Tensor yc = sync_batch_norm(xc, *one, [](const at::Tensor& t) { return t; });
  (yc * up).sum().backward();
  EXPECT_TRUE(at::allclose(yc, ya, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(xc.grad(), xa.grad(), 1e-4, 1e-5)) << (xc.grad() - xa.grad()).abs().max();
  EXPECT_TRUE(at::allclose(one->weight.grad(), ref->weight.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(one->bias.grad(), ref->bias.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(one->running_mean, ref->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(one->running_var, ref->running_var, 1e-6, 1e-6));
  EXPECT_EQ(one->num_batches_tracked.item<int64_t>(), ref->num_batches_tracked.item<int64_t>());
}
