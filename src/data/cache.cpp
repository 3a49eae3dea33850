#include "headroom/data/cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>

#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/threads.h"

namespace headroom::data {

namespace fs = std::filesystem;

std::string default_shard_path(const SplitSource& source, int canvas, Preprocess p) {
  const std::string suffix = "." + std::to_string(canvas) + (p == Preprocess::source ? ".source" : "") + ".hrcache";
  fs::path anchor = source.format == SplitSource::Format::coco ? fs::path(source.annotations)
                                                                : fs::path(source.images.front());
  anchor = anchor.lexically_normal();
  if (anchor.filename().empty()) anchor = anchor.parent_path();
  return (anchor.parent_path() / (anchor.stem().string() + suffix)).string();
}

std::string share_shard_path(const std::string& path, int rank, int world) {
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world) +
                             p.extension().string())).string();
}

namespace {

constexpr char kMagic[8] = {'H', 'R', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kImagesOffset = 4096;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t canvas;
  uint64_t key;
  uint64_t count;
  uint64_t index_offset;
  uint64_t boxes_offset;
  uint64_t total_boxes;
  uint64_t file_bytes;
};

struct ShardEntry {
  int32_t orig_w, orig_h, resized_w, resized_h, pad_x, pad_y;
  int32_t decoded;
  uint32_t box_count;
  uint64_t box_start;
};

struct ShardBox {
  float xyxy[4];
  int32_t cls;
  int32_t crowd;
};

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
}

template <class T>
void fnv_value(uint64_t& h, const T& v) {
  fnv(h, &v, sizeof v);
}

bool same_geometry(const ShardEntry& e, const Letterbox& g) {
  return e.orig_w == g.orig_w && e.orig_h == g.orig_h && e.resized_w == g.resized_w &&
         e.resized_h == g.resized_h && e.pad_x == g.pad_x && e.pad_y == g.pad_y;
}

}  // namespace

uint64_t cache_key(const Split& split, int canvas, Preprocess p) {
  uint64_t h = 0xCBF29CE484222325ull;
  fnv_value(h, kVersion);
  fnv_value(h, canvas);
  if (p != Preprocess::fast) fnv_value(h, static_cast<int>(p));  // fast shards keep their key
  for (const Sample& s : split.samples) {
    struct stat st {};
    ::stat(s.image.c_str(), &st);
    fnv(h, s.image.data(), s.image.size() + 1);
    fnv_value(h, s.record);  // a TFRecord sample: which record of the file
    fnv_value(h, static_cast<int64_t>(st.st_size));
    fnv_value(h, static_cast<int64_t>(st.st_mtim.tv_sec));
    fnv_value(h, static_cast<int64_t>(st.st_mtim.tv_nsec));
  }
  return h;
}

DecodedCache::~DecodedCache() {
  if (map_) ::munmap(map_, map_bytes_);
}

// Geometry and boxes follow from the scan (header sizes + labels), before any decoding.
void DecodedCache::plan(const Split& split, int canvas) {
  slot_bytes_ = size_t(canvas_bytes(canvas));
  for (const Sample& s : split.samples) {
    geometry_.push_back(letterbox_geometry(s.width, s.height, canvas));
    boxes_.push_back(boxes_in_canvas(s, geometry_.back()));
  }
  decoded_.assign(geometry_.size(), 1);
}

void DecodedCache::decode_all(const Split& split, const CacheOptions& o,
                              const std::function<void(int64_t, const uint8_t*)>& store) {
  parallel_for(static_cast<int64_t>(geometry_.size()), o.threads, [&](int64_t i) {
    thread_local std::vector<uint8_t> slot;
    slot.resize(slot_bytes_);
    try {
      decode_into_canvas(split.samples[size_t(i)], geometry_[size_t(i)], o.max_pixels, slot.data(), o.preprocess);
    } catch (const ImageError& e) {
      spdlog::warn("{} (not cached; the loader will skip it)", e.what());
      if (dynamic_cast<const UnreadableImage*>(&e)) ++unreadable_;
      decoded_[size_t(i)] = 0;
      std::memset(slot.data(), kPadValue, slot_bytes_);
    }
    store(i, slot.data());
  });
}

