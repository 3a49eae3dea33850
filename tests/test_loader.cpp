#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <set>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/data/loader.h"
#include "headroom/memory/cpu_allocator.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Split> train_split(const std::string& yaml = test::small_synth()) {
  ScanOptions o;
  o.threads = 2;
  return std::make_shared<const Split>(scan_split(read_data_yaml(yaml), "train", o));
}

LoaderOptions opts(int workers) {
  return LoaderOptions().batch(4).imgsz(64).workers(workers).prefetch(2).seed(11);
}

std::vector<HostBatch> epoch(Loader& l, int64_t e, int64_t from = 0) {
  l.start(e, from);
  std::vector<HostBatch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

void expect_same(const HostBatch& a, const HostBatch& b) {
  EXPECT_TRUE(at::equal(a.images, b.images));
  EXPECT_TRUE(at::equal(a.boxes, b.boxes));
  EXPECT_TRUE(at::equal(a.classes, b.classes));
  EXPECT_TRUE(at::equal(a.counts, b.counts));
  ASSERT_EQ(a.meta.size(), b.meta.size());
  for (size_t i = 0; i < a.meta.size(); ++i) EXPECT_EQ(a.meta[i].index, b.meta[i].index);
}

}  // namespace

TEST(Loader, BatchesHaveTheDocumentedShapesAndTypes) {
  const auto split = train_split();
  Loader l(split, opts(2));
  EXPECT_EQ(l.batches_per_epoch(), 7);  // 26 images, batch 4: 6 full and a partial one
  const auto batches = epoch(l, 0);
  ASSERT_EQ(batches.size(), 7u);
  const HostBatch& b = batches[0];
  EXPECT_EQ(b.images.sizes(), (at::IntArrayRef{4, 3, 64, 64}));
  EXPECT_EQ(b.images.scalar_type(), at::kByte);
  EXPECT_EQ(b.boxes.dim(), 3);
  EXPECT_EQ(b.boxes.size(2), 4);
  EXPECT_EQ(b.boxes.scalar_type(), at::kFloat);
  EXPECT_EQ(b.classes.scalar_type(), at::kLong);
  EXPECT_EQ(b.crowd.scalar_type(), at::kBool);
  EXPECT_EQ(b.counts.sizes(), (at::IntArrayRef{4}));
  EXPECT_EQ(batches[6].size(), 2);
  EXPECT_EQ(batches[6].images.size(0), 2);
  EXPECT_EQ(b.epoch, 0);
  EXPECT_EQ(batches[3].index, 3);
}

TEST(Loader, BoxesAreLetterboxedLabelsAndPaddingIsMarked) {
  const auto split = train_split();
  Loader l(split, opts(1).shuffle(false));
  for (const HostBatch& b : epoch(l, 0)) {
    const int64_t N = b.boxes.size(1);
    for (int64_t i = 0; i < b.size(); ++i) {
      const Sample& s = split->samples[size_t(b.meta[size_t(i)].index)];
      const Letterbox& g = b.meta[size_t(i)].geometry;
      EXPECT_EQ(g.orig_w, s.width);
      const int64_t n = b.counts[i].item<int64_t>();
      ASSERT_EQ(n, static_cast<int64_t>(s.boxes.size()));
      for (int64_t j = 0; j < N; ++j) {
        if (j < n) {
          const auto want = box_to_canvas(s.boxes[size_t(j)], g);
          for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(b.boxes[i][j][k].item<float>(), want[size_t(k)]);
          EXPECT_EQ(b.classes[i][j].item<int64_t>(), s.boxes[size_t(j)].cls);
        } else {
          EXPECT_EQ(b.classes[i][j].item<int64_t>(), -1);
          EXPECT_EQ(b.boxes[i][j].abs().sum().item<float>(), 0.f);
        }
      }
      // The padding band of a letterboxed image is grey 114.
      if (g.pad_y > 0) {
        EXPECT_EQ(b.images[i][0][0][g.canvas / 2].item<uint8_t>(), kPadValue);
      }
    }
  }
}

TEST(Loader, SameSeedSameBatchesWhateverTheThreadCount) {
  const auto split = train_split();
  Loader sync(split, opts(0)), one(split, opts(1)), three(split, opts(3).prefetch(5));
  const auto a = epoch(sync, 2), b = epoch(one, 2), c = epoch(three, 2);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    expect_same(a[i], b[i]);
    expect_same(a[i], c[i]);
  }
}

