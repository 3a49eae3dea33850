#include "headroom/models/weights.h"

#include <fcntl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"

namespace headroom::models {

namespace {
constexpr const char* kMetaKey = "headroom_weights";
constexpr int kFormat = 1;
}  // namespace

void write_weights(DetectorImpl& model, const WeightsInfo& info, torch::serialize::OutputArchive& archive) {
  Json meta = Json::object();
  meta["format"] = kFormat;
  meta["model_file"] = model.yaml_file();
  meta["model_yaml"] = model.yaml_text();
  meta["scale"] = model.scale();
  meta["nc"] = model.info().nc;
  Json names = Json::array(), ids = Json::array();
  for (const auto& n : info.names) names.push_back(n);
  for (int id : info.category_ids) ids.push_back(id);
  meta["names"] = names;
  meta["category_ids"] = ids;
  model.save(archive);
  archive.write(kMetaKey, c10::IValue(meta.dump()));
}

void save_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path) {
  torch::serialize::OutputArchive archive;
  write_weights(model, info, archive);
  save_archive_atomic(archive, path);
}

namespace {

// Trailer after the zip archive (LibTorch's reader does not check the zip CRCs, so without it a
// flipped bit would load silently):
//   format 2: [archive][meta JSON] "HRSUM002" archive_bytes meta_bytes hash(archive + meta)
//   format 1: [archive]            "HRSUM001" archive_bytes hash(archive)   (read only)
constexpr char kMagic2[8] = {'H', 'R', 'S', 'U', 'M', '0', '0', '2'};
constexpr char kMagic1[8] = {'H', 'R', 'S', 'U', 'M', '0', '0', '1'};
constexpr size_t kTrailer2 = 32, kTrailer1 = 24;
constexpr uint64_t kHashSeed = 0x9E3779B97F4A7C15ull;

// A 64-bit hash fed in pieces: 8-byte words mixed in order, the bytes after the last word one
// by one at the end (the same value as hashing the whole buffer at once).
class StreamHash {
 public:
  explicit StreamHash(uint64_t seed) : h_(seed) {}
  void update(const char* p, size_t n) {
    total_ += n;
    while (n > 0 && carry_n_ > 0 && carry_n_ < 8) carry_[carry_n_++] = *p++, --n;
    if (carry_n_ == 8) {
      mix(carry_);
      carry_n_ = 0;
    }
    for (; n >= 8; p += 8, n -= 8) mix(p);
    while (n > 0) carry_[carry_n_++] = *p++, --n;
  }
  uint64_t finish_v1() const {
    uint64_t h = h_;
    for (size_t i = 0; i < carry_n_; ++i) h = (h ^ uint8_t(carry_[i])) * 0x100000001B3ull;
    return h;
  }
  uint64_t finish() const {
    uint64_t h = (finish_v1() ^ total_) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
  }

 private:
  void mix(const char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = (h_ ^ (w * 0xBF58476D1CE4E5B9ull)) * 0x94D049BB133111EBull;
    h_ ^= h_ >> 31;
  }
  uint64_t h_, total_ = 0;
  char carry_[8] = {};
  size_t carry_n_ = 0;
};

class ReadFd {
 public:
  explicit ReadFd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY)) {}
  ~ReadFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadFd(const ReadFd&) = delete;
  ReadFd& operator=(const ReadFd&) = delete;
  int get() const { return fd_; }
  // Reads exactly n bytes at pos; false at the end of the file or on an error.
  bool read_at(uint64_t pos, void* buf, size_t n) const {
    char* out = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, out, n, off_t(pos));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      out += r, pos += uint64_t(r), n -= size_t(r);
    }
    return true;
  }

 private:
  int fd_;
};

}  // namespace

void save_archive_atomic(torch::serialize::OutputArchive& archive, const std::string& path, const std::string& meta) {
  AtomicFile file(path);  // removed again if anything below throws
  StreamHash hash(kHashSeed);
  uint64_t n = 0;
  // A write that fails (a full disk) must not throw through LibTorch's zip writer, whose
  // destructor would call back into this function while unwinding: the first error is kept,
  // later bytes are dropped, and it is thrown once the writer is done.
  std::exception_ptr failed;
  try {
    archive.save_to([&](const void* data, size_t size) -> size_t {
      if (failed) return size;
      try {
        file.write(data, size);
      } catch (...) {
        failed = std::current_exception();
        return size;
      }
      hash.update(static_cast<const char*>(data), size);
      n += size;
      return size;
    });
  } catch (const c10::Error& e) {
    throw Error(path + ": writing failed (the previous file, if any, is untouched): " + e.what_without_backtrace());
  }
  if (failed) std::rethrow_exception(failed);
  file.write(meta.data(), meta.size());
  hash.update(meta.data(), meta.size());
  const uint64_t m = meta.size(), h = hash.finish();
  char trailer[kTrailer2];
  std::memcpy(trailer, kMagic2, 8);
  std::memcpy(trailer + 8, &n, 8);
  std::memcpy(trailer + 16, &m, 8);
  std::memcpy(trailer + 24, &h, 8);
  file.write(trailer, sizeof trailer);
  file.commit();  // fsync, rename, fsync of the folder
}

