#include "headroom/interop/tf_checkpoint.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/checksum.h"
#include "headroom/proto/tensor_bundle.pb.h"

namespace headroom::interop {

namespace fs = std::filesystem;

std::string tf_checkpoint_prefix(const std::string& path) {
  std::error_code ec;
  const std::string suffix = ".index";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0 &&
      fs::is_regular_file(path, ec))
    return path.substr(0, path.size() - suffix.size());
  if (!fs::exists(path, ec) && fs::is_regular_file(path + suffix, ec)) return path;
  return "";
}

namespace {

// The table's file layout (LevelDB's): blocks, each followed by a type byte (0: stored as is)
// and the masked CRC-32C of the block and that byte; at the end a 48-byte footer holding the
// metaindex and index block handles (varints) and a magic number. A block is a run of
// prefix-compressed entries (shared key bytes, new key bytes, value length, as varints) and an
// array of restart offsets with its count.
constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
constexpr size_t kFooter = 48, kTrailer = 5;

class TableReader {
 public:
  TableReader(std::string path, std::string bytes) : path_(std::move(path)), bytes_(std::move(bytes)) {}

  // Every key and value of the table, in key order.
  std::vector<std::pair<std::string, std::string>> entries() const {
    if (bytes_.size() < kFooter) fail("shorter than a table footer (" + std::to_string(bytes_.size()) + " bytes)");
    uint64_t magic = 0;
    std::memcpy(&magic, bytes_.data() + bytes_.size() - 8, 8);
    if (magic != kTableMagic) fail("no table magic number at its end (not a TensorFlow checkpoint index)");
    size_t at = bytes_.size() - kFooter;
    const uint64_t meta_at = handle(at, bytes_.size()).first;  // the metaindex block: empty in checkpoints
    const auto [index_at, index_size] = handle(at, bytes_.size());
    std::vector<std::pair<std::string, std::string>> out;
    uint64_t next = 0;  // data blocks follow each other, before the metaindex block
    for (const auto& [key, value] : block(index_at, index_size)) {
      size_t p = 0;
      const auto [data_at, data_size] = handle_in(value, p, value.size());
      if (data_at < next || data_at > meta_at) fail("the index names a data block at byte " + std::to_string(data_at) + " out of order");
      for (auto& kv : block(data_at, data_size)) {
        if (!out.empty() && !(out.back().first < kv.first)) fail("key '" + kv.first + "' out of order or repeated");
        out.push_back(std::move(kv));
      }
      next = data_at + data_size + kTrailer;
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw InputError(path_ + ": damaged checkpoint index: " + why); }

  // A varint of `s` at p, not reading at or past `end`.
  uint64_t varint(const std::string& s, size_t& p, size_t end) const {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) fail("a number runs past its block");
      const uint8_t b = uint8_t(s[p++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a number longer than 10 bytes");
  }
  std::pair<uint64_t, uint64_t> handle_in(const std::string& s, size_t& p, size_t end) const {
    const uint64_t offset = varint(s, p, end), size = varint(s, p, end);
    return {offset, size};
  }
  std::pair<uint64_t, uint64_t> handle(size_t& at, size_t end) const { return handle_in(bytes_, at, end); }

  std::vector<std::pair<std::string, std::string>> block(uint64_t at, uint64_t size) const {
    const std::string where = "block at byte " + std::to_string(at);
    const uint64_t n = bytes_.size();  // the footer has no checksum: its handles are checked, not trusted
    if (at > n || size > n - at || n - at - size < kTrailer) fail(where + " runs past the end of the file");
    const std::string contents = bytes_.substr(size_t(at), size_t(size));
    const uint8_t type = uint8_t(bytes_[size_t(at + size)]);
    uint32_t stored = 0;
    std::memcpy(&stored, bytes_.data() + at + size + 1, 4);
    if (masked_crc32c(bytes_.data() + at, size_t(size) + 1) != stored) fail(where + ": checksum mismatch");
    if (type != 0) fail(where + ": compressed (type " + std::to_string(type) + "); TensorFlow writes checkpoints uncompressed");
    if (contents.size() < 4) fail(where + ": too short");
    uint32_t restarts = 0;
    std::memcpy(&restarts, contents.data() + contents.size() - 4, 4);
    if (restarts == 0 || uint64_t(restarts) * 4 + 4 > contents.size()) fail(where + ": no restart array, or one that overruns it");
    const size_t end = contents.size() - 4 - size_t(restarts) * 4;
    std::vector<std::pair<std::string, std::string>> out;
    std::string key;
    for (size_t p = 0; p < end;) {
      const uint64_t shared = varint(contents, p, end), fresh = varint(contents, p, end), length = varint(contents, p, end);
      if (shared > key.size() || fresh > end - p || length > end - p - fresh) fail(where + ": an entry overruns the block");
      key = key.substr(0, size_t(shared)) + contents.substr(p, size_t(fresh));
      p += size_t(fresh);
      out.emplace_back(key, contents.substr(p, size_t(length)));
      p += size_t(length);
    }
    return out;
  }

  std::string path_, bytes_;
};

at::ScalarType scalar_type(int dtype) {
  switch (dtype) {
    case 1: return at::kFloat;
    case 2: return at::kDouble;
    case 3: return at::kInt;
    case 9: return at::kLong;
    case 14: return at::kBFloat16;
    case 19: return at::kHalf;
    default: return at::ScalarType::Undefined;
  }
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_tf_checkpoint(const std::string& prefix, bool with_data) {
  const std::string index = prefix + ".index";
  TableReader table(index, read_file(index));
  const auto entries = table.entries();
  if (entries.empty() || !entries.front().first.empty()) throw InputError(index + ": damaged checkpoint index: no header entry");
  tf::BundleHeaderProto header;
  if (!header.ParseFromString(entries.front().second)) throw InputError(index + ": damaged checkpoint index: unreadable header");
  if (header.endianness() != tf::BundleHeaderProto::LITTLE) throw InputError(index + ": a big-endian checkpoint; Headroom reads little-endian ones");
  if (header.num_shards() < 1) throw InputError(index + ": damaged checkpoint index: " + std::to_string(header.num_shards()) + " data shards");

  struct Shard {
    std::string file;
    std::ifstream in;
    int64_t size = 0;
  };
  std::map<int, Shard> shards;
  const auto shard = [&](int k) -> Shard& {
    char suffix[48];
    std::snprintf(suffix, sizeof suffix, ".data-%05d-of-%05d", k, header.num_shards());
    auto it = shards.find(k);
    if (it == shards.end()) {
      Shard s;
      s.file = prefix + suffix;
      std::error_code ec;
      s.size = int64_t(fs::file_size(s.file, ec));
      s.in.open(s.file, std::ios::binary);
      if (ec || !s.in) throw InputError(s.file + ": the checkpoint's data shard " + std::to_string(k) + " is missing (" + index + " names it)");
      it = shards.emplace(k, std::move(s)).first;
    }
    return it->second;
  };

  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 1; i < entries.size(); ++i) {
    const auto& [key, value] = entries[i];
    tf::BundleEntryProto e;
    if (!e.ParseFromString(value)) throw InputError(index + ": damaged checkpoint index: the entry of " + key + " is unreadable");
    const at::ScalarType type = scalar_type(e.dtype());
    if (type == at::ScalarType::Undefined) continue;  // strings: the object graph
    if (e.slices_size() > 0) throw InputError(index + ": " + key + " is a partitioned variable; Headroom reads whole tensors");
    if (e.shard_id() < 0 || e.shard_id() >= header.num_shards())
      throw InputError(index + ": damaged checkpoint index: " + key + " names data shard " + std::to_string(e.shard_id()));
    // The shape and byte range are checked before anything is allocated.
    std::vector<int64_t> shape;
    int64_t bytes = int64_t(c10::elementSize(type));
    for (const auto& d : e.shape().dim()) {
      if (d.size() < 0 || __builtin_mul_overflow(bytes, d.size(), &bytes))
        throw InputError(index + ": damaged checkpoint index: " + key + " has a dimension of " + std::to_string(d.size()));
      shape.push_back(d.size());
    }
    if (e.shape().unknown_rank() || bytes != e.size())
      throw InputError(index + ": damaged checkpoint index: " + key + " holds " + std::to_string(e.size()) + " bytes for its shape");
    Shard& sh = shard(e.shard_id());
    if (e.offset() < 0 || e.offset() > sh.size || e.size() > sh.size - e.offset())
      throw InputError(sh.file + ": ends inside " + key + " (bytes " + std::to_string(e.offset()) + ".." +
                       std::to_string(e.offset() + e.size()) + " of " + std::to_string(sh.size) + "; truncated?)");
    if (!with_data) {
      out.emplace_back(key, at::empty(shape, at::TensorOptions().dtype(type).device(at::kMeta)));
      continue;
    }
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    sh.in.clear();
    sh.in.seekg(e.offset());
    sh.in.read(static_cast<char*>(t.data_ptr()), std::streamsize(e.size()));
    if (sh.in.gcount() != std::streamsize(e.size())) throw InputError(sh.file + ": read error in " + key);
    if (masked_crc32c(t.data_ptr(), size_t(e.size())) != e.crc32c())
      throw InputError(sh.file + ": checksum mismatch in " + key + " at byte " + std::to_string(e.offset()) + " (damaged file)");
    out.emplace_back(key, std::move(t));
  }
  return out;
}

}  // namespace headroom::interop