TEST(Loader, EveryEpochSeesEachImageOnceInANewOrder) {
  const auto split = train_split();
  Loader l(split, opts(2));
  std::vector<int64_t> orders[2];
  for (int e = 0; e < 2; ++e) {
    for (const HostBatch& b : epoch(l, e))
      for (const auto& m : b.meta) orders[e].push_back(m.index);
    std::set<int64_t> unique(orders[e].begin(), orders[e].end());
    EXPECT_EQ(unique.size(), 26u);
    EXPECT_EQ(orders[e].size(), 26u);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(Loader::epoch_order(26, 11, 0, true), Loader::epoch_order(26, 12, 0, true));
  EXPECT_EQ(Loader::epoch_order(5, 11, 0, false), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Loader, StartsAtAnyPositionForResume) {
  const auto split = train_split();
  Loader full(split, opts(2)), resumed(split, opts(2));
  const auto all = epoch(full, 1);
  const auto tail = epoch(resumed, 1, 4);
  ASSERT_EQ(tail.size(), all.size() - 4);
  for (size_t i = 0; i < tail.size(); ++i) expect_same(tail[i], all[i + 4]);
  EXPECT_EQ(tail[0].index, 4);
  EXPECT_THROW(resumed.start(1, 99), c10::Error);
}

TEST(Loader, DropLastKeepsOnlyFullBatches) {
  Loader l(train_split(), opts(2).drop_last(true));
  EXPECT_EQ(l.batches_per_epoch(), 6);
  const auto batches = epoch(l, 0);
  ASSERT_EQ(batches.size(), 6u);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 4);
}

TEST(Loader, RecordsHowLongTheConsumerWaited) {
  Loader l(train_split(), opts(1));
  const auto batches = epoch(l, 0);
  const LoaderStats s = l.stats();
  EXPECT_EQ(s.batches, 7);
  double sum = 0;
  for (const auto& b : batches) {
    EXPECT_GE(b.wait_seconds, 0.0);
    sum += b.wait_seconds;
  }
  EXPECT_NEAR(s.wait_seconds, sum, 1e-9);
  EXPECT_GT(s.wait_seconds, 0.0);  // the first batch cannot be ready at once
  EXPECT_GE(s.max_wait_seconds, batches[0].wait_seconds);
}

TEST(Loader, AnImageThatBreaksAfterTheScanIsReplacedDeterministically) {
  const std::string yaml = test::copy_of_small_synth("loader-break");
  const auto split = train_split(yaml);
  // The file goes bad between the scan and the epoch (a network share, a careless sync).
  const Sample& victim = split->samples[5];
  test::write_bytes(victim.image, "garbage");
  Loader a(split, opts(2)), b(split, opts(0));
  const auto ea = epoch(a, 0), eb = epoch(b, 0);
  ASSERT_EQ(ea.size(), eb.size());
  int64_t images = 0;
  for (size_t i = 0; i < ea.size(); ++i) {
    expect_same(ea[i], eb[i]);
    for (const auto& m : ea[i].meta) EXPECT_NE(m.index, 5);
    images += ea[i].size();
  }
  EXPECT_EQ(images, 26);  // the batch stays full: the next image in the order fills the slot
  EXPECT_EQ(a.stats().skipped_images, 1);

  Loader strict(split, opts(2).on_error(OnError::fail));
  strict.start(0);
  try {
    while (strict.next()) {
    }
    FAIL() << "on_error=fail did not stop";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(victim.image), std::string::npos) << e.what();
  }
}

// A CPU budget counts the loader's buffers, so a decode thread can run out of memory. The
// error reaches the consumer (it used to end the process from inside the thread), and asking
// again gives the same batch.
TEST(Loader, AnOutOfMemoryErrorInADecodeThreadReachesTheConsumerAndTheBatchComesAgain) {
  const auto split = train_split();
  Loader clean(split, opts(1));
  const auto expected = epoch(clean, 0);
  auto& alloc = memory::CachingCpuAllocator::install();
  Loader l(split, opts(1));
  for (int64_t first : {1, 2}) {  // the batch's buffer, then its box tensors
    alloc.inject_oom_after(first, /*other_threads=*/true);
    l.start(0);
    EXPECT_THROW(l.next(), c10::OutOfMemoryError) << "allocation " << first;
    std::vector<HostBatch> got;
    while (auto b = l.next()) got.push_back(std::move(*b));
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], expected[i]);
  }
  // Without workers the error comes from next() itself, and the same holds.
  Loader inline_loader(split, opts(0));
  alloc.inject_oom_after(1);
  inline_loader.start(0);
  EXPECT_THROW(inline_loader.next(), c10::OutOfMemoryError);
  const auto again = inline_loader.next();
  ASSERT_TRUE(again);
  expect_same(*again, expected[0]);
}

TEST(Loader, OptionsFromTheConfigInOnePlace) {
  const Config c = load_config("", {"train.batch=8", "data.imgsz=320", "data.workers=3", "data.prefetch=6", "seed=5",
                                    "data.cache=disk"});
  const auto split = train_split();
  const LoaderOptions o = loader_options(c, *split, true, false);
  EXPECT_EQ(o.batch(), 8);
  EXPECT_EQ(o.imgsz(), 320);
  EXPECT_EQ(o.workers(), 3);
  EXPECT_EQ(o.prefetch(), 6);
  EXPECT_EQ(o.seed(), 5);
  EXPECT_TRUE(o.shuffle());
  EXPECT_EQ(o.cache(), CacheMode::disk);
  EXPECT_NE(o.shard_path().find("images/train.320.hrcache"), std::string::npos) << o.shard_path();
  EXPECT_FALSE(loader_options(c, *split, false, false).shuffle());
}

TEST(Loader, PinsBatchesWhenTheRunUsesCuda) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  Loader l(train_split(), opts(2).pin_memory(true));
  l.start(0);
  const auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->images.is_pinned());
  EXPECT_TRUE(b->boxes.is_pinned());
  const at::Tensor on_gpu = b->images.to(at::Device(at::kCUDA, 0), /*non_blocking=*/true);
  EXPECT_TRUE(at::equal(on_gpu.cpu(), b->images));
}