bool has_headroom_trailer(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  const ReadFd fd(path);
  const uint64_t size = std::filesystem::file_size(path, ec);
  char tail[kTrailer2] = {};
  if (fd.get() < 0 || ec) return false;
  if (size >= kTrailer2 && fd.read_at(size - kTrailer2, tail, kTrailer2) && std::memcmp(tail, kMagic2, 8) == 0) return true;
  return size >= kTrailer1 && fd.read_at(size - kTrailer1, tail, kTrailer1) && std::memcmp(tail, kMagic1, 8) == 0;
}

ArchiveFile verify_archive(const std::string& path, const std::string& what) {
  if (!std::filesystem::is_regular_file(path)) throw InputError(path + ": " + what + " not found");
  const ReadFd fd(path);
  if (fd.get() < 0) throw InputError(path + ": cannot open the " + what + ": " + std::strerror(errno));
  const uint64_t size = std::filesystem::file_size(path);
  char tail[kTrailer2] = {};
  const bool v2 = size >= kTrailer2 && fd.read_at(size - kTrailer2, tail, kTrailer2) && std::memcmp(tail, kMagic2, 8) == 0;
  const bool v1 = !v2 && size >= kTrailer1 && fd.read_at(size - kTrailer1, tail, kTrailer1) && std::memcmp(tail, kMagic1, 8) == 0;
  if (!v1 && !v2) throw InputError(path + ": not a Headroom " + what + ", or truncated (no end marker)");
  ArchiveFile f;
  uint64_t m = 0, h = 0;
  std::memcpy(&f.archive_bytes, tail + 8, 8);
  if (v2) std::memcpy(&m, tail + 16, 8);
  std::memcpy(&h, tail + (v2 ? 24 : 16), 8);
  const uint64_t hashed = f.archive_bytes + m;
  if (hashed + (v2 ? kTrailer2 : kTrailer1) != size)
    throw InputError(path + ": damaged " + what + " (its length does not match its end marker)");
  StreamHash hash(v2 ? kHashSeed : kHashSeed ^ f.archive_bytes);
  std::vector<char> buf(size_t(1) << 20);
  for (uint64_t pos = 0; pos < hashed;) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), hashed - pos));
    if (!fd.read_at(pos, buf.data(), n)) throw InputError(path + ": cannot read the " + what + " at byte " + std::to_string(pos));
    hash.update(buf.data(), n);
    if (pos + n > f.archive_bytes) {  // the meta JSON follows the archive
      const uint64_t from = std::max(pos, f.archive_bytes);
      f.meta.append(buf.data() + (from - pos), size_t(pos + n - from));
    }
    pos += n;
  }
  if ((v2 ? hash.finish() : hash.finish_v1()) != h)
    throw InputError(path + ": damaged " + what + " (checksum mismatch: the file changed after it was written)");
  return f;
}

ArchiveFile load_archive_verified(torch::serialize::InputArchive& archive, const std::string& path, c10::Device device,
                                  const std::string& what) {
  const ArchiveFile f = verify_archive(path, what);
  const ReadFd fd(path);
  try {
    archive.load_from([&](uint64_t pos, void* buf, size_t n) -> size_t { return fd.read_at(pos, buf, n) ? n : 0; },
                      [&]() -> size_t { return size_t(f.archive_bytes); }, device);
  } catch (const c10::Error& e) {
    throw InputError(path + ": cannot read the " + what + ": " + e.what_without_backtrace());
  }
  return f;
}

namespace {

Json stored_meta(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue meta_value;
  if (!archive.try_read(kMetaKey, meta_value) || !meta_value.isString())
    throw InputError(path + ": not a Headroom weights file (no model description inside)");
  Json meta = Json::parse(meta_value.toStringRef(), path);
  const Json* format = meta.find("format");
  if (!format || format->as_number() != kFormat) throw InputError(path + ": weights format not supported by this Headroom");
  return meta;
}

ModelSpec spec_of(const Json& meta) {
  ModelSpec spec;
  spec.file = meta.find("model_file")->as_string();
  spec.text = meta.find("model_yaml")->as_string();
  spec.scale = meta.find("scale")->as_string();
  spec.nc = static_cast<int64_t>(meta.find("nc")->as_number());
  return spec;
}

}  // namespace

ModelSpec stored_model(torch::serialize::InputArchive& archive, const std::string& path) { return spec_of(stored_meta(archive, path)); }

bool same_model(const ModelSpec& spec, const DetectorImpl& model) {
  if (spec.scale != model.scale()) return false;
  if (spec.text == model.yaml_text()) return true;
  try {
    return YAML::Dump(YAML::Load(spec.text)) == YAML::Dump(YAML::Load(model.yaml_text()));
  } catch (const YAML::Exception&) {
    return false;
  }
}

LoadedWeights load_weights(const std::string& path, c10::Device device) {
  torch::serialize::InputArchive archive;
  load_archive_verified(archive, path, c10::Device(c10::kCPU), "weights file");
  const Json meta = stored_meta(archive, path);
  const ModelSpec spec = spec_of(meta);
  LoadedWeights out;
  out.model = Detector(spec);
  try {
    out.model->load(archive);
  } catch (const c10::Error& e) {
    throw InputError(path + ": the weights do not fit their own model description: " + e.what_without_backtrace());
  }
  out.model->to(device);
  for (const auto& n : meta.find("names")->items()) out.info.names.push_back(n.as_string());
  for (const auto& id : meta.find("category_ids")->items()) out.info.category_ids.push_back(static_cast<int>(id.as_number()));
  return out;
}

}  // namespace headroom::models