std::unique_ptr<DecodedCache> DecodedCache::open(const Split& split, const CacheOptions& o) {
  if (o.mode == CacheMode::none) return nullptr;
  std::unique_ptr<DecodedCache> c(new DecodedCache());
  c->plan(split, o.canvas);
  const size_t n = split.samples.size();
  const double need = double(c->slot_bytes_) * n;

  if (o.mode == CacheMode::ram) {
    const int64_t avail = host_memory().available;
    if (need > 0.8 * double(avail)) {
      spdlog::warn("data.cache=ram: not caching split '{}': it needs {} but only {} of memory is available; "
                   "reading images from disk instead (use data.cache=disk, or a smaller data.imgsz)",
                   split.name, format_bytes(need), format_bytes(double(avail)));
      return nullptr;
    }
    spdlog::info("caching {} images of split '{}' in RAM ({})", n, split.name, format_bytes(need));
    c->ram_.resize(static_cast<size_t>(need));
    c->decode_all(split, o, [&](int64_t i, const uint8_t* chw) {
      std::memcpy(c->ram_.data() + size_t(i) * c->slot_bytes_, chw, c->slot_bytes_);
    });
    c->base_ = c->ram_.data();
    return c;
  }

  const std::string path = o.shard_path;
  const uint64_t key = cache_key(split, o.canvas, o.preprocess);
  // One builder per shard: the other ranks on this host (or a second run on the same data) wait
  // for it and then map its file, instead of each decoding every image into a temporary file.
  const fs::path file(path);
  const std::string lock_path = (file.parent_path() / ("." + file.filename().string() + ".lock")).string();
  std::unique_ptr<FileLock> lock;
  bool waited = false;
  try {
    lock = std::make_unique<FileLock>(lock_path, false);
    if (lock->state() == FileLock::State::busy) {
      spdlog::info("{}: another process is building this cache shard; waiting for it", path);
      lock = std::make_unique<FileLock>(lock_path, true);
      waited = true;
    }
  } catch (const Error& e) {  // a read-only data folder: the shard cannot be written there either
    spdlog::debug("{}", e.what());
  }
  if (c->load_shard(path, key)) return c;
  if (waited) {  // the build it waited for was not kept (disk full, an unreadable image): one try is enough
    spdlog::warn("data.cache=disk: {} was not kept by the process that built it; reading images directly this run", path);
    return nullptr;
  }
  if (!c->write_shard(path, split, o, key)) return nullptr;
  c->rebuilt_ = true;
  return c;
}

bool DecodedCache::map_shard(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool mapped = map_fd(fd);
  ::close(fd);
  return mapped;
}

bool DecodedCache::map_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  if (map_) ::munmap(map_, map_bytes_);
  map_ = m;
  map_bytes_ = static_cast<size_t>(st.st_size);
  base_ = static_cast<const uint8_t*>(m) + kImagesOffset;
  return true;
}

// Uses the shard only when its key, sizes, geometry and boxes all match this scan.
bool DecodedCache::load_shard(const std::string& path, uint64_t key) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  auto stale = [&](const std::string& why) {
    spdlog::info("{}: cache shard is {}; rebuilding it", path, why);
    return false;
  };
  if (!map_shard(path)) return stale("unreadable");
  ShardHeader h{};
  if (map_bytes_ < sizeof h) return stale("truncated");
  std::memcpy(&h, map_, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion) return stale("not a cache shard of this version");
  if (h.file_bytes != map_bytes_) return stale("truncated or damaged");
  if (h.key != key || h.count != geometry_.size() || h.canvas * h.canvas * 3ull != slot_bytes_)
    return stale("stale (the images or the canvas changed)");
  const auto* base = static_cast<const uint8_t*>(map_);
  if (h.index_offset + h.count * sizeof(ShardEntry) > map_bytes_ ||
      h.boxes_offset + h.total_boxes * sizeof(ShardBox) > map_bytes_)
    return stale("damaged");
  const auto* entries = reinterpret_cast<const ShardEntry*>(base + h.index_offset);
  const auto* boxes = reinterpret_cast<const ShardBox*>(base + h.boxes_offset);
  for (size_t i = 0; i < geometry_.size(); ++i) {
    const ShardEntry& e = entries[i];
    const ItemBoxes& b = boxes_[i];
    if (!same_geometry(e, geometry_[i]) || e.box_count != b.classes.size() || e.box_start + e.box_count > h.total_boxes)
      return stale("stale (image sizes or labels changed)");
    for (uint32_t j = 0; j < e.box_count; ++j) {
      const ShardBox& sb = boxes[e.box_start + j];
      if (std::memcmp(sb.xyxy, b.xyxy[j].data(), sizeof sb.xyxy) != 0 || sb.cls != b.classes[j] ||
          (sb.crowd != 0) != b.crowd[j])
        return stale("stale (labels changed)");
    }
    decoded_[i] = static_cast<uint8_t>(e.decoded != 0);
  }
  spdlog::info("{}: using the cache shard ({} images)", path, h.count);
  return true;
}

