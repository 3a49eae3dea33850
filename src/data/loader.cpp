#include "headroom/data/loader.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>

#include "headroom/core/logging.h"
#include "headroom/core/memory_errors.h"
#include "headroom/core/random.h"
#include "headroom/core/threads.h"

namespace headroom::data {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

LoaderOptions loader_options(const Config& c, const Split& split, bool training, bool pin_memory, Preprocess preprocess) {
  return LoaderOptions()
      .batch(c.train.batch)
      .imgsz(c.data.imgsz)
      .workers(resolve_workers(c.data.workers))
      .prefetch(c.data.prefetch)
      .shuffle(training)
      .replace_bad(training)
      .seed(c.seed)
      .pin_memory(pin_memory)
      .max_pixels(c.data.max_pixels)
      .on_error(on_error_from(c.data.on_error))
      .cache(cache_mode_from(c.data.cache))
      .preprocess(preprocess)
      .shard_path(default_shard_path(split.source, c.data.imgsz, preprocess));
}

std::vector<int64_t> Loader::epoch_order(int64_t n, int64_t seed, int64_t epoch, bool shuffle) {
  if (!shuffle) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
    return order;
  }
  Rng rng(mix_seed(static_cast<uint64_t>(seed)) ^ mix_seed(static_cast<uint64_t>(epoch) + 1));
  return permutation(n, rng);
}

std::shared_ptr<const DecodedCache> open_cache(const Split& split, const LoaderOptions& o) {
  if (o.cache() == CacheMode::none) return nullptr;
  CacheOptions co;
  co.mode = o.cache();
  co.canvas = o.imgsz();
  co.threads = std::max(1, o.workers());
  co.max_pixels = o.max_pixels();
  co.preprocess = o.preprocess();
  co.shard_path = o.shard_path().empty() ? default_shard_path(split.source, o.imgsz(), o.preprocess()) : o.shard_path();
  return DecodedCache::open(split, co);
}

Loader::Loader(std::shared_ptr<const Split> split, LoaderOptions options, std::shared_ptr<const DecodedCache> cache)
    : split_(std::move(split)), options_(std::move(options)), cache_(std::move(cache)) {
  TORCH_CHECK(options_.batch() > 0 && options_.imgsz() > 0 && options_.prefetch() > 0, "bad loader options");
  per_epoch_ = batches_per_epoch();
  if (!cache_) cache_ = open_cache(*split_, options_);
}

Loader::~Loader() { stop_workers(); }

int64_t Loader::batches_in(int64_t images, int64_t batch, bool drop_last, int64_t min_batch) {
  return drop_last || images % batch < min_batch ? images / batch : (images + batch - 1) / batch;
}

int64_t Loader::batches_per_epoch() const {
  const int64_t W = options_.world();
  return batches_in(static_cast<int64_t>(split_->samples.size()), options_.batch() * W, options_.drop_last(), options_.min_batch() * W);
}

int64_t Loader::global_size(int64_t batch) const {
  const int64_t n = static_cast<int64_t>(split_->samples.size()), G = int64_t(options_.batch()) * options_.world();
  return std::min(G, n - batch * G);
}

std::pair<int64_t, int64_t> Loader::share(int64_t batch) const {
  const int64_t W = options_.world(), r = options_.rank(), g = global_size(batch);
  const int64_t start = batch * int64_t(options_.batch()) * W + r * (g / W) + std::min(r, g % W);
  return {start, g / W + (r < g % W ? 1 : 0)};
}

void Loader::stop() {
  stop_workers();
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.clear();
  started_ = false;
}

