#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/data/loader.h"
#include "headroom/eval/validate.h"
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

// Waits (10 s at most) until the loader's threads have filled `slots` image slots in all.
int64_t wait_for_slots(const Loader& l, int64_t slots) {
  for (int i = 0; i < 2000 && l.stats().images < slots; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return l.stats().images;
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

// The epoch boundary: with then_next, the threads fill the next epoch's first batches while the
// consumer takes this one's last ones, and the next start keeps them: the same batches a fresh
// start makes, none decoded twice. Any other start (not right after the epoch's end, another
// epoch, another thread count) begins afresh with the same batches.
TEST(Loader, TheNextEpochsFirstBatchesAreMadeBeforeItStarts) {
  const auto split = train_split();
  Loader fresh(split, opts(2));
  const auto e1 = epoch(fresh, 1), e2 = epoch(fresh, 2);
  Loader l(split, opts(2));
  l.start(0, 0, /*then_next=*/true);
  int64_t taken = 0;
  while (auto b = l.next()) {
    EXPECT_EQ(b->epoch, 0);
    taken += b->size();
  }
  EXPECT_EQ(taken, 26);
  // The prefetch window (2 batches of 4) of epoch 1, filled with no consumer asking.
  ASSERT_EQ(wait_for_slots(l, 26 + 8), 26 + 8) << "the threads did not go on into the next epoch";
  l.start(1, 0, /*then_next=*/false);
  std::vector<HostBatch> got;
  while (auto b = l.next()) got.push_back(std::move(*b));
  ASSERT_EQ(got.size(), e1.size());
  for (size_t i = 0; i < got.size(); ++i) {
    expect_same(got[i], e1[i]);
    EXPECT_EQ(got[i].epoch, 1);
    EXPECT_EQ(got[i].index, int64_t(i));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(l.stats().images, 52) << "slots decoded twice, or the threads went past an epoch without then_next";
  // Epoch 2 after an epoch without then_next, and a start that is not the next epoch's first batch.
  const auto again = epoch(l, 2);
  ASSERT_EQ(again.size(), e2.size());
  for (size_t i = 0; i < again.size(); ++i) expect_same(again[i], e2[i]);
  l.start(1, 0, true);
  ASSERT_TRUE(l.next());
  const auto tail = epoch(l, 2, 3);  // mid-epoch: a resume's position
  ASSERT_EQ(tail.size(), e2.size() - 3);
  for (size_t i = 0; i < tail.size(); ++i) expect_same(tail[i], e2[i + 3]);
  // A thread count changed between epochs (data.workers auto) starts threads anew.
  const int64_t idle = l.stats().images;  // the threads stopped at epoch 2's end
  l.start(1, 0, true);
  while (l.next()) {
  }
  const int64_t decoded = wait_for_slots(l, idle + 26 + 8);
  ASSERT_EQ(decoded, idle + 26 + 8);
  l.set_workers(3);
  const auto more = epoch(l, 2);
  ASSERT_EQ(more.size(), e2.size());
  for (size_t i = 0; i < more.size(); ++i) expect_same(more[i], e2[i]);
  EXPECT_EQ(l.stats().images - decoded, 26) << "the threads were kept though their count changed";
  // A run that ends stops the threads and keeps nothing decoded ahead.
  l.start(1, 0, true);
  while (l.next()) {
  }
  l.stop();
  EXPECT_THROW(l.next(), c10::Error);
}

// A decode error reaches the consumer with its batch: the batches before it come first.
TEST(Loader, ADecodeErrorComesWithItsBatch) {
  const std::string yaml = test::copy_of_small_synth("loader-error-batch");
  const auto split = train_split(yaml);
  const LoaderOptions o = opts(2).on_error(OnError::fail);
  const std::vector<int64_t> order = Loader::epoch_order(26, o.seed(), 0, true);
  Loader l(split, o);
  l.start(0);
  ASSERT_TRUE(l.next());
  ASSERT_TRUE(l.next());  // at batch 2: the threads work on batches 2 and 3 at most
  const std::string victim = split->samples[size_t(order[4 * 4])].image;  // batch 4's first image
  test::write_bytes(victim, "garbage");
  ASSERT_TRUE(l.next());  // batch 2: the threads go on to batch 4, which fails
  ASSERT_EQ(wait_for_slots(l, 5 * 4), 5 * 4);
  try {
    EXPECT_TRUE(l.next()) << "batch 3";
  } catch (const InputError& e) {
    FAIL() << "batch 4's error came with batch 3: " << e.what();
  }
  try {
    l.next();
    FAIL() << "the broken image of batch 4 did not stop it";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
}

// An image that breaks while the threads already work on the next epoch: the error belongs to a
// batch of that epoch and reaches the consumer there, not while it still takes this epoch's.
TEST(Loader, ADecodeErrorWaitsForItsBatch) {
  const std::string yaml = test::copy_of_small_synth("loader-next-error");
  const auto split = train_split(yaml);
  const LoaderOptions o = opts(2).on_error(OnError::fail);
  const std::vector<int64_t> first = Loader::epoch_order(26, o.seed(), 0, true), second = Loader::epoch_order(26, o.seed(), 1, true);
  // The image of epoch 1's first batch that epoch 0 reads first; it breaks once epoch 0 has taken
  // it, while the threads (at most 2 batches ahead) are still in epoch 0.
  int64_t victim = -1, at = 26;
  for (size_t k = 0; k < 4; ++k) {
    const int64_t pos = std::find(first.begin(), first.end(), second[k]) - first.begin();
    if (pos < at) victim = second[k], at = pos;
  }
  const int64_t taken_before = at / 4 + 1;
  ASSERT_LE(taken_before + 2, 7) << "this seed puts every image of epoch 1's first batch late in epoch 0";
  Loader l(split, o);
  l.start(0, 0, /*then_next=*/true);
  for (int64_t i = 0; i < taken_before; ++i) ASSERT_TRUE(l.next());
  test::write_bytes(split->samples[size_t(victim)].image, "garbage");
  for (int64_t i = taken_before; i < 6; ++i) ASSERT_TRUE(l.next());
  // Epoch 1's first batch tried (its 4 slots, the broken one among them) before epoch 0's last is taken.
  ASSERT_EQ(wait_for_slots(l, 26 + 4), 26 + 4);
  try {
    EXPECT_TRUE(l.next()) << "epoch 0's last batch";
  } catch (const InputError& e) {
    FAIL() << "epoch 1's error reached epoch 0: " << e.what();
  }
  EXPECT_FALSE(l.next());
  l.start(1, 0, false);
  try {
    l.next();
    FAIL() << "the broken image of epoch 1's first batch did not stop it";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(split->samples[size_t(victim)].image), std::string::npos) << e.what();
  }
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

// Validation and prediction leave out an image that fails to decode instead of taking the next
// one (which would score that one twice): its slot holds the pad colour and no boxes, is marked
// not decoded, and its ground truth is not counted.
TEST(Loader, ValidationLeavesOutAnImageThatFailsToDecode) {
  const std::string yaml = test::copy_of_small_synth("loader-leave-out");
  const auto split = train_split(yaml);
  test::write_bytes(split->samples[5].image, "garbage");
  Loader l(split, opts(2).shuffle(false).replace_bad(false));
  std::vector<int64_t> seen;
  for (const HostBatch& b : epoch(l, 0))
    for (size_t i = 0; i < b.meta.size(); ++i) {
      seen.push_back(b.meta[i].index);
      EXPECT_EQ(b.meta[i].decoded, b.meta[i].index != 5);
      if (b.meta[i].decoded) continue;
      EXPECT_EQ(b.counts[int64_t(i)].item<int64_t>(), 0);
      EXPECT_TRUE(b.images[int64_t(i)].eq(int(kPadValue)).all().item<bool>());
    }
  std::vector<int64_t> all(split->samples.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
  EXPECT_EQ(seen, all);  // each image once, in order
  EXPECT_EQ(l.stats().skipped_images, 1);

  std::vector<int64_t> ids, with_ids;
  const auto truth = eval::ground_truth_boxes(*split, &ids, nullptr, {5}), whole = eval::ground_truth_boxes(*split, &with_ids, nullptr);
  EXPECT_EQ(ids.size() + 1, with_ids.size());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), with_ids[5]), 0);
  EXPECT_EQ(truth.size() + split->samples[5].boxes.size(), whole.size());
  EXPECT_GT(split->samples[5].boxes.size(), 0u);
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
