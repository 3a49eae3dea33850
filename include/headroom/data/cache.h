// Decoded-image cache: letterboxed canvases (+ their boxes) in RAM, or in a memory-mapped
// shard file beside the data. A shard is keyed by a hash of the file list, sizes, mtimes and
// the canvas; a stale or damaged shard is rebuilt, never used.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "headroom/data/batch.h"
#include "headroom/data/dataset.h"
#include "headroom/data/letterbox.h"

namespace headroom::data {

struct CacheOptions {
  CacheMode mode = CacheMode::none;
  int canvas = 640;
  int threads = 1;
  int64_t max_pixels = 89478485;
  Preprocess preprocess = Preprocess::fast;
  std::string shard_path;  // disk mode; default_shard_path() when empty
};

// Where a split's shard lives: beside its image folder, list, or COCO JSON (a source-preprocessed
// shard has its own file).
std::string default_shard_path(const SplitSource& source, int canvas, Preprocess p = Preprocess::fast);

// The shard of one rank's share of a split (validation on several ranks): each share is its own
// set of images, so each has its own file ("val.640.rank1-of-2.hrcache").
std::string share_shard_path(const std::string& path, int rank, int world);

// Hash of everything a shard depends on.
uint64_t cache_key(const Split& split, int canvas, Preprocess p = Preprocess::fast);

class DecodedCache {
 public:
  // Fills a RAM cache, or opens (rebuilding when stale) a disk shard. Returns nullptr after a
  // warning saying why when caching is not possible: not enough free memory or disk, or a
  // folder that cannot be written.
  static std::unique_ptr<DecodedCache> open(const Split& split, const CacheOptions& options);
  ~DecodedCache();

  const uint8_t* image(int64_t i) const { return base_ + static_cast<size_t>(i) * slot_bytes_; }
  const Letterbox& geometry(int64_t i) const { return geometry_[static_cast<size_t>(i)]; }
  const ItemBoxes& boxes(int64_t i) const { return boxes_[static_cast<size_t>(i)]; }
  // False when the image failed to decode while the cache was built.
  bool decoded(int64_t i) const { return decoded_[static_cast<size_t>(i)] != 0; }
  int64_t size() const { return static_cast<int64_t>(geometry_.size()); }
  bool rebuilt() const { return rebuilt_; }  // disk: this open wrote a new shard

 private:
  DecodedCache() = default;
  void plan(const Split& split, int canvas);
  // Decodes every sample in parallel, handing each canvas to `store(i, chw)`.
  void decode_all(const Split& split, const CacheOptions& o,
                  const std::function<void(int64_t, const uint8_t*)>& store);
  bool load_shard(const std::string& path, uint64_t key);
  bool write_shard(const std::string& path, const Split& split, const CacheOptions& o, uint64_t key);
  bool map_shard(const std::string& path);
  bool map_fd(int fd);

  size_t slot_bytes_ = 0;
  const uint8_t* base_ = nullptr;
  std::vector<uint8_t> ram_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<Letterbox> geometry_;
  std::vector<ItemBoxes> boxes_;
  std::vector<uint8_t> decoded_;
  std::atomic<int64_t> unreadable_{0};  // images decode_all could not read (UnreadableImage)
  bool rebuilt_ = false;
};


}  // namespace headroom::data
