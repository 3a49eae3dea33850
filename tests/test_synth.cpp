#include <gtest/gtest.h>

#include <filesystem>

#include "headroom/core/errors.h"
#include "headroom/data/dataset.h"
#include "headroom/data/synth.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

namespace {

SynthOptions small(const std::string& out, int threads) {
  SynthOptions o;
  o.out = out;
  o.images = 12;
  o.size = 96;
  o.seed = 3;
  o.threads = threads;
  return o;
}

}  // namespace

TEST(Synth, SameSeedSameBytesWhateverTheThreads) {
  const std::string a = test::temp_dir("synth-a"), b = test::temp_dir("synth-b");
  const SynthSummary sa = synthesize(small(a, 1));
  const SynthSummary sb = synthesize(small(b, 3));
  EXPECT_EQ(sa.train_images, 10);
  EXPECT_EQ(sa.val_images, 2);
  EXPECT_EQ(sa.boxes, sb.boxes);
  for (const char* f : {"images/train/im000000.jpg", "images/val/im000011.jpg", "labels/train/im000003.txt",
                        "annotations/instances_train.json", "data.yaml"})
    EXPECT_EQ(test::read_bytes(a + "/" + f), test::read_bytes(b + "/" + f)) << f;
  SynthOptions other = small(test::temp_dir("synth-c"), 1);
  other.seed = 4;
  synthesize(other);
  EXPECT_NE(test::read_bytes(a + "/images/train/im000000.jpg"), test::read_bytes(other.out + "/images/train/im000000.jpg"));
}

TEST(Synth, ReusesItsOwnFolderAndRefusesForeignOnes) {
  const std::string out = test::temp_dir("synth-reuse");
  EXPECT_FALSE(synthesize(small(out, 2)).reused);
  EXPECT_TRUE(synthesize(small(out, 2)).reused);
  SynthOptions bigger = small(out, 2);
  bigger.images = 14;
  const SynthSummary s = synthesize(bigger);
  EXPECT_FALSE(s.reused);
  EXPECT_EQ(s.train_images + s.val_images, 14);
  // An image deleted since, or a synth.json edited by hand, makes the set again (it was taken as
  // it was, and a missing count crashed).
  const auto first_val = *fs::directory_iterator(fs::path(out) / "images" / "val");
  fs::remove(first_val.path());
  const SynthSummary again = synthesize(bigger);
  EXPECT_FALSE(again.reused);
  EXPECT_TRUE(fs::exists(first_val.path()));
  std::string json = test::read_bytes(out + "/synth.json");
  json.replace(json.find("\"train_images\""), 14, "\"train_imagez\"");
  test::write_bytes(out + "/synth.json", json);
  EXPECT_FALSE(synthesize(bigger).reused);
  EXPECT_TRUE(synthesize(bigger).reused);

  const std::string foreign = test::temp_dir("synth-foreign");
  test::write_bytes(foreign + "/precious.txt", "keep me");
  EXPECT_THROW(synthesize(small(foreign, 1)), InputError);
  EXPECT_EQ(test::read_bytes(foreign + "/precious.txt"), "keep me");
}

TEST(Synth, WritesWhatTheScannerReadsBack) {
  const std::string out = test::temp_dir("synth-scan");
  SynthOptions o = small(out, 2);
  o.classes = 6;
  o.max_objects = 10;
  const SynthSummary s = synthesize(o);
  ScanOptions so;
  so.full_decode = true;
  int64_t boxes = 0;
  for (const char* split : {"train", "val"}) {
    const Split sp = scan_split(read_data_yaml(s.data_yaml), split, so);
    EXPECT_TRUE(sp.problems.empty());
    for (const auto& smp : sp.samples) boxes += static_cast<int64_t>(smp.boxes.size());
    EXPECT_EQ(sp.names.size(), 6u);
  }
  EXPECT_EQ(boxes, s.boxes);
}

TEST(Synth, RejectsBadOptions) {
  SynthOptions o = small(test::temp_dir("synth-bad"), 1);
  o.classes = 9;
  EXPECT_THROW(synthesize(o), InputError);
  o = small("", 1);
  EXPECT_THROW(synthesize(o), InputError);
}
