#include <gtest/gtest.h>

#include "headroom/core/errors.h"
#include "headroom/data/labels.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;

namespace {

// The single problem a one-line label file produces.
Problem only_problem(const std::string& line, int nc = 3) {
  const LabelFile f = parse_yolo_labels(line + "\n", "l.txt", nc);
  EXPECT_EQ(f.problems.size(), 1u) << line;
  return f.problems.empty() ? Problem{} : f.problems[0];
}

}  // namespace

TEST(YoloLabels, ParsesBoxesToNormalisedCorners) {
  const LabelFile f = parse_yolo_labels("0 0.5 0.5 0.2 0.4\n\n2 0.25 0.75 0.1 0.1\n", "l.txt", 3);
  ASSERT_TRUE(f.problems.empty());
  ASSERT_EQ(f.boxes.size(), 2u);
  EXPECT_FLOAT_EQ(f.boxes[0].x1, 0.4f);
  EXPECT_FLOAT_EQ(f.boxes[0].y1, 0.3f);
  EXPECT_FLOAT_EQ(f.boxes[0].x2, 0.6f);
  EXPECT_FLOAT_EQ(f.boxes[0].y2, 0.7f);
  EXPECT_EQ(f.boxes[1].cls, 2);
}

TEST(YoloLabels, PolygonLinesBecomeTheirExtent) {
  const LabelFile f = parse_yolo_labels("1 0.1 0.2 0.5 0.1 0.3 0.6\n", "l.txt", 3);
  ASSERT_EQ(f.boxes.size(), 1u);
  EXPECT_FLOAT_EQ(f.boxes[0].x1, 0.1f);
  EXPECT_FLOAT_EQ(f.boxes[0].y1, 0.1f);
  EXPECT_FLOAT_EQ(f.boxes[0].x2, 0.5f);
  EXPECT_FLOAT_EQ(f.boxes[0].y2, 0.6f);
}

TEST(YoloLabels, EachKindOfBadLineNamesFileLineAndFix) {
  struct Case { std::string line, expect; };
  const std::vector<Case> cases = {
      {"0 0.5 0.5 0.2", "4 fields; expected 5"},
      {"0 0.5 0.5 0.2 0.2 0.3", "6 fields"},
      {"0 0.5 abc 0.2 0.2", "'abc' is not a number"},
      {"0 0.5 nan 0.2 0.2", "'nan' is not a finite number"},
      {"-1 0.5 0.5 0.2 0.2", "class id -1 is not valid: this data set has 3 classes, ids 0..2"},
      {"3 0.5 0.5 0.2 0.2", "class id 3 is not valid"},
      {"1.5 0.5 0.5 0.2 0.2", "class id 1.5 is not valid"},
      {"0 320 240 50 60", "outside [0, 1]"},
      {"0 0.5 1.2 0.2 0.2", "outside [0, 1]"},
  };
  for (const auto& c : cases) {
    const LabelFile f = parse_yolo_labels("0 0.5 0.5 0.1 0.1\n" + c.line + "\n", "dir/l.txt", 3);
    EXPECT_TRUE(f.corrupt) << c.line;
    ASSERT_EQ(f.problems.size(), 1u) << c.line;
    EXPECT_EQ(f.problems[0].kind, ProblemKind::bad_label);
    EXPECT_EQ(f.problems[0].where, "dir/l.txt:2") << c.line;
    EXPECT_NE(f.problems[0].message.find(c.expect), std::string::npos) << c.line << " -> " << f.problems[0].message;
  }
}

TEST(YoloLabels, SmallOverflowIsClippedNotAnError) {
  const LabelFile f = parse_yolo_labels("0 1.0005 0.5 0.2 0.2\n", "l.txt", 1);
  ASSERT_TRUE(f.problems.empty());
  EXPECT_FLOAT_EQ(f.boxes[0].x2, 1.0f);
}

TEST(YoloLabels, ZeroAreaAndDuplicateBoxesAreDroppedKeepingTheImage) {
  Problem p = only_problem("0 0.5 0.5 0 0.2");
  EXPECT_EQ(p.kind, ProblemKind::zero_area_box);
  EXPECT_FALSE(p.image_skipped);
  const LabelFile f = parse_yolo_labels("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n", "l.txt", 3);
  EXPECT_FALSE(f.corrupt);
  EXPECT_EQ(f.boxes.size(), 2u);
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_EQ(f.problems[0].kind, ProblemKind::duplicate_box);
  EXPECT_EQ(f.problems[0].where, "l.txt:2");
}

TEST(YoloLabels, LabelPathMirrorsTheImagesFolder) {
  EXPECT_EQ(yolo_label_path("/d/images/train/a.jpg"), "/d/labels/train/a.txt");
  EXPECT_EQ(yolo_label_path("/d/images/x/images/b.PNG"), "/d/images/x/labels/b.txt");
  EXPECT_EQ(yolo_label_path("images/c.jpeg"), "labels/c.txt");
  EXPECT_EQ(yolo_label_path("/flat/d.jpg"), "/flat/d.txt");
}

namespace {

std::string write_coco(const std::string& body) {
  const std::string dir = test::temp_dir("coco");
  test::write_bytes(dir + "/ann.json", body);
  return dir + "/ann.json";
}

const char* kCocoHead = R"({"images": [
  {"id": 1, "file_name": "a.jpg", "width": 100, "height": 50},
  {"id": 2, "file_name": "b.jpg", "width": 200, "height": 100}
], "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
"annotations": [
)";

}  // namespace

