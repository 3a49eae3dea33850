#include <gtest/gtest.h>

#include <filesystem>

#include "headroom/data/check.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

TEST(DataCheck, CountsClassesSizesAndBackgrounds) {
  ScanOptions o;
  o.full_decode = true;
  o.report_only = true;
  const CheckReport r = check_data(test::small_synth(), {}, o);
  ASSERT_EQ(r.splits.size(), 2u);
  const SplitReport& train = r.splits[0];
  int64_t boxes = 0, per_image = 0;
  for (const Sample& s : train.split.samples) boxes += static_cast<int64_t>(s.boxes.size());
  for (int64_t b : train.boxes_per_class) per_image += b;
  EXPECT_EQ(per_image, boxes);
  int64_t hist = 0;
  for (int64_t c : train.box_sizes.counts) hist += c;
  EXPECT_EQ(hist, boxes);
  EXPECT_EQ(train.image_sizes.counts[0], 26);  // every image's long side is 128 (< 256)
  int64_t counted = 0;
  for (int64_t c : train.boxes_per_image.counts) counted += c;
  EXPECT_EQ(counted, 26);
  EXPECT_EQ(train.boxes_per_image.counts[0], train.split.background_images());
  EXPECT_FALSE(r.has_skips());
  const std::string text = format_check_report(r);
  EXPECT_NE(text.find("[train] 26 images listed, 26 usable, 0 skipped"), std::string::npos) << text;
  EXPECT_NE(text.find("circle"), std::string::npos);
  const Json j = check_report_json(r);
  EXPECT_TRUE(j.find("ok")->as_bool());
  EXPECT_EQ(j.find("splits")->items()[1].find("usable_images")->as_number(), 6);
}

TEST(DataCheck, ListsEveryProblemAndAnEmptySplitWithoutThrowing) {
  const std::string yaml = test::copy_of_small_synth("check");
  const fs::path root = fs::path(yaml).parent_path();
  for (const auto& e : fs::directory_iterator(root / "images" / "val")) test::write_bytes(e.path(), "x");
  test::write_bytes((root / "labels" / "train" / "im000002.txt").string(), "0 1 2\n");
  ScanOptions o;
  o.report_only = true;
  const CheckReport r = check_data(yaml, {}, o);
  EXPECT_TRUE(r.has_skips());
  EXPECT_EQ(r.splits[1].split.samples.size(), 0u);
  EXPECT_EQ(r.splits[1].split.problems.size(), 6u);
  const std::string text = format_check_report(r);
  EXPECT_NE(text.find("im000002.txt:1: bad label: 3 fields"), std::string::npos) << text;
  EXPECT_NE(text.find("unreadable image 6"), std::string::npos) << text;
}
