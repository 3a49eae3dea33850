// The prefetching loader: decode threads fill a bounded window of batches ahead of the
// consumer. Batches are identical for a seed whatever the thread count, reshuffled every
// epoch, and the loader can start at any (epoch, batch) position for resume. Asked to, the
// threads go on into the next epoch's first batches while the consumer ends this one, so the
// next epoch's first batch is not decoded while the device waits at the epoch boundary.
#pragma once

#include <torch/arg.h>

#include <condition_variable>
#include <deque>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/data/batch.h"
#include "headroom/data/cache.h"
#include "headroom/data/dataset.h"

namespace headroom::data {

struct LoaderOptions {
  TORCH_ARG(int, batch) = 16;
  TORCH_ARG(int, imgsz) = 640;
  TORCH_ARG(int, workers) = 2;         // 0: decode on the consumer's thread
  TORCH_ARG(int, prefetch) = 4;        // batches decoded ahead
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(bool, drop_last) = false;
  // A last batch with fewer images is left out of the epoch, as drop_last does: the model cannot
  // train on it (BatchNorm over a 1x1 map needs 2 images; smallest_trainable_batch).
  TORCH_ARG(int64_t, min_batch) = 1;
  TORCH_ARG(int64_t, seed) = 0;
  // Several processes (dist/): each epoch's order is the same on every rank and cut into global
  // batches of batch x world images; rank r takes the r-th of `world` balanced shares of each,
  // so every image is seen once per epoch across ranks. A last global batch with fewer than
  // min_batch x world images is left out.
  TORCH_ARG(int, rank) = 0;
  TORCH_ARG(int, world) = 1;
  TORCH_ARG(bool, pin_memory) = false; // page-locked batches for async host-to-device copies
  TORCH_ARG(int64_t, max_pixels) = 89478485;
  TORCH_ARG(OnError, on_error) = OnError::skip;
  // An image that fails to decode (on_error skip): training replaces it by the next one in the
  // epoch's order, which keeps batches full and deterministic; validation and prediction leave
  // its slot out (ImageMeta::decoded false), so no other image is counted twice.
  TORCH_ARG(bool, replace_bad) = true;
  TORCH_ARG(CacheMode, cache) = CacheMode::none;
  TORCH_ARG(std::string, shard_path) = "";  // disk cache file; beside the data when empty
  TORCH_ARG(Preprocess, preprocess) = Preprocess::fast;  // how images become canvases
};

// Config -> loader options, in one place. `training` shuffles and replaces images that fail to
// decode (replace_bad); `pin_memory` when the run's
// device is CUDA; `preprocess`: how images become canvases (and which disk shard holds them).
LoaderOptions loader_options(const Config& c, const Split& split, bool training, bool pin_memory,
                             Preprocess preprocess = Preprocess::fast);

// The decoded cache the options ask for (null for none, or when it cannot be made: the cache
// says why); a Loader opens it itself unless it is given one.
std::shared_ptr<const DecodedCache> open_cache(const Split& split, const LoaderOptions& o);

struct LoaderStats {
  int64_t batches = 0;
  double wait_seconds = 0;      // consumer time blocked in next()
  double max_wait_seconds = 0;
  int64_t skipped_images = 0;   // decode failures replaced by the next image in the order
  double decode_seconds = 0;    // time the decode threads spent filling slots (decode or cache copy)
  int64_t images = 0;           // slots filled
};

// An out-of-memory error while a decode thread fills a batch (a CPU budget counts the loader's
// buffers) reaches the consumer from next() at once; the failed image slots are queued again, so
// calling next() once memory is freed continues with the same batch. Another error (an image that
// cannot be read with data.on_error fail) reaches it when it asks for that error's batch.
class Loader {
 public:
  // `cache`: a decoded cache of this split already open (validation reuses one across passes);
  // null = open one when options.cache() asks for it.
  Loader(std::shared_ptr<const Split> split, LoaderOptions options, std::shared_ptr<const DecodedCache> cache = nullptr);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Global batches (of batch x world images) per epoch: the same on every rank.
  int64_t batches_per_epoch() const;
  static int64_t batches_in(int64_t images, int64_t batch, bool drop_last, int64_t min_batch = 1);
  // The images of global batch `batch` across ranks, and where this rank's share of it starts
  // in the epoch's order and how many images it has.
  int64_t global_size(int64_t batch) const;
  std::pair<int64_t, int64_t> share(int64_t batch) const;
  // Positions the loader at batch `batch` of `epoch` and starts decoding from there. `then_next`:
  // once this epoch's batches are taken, the threads go on with the next epoch's, as far as the
  // prefetch window reaches, and start(epoch + 1) right after this epoch's end keeps what they
  // made (the same batches a fresh start makes) and the threads; any other start begins afresh.
  void start(int64_t epoch, int64_t batch = 0, bool then_next = false);
  // The next batch of the current epoch, or nullopt at its end.
  std::optional<HostBatch> next();
  // Stops the threads and drops what they made (a run that ends keeps no batches decoded ahead).
  void stop();

  const LoaderOptions& options() const { return options_; }
  LoaderStats stats() const;
  // Decode threads from the next start() on (data.workers: auto adjusts them between epochs).
  void set_workers(int workers) { options_.workers(workers); }
  const std::shared_ptr<const DecodedCache>& cache() const { return cache_; }
  // The epoch's order of sample indices (a fresh shuffle per epoch, from the seed).
  static std::vector<int64_t> epoch_order(int64_t n, int64_t seed, int64_t epoch, bool shuffle);

 private:
  struct Pending {
    HostBatch batch;
    std::vector<ItemBoxes> boxes;
    int64_t remaining = 0;
    bool ready = false;
  };

  void stop_workers();
  void worker_loop();
  // Hands the failed slots of out-of-memory errors back to the workers; requires mutex_.
  void requeue_failed();
  // Fills slot `slot` of `p`'s batch from its epoch's order position `pos`, skipping undecodable images.
  void fill_slot(Pending& p, int64_t slot, int64_t pos);
  // Batches are numbered across epochs (epoch x batches_per_epoch + batch): the threads' work
  // runs on from one epoch into the next.
  Pending& pending_for(int64_t run_batch);  // requires mutex_
  int64_t batch_size(int64_t run_batch) const { return share(run_batch % per_epoch_).second; }

  std::shared_ptr<const Split> split_;
  LoaderOptions options_;
  std::shared_ptr<const DecodedCache> cache_;

  int64_t per_epoch_ = 0;     // batches_per_epoch()
  std::map<int64_t, std::vector<int64_t>> orders_;  // by epoch: the current one and the next, made by start (nodes stay put)
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;        // next batch the consumer takes (numbered across epochs)
  int64_t end_batch_ = 0;     // the end of the consumer's epoch
  int64_t horizon_ = 0;       // the end of the threads' work: this epoch's, or the next's
  int64_t next_task_ = 0;     // next image slot a worker claims, as batch * B + slot

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::map<int64_t, Pending> pending_;
  std::exception_ptr error_;       // the earliest batch's decode error, thrown when that batch is due
  int64_t error_batch_ = 0;
  std::exception_ptr oom_;         // an out-of-memory error; its slots are in failed_
  std::vector<int64_t> failed_;   // slots (batch * B + slot) whose filling ran out of memory
  std::deque<int64_t> retry_;     // ... queued again, taken before new work
  bool stop_ = false;
  bool started_ = false;
  std::vector<std::thread> workers_;
  std::set<int64_t> bad_samples_;
  LoaderStats stats_;
};

}  // namespace headroom::data