bool DecodedCache::write_shard(const std::string& path, const Split& split, const CacheOptions& o, uint64_t key) {
  const size_t n = geometry_.size();
  size_t total_boxes = 0;
  for (const auto& b : boxes_) total_boxes += b.classes.size();
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.canvas = static_cast<uint32_t>(o.canvas);
  h.key = key;
  h.count = n;
  h.index_offset = kImagesOffset + n * slot_bytes_;
  h.boxes_offset = h.index_offset + n * sizeof(ShardEntry);
  h.total_boxes = total_boxes;
  h.file_bytes = h.boxes_offset + total_boxes * sizeof(ShardBox);

  const fs::path dir = fs::path(path).parent_path();
  // A killed build leaves a shard-sized temporary file: those of processes that are gone go first.
  remove_abandoned_temporaries(dir.empty() ? "." : dir.string());
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0 && double(vfs.f_bavail) * vfs.f_frsize < 1.05 * double(h.file_bytes)) {
    spdlog::warn("data.cache=disk: not caching split '{}': the shard needs {} but {} has {} free; reading "
                 "images directly", split.name, format_bytes(double(h.file_bytes)), dir.string(),
                 format_bytes(double(vfs.f_bavail) * vfs.f_frsize));
    return false;
  }
  const std::string tmp = temporary_path(path);
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    spdlog::warn("data.cache=disk: cannot write {} ({}); reading images directly", tmp, std::strerror(errno));
    return false;
  }
  bool ok = ::ftruncate(fd, static_cast<off_t>(h.file_bytes)) == 0;
  spdlog::info("building cache shard {} ({} images, {})", path, n, format_bytes(double(h.file_bytes)));
  std::mutex io;
  auto put = [&](const void* data, size_t bytes, uint64_t offset) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const ssize_t w = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
      if (w <= 0) {
        if (w < 0 && errno == EINTR) continue;
        std::lock_guard<std::mutex> lock(io);
        ok = false;
        return;
      }
      p += w, bytes -= size_t(w), offset += uint64_t(w);
    }
  };
  if (ok) {
    decode_all(split, o, [&](int64_t i, const uint8_t* chw) {
      put(chw, slot_bytes_, kImagesOffset + uint64_t(i) * slot_bytes_);
    });
    std::vector<ShardEntry> entries(n);
    std::vector<ShardBox> boxes;
    boxes.reserve(total_boxes);
    for (size_t i = 0; i < n; ++i) {
      const Letterbox& g = geometry_[i];
      entries[i] = {g.orig_w, g.orig_h, g.resized_w, g.resized_h, g.pad_x, g.pad_y, decoded_[i],
                    static_cast<uint32_t>(boxes_[i].classes.size()), boxes.size()};
      for (size_t j = 0; j < boxes_[i].classes.size(); ++j) {
        ShardBox sb{};
        std::memcpy(sb.xyxy, boxes_[i].xyxy[j].data(), sizeof sb.xyxy);
        sb.cls = static_cast<int32_t>(boxes_[i].classes[j]);
        sb.crowd = boxes_[i].crowd[j];
        boxes.push_back(sb);
      }
    }
    put(entries.data(), entries.size() * sizeof(ShardEntry), h.index_offset);
    put(boxes.data(), boxes.size() * sizeof(ShardBox), h.boxes_offset);
    put(&h, sizeof h, 0);  // the header last: a crash before this leaves no valid shard
    // A shard remembers a failed image until the data changes: one that could not be read now
    // (not one that failed to decode) would be skipped by every later run.
    if (unreadable_ > 0) {
      spdlog::warn("data.cache=disk: not keeping {}: {} image{} could not be read while it was built; reading images directly "
                   "this run, the next one builds it again", path, unreadable_.load(), unreadable_ == 1 ? "" : "s");
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
  }
  ok = ok && ::fsync(fd) == 0;
  // Mapped before the rename: another process renaming its own shard onto `path` meanwhile
  // cannot swap this one's images for its own.
  ok = ok && map_fd(fd);
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("data.cache=disk: writing {} failed ({}); reading images directly", path, std::strerror(errno));
    ::unlink(tmp.c_str());
    return false;
  }
  fsync_path(dir.empty() ? "." : dir.string(), true);
  return true;
}

}  // namespace headroom::data