void Loader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void Loader::start(int64_t epoch, int64_t batch, bool then_next) {
  TORCH_CHECK(batch >= 0 && batch <= per_epoch_, "loader position ", batch, " is outside the epoch (", per_epoch_,
              " batches)");
  // The orders the threads will need, shuffled before the lock is taken.
  const int64_t n = int64_t(split_->samples.size());
  const auto order = [&](int64_t e) { return epoch_order(n, options_.seed(), e, options_.shuffle()); };
  std::vector<int64_t> next_order = then_next ? order(epoch + 1) : std::vector<int64_t>();
  {
    // Right after the epoch before, whose threads went on into this one: keep them and their work.
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_ && !workers_.empty() && int(workers_.size()) == options_.workers() && epoch == epoch_ + 1 && batch == 0 &&
        cursor_ == end_batch_ && horizon_ > end_batch_ && !error_ && !oom_ && failed_.empty() && retry_.empty()) {
      orders_.erase(epoch_);  // every slot of that epoch was filled: its batches were all taken
      if (then_next) orders_.emplace(epoch + 1, std::move(next_order));
      epoch_ = epoch;
      end_batch_ = horizon_;
      horizon_ = end_batch_ + (then_next ? per_epoch_ : 0);
      work_cv_.notify_all();
      return;
    }
  }
  std::vector<int64_t> this_order = order(epoch);
  stop_workers();
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.clear();
  error_ = oom_ = nullptr;
  failed_.clear();
  retry_.clear();
  orders_.clear();
  orders_.emplace(epoch, std::move(this_order));
  if (then_next) orders_.emplace(epoch + 1, std::move(next_order));
  epoch_ = epoch;
  cursor_ = epoch * per_epoch_ + batch;
  end_batch_ = (epoch + 1) * per_epoch_;
  horizon_ = end_batch_ + (then_next ? per_epoch_ : 0);
  next_task_ = cursor_ * options_.batch();
  stop_ = false;
  started_ = true;
  for (int i = 0; i < options_.workers(); ++i) workers_.emplace_back([this] { worker_loop(); });
}

Loader::Pending& Loader::pending_for(int64_t run_batch) {
  auto it = pending_.find(run_batch);
  if (it != pending_.end()) return it->second;
  Pending p;  // allocated before it is inserted: an out-of-memory error leaves no half-made entry
  const int64_t batch = run_batch % per_epoch_, bs = batch_size(run_batch), S = options_.imgsz();
  p.batch.images = at::empty({bs, 3, S, S}, at::TensorOptions().dtype(at::kByte).pinned_memory(options_.pin_memory()));
  p.batch.meta.resize(static_cast<size_t>(bs));
  p.batch.epoch = run_batch / per_epoch_;
  p.batch.index = batch;
  p.batch.global_size = global_size(batch);
  p.batch.largest_share = (p.batch.global_size + options_.world() - 1) / options_.world();
  p.boxes.resize(static_cast<size_t>(bs));
  p.remaining = bs;
  return pending_.emplace(run_batch, std::move(p)).first->second;
}

void Loader::requeue_failed() {
  retry_.insert(retry_.end(), failed_.begin(), failed_.end());
  failed_.clear();
  oom_ = nullptr;
  work_cv_.notify_all();
}

void Loader::fill_slot(Pending& p, int64_t slot, int64_t pos) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Timed {  // adds this slot's time to the stats however it ends
    Loader& l;
    std::chrono::steady_clock::time_point t0;
    ~Timed() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(l.mutex_);
      l.stats_.decode_seconds += s;
      ++l.stats_.images;
    }
  } timed{*this, t0};
  const std::vector<int64_t>* order;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    order = &orders_.at(p.batch.epoch);
  }
  const int64_t n = static_cast<int64_t>(order->size());
  const size_t slot_bytes = size_t(canvas_bytes(options_.imgsz()));
  uint8_t* dst = p.batch.images.data_ptr<uint8_t>() + size_t(slot) * slot_bytes;
  // An image that fails to decode is replaced by the next one in the epoch's order: the
  // replacement depends only on the data, so batches stay deterministic. Without replace_bad its
  // slot is left out instead.
  const auto leave_out = [&](int64_t idx) {
    std::memset(dst, kPadValue, slot_bytes);
    p.boxes[size_t(slot)] = ItemBoxes();
    const int S = options_.imgsz();
    p.batch.meta[size_t(slot)] = ImageMeta{idx, letterbox_geometry(S, S, S), /*decoded=*/false};
  };
  for (int64_t k = 0; k < n; ++k) {
    const int64_t idx = (*order)[size_t((pos + k) % n)];
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bad_samples_.count(idx)) {
        if (!options_.replace_bad()) return leave_out(idx);
        continue;
      }
    }
    const Sample& s = split_->samples[size_t(idx)];
    try {
      Letterbox g;
      if (cache_) {
        if (!cache_->decoded(idx)) throw ImageError(s.image + ": could not be decoded when the cache was built");
        std::memcpy(dst, cache_->image(idx), slot_bytes);
        g = cache_->geometry(idx);
        p.boxes[size_t(slot)] = cache_->boxes(idx);
      } else {
        g = letterbox_geometry(s.width, s.height, options_.imgsz());
        decode_into_canvas(s, g, options_.max_pixels(), dst, options_.preprocess());
        p.boxes[size_t(slot)] = boxes_in_canvas(s, g);
      }
      p.batch.meta[size_t(slot)] = ImageMeta{idx, g};
      return;
    } catch (const ImageError& e) {
      if (options_.on_error() == OnError::fail)
        throw InputError(std::string(e.what()) + " (data.on_error is fail; set it to skip to train past it)");
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (bad_samples_.insert(idx).second) {
          ++stats_.skipped_images;
          if (options_.replace_bad())
            spdlog::warn("{}; skipped, batch {} of epoch {} takes the next image instead", e.what(), p.batch.index, p.batch.epoch);
          else
            spdlog::warn("{}; left out of split '{}'", e.what(), split_->name);
        }
      }
      if (!options_.replace_bad()) return leave_out(idx);
    }
  }
  throw InputError("split '" + split_->name + "': no image could be decoded");
}

