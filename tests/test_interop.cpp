// Weights in and out: files made by the reference libraries themselves (Ultralytics, YOLOv5
// v7.0, xingyizhou/CenterNet, safetensors; scripts/make_interop_fixtures.py) load into our
// models and give the outputs those libraries computed on the same input.
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

namespace {

// Our outputs against the library's, in fp32 and in fp64. `want` maps each of our outputs
// ("pred" level l, "heatmap" stack s, ...) to the reference tensor's name. fp64 shows a
// structural difference (a wrong layer, an eps, an order) at once: the bound is 1e-9 of the
// output's scale. fp32 differs by rounding, accumulated over the depth: within 1e-4 of it.
void expect_library_outputs(DetectorImpl& model, const std::map<std::string, at::Tensor>& ref,
                            const std::vector<std::tuple<std::string, size_t, std::string>>& want, const std::string& what) {
  model.eval();
  at::NoGradGuard no_grad;
  const HeadOutputs out32 = model.forward(ref.at("input"));
  model.to(at::kDouble);
  const HeadOutputs out64 = model.forward(ref.at("input").to(at::kDouble));
  model.to(at::kFloat);
  for (const auto& [name, i, key] : want) {
    const at::Tensor& r32 = ref.at(key);
    const at::Tensor& r64 = ref.at(key + "_f64");
    ASSERT_EQ(out32.at(name)[i].sizes(), r32.sizes()) << what << " " << key;
    const double scale = std::max(1.0, r64.abs().max().item<double>());
    const double d32 = max_abs(out32.at(name)[i], r32), d64 = max_abs(out64.at(name)[i], r64);
    EXPECT_LT(d32, 1e-4 * scale) << what << " " << key << " (fp32; outputs up to " << scale << ")";
    EXPECT_LT(d64, 1e-9 * scale) << what << " " << key << " (fp64)";
    std::printf("%s %s: max |diff| fp32 %.3g, fp64 %.3g (outputs up to %.3g)\n", what.c_str(), key.c_str(), d32, d64, scale);
  }
}

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Every parameter and buffer of the model, cloned.
std::vector<at::Tensor> snapshot(DetectorImpl& m) {
  std::vector<at::Tensor> v;
  for (const auto& p : m.named_parameters()) v.push_back(p.value().detach().clone());
  for (const auto& b : m.named_buffers()) v.push_back(b.value().detach().clone());
  return v;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST(Interop, UltralyticsCheckpointsGiveTheLibrarysOutputs) {
  for (const std::string name : {"ul_yolov8t", "ul_yolo11t", "ul_yolov5tu", "ul_yolo26t", "ul_yolo12t"}) {
    LoadedWeights w = load_any_weights(fixture(name + ".pt"), c10::Device(c10::kCPU));
    EXPECT_EQ(w.model->info().family, "yolov8") << name;
    EXPECT_EQ(w.model->info().nc, 3) << name;
    EXPECT_EQ(w.info.names.size(), 3u) << name;
    const bool yolo26 = name == "ul_yolo26t";
    EXPECT_EQ(w.model->info().end2end, yolo26) << name;
    EXPECT_EQ(w.model->info().reg_max, yolo26 ? 1 : 16) << name;
    // per level [B, 4 * reg_max + nc, H, W]; YOLO26's one-to-one branch beside them
    std::vector<std::tuple<std::string, size_t, std::string>> want = {{"pred", 0, "raw0"}, {"pred", 1, "raw1"}, {"pred", 2, "raw2"}};
    if (yolo26)
      for (size_t i = 0; i < 3; ++i) want.emplace_back("one2one", i, "o2o_raw" + std::to_string(i));
    expect_library_outputs(*w.model, reference(name), want, name);
  }
}

// YOLO12's area attention on a map whose areas cross its rows (P4 6 x 4 in 4 runs of 6 positions,
// from a 96 x 64 input): the runs are cut from the positions in row-major order, as Ultralytics cuts them.
TEST(Interop, Yolo12AreasAreCutAsUltralyticsCutsThem) {
  LoadedWeights w = load_any_weights(fixture("ul_yolo12t.pt"), c10::Device(c10::kCPU));
  const auto ref = reference("ul_yolo12t");
  w.model->eval();
  w.model->to(at::kDouble);
  at::NoGradGuard no_grad;
  const HeadOutputs out = w.model->forward(ref.at("input_wide").to(at::kDouble));
  for (size_t i = 0; i < 3; ++i) {
    const at::Tensor& want = ref.at("raw" + std::to_string(i) + "_wide_f64");
    ASSERT_EQ(out.at("pred")[i].sizes(), want.sizes());
    EXPECT_LT(max_abs(out.at("pred")[i], want), 1e-9 * std::max(1.0, want.abs().max().item<double>())) << "level " << i;
  }
}

// YOLO26 needs no NMS: its detections are the one-to-one branch's best (anchor, class) pairs,
// row for row what Ultralytics' predictor (nms=False, its default) returns, on the library's input.
TEST(Interop, Yolo26DetectionsAreTheLibrarysEndToEndOutput) {
  LoadedWeights w = load_any_weights(fixture("ul_yolo26t.pt"), c10::Device(c10::kCPU));
  auto ref = reference("ul_yolo26t");
  w.model->eval();
  at::NoGradGuard no_grad;
  eval::DecodeOptions o;
  o.nms.conf = 0;  // every row, to compare them all
  const eval::Detections d = eval::detect(*w.model, ref.at("input"), o);  // the one-to-one branch alone
  // which computes its branch as when both run, and only for that call
  const HeadOutputs both = w.model->forward(ref.at("input"));
  w.model->head().set_one_to_one_only(true);
  const HeadOutputs alone = w.model->forward(ref.at("input"));
  w.model->head().set_one_to_one_only(false);
  EXPECT_EQ(both.count("pred"), 1u);
  EXPECT_EQ(alone.count("pred"), 0u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(alone.at("one2one")[i], both.at("one2one")[i])) << "level " << i;
  const at::Tensor want = ref.at("decoded").to(at::kFloat);  // [2, 84, 6]: x1, y1, x2, y2, score, class
  ASSERT_EQ(d.boxes.sizes(), (at::IntArrayRef{2, want.size(1), 4}));
  EXPECT_TRUE(at::equal(d.counts, at::full({2}, want.size(1), at::kLong))) << d.counts;
  EXPECT_LT(max_abs(d.boxes, want.narrow(2, 0, 4)), 1e-2);  // pixels: fp32 distances times a stride of 32
  EXPECT_LT(max_abs(d.scores, want.select(2, 4)), 1e-5);
  EXPECT_TRUE(at::equal(d.classes, want.select(2, 5).to(at::kLong)));
  // A threshold keeps the leading rows, the order unchanged.
  o.nms.conf = (want[0][8][4].item<double>() + want[0][9][4].item<double>()) / 2;
  const eval::Detections top = eval::decode(w.model->info(), w.model->forward(ref.at("input")), o);
  EXPECT_EQ(top.counts[0].item<int64_t>(), 9);
  EXPECT_TRUE(at::equal(top.classes[0].narrow(0, 0, 9), d.classes[0].narrow(0, 0, 9)));
}

TEST(Interop, YoloV5v7CheckpointKeepsItsAnchors) {
  LoadedWeights w = load_any_weights(fixture("yolov5v7_t.pt"), c10::Device(c10::kCPU));
  EXPECT_EQ(w.model->info().family, "yolov5");
  auto ref = reference("yolov5v7_t");
  // The library keeps anchors in grid units of each level; ours are pixels.
  const at::Tensor stride = ref.at("stride").to(at::kFloat).view({-1, 1, 1});
  EXPECT_LT(max_abs(w.model->info().anchors, ref.at("anchors").to(at::kFloat) * stride), 1e-4);
  // per level [B, anchors, H, W, 5 + nc]
  expect_library_outputs(*w.model, ref, {{"pred", 0, "raw0"}, {"pred", 1, "raw1"}, {"pred", 2, "raw2"}}, "yolov5v7_t");
}

// The network is held to the library on the library's own input; the model the file loads into
// also carries xingyizhou's input, (BGR / 255 - mean) / std (src/lib/datasets/dataset/coco.py),
// which its checkpoints do not record: on the RGB image the library's input came from, it gives
// the library's outputs (fp64, so the constants and the channel order are checked exactly).
TEST(Interop, CenterNetCheckpointsInBothFormats) {
  auto ref = reference("centernet_hg_t");
  const at::Tensor mean = at::tensor({0.40789654, 0.44719302, 0.47026115}, at::kDouble).view({1, 3, 1, 1});  // B, G, R
  const at::Tensor std = at::tensor({0.28863828, 0.27408164, 0.27809835}, at::kDouble).view({1, 3, 1, 1});
  const at::Tensor image = (ref.at("input").to(at::kDouble) * std + mean).flip(1);  // [2, 3, H, W] RGB
  for (const std::string file : {"centernet_hg_t_legacy.pth", "centernet_hg_t_zip.pth"}) {
    EXPECT_EQ(interop::read_torch_file(fixture(file)).format, file.find("legacy") != std::string::npos ? "legacy" : "zip");
    std::vector<std::tuple<std::string, size_t, std::string>> want;
    for (size_t s = 0; s < 2; ++s)
      for (const auto& [ours, theirs] : std::vector<std::pair<std::string, std::string>>{{"heatmap", "hm"}, {"size", "wh"}, {"offset", "reg"}})
        want.emplace_back(ours, s, theirs + std::to_string(s));

    const ImportedWeights imported = read_imported_weights(fixture(file));
    ModelSpec network = *imported.model;
    ASSERT_NE(network.text.find("input:"), std::string::npos) << network.text;
    network.text.erase(network.text.find("input:"));
    Detector plain(network);
    import_weights(*plain, imported, /*new_head=*/false);
    EXPECT_EQ(plain->info().family, "centernet") << file;
    EXPECT_EQ(plain->info().stacks, 2) << file;
    expect_library_outputs(*plain, ref, want, file);

    LoadedWeights w = load_any_weights(fixture(file), c10::Device(c10::kCPU));
    w.model->eval();
    w.model->to(at::kDouble);
    at::NoGradGuard no_grad;
    const HeadOutputs out = w.model->forward(image);
    for (const auto& [name, i, key] : want) {
      const at::Tensor& r64 = ref.at(key + "_f64");
      EXPECT_LT(max_abs(out.at(name)[i], r64), 1e-9 * std::max(1.0, r64.abs().max().item<double>())) << file << " " << key << " from the image";
    }
  }
}

// The reference library's file, read tensor by tensor against the values it printed.
TEST(Interop, SafetensorsWrittenByTheReferenceLibrary) {
  const interop::SafeTensors st = interop::read_safetensors(fixture("hf_tensors.safetensors"));
  EXPECT_EQ(st.metadata.at("note"), "fixture");
  std::map<std::string, at::Tensor> got(st.tensors.begin(), st.tensors.end());
  std::ifstream expected(fixture("hf_tensors.expected.txt"));
  std::string line, name;
  int checked = 0;
  while (std::getline(expected, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "tensor") {
      std::string dtype, shape;
      in >> name >> dtype >> shape;
      ASSERT_TRUE(got.count(name)) << name;
      std::string sizes;
      for (int64_t s : got.at(name).sizes()) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
      EXPECT_EQ("[" + sizes + "]", shape) << name;
    } else if (what == "bits") {  // floating point: the exact bit patterns
      const at::Tensor t = got.at(name).contiguous();
      const size_t width = t.element_size();
      std::string hex;
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint64_t bits = 0;
        std::memcpy(&bits, static_cast<const char*>(t.data_ptr()) + size_t(i) * width, width);
        char buf[24];
        std::snprintf(buf, sizeof buf, "0x%0*llx", int(width * 2), static_cast<unsigned long long>(bits));
        std::string want;
        in >> want;
        EXPECT_EQ(buf, want) << name << "[" << i << "]";
      }
      ++checked;
    } else if (what == "values" && !got.at(name).is_floating_point()) {
      const at::Tensor t = got.at(name).to(at::kLong).flatten();
      for (int64_t i = 0; i < t.numel(); ++i) {
        long long want = 0;
        in >> want;
        EXPECT_EQ(t[i].item<int64_t>(), want) << name << "[" << i << "]";
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, int(st.tensors.size()));
}

TEST(Interop, SafetensorsExportComesBack) {
  const std::string dir = test::temp_dir("safetensors");
  LoadedWeights w = load_any_weights(fixture("ul_yolo11t.pt"), c10::Device(c10::kCPU));
  w.model->eval();
  save_safetensors_weights(*w.model, w.info, dir + "/m.safetensors");
  save_safetensors_weights(*w.model, w.info, dir + "/h.safetensors", /*half=*/true);
  const at::Tensor x = reference("ul_yolo11t").at("input");
  at::NoGradGuard no_grad;
  const HeadOutputs want = w.model->forward(x);
  for (const std::string f : {"m", "h"}) {
    LoadedWeights back = load_any_weights(dir + "/" + f + ".safetensors", c10::Device(c10::kCPU));
    EXPECT_EQ(back.info.names, w.info.names);
    EXPECT_EQ(back.model->parameter_count(), w.model->parameter_count());
    back.model->eval();
    const HeadOutputs got = back.model->forward(x);
    for (size_t l = 0; l < 3; ++l) {
      // fp32: the same bits; fp16 storage: within fp16 rounding of the weights
      const double d = max_abs(got.at("pred")[l], want.at("pred")[l]);
      if (f == "m")
        EXPECT_EQ(d, 0.0);
      else
        EXPECT_LT(d, 0.05);
    }
  }
}

TEST(Interop, AnotherArchitectureIsRefusedAndNothingIsLoaded) {
  // YOLOv8 weights into the YOLO11 model of the same width: names and shapes differ.
  LoadedWeights target = load_any_weights(fixture("ul_yolo11t.pt"), c10::Device(c10::kCPU));
  const std::vector<at::Tensor> before = snapshot(*target.model);
  const ImportedWeights v8 = read_imported_weights(fixture("ul_yolov8t.pt"));
  const std::string err = thrown([&] { import_weights(*target.model, v8, /*new_head=*/true); });
  EXPECT_NE(err.find("ul_yolov8t.pt"), std::string::npos) << err;
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
  EXPECT_NE(err.find("nothing was loaded"), std::string::npos) << err;
  EXPECT_TRUE(same(before, snapshot(*target.model)));
}

TEST(Interop, AnotherClassCountKeepsEverythingButTheClassOutputs) {
  ImportedWeights w = read_imported_weights(fixture("ul_yolov8t.pt"));
  ModelSpec spec = *w.model;
  spec.nc = 5;
  Detector m(spec);
  const ImportReport r = import_weights(*m, w, /*new_head=*/true);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  ASSERT_EQ(r.reinitialised.size(), 6u);  // per level: the class conv's weight and bias
  for (const auto& s : r.reinitialised) EXPECT_NE(s.find("head.cv3."), std::string::npos) << s;
  // and the backbone is the file's
  std::map<std::string, at::Tensor> file(w.tensors.begin(), w.tensors.end());
  EXPECT_TRUE(at::equal(m->named_parameters()["model.0.m.0.cb.conv.weight"], file.at("model.0.conv.weight").to(at::kFloat)));
  // 40 classes widen YOLOv8's class branch (max(32 P3 channels, 40)): all of it starts afresh, as
  // Ultralytics' transfer of matching shapes does; the box branch is the file's
  spec.nc = 40;
  Detector wide(spec);
  const ImportReport r40 = import_weights(*wide, w, /*new_head=*/true);
  EXPECT_EQ(r40.reinitialised.size(), 36u);  // per level: 2 convs with BatchNorm (5 shaped tensors each), the class conv (2)
  for (const auto& s : r40.reinitialised) EXPECT_EQ(s.rfind("head.cv3.", 0), 0u) << s;
  EXPECT_TRUE(at::equal(wide->named_parameters()["head.cv2.0.0.cb.conv.weight"], file.at("model.22.cv2.0.0.conv.weight").to(at::kFloat)));
  // YOLO26: both class branches (one-to-many and one-to-one) start afresh, nothing else.
  ImportedWeights w26 = read_imported_weights(fixture("ul_yolo26t.pt"));
  ModelSpec spec26 = *w26.model;
  spec26.nc = 5;
  Detector m26(spec26);
  const ImportReport r26 = import_weights(*m26, w26, /*new_head=*/true);
  EXPECT_TRUE(r26.missing.empty() && r26.unexpected.empty() && r26.mismatched.empty());
  ASSERT_EQ(r26.reinitialised.size(), 12u);  // per level and branch: the class conv's weight and bias
  for (const auto& s : r26.reinitialised)
    EXPECT_TRUE(s.rfind("head.cv3.", 0) == 0 || s.rfind("head.one2one_cv3.", 0) == 0) << s;
  spec.nc = 5;
  // without permission the same file is refused
  Detector strict(spec);
  EXPECT_NE(thrown([&] { import_weights(*strict, w, /*new_head=*/false); }).find("other shapes"), std::string::npos);
}

TEST(Interop, DamagedFilesNameTheFileAndTheFault) {
  const std::string dir = test::temp_dir("damaged");
  const std::string zip = test::read_bytes(fixture("ul_yolov8t.pt"));
  // truncated: the zip directory is gone
  test::write_bytes(dir + "/cut.pt", zip.substr(0, zip.size() / 2));
  std::string e = thrown([&] { read_imported_weights(dir + "/cut.pt"); });
  EXPECT_NE(e.find("cut.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // one flipped byte inside a tensor's storage: its record's CRC-32 no longer matches
  std::string flipped = zip;
  flipped[zip.size() / 2] = char(flipped[zip.size() / 2] ^ 0x10);
  test::write_bytes(dir + "/flip.pt", flipped);
  e = thrown([&] { read_imported_weights(dir + "/flip.pt"); });
  EXPECT_NE(e.find("flip.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("damaged"), std::string::npos) << e;
  // torch.save under set_crc32_options(False) writes CRC 0, which torch.load accepts: so do we
  // (the same tensors), while a wrong non-zero CRC stays damage.
  std::string no_crc = zip;
  const auto le32 = [&](size_t at) { return uint32_t(uint8_t(no_crc[at])) | uint32_t(uint8_t(no_crc[at + 1])) << 8 |
                                            uint32_t(uint8_t(no_crc[at + 2])) << 16 | uint32_t(uint8_t(no_crc[at + 3])) << 24; };
  const size_t eocd = no_crc.rfind(std::string("PK\x05\x06", 4));
  ASSERT_NE(eocd, std::string::npos);
  size_t at = le32(eocd + 16);
  int zeroed = 0;
  while (le32(at) == 0x02014b50u) {  // central directory entries, and the local header each names
    const size_t local = le32(at + 42);
    for (size_t crc : {at + 16, local + 14}) no_crc.replace(crc, 4, 4, '\0');
    at += 46 + (uint8_t(no_crc[at + 28]) | uint8_t(no_crc[at + 29]) << 8) + (uint8_t(no_crc[at + 30]) | uint8_t(no_crc[at + 31]) << 8) +
          (uint8_t(no_crc[at + 32]) | uint8_t(no_crc[at + 33]) << 8);
    ++zeroed;
  }
  EXPECT_GT(zeroed, 10);
  test::write_bytes(dir + "/no_crc.pt", no_crc);
  const ImportedWeights plain = read_imported_weights(fixture("ul_yolov8t.pt")), unchecked = read_imported_weights(dir + "/no_crc.pt");
  ASSERT_EQ(plain.tensors.size(), unchecked.tensors.size());
  for (size_t i = 0; i < plain.tensors.size(); ++i) EXPECT_TRUE(at::equal(plain.tensors[i].second, unchecked.tensors[i].second));
  // a protocol 0 number in the object's pickle that is not one: named with its pickle byte
  const std::string magic = std::string("\x80\x02\x8a\x0a", 4) + std::string("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10) + ".";
  test::write_bytes(dir + "/text.pth", magic + std::string("\x80\x02M\xe9\x03.", 6) + std::string("\x80\x02}q\x00.", 6) + "(dp0\nS'a'\nI12x\ns.");
  e = thrown([&] { read_imported_weights(dir + "/text.pth"); });
  EXPECT_NE(e.find("text.pth"), std::string::npos) << e;
  EXPECT_NE(e.find("'12x' is not an integer"), std::string::npos) << e;
  EXPECT_NE(e.find("pickle byte"), std::string::npos) << e;
  // legacy format cut inside its raw storages
  const std::string legacy = test::read_bytes(fixture("centernet_hg_t_legacy.pth"));
  test::write_bytes(dir + "/cut.pth", legacy.substr(0, legacy.size() - 1000));
  e = thrown([&] { read_imported_weights(dir + "/cut.pth"); });
  EXPECT_NE(e.find("cut.pth"), std::string::npos) << e;
  EXPECT_NE(e.find("ends inside storage"), std::string::npos) << e;
  // safetensors whose header claims more bytes than the file has
  std::string st = test::read_bytes(fixture("hf_tensors.safetensors"));
  test::write_bytes(dir + "/cut.safetensors", st.substr(0, st.size() - 10));
  e = thrown([&] { interop::read_safetensors(dir + "/cut.safetensors"); });
  EXPECT_NE(e.find("cut.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("byte range"), std::string::npos) << e;
  // not a weights file at all
  test::write_bytes(dir + "/notes.txt", "hello");
  e = thrown([&] { load_any_weights(dir + "/notes.txt", c10::Device(c10::kCPU)); });
  EXPECT_NE(e.find("not a weights file"), std::string::npos) << e;
}

namespace {

// Pickle opcodes for hand-made hostile files.
std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string text(const std::string& s) { return "X" + u32(uint32_t(s.size())) + s; }  // BINUNICODE
std::string get(uint32_t memo) { return "j" + u32(memo); }                              // LONG_BINGET

// A torch.save file in the legacy format around the object pickle `object`: magic number,
// protocol, system info, the object, then the storage keys (none) and no raw storages.
std::string legacy_file(const std::string& object) {
  const std::string magic = std::string("\x80\x02\x8a\x0a", 4) + std::string("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10) + ".";
  return magic + std::string("\x80\x02M\xe9\x03.", 6) + "\x80\x02}." + "\x80\x02" + object + "." + "\x80\x02]."; 
}

}  // namespace

// A few bytes of opcodes must not make the reader allocate or walk without bound: storages that
// together claim more than the file, containers changed after they were nested (a chain that
// would overflow the stack when freed), shared values nested in each other (2^levels values to
// walk), and a view past its storage.
TEST(Interop, HostileTorchFilesAreRefusedWithinBoundedMemory) {
  const std::string dir = temp_dir("hostile");
  const auto refused = [&](const std::string& name, const std::string& bytes) {
    write_bytes(dir + "/" + name, bytes);
    return thrown([&] { interop::read_torch_file(dir + "/" + name); });
  };
  // 4,000 storages, each claiming 2/3 of the file: 640 MB if each were judged alone.
  std::string object = "(";
  for (int i = 0; i < 4000; ++i)
    object += "(" + text("storage") + "ctorch\nFloatStorage\n" + text("k" + std::to_string(i)) + text("cpu") + "J" + u32(40000) + "NtQ";
  object += "l";
  std::string e = refused("claims.pt", legacy_file(object));
  EXPECT_NE(e.find("claims.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("more than the file holds beside the storages before it"), std::string::npos) << e;

  // 300,000 empty lists, each appended to the one before after that one was placed: a chain
  // 300,000 deep whose depth no holder records.
  const uint32_t n = 300000;
  object.clear();
  for (uint32_t i = 0; i < n; ++i) object += "]r" + u32(i) + "0";  // EMPTY_LIST, LONG_BINPUT, POP
  for (uint32_t i = 0; i + 1 < n; ++i) object += get(i) + get(i + 1) + "a0";  // list i appends list i + 1
  object += get(0);
  e = refused("chain.pt", legacy_file(object));
  EXPECT_NE(e.find("a value changed after it was placed in another"), std::string::npos) << e;

  // x = [], then 200 times x = (x, x): 2^200 values to walk in a 1.6 KB pickle.
  object = "]r" + u32(0);
  for (uint32_t i = 0; i < 200; ++i) object += "0" + get(i) + get(i) + "\x86" + "r" + u32(i + 1);  // TUPLE2
  e = refused("shared.pt", legacy_file(object));
  EXPECT_NE(e.find("more than 10^7 values"), std::string::npos) << e;

  // A view whose element count is small but reaches past its 4-element storage.
  object = "ctorch._utils\n_rebuild_tensor_v2\n(" + ("(" + text("storage") + "ctorch\nFloatStorage\n" + text("0") + text("cpu") +
                                                       "J" + u32(4) + "NtQ") +
           "K\x03" + "K\x02\x85" + "K\x01\x85" + "\x89" + "}" + "tR";  // offset 3, size (2,), stride (1,)
  e = refused("view.pt", legacy_file(object));
  EXPECT_NE(e.find("reaches past the end of its storage"), std::string::npos) << e;
}

// A pickle's value tree as the library wrote it: the checkpoint dict, the model object with
// its class name, attributes and state_dict names.
TEST(Interop, PickleTreeOfAnUltralyticsCheckpoint) {
  const interop::TorchFile f = interop::read_torch_file(fixture("ul_yolov8t.pt"));
  EXPECT_EQ(f.format, "zip");
  const interop::PyValue& root = *f.root;
  ASSERT_TRUE(root.is_dict());
  const interop::PyValue* model = root.get("model");
  ASSERT_TRUE(model && model->is_object());
  EXPECT_EQ(model->text, "ultralytics.nn.tasks.DetectionModel");
  ASSERT_TRUE(model->get("yaml"));
  EXPECT_EQ(model->get("yaml")->get("nc")->integer, 3);
  const auto tensors = interop::module_state(*model);
  ASSERT_FALSE(tensors.empty());
  EXPECT_EQ(tensors.front().first, "model.0.conv.weight");
  EXPECT_EQ(tensors.front().second.scalar_type(), at::kHalf);  // saved as yolo train saves: fp16
}

// --- ONNX export ---------------------------------------------------------------------------

TEST(Interop, HourglassNamesCoverCenterNetsHg104) {
  ModelSpec spec;
  spec.file = std::string(HEADROOM_SOURCE_DIR) + "/models/centernet_hg104.yaml";
  spec.nc = 80;
  Detector m(spec);
  std::map<std::string, std::string> theirs;  // name -> "d0,d1,..."
  std::ifstream keys(fixture("centernet_hg104_keys.txt"));
  std::string line;
  while (std::getline(keys, line))
    if (!line.empty() && line[0] != '#') theirs[line.substr(0, line.find(' '))] = line.substr(line.find(' ') + 1);
  std::map<std::string, at::Tensor> ours;
  for (const auto& p : m->named_parameters()) ours[p.key()] = p.value();
  for (const auto& b : m->named_buffers()) ours[b.key()] = b.value();
  size_t matched = 0;
  for (const auto& [mine, name] : file_names(*m, Naming::centernet)) {
    const auto it = theirs.find(name);
    if (it == theirs.end()) {
      ADD_FAILURE() << mine << " -> " << name << ": not in CenterNet's network";
      continue;
    }
    std::string shape;
    for (int64_t d : ours.at(mine).sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    EXPECT_EQ(shape, it->second) << name;
    ++matched;
  }
  EXPECT_EQ(matched, theirs.size());
}

// A bad model.init_from names the file and the config line that gave it; nothing is written.
TEST(Interop, ABadInitFromNamesTheConfigLine) {
  const std::string dir = test::temp_dir("bad-init-from");
  test::write_bytes(dir + "/run.yaml", "model:\n  init_from: " + dir + "/nope.pt\n");
  std::string e = thrown([&] { interop::run_model(load_config(dir + "/run.yaml"), 3); });
  EXPECT_NE(e.find("nope.pt: weights file not found"), std::string::npos) << e;
  EXPECT_NE(e.find("model.init_from from " + dir + "/run.yaml:2"), std::string::npos) << e;
  test::write_bytes(dir + "/notes.pt", "not weights");
  e = thrown([&] { interop::run_model(load_config(dir + "/run.yaml", {"model.init_from=" + dir + "/notes.pt"}), 3); });
  EXPECT_NE(e.find("notes.pt: not a weights file Headroom reads"), std::string::npos) << e;
  EXPECT_NE(e.find("command line 'model.init_from="), std::string::npos) << e;
}

namespace {

std::string tf_fixture(const std::string& name) { return std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/tfod/ckpt/" + name; }

// The zoo's normalisation, as the fixture's pipeline.config gives it (BGR pixel means and stds).
InputNorm zoo_input() { return {{104.01362025, 114.03422265, 119.9165958}, {73.6027665, 69.89082075, 70.9150767}, true}; }

// An NHWC float32 output of the OD API's model as [1, C, H, W].
at::Tensor tf_output(const std::string& name, int64_t channels) {
  const std::string bytes = test::read_bytes(tf_fixture(name + ".f32"));
  at::Tensor t = at::empty({int64_t(bytes.size() / 4)}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t.view({1, 16, 16, channels}).permute({0, 3, 1, 2});
}

}  // namespace

// A TF2 checkpoint of the OD API's own CenterNet (its model_builder and HourglassNetwork, two
// stacks, seeded weights and BatchNorm statistics; scripts/make_tf_checkpoint_fixtures.py) read
// by our tensor-bundle reader and loaded into the Hourglass read off its shapes: every head of
// every stack equals TensorFlow's on the same image, after the same normalisation. The box
// outputs come in our channel order (TF: height, width and y, x).
TEST(Interop, TfOdApiCheckpointGivesTensorFlowsHeadOutputs) {
  const ImportedWeights w = read_imported_weights(tf_fixture("ckpt-0"));
  EXPECT_EQ(read_imported_weights(tf_fixture("ckpt-0.index")).tensors.size(), w.tensors.size());  // the index names it too
  ASSERT_TRUE(w.model);
  ModelSpec spec = *w.model;
  spec.input = zoo_input();
  Detector model(spec);
  const ImportReport r = import_weights(*model, w, /*new_head=*/false);
  EXPECT_GT(r.matched, 300);
  model->eval();
  const std::string rgb = test::read_bytes(tf_fixture("input.rgb"));
  at::Tensor image = at::empty({64, 64, 3}, at::kByte);
  std::memcpy(image.data_ptr(), rgb.data(), rgb.size());
  const at::Tensor x = image.permute({2, 0, 1}).unsqueeze(0).to(at::kFloat) / 255.0;
  at::NoGradGuard no_grad;
  const HeadOutputs out = model->forward(x);
  ASSERT_EQ(out.at("heatmap").size(), 2u);
  const at::Tensor swap = at::tensor(std::vector<int64_t>{1, 0});
  for (size_t s = 0; s < 2; ++s)
    for (const auto& [ours, theirs, channels] : std::vector<std::tuple<std::string, std::string, int64_t>>{
             {"heatmap", "heatmap_logits", 2}, {"size", "box_scale", 2}, {"offset", "box_offset", 2}}) {
      at::Tensor want = tf_output(theirs + "_" + std::to_string(s), channels);
      if (ours != "heatmap") want = want.index_select(1, swap);
      const at::Tensor got = out.at(ours)[s];
      const double scale = std::max(1.0, want.abs().max().item<double>()), err = (got - want).abs().max().item<double>();
      EXPECT_LE(err, 1e-3 * scale) << ours << " stack " << s;
      std::printf("TF checkpoint %s stack %zu: max |ours - TF| %.3g (outputs up to %.3g)\n", ours.c_str(), s, err, scale);
    }
  // The normalisation is the model's own: it goes into the YAML it carries and into ONNX.
  EXPECT_NE(model->yaml_text().find("input:"), std::string::npos) << model->yaml_text();
  EXPECT_TRUE(Detector(ModelSpec{"tf.yaml", model->yaml_text()})->input_norm().bgr);
  const std::string onnx = test::temp_dir("tf-onnx") + "/tf.onnx";
  WeightsInfo info;
  info.names = {"a", "b"};
  model->fuse();
  const auto want = forward_outputs(*model, x);
  export_onnx(*model, info, onnx, OnnxExportOptions().imgsz(64));
  const auto got = run_onnx(onnx, x);
  for (const auto& [name, t] : want)
    EXPECT_LT(max_abs(got.at(name), t), 1e-4 * std::max(1.0, t.abs().max().item<double>())) << name;
}

// A keypoint checkpoint of the zoo (centernet_hg104_512x512_kpts) carries heads a detector has not
// (human_pose/*): TF's restore (expect_partial) leaves them, so fine-tuning a detector from it
// works there; here too, where they counted as unexpected tensors and refused the whole file.
TEST(Interop, TfCheckpointHeadsOtherThanADetectorsAreLeftOut) {
  const std::string pre = "model/_prediction_head_dict/", post = "/0/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE";
  const auto out = tf_centernet_tensors({{pre + "object_center" + post, at::zeros({3, 3, 4, 8})},
                                         {pre + "human_pose.Sheatmap" + post, at::zeros({3, 3, 4, 17})},
                                         {pre + "human_pose.Sreg_offset" + post, at::zeros({3, 3, 4, 2})},
                                         {pre + "box.Sscale" + post, at::zeros({3, 3, 4, 2})}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].first.rfind("head.heatmap.", 0), 0u) << out[0].first;
  EXPECT_EQ(out[1].first.rfind("head.size.", 0), 0u) << out[1].first;
  EXPECT_EQ(out[0].second.sizes(), (at::IntArrayRef{8, 4, 3, 3}));  // HWIO -> OIHW
}

// Damage is named with the file and the place; a checkpoint alone, without the normalisation its
// pipeline states, is not taken for val or predict.
TEST(Interop, DamagedTfCheckpointsNameTheFileAndTheFault) {
  const std::string dir = test::temp_dir("tf-damaged");
  const std::string index = test::read_bytes(tf_fixture("ckpt-0.index")), data = test::read_bytes(tf_fixture("ckpt-0.data-00000-of-00001"));
  const auto write = [&](const std::string& name, const std::string& i, const std::string& d) {
    test::write_bytes(dir + "/" + name + ".index", i);
    if (!d.empty()) test::write_bytes(dir + "/" + name + ".data-00000-of-00001", d);
    return dir + "/" + name;
  };
  std::string flipped = data;
  flipped[data.size() / 3] = char(flipped[data.size() / 3] ^ 0x20);
  std::string e = thrown([&] { read_imported_weights(write("flip", index, flipped)); });
  EXPECT_NE(e.find("flip.data-00000-of-00001: checksum mismatch in model/"), std::string::npos) << e;
  std::string bad_index = index;
  bad_index[100] = char(bad_index[100] ^ 0x01);
  e = thrown([&] { read_imported_weights(write("index", bad_index, data)); });
  EXPECT_NE(e.find("index.index: damaged checkpoint index: block at byte 0: checksum mismatch"), std::string::npos) << e;
  e = thrown([&] { read_imported_weights(write("cut", index.substr(0, index.size() - 20), data)); });
  EXPECT_NE(e.find("cut.index: damaged checkpoint index: no table magic number"), std::string::npos) << e;
  e = thrown([&] { read_imported_weights(write("noshard", index, "")); });
  EXPECT_NE(e.find("noshard.data-00000-of-00001: the checkpoint's data shard 0 is missing"), std::string::npos) << e;
  e = thrown([&] { read_imported_weights(write("short", index, data.substr(0, data.size() / 2))); });
  EXPECT_NE(e.find("short.data-00000-of-00001: ends inside"), std::string::npos) << e;
  e = thrown([&] { load_any_weights(tf_fixture("ckpt-0"), c10::Device(c10::kCPU)); });
  EXPECT_NE(e.find("does not record the input normalisation"), std::string::npos) << e;
  test::write_bytes(dir + "/run.yaml", "model:\n  init_from: " + tf_fixture("ckpt-0") + "\n");
  e = thrown([&] { interop::run_model(load_config(dir + "/run.yaml"), 1); });
  EXPECT_NE(e.find("run.yaml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("model.init_from " + tf_fixture("ckpt-0") + " is a TF checkpoint, which does not record"), std::string::npos) << e;
  // With the normalisation, the backbone alone: the heads keep their initialisation.
  const Config c = load_config(dir + "/run.yaml", {"model.input_mean=[104, 114, 120]", "model.input_std=[74, 70, 71]", "model.input_bgr=true"});
  Detector d = interop::run_model(c, 1);
  const at::Tensor head_before = d->head().named_parameters()[0].value().clone();
  const auto kept = interop::init_from_weights(*d, c.model.init_from, /*backbone_only=*/true);
  EXPECT_EQ(kept.size(), 24u);  // 2 stacks x 3 heads x 2 convolutions x (weight, bias)
  EXPECT_TRUE(at::equal(d->head().named_parameters()[0].value(), head_before));
}
