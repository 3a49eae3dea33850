#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "headroom/core/device.h"
#include "headroom/core/files.h"
#include "headroom/data/cache.h"
#include "headroom/data/loader.h"
#include <opencv2/imgproc.hpp>
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Split> scan_train(const std::string& yaml) {
  ScanOptions o;
  o.threads = 2;
  return std::make_shared<const Split>(scan_split(read_data_yaml(yaml), "train", o));
}

// A disk shard of the split at a 64 px canvas, beside its images.
CacheOptions disk_at_64(const Split& split) {
  CacheOptions o;
  o.mode = CacheMode::disk;
  o.canvas = 64;
  o.shard_path = default_shard_path(split.source, 64);
  return o;
}

std::vector<HostBatch> one_epoch(const std::shared_ptr<const Split>& split, LoaderOptions o) {
  Loader l(split, o);
  l.start(0);
  std::vector<HostBatch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

void expect_identical(const std::vector<HostBatch>& a, const std::vector<HostBatch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].images, b[i].images)) << "batch " << i;
    EXPECT_TRUE(at::equal(a[i].boxes, b[i].boxes)) << "batch " << i;
    EXPECT_TRUE(at::equal(a[i].classes, b[i].classes)) << "batch " << i;
  }
}

LoaderOptions base() { return LoaderOptions().batch(5).imgsz(96).workers(2).seed(3); }

}  // namespace

TEST(Cache, RamAndDiskGiveTheSameBatchesAsDecoding) {
  const std::string yaml = test::copy_of_small_synth("cache-same");
  const auto split = scan_train(yaml);
  const auto plain = one_epoch(split, base());
  expect_identical(plain, one_epoch(split, base().cache(CacheMode::ram)));
  expect_identical(plain, one_epoch(split, base().cache(CacheMode::disk)));
  const std::string shard = default_shard_path(split->source, 96);
  EXPECT_TRUE(fs::exists(shard));
  EXPECT_EQ(shard, (fs::path(yaml).parent_path() / "images" / "train.96.hrcache").string());
  for (const auto& e : fs::directory_iterator(fs::path(shard).parent_path()))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Cache, ADiskShardIsReusedUntilTheDataChanges) {
  const std::string yaml = test::copy_of_small_synth("cache-stale");
  auto split = scan_train(yaml);
  CacheOptions o;
  o.mode = CacheMode::disk;
  o.canvas = 64;
  o.threads = 2;
  o.shard_path = default_shard_path(split->source, 64);
  EXPECT_TRUE(DecodedCache::open(*split, o)->rebuilt());
  EXPECT_FALSE(DecodedCache::open(*split, o)->rebuilt());

  // Another canvas is another shard.
  CacheOptions bigger = o;
  bigger.canvas = 96;
  bigger.shard_path = default_shard_path(split->source, 96);
  EXPECT_TRUE(DecodedCache::open(*split, bigger)->rebuilt());
  EXPECT_FALSE(DecodedCache::open(*split, o)->rebuilt());

  // A replaced image (new bytes, new mtime) makes the shard stale.
  const std::string victim = split->samples[3].image;
  const std::string other = test::read_bytes(split->samples[4].image);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  test::write_bytes(victim, other);
  split = scan_train(yaml);
  auto c = DecodedCache::open(*split, o);
  EXPECT_TRUE(c->rebuilt());
  EXPECT_EQ(0, std::memcmp(c->image(3), c->image(4), 3 * 64 * 64));

  // Changed labels with unchanged images are caught by the box check.
  test::write_bytes(split->samples[0].labels, "0 0.5 0.5 0.25 0.25\n");
  split = scan_train(yaml);
  EXPECT_TRUE(DecodedCache::open(*split, o)->rebuilt());
}

// Ranks on one host open the same training shard at once: one builds it, the others wait for
// its lock and map the file it built (each decoding every image would cost N times the work).
TEST(Cache, ProcessesOpeningOneShardTogetherBuildItOnce) {
  const auto split = scan_train(test::copy_of_small_synth("cache-together"));
  CacheOptions o = disk_at_64(*split);
  o.threads = 1;
  std::atomic<int> ready{0};
  std::unique_ptr<DecodedCache> caches[3];
  std::vector<std::thread> ranks;
  for (auto& c : caches)
    ranks.emplace_back([&] {
      ++ready;
      while (ready < 3) std::this_thread::yield();
      c = DecodedCache::open(*split, o);
    });
  for (auto& t : ranks) t.join();
  int built = 0;
  for (const auto& c : caches) {
    ASSERT_TRUE(c);
    built += c->rebuilt();
    EXPECT_EQ(0, std::memcmp(c->image(5), caches[0]->image(5), 3 * 64 * 64));
  }
  EXPECT_EQ(built, 1);
  EXPECT_TRUE(fs::exists(fs::path(o.shard_path).parent_path() / ".train.64.hrcache.lock"));
}

