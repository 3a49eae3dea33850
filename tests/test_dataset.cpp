#include <gtest/gtest.h>

#include <filesystem>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/data/dataset.h"
#include "headroom/data/tfrecord.h"
#include "headroom/data/image.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

namespace {

Split scan(const std::string& yaml, const std::string& split, OnError on_error = OnError::skip) {
  ScanOptions o;
  o.threads = 2;
  o.on_error = on_error;
  return scan_split(read_data_yaml(yaml), split, o);
}

std::string yaml_error(const std::string& text) {
  const std::string path = test::temp_dir("yaml") + "/data.yaml";
  test::write_bytes(path, text);
  try {
    read_data_yaml(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const Problem* find_problem(const Split& s, const std::string& where_suffix) {
  for (const auto& p : s.problems)
    if (p.where.size() >= where_suffix.size() &&
        p.where.compare(p.where.size() - where_suffix.size(), where_suffix.size(), where_suffix) == 0)
      return &p;
  return nullptr;
}

}  // namespace

TEST(Dataset, ScansTheSyntheticSet) {
  const Split train = scan(test::small_synth(), "train");
  const Split val = scan(test::small_synth(), "val");
  EXPECT_EQ(train.listed_images, 26);
  EXPECT_EQ(val.listed_images, 6);
  EXPECT_EQ(train.samples.size(), 26u);
  EXPECT_TRUE(train.problems.empty());
  EXPECT_EQ(train.names, (std::vector<std::string>{"circle", "square", "triangle", "cross"}));
  for (const Sample& s : train.samples) {
    EXPECT_EQ(std::max(s.width, s.height), 128);
    for (const Box& b : s.boxes) {
      EXPECT_LT(b.x1, b.x2);
      EXPECT_LT(b.y1, b.y2);
      EXPECT_GE(b.x1, 0.f);
      EXPECT_LE(b.y2, 1.f);
    }
  }
}

TEST(Dataset, YoloAndCocoViewsOfTheSameSetAgree) {
  const std::string coco_yaml = fs::path(test::small_synth()).parent_path() / "data_coco.yaml";
  const Split yolo = scan(test::small_synth(), "train");
  const Split coco = scan(coco_yaml, "train");
  EXPECT_EQ(coco.category_ids, (std::vector<int>{1, 2, 3, 4}));
  ASSERT_EQ(yolo.samples.size(), coco.samples.size());
  for (size_t i = 0; i < yolo.samples.size(); ++i) {
    const Sample &a = yolo.samples[i], &b = coco.samples[i];
    EXPECT_EQ(a.image, b.image);
    EXPECT_EQ(a.width, b.width);
    ASSERT_EQ(a.boxes.size(), b.boxes.size()) << a.image;
    for (size_t j = 0; j < a.boxes.size(); ++j) {
      EXPECT_EQ(a.boxes[j].cls, b.boxes[j].cls);
      EXPECT_NEAR(a.boxes[j].x1, b.boxes[j].x1, 1e-3);
      EXPECT_NEAR(a.boxes[j].y2, b.boxes[j].y2, 1e-3);
    }
  }
}

// Names in the data YAML take their category ids from the COCO file: a name it lacks has none.
TEST(Dataset, ACocoSplitWithoutACategoryForANameIsRefused) {
  const fs::path dir = fs::path(test::copy_of_small_synth("coco-missing-category")).parent_path();
  test::write_bytes((dir / "more.yaml").string(), test::read_bytes((dir / "data_coco.yaml").string()) +
                                                      "names: [circle, square, triangle, cross, star]\n");
  const std::string e = test::input_error_of([&] { scan((dir / "more.yaml").string(), "train"); });
  EXPECT_NE(e.find("instances_train.json: the data YAML's names list 'star' (class 4), which this file has no category for"),
            std::string::npos) << e;
}

// nc beside a COCO file and no names: held to the file's categories.
TEST(Dataset, NcIsHeldToTheCocoCategories) {
  const fs::path dir = fs::path(test::copy_of_small_synth("coco-nc")).parent_path();
  test::write_bytes((dir / "seven.yaml").string(), test::read_bytes((dir / "data_coco.yaml").string()) + "nc: 7\n");
  const std::string e = test::input_error_of([&] { scan((dir / "seven.yaml").string(), "train"); });
  EXPECT_NE(e.find("seven.yaml:5:5: nc is 7 but split 'train' has 4 classes ("), std::string::npos) << e;
  test::write_bytes((dir / "four.yaml").string(), test::read_bytes((dir / "data_coco.yaml").string()) + "nc: 4\n");
  EXPECT_EQ(scan((dir / "four.yaml").string(), "train").names.size(), 4u);
}

TEST(Dataset, EveryBadFileIsSkippedAndNamed) {
  const std::string yaml = test::copy_of_small_synth("bad");
  const fs::path root = fs::path(yaml).parent_path();
  const fs::path img = root / "images" / "train", lab = root / "labels" / "train";
  test::write_bytes(img / "im000000.jpg", "");                                       // zero bytes
  const std::string jpeg = test::read_bytes(img / "im000001.jpg");
  test::write_bytes(img / "im000001.jpg", jpeg.substr(0, jpeg.size() / 2));          // truncated
  test::write_bytes(img / "im000002.jpg", "<html>not found</html>");                 // not an image
  const std::string bomb("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\x01\x86\xa0\0\x01\x86\xa0\x08\x02\0\0\0\0\0\0\0", 33);
  test::write_bytes(img / "im000003.jpg", bomb);                                     // 10^10 pixels
  test::write_bytes(lab / "im000004.txt", "0 0.5 0.5 0.2\n");                        // wrong field count
  test::write_bytes(lab / "im000005.txt", "9 0.5 0.5 0.2 0.2\n");                    // class out of range
  fs::remove(lab / "im000006.txt");                                                  // background now
  test::write_bytes(lab / "im000007.txt", "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n"); // duplicate

  const Split s = scan(yaml, "train");
  EXPECT_EQ(s.listed_images, 26);
  EXPECT_EQ(s.skipped_images(), 6);
  EXPECT_EQ(s.samples.size(), 20u);
  struct Expect { std::string where; ProblemKind kind; std::string text; };
  const std::vector<Expect> expected = {
      {"im000000.jpg", ProblemKind::unreadable_image, "empty file"},
      {"im000001.jpg", ProblemKind::truncated_image, "ends before its end marker"},
      {"im000002.jpg", ProblemKind::unreadable_image, "holds text"},
      {"im000003.jpg", ProblemKind::oversized_image, "refused before decoding"},
      {"im000004.txt:1", ProblemKind::bad_label, "4 fields"},
      {"im000005.txt:1", ProblemKind::bad_label, "class id 9"},
      {"im000007.txt:2", ProblemKind::duplicate_box, "duplicate"},
  };
  for (const auto& e : expected) {
    const Problem* p = find_problem(s, e.where);
    ASSERT_NE(p, nullptr) << e.where;
    EXPECT_EQ(p->kind, e.kind) << e.where;
    EXPECT_NE(p->message.find(e.text), std::string::npos) << e.where << ": " << p->message;
  }
  EXPECT_EQ(s.problems.size(), expected.size());
  bool background_found = false;
  for (const Sample& smp : s.samples)
    background_found |= smp.image.find("im000006.jpg") != std::string::npos && smp.boxes.empty();
  EXPECT_TRUE(background_found);

  try {
    scan(yaml, "train", OnError::fail);
    FAIL() << "on_error=fail did not stop";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("im000000.jpg: empty file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.on_error is fail"), std::string::npos);
  }
}

// The log's first 20 problems are those that skip an image: 30 dropped boxes listed first hid
// the one image left out. The rest are counted by kind.
TEST(Dataset, TheLogNamesSkippedImagesBeforeDroppedBoxes) {
  const std::string yaml = test::copy_of_small_synth("many-drops");
  const fs::path root = fs::path(yaml).parent_path();
  std::string zero_area;
  for (int i = 0; i < 30; ++i) zero_area += "0 0.5 0.5 0 0.2\n";
  test::write_bytes(root / "labels" / "train" / "im000000.txt", zero_area);
  test::write_bytes(root / "images" / "train" / "im000025.jpg", "");  // the last image: its problem comes last
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const Split s = scan(yaml, "train");
  const std::string log = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
  ASSERT_EQ(s.problems.size(), 31u);
  const size_t skipped = log.find("im000025.jpg: unreadable image"), dropped = log.find("zero-area box");
  ASSERT_NE(skipped, std::string::npos) << log;
  EXPECT_LT(skipped, dropped) << log;
  EXPECT_NE(log.find("... and 11 more problems in split 'train': 11 zero-area box (trainer data check lists them all)"), std::string::npos)
      << log;
}

// Class names go on into predictions, COCO JSON and ONNX metadata, which are UTF-8: a name saved
// in Latin-1 is refused where it is read, with its place. Paths are bytes and are left alone.
TEST(Dataset, ClassNamesThatAreNotUtf8AreRefusedWhereTheyAreRead) {
  EXPECT_EQ(invalid_utf8_at("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), std::nullopt);  // é, €, an emoji
  EXPECT_EQ(invalid_utf8_at("caf\xE9"), std::optional<size_t>(3));                        // Latin-1 é
  EXPECT_EQ(invalid_utf8_at("\xC0\xAF"), std::optional<size_t>(0));                       // overlong '/'
  EXPECT_EQ(invalid_utf8_at("a\xED\xA0\x80"), std::optional<size_t>(1));                  // a surrogate
  EXPECT_EQ(invalid_utf8_at("ab\xE2\x82"), std::optional<size_t>(2));                     // cut short
  EXPECT_EQ(invalid_utf8_at("\xF4\x90\x80\x80"), std::optional<size_t>(0));              // past U+10FFFF
  const std::string dir = test::temp_dir("latin1-names");
  test::write_bytes(dir + "/utf8.yaml", "path: .\ntrain: images\nnames: [ok, \"caf\xC3\xA9\"]\n");
  EXPECT_EQ(read_data_yaml(dir + "/utf8.yaml").names, (std::vector<std::string>{"ok", "caf\xC3\xA9"}));
  test::write_bytes(dir + "/latin1.yaml", "path: .\ntrain: images\nnames:\n  0: ok\n  1: caf\xE9\n");
  std::string e = test::input_error_of([&] { read_data_yaml(dir + "/latin1.yaml"); });
  EXPECT_NE(e.find(dir + "/latin1.yaml:5:6: class name 'caf?' is not UTF-8 text (byte 0xE9"), std::string::npos) << e;
  EXPECT_NE(e.find("save the file as UTF-8"), std::string::npos) << e;
  test::write_bytes(dir + "/map.pbtxt", "item {\n  id: 1\n  name: \"caf\xE9\"\n}\n");
  e = test::input_error_of([&] { read_label_map(dir + "/map.pbtxt"); });
  EXPECT_NE(e.find(dir + "/map.pbtxt:1: class name 'caf?' is not UTF-8 text"), std::string::npos) << e;
  test::write_bytes(dir + "/coco.json", "{\"images\": [], \"annotations\": [],\n \"categories\": [{\"id\": 1, \"name\": \"caf\xE9\"}]}\n");
  test::write_bytes(dir + "/coco.yaml", "path: .\ntrain: {coco: coco.json, images: .}\n");
  e = test::input_error_of([&] { scan(dir + "/coco.yaml", "train"); });
  EXPECT_NE(e.find(dir + "/coco.json:2: class name 'caf?' is not UTF-8 text"), std::string::npos) << e;
}

TEST(Dataset, FullDecodeFindsDamageTheHeaderHides) {
  const std::string yaml = test::copy_of_small_synth("decode");
  const fs::path img = fs::path(yaml).parent_path() / "images" / "train" / "im000000.jpg";
  std::string jpeg = test::read_bytes(img);
  // Keep the header and the end marker; cut out the middle of the entropy-coded data.
  jpeg = jpeg.substr(0, jpeg.size() / 2) + jpeg.substr(jpeg.size() - 2);
  test::write_bytes(img, jpeg);
  EXPECT_TRUE(scan(yaml, "train").problems.empty());  // header + end marker look fine
  ScanOptions o;
  o.full_decode = true;
  const Split s = scan_split(read_data_yaml(yaml), "train", o);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_EQ(s.problems[0].kind, ProblemKind::unreadable_image);
  EXPECT_NE(s.problems[0].message.find("corrupt JPEG"), std::string::npos) << s.problems[0].message;
}

TEST(Dataset, NoUsableImageFailsClearly) {
  const std::string yaml = test::copy_of_small_synth("none");
  const fs::path img = fs::path(yaml).parent_path() / "images" / "val";
  for (const auto& e : fs::directory_iterator(img)) test::write_bytes(e.path(), "");
  try {
    scan(yaml, "val");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("split 'val' has no usable image (6 listed; first problem:"), std::string::npos) << e.what();
  }
}

// A YOLO split none of whose images has a label file (the labels/ folder missing or misplaced)
// is a problem naming where the labels were looked for; its images stay (each alone could be a
// background image), and one label file anywhere in the split is enough to say nothing.
TEST(Dataset, ASplitWithoutAnyLabelFileIsAProblem) {
  const std::string yaml = test::copy_of_small_synth("no-labels");
  const fs::path labels = fs::path(yaml).parent_path() / "labels" / "val";
  fs::path one;
  for (const auto& e : fs::directory_iterator(labels)) one = e.path();
  const std::string kept = test::read_bytes(one.string());
  fs::remove_all(labels);
  const Split val = scan(yaml, "val");
  EXPECT_EQ(val.samples.size(), 6u);
  ASSERT_EQ(val.problems.size(), 1u);
  EXPECT_EQ(val.problems[0].kind, ProblemKind::missing_labels);
  EXPECT_NE(val.problems[0].message.find("looked for " + val.samples.front().labels), std::string::npos) << val.problems[0].message;
  EXPECT_FALSE(val.problems[0].image_skipped);
  fs::create_directories(labels);
  test::write_bytes(one.string(), kept);
  EXPECT_TRUE(scan(yaml, "val").problems.empty());
}

TEST(Dataset, TextListsResolveRelativePathsAndReportMissingOnes) {
  const std::string yaml = test::copy_of_small_synth("list");
  const fs::path root = fs::path(yaml).parent_path();
  test::write_bytes(root / "train.txt", "./images/train/im000000.jpg\nimages/train/im000001.jpg\n\nimages/train/gone.jpg\n");
  test::write_bytes(root / "list.yaml", "path: .\ntrain: train.txt\nnames: [circle, square, triangle, cross]\n");
  const Split s = scan((root / "list.yaml").string(), "train");
  EXPECT_EQ(s.samples.size(), 2u);
  EXPECT_EQ(s.listed_images, 3);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_EQ(s.problems[0].kind, ProblemKind::missing_image);
  EXPECT_EQ(s.problems[0].where, (root / "train.txt").string() + ":4");
}

TEST(DataYaml, NamesAsListOrMapAndSplitForms) {
  const std::string dir = test::temp_dir("yaml");
  test::write_bytes(dir + "/d.yaml",
                    "path: sub\ntrain: [a, b]\nval: {coco: ann/val.json, images: img/val}\nnames:\n  0: x\n  1: y\nnc: 2\ndownload: ignored\n");
  const DataSpec d = read_data_yaml(dir + "/d.yaml");
  EXPECT_EQ(d.names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(d.root, fs::path(dir + "/sub").lexically_normal().string());
  ASSERT_EQ(d.split("train")->images.size(), 2u);
  EXPECT_EQ(d.split("train")->images[1], d.root + "/b");
  EXPECT_EQ(d.split("val")->format, SplitSource::Format::coco);
  EXPECT_EQ(d.split("val")->annotations, d.root + "/ann/val.json");
}

TEST(DataYaml, MistakesNameFileLineAndFix) {
  EXPECT_NE(yaml_error("train: a\nnames: [x, y]\nnc: 3\n").find(":3:5: nc is 3 but names lists 2 classes"), std::string::npos);
  EXPECT_NE(yaml_error("train: a.json\nnames: [x]\n").find(":1:8: a COCO split is written {coco: a.json"), std::string::npos);
  EXPECT_NE(yaml_error("train: a\n").find("names is missing"), std::string::npos);
  EXPECT_NE(yaml_error("names: [x]\n").find("no train or val split"), std::string::npos);
  EXPECT_NE(yaml_error("train: a\nnames: {0: x, 2: y}\n").find("without gaps; 1 is missing"), std::string::npos);
  EXPECT_NE(yaml_error("train: [a\n").find("YAML syntax error"), std::string::npos);
  EXPECT_NE(yaml_error("train: {coco: a.json}\nnames: [x]\n").find("needs both keys"), std::string::npos);
}

// yaml-cpp answers a key given twice with its first value: a data YAML's second 'train' (or a
// class id given twice) was dropped without a word.
TEST(Dataset, AKeyOrAClassIdGivenTwiceIsRefused) {
  const std::string yaml = test::copy_of_small_synth("data-twice");
  const std::string dir = fs::path(yaml).parent_path().string();
  test::write_bytes(dir + "/twice.yaml", "path: .\ntrain: images/train\ntrain: images/val\nval: images/val\nnames: [circle, square, triangle, cross]\n");
  std::string e = test::input_error_of([&] { read_data_yaml(dir + "/twice.yaml"); });
  EXPECT_NE(e.find(dir + "/twice.yaml:3:1: 'train' is given twice (first at " + dir + "/twice.yaml:2:1)"), std::string::npos) << e;
  test::write_bytes(dir + "/ids.yaml", "path: .\ntrain: images/train\nval: images/val\nnames: {0: circle, 1: square, 1: triangle, 2: cross}\n");
  e = test::input_error_of([&] { read_data_yaml(dir + "/ids.yaml"); });
  EXPECT_NE(e.find("class id 1 is given twice in names"), std::string::npos) << e;
}

TEST(Dataset, ConfigPointsAtTheSplit) {
  const Config c = load_config("", {"data.dataset=" + test::small_synth(), "data.workers=2"});
  EXPECT_EQ(load_split(c, "val").samples.size(), 6u);
  EXPECT_THROW(load_split(load_config(""), "train"), InputError);
}