TEST(CocoLabels, MapsCategoriesInIdOrderAndNormalisesBoxes) {
  const std::string path = write_coco(std::string(kCocoHead) +
                                      R"({"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10]},
  {"id": 2, "image_id": 2, "category_id": 3, "bbox": [0, 0, 200, 100], "iscrowd": 1}]})");
  const CocoData d = read_coco(path, "/imgs", {});
  ASSERT_EQ(d.names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(d.category_ids, (std::vector<int>{3, 7}));
  ASSERT_EQ(d.samples.size(), 2u);
  EXPECT_EQ(d.samples[0].image, "/imgs/a.jpg");
  EXPECT_EQ(d.samples[0].image_id, 1);
  ASSERT_EQ(d.samples[0].boxes.size(), 1u);
  EXPECT_EQ(d.samples[0].boxes[0].cls, 1);
  EXPECT_FLOAT_EQ(d.samples[0].boxes[0].x1, 0.1f);
  EXPECT_FLOAT_EQ(d.samples[0].boxes[0].y2, 0.3f);
  EXPECT_TRUE(d.samples[1].boxes[0].crowd);
  EXPECT_TRUE(d.problems.empty());
}

TEST(CocoLabels, NamesFromTheYamlMapByName) {
  const std::string path = write_coco(std::string(kCocoHead) +
                                      R"({"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10]}]})");
  const CocoData d = read_coco(path, "/imgs", {"dog", "cat"});
  EXPECT_EQ(d.samples[0].boxes[0].cls, 0);
  EXPECT_EQ(d.category_ids, (std::vector<int>{7, 3}));
  EXPECT_THROW(read_coco(path, "/imgs", {"dog"}), InputError);  // cat has no class
  // A name without a category would have no id for its detections.
  const std::string bird = test::input_error_of([&] { read_coco(path, "/imgs", {"dog", "cat", "bird"}); });
  EXPECT_NE(bird.find("names list 'bird' (class 2), which this file has no category for"), std::string::npos) << bird;
}

// iscrowd as pycocotools reads it (true counts), and an annotation listed twice is one box, as
// YOLO and TFRecord labels drop duplicates.
TEST(CocoLabels, CrowdAsPycocotoolsAndDuplicatesDropped) {
  const std::string path = write_coco(std::string(kCocoHead) +
                                      R"({"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10], "iscrowd": true},
  {"id": 2, "image_id": 2, "category_id": 3, "bbox": [10, 5, 20, 10]},
  {"id": 3, "image_id": 2, "category_id": 3, "bbox": [10, 5, 20, 10]}]})");
  const CocoData d = read_coco(path, "/imgs", {});
  ASSERT_EQ(d.samples.size(), 2u);
  ASSERT_EQ(d.samples[0].boxes.size(), 1u);
  EXPECT_TRUE(d.samples[0].boxes[0].crowd);
  EXPECT_EQ(d.samples[1].boxes.size(), 1u);
  ASSERT_EQ(d.problems.size(), 1u);
  EXPECT_EQ(d.problems[0].kind, ProblemKind::duplicate_box);
  EXPECT_TRUE(coco_crowd(Json::parse(R"({"iscrowd": 1})", "x")));
  EXPECT_FALSE(coco_crowd(Json::parse(R"({"iscrowd": false})", "x")));
}

// Two categories with one id would make two classes of one (or one box of either): refused,
// naming both lines.
TEST(CocoLabels, ACategoryIdListedTwiceIsRefused) {
  std::string head = kCocoHead;
  const std::string cats = R"("categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],)";
  const size_t at = head.find(cats);
  ASSERT_NE(at, std::string::npos);
  head.replace(at, cats.size(), "\"categories\": [{\"id\": 7, \"name\": \"dog\"},\n{\"id\": 7, \"name\": \"wolf\"}],");
  const std::string path = write_coco(head + R"({"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 5, 20, 10]}]})");
  const std::string what = test::input_error_of([&] { read_coco(path, "/imgs", {}); });
  EXPECT_NE(what.find("category id 7 is listed again (first at line"), std::string::npos) << what;
  EXPECT_NE(what.find(path + ":"), std::string::npos) << what;
}

TEST(CocoLabels, BadAnnotationsNameTheirLineAndSkipTheImage) {
  const std::string path = write_coco(std::string(kCocoHead) +
                                      R"({"id": 1, "image_id": 1, "category_id": 99, "bbox": [10, 5, 20, 10]},
  {"id": 2, "image_id": 2, "category_id": 3, "bbox": [150, 0, 80, 10]},
  {"id": 3, "image_id": 42, "category_id": 3, "bbox": [1, 1, 2, 2]},
  {"id": 4, "image_id": 2, "category_id": 3, "bbox": [1, 1, 0, 2]}]})");
  const CocoData d = read_coco(path, "/imgs", {});
  ASSERT_EQ(d.problems.size(), 4u);
  EXPECT_EQ(d.problems[0].where, path + ":6");
  EXPECT_NE(d.problems[0].message.find("category_id"), std::string::npos);
  EXPECT_EQ(d.problems[1].where, path + ":7");
  EXPECT_NE(d.problems[1].message.find("outside the 200x100 image"), std::string::npos);
  EXPECT_NE(d.problems[2].message.find("not in \"images\""), std::string::npos);
  EXPECT_EQ(d.problems[3].kind, ProblemKind::zero_area_box);
  EXPECT_TRUE(d.corrupt[0]);
  EXPECT_TRUE(d.corrupt[1]);
}

TEST(CocoLabels, StructuralErrorsAreClear) {
  EXPECT_THROW(read_coco(write_coco(R"({"annotations": []})"), "/i", {}), InputError);
  try {
    read_coco(write_coco("{\"images\": [\n{\"id\": 1,"), "/i", {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}