// A process that waited for another's build and finds no shard after it (that build was not
// kept: a full disk, an unreadable image) reads images directly instead of building again: W
// ranks would otherwise decode the set one after another, past the exchanges' timeout.
TEST(Cache, AWaiterWhoseBuildWasNotKeptReadsImagesDirectly) {
  const auto split = scan_train(test::copy_of_small_synth("cache-not-kept"));
  const CacheOptions o = disk_at_64(*split);
  const fs::path shard(o.shard_path);
  auto holder = std::make_unique<FileLock>((shard.parent_path() / ("." + shard.filename().string() + ".lock")).string(), false);
  ASSERT_EQ(holder->state(), FileLock::State::held);
  std::unique_ptr<DecodedCache> waited;
  std::atomic<bool> done{false};
  std::thread rank([&] {
    waited = DecodedCache::open(*split, o);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(done);  // waiting for the lock
  holder.reset();      // the "builder" ends without a shard
  rank.join();
  EXPECT_EQ(waited, nullptr);
  EXPECT_FALSE(fs::exists(shard));
}

// An image that cannot be read while the shard is built (moved away for a moment, a network file
// system's hiccup) is not remembered as bad: that shard is not kept, and the next build, with the
// image back, holds it decoded.
TEST(Cache, AnImageUnreadableForAMomentIsNotRememberedAsBad) {
  const auto split = scan_train(test::copy_of_small_synth("cache-unreadable"));
  const CacheOptions o = disk_at_64(*split);
  const std::string image = split->samples[2].image;
  fs::rename(image, image + ".away");
  EXPECT_EQ(DecodedCache::open(*split, o), nullptr);
  EXPECT_FALSE(fs::exists(o.shard_path));
  fs::rename(image + ".away", image);
  const auto back = DecodedCache::open(*split, o);
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->rebuilt());
  EXPECT_TRUE(back->decoded(2));
  EXPECT_FALSE(DecodedCache::open(*split, o)->rebuilt());
}

TEST(Cache, ADamagedShardIsRebuiltNotUsed) {
  const auto split = scan_train(test::copy_of_small_synth("cache-damaged"));
  const CacheOptions o = disk_at_64(*split);
  DecodedCache::open(*split, o);
  const std::string bytes = test::read_bytes(o.shard_path);
  test::write_bytes(o.shard_path, bytes.substr(0, bytes.size() - 100));  // truncated
  auto c = DecodedCache::open(*split, o);
  EXPECT_TRUE(c->rebuilt());
  test::write_bytes(o.shard_path, "not a shard at all");
  // A build killed midway left its shard-sized temporary file: the next build removes it (its
  // process is gone), and writes its own under the name that cleanup knows.
  const fs::path shard(o.shard_path);
  const std::string abandoned = (shard.parent_path() / ("." + shard.filename().string() + ".tmp999999999@" + host_name() + ".1")).string();
  test::write_bytes(abandoned, bytes);
  EXPECT_TRUE(DecodedCache::open(*split, o)->rebuilt());
  EXPECT_EQ(test::read_bytes(o.shard_path).size(), bytes.size());
  EXPECT_FALSE(fs::exists(abandoned));
  for (const auto& f : fs::directory_iterator(shard.parent_path()))
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
}

TEST(Cache, RamCacheIsRefusedWhenMemoryIsShort) {
  const auto split = scan_train(test::small_synth());
  CacheOptions o;
  o.mode = CacheMode::ram;
  // A canvas so large that 26 of them exceed twice the memory of whatever machine runs this
  // (its free memory moves with the other tests); nothing is allocated, the check comes first.
  o.canvas = static_cast<int>(std::ceil(std::sqrt(2.0 * double(host_memory().total) / (3.0 * 26)))) + 1;
  EXPECT_EQ(DecodedCache::open(*split, o), nullptr);
}

TEST(Cache, KeyDependsOnFilesCanvasAndPreprocessing) {
  const auto split = scan_train(test::small_synth());
  EXPECT_EQ(cache_key(*split, 64), cache_key(*split, 64));
  EXPECT_NE(cache_key(*split, 64), cache_key(*split, 96));
  EXPECT_NE(cache_key(*split, 64), cache_key(*split, 64, Preprocess::source));
  Split fewer = *split;
  fewer.samples.pop_back();
  EXPECT_NE(cache_key(fewer, 64), cache_key(*split, 64));
  // Source-prepared canvases have a shard of their own: val with imported weights and training
  // on the same split do not rebuild each other's.
  const std::string fast = default_shard_path(split->source, 64), source = default_shard_path(split->source, 64, Preprocess::source);
  EXPECT_NE(fast, source);
  EXPECT_NE(source.find(".64.source.hrcache"), std::string::npos) << source;
}

// The source path decodes a JPEG at full scale and resizes it bilinearly, as cv2.imread and
// cv2.resize(INTER_LINEAR) do; the fast path decodes a large JPEG at a reduced DCT scale.
TEST(Cache, SourcePreprocessingIsAFullDecodeAndABilinearResize) {
  const auto split = scan_train(test::small_synth());
  const Sample& s = split->samples.front();
  const int canvas = 16;  // a quarter of the 64-px image or less: the fast path decodes at 1/4
  const Letterbox g = letterbox_geometry(s.width, s.height, canvas);
  std::vector<uint8_t> fast(size_t(3) * canvas * canvas), source(fast.size()), want(fast.size());
  decode_into_canvas(s, g, 1 << 30, fast.data());
  decode_into_canvas(s, g, 1 << 30, source.data(), Preprocess::source);
  const std::string bytes = test::read_bytes(s.image);
  const Image full = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 1 << 30);
  ASSERT_EQ(full.width, s.width);
  cv::Mat resized;
  cv::resize(cv::Mat(full.height, full.width, CV_8UC3, const_cast<uint8_t*>(full.pixels.data())), resized,
             cv::Size(g.resized_w, g.resized_h), 0, 0, cv::INTER_LINEAR);
  std::fill(want.begin(), want.end(), kPadValue);
  for (int y = 0; y < g.resized_h; ++y)
    for (int x = 0; x < g.resized_w; ++x)
      for (int c = 0; c < 3; ++c)
        want[size_t(c) * canvas * canvas + size_t(y + g.pad_y) * canvas + size_t(x + g.pad_x)] = resized.at<cv::Vec3b>(y, x)[c];
  EXPECT_EQ(source, want);
  EXPECT_NE(source, fast);
}