void Loader::worker_loop() {
  const int64_t B = options_.batch();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    // Tasks are numbered batch * B + slot; slots beyond this rank's share of a batch are none.
    while (next_task_ < horizon_ * B && next_task_ % B >= batch_size(next_task_ / B)) next_task_ = (next_task_ / B + 1) * B;
    work_cv_.wait(lock, [&] {
      return stop_ || !retry_.empty() || (next_task_ < horizon_ * B && next_task_ / B < cursor_ + options_.prefetch());
    });
    if (stop_) return;
    int64_t task;
    if (!retry_.empty()) {
      task = retry_.front();
      retry_.pop_front();
    } else {
      task = next_task_++;
      if (task % B >= batch_size(task / B)) continue;
    }
    const int64_t batch = task / B, slot = task % B, pos = share(batch % per_epoch_).first + slot;
    // Everything that allocates sits inside the try: an error here reaches the consumer, and a
    // thread that threw would end the process.
    std::exception_ptr error;
    Pending* p = nullptr;
    try {
      p = &pending_for(batch);
      lock.unlock();
      fill_slot(*p, slot, pos);
      lock.lock();
      if (--p->remaining == 0) {
        try {
          collate(p->batch, p->boxes, options_.pin_memory());
        } catch (...) {
          ++p->remaining;  // the retried slot completes the batch again
          throw;
        }
        p->ready = true;
        ready_cv_.notify_all();
      }
    } catch (...) {
      error = std::current_exception();
      if (!lock.owns_lock()) lock.lock();
    }
    if (!error) continue;
    bool oom = false;
    try {
      std::rethrow_exception(error);
    } catch (const c10::Error& e) {
      oom = is_out_of_memory(e);
    } catch (...) {
    }
    if (oom) {
      failed_.push_back(task);
      if (!oom_) oom_ = error;
    } else if (!error_ || batch < error_batch_) {
      error_ = error;
      error_batch_ = batch;
    }
    ready_cv_.notify_all();
  }
}

std::optional<HostBatch> Loader::next() {
  TORCH_CHECK(started_, "Loader::next() before Loader::start(epoch, batch)");
  if (cursor_ >= end_batch_) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  HostBatch batch;
  if (workers_.empty()) {
    Pending* p;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      p = &pending_for(cursor_);
    }
    const int64_t first = share(cursor_ % per_epoch_).first;
    for (int64_t slot = 0; slot < p->remaining; ++slot) fill_slot(*p, slot, first + slot);
    collate(p->batch, p->boxes, options_.pin_memory());
    std::lock_guard<std::mutex> lock(mutex_);
    batch = std::move(p->batch);
    pending_.erase(cursor_++);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    // A real error when its batch is due (it outranks an out-of-memory one), an out-of-memory
    // error at once: its slots wait for the caller to free memory and ask again.
    const auto due = [&] { return error_ && error_batch_ <= cursor_; };
    ready_cv_.wait(lock, [&] {
      const auto it = pending_.find(cursor_);
      return due() || oom_ || (it != pending_.end() && it->second.ready);
    });
    if (due()) std::rethrow_exception(error_);
    if (oom_) {
      const std::exception_ptr error = oom_;
      requeue_failed();
      std::rethrow_exception(error);
    }
    batch = std::move(pending_[cursor_].batch);
    pending_.erase(cursor_++);
    lock.unlock();
    work_cv_.notify_all();
  }
  batch.wait_seconds = seconds_since(t0);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.batches;
  stats_.wait_seconds += batch.wait_seconds;
  stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, batch.wait_seconds);
  return batch;
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace headroom::data
