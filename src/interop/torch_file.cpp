#include "headroom/interop/torch_file.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "headroom/core/checksum.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "torch_file_internal.h"

namespace headroom::interop {

namespace {

using Kind = PyValue::Kind;

at::Tensor storage_from_bytes(const void* data, size_t nbytes, at::ScalarType dtype) {
  const size_t element = c10::elementSize(dtype);
  if (nbytes % element) throw std::runtime_error("a storage whose size is not a whole number of elements");
  at::Tensor t = at::empty({int64_t(nbytes / element)}, at::TensorOptions().dtype(dtype));
  if (nbytes) std::memcpy(t.data_ptr(), data, nbytes);
  return t;
}

template <class T>
T read_le(const std::string& b, size_t at) {
  if (at > b.size() || b.size() - at < sizeof(T)) throw std::runtime_error("byte " + std::to_string(at) + ": the zip directory runs past the end of the file");
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

// The zip archive torch.save writes: stored (uncompressed) records under one folder. Each
// record's CRC-32 is checked, so a damaged byte is found (LibTorch's own reader skips the check).
class ZipRecords {
 public:
  explicit ZipRecords(std::string bytes) : bytes_(std::move(bytes)) {
    const size_t n = bytes_.size();
    if (n < 22) throw std::runtime_error("too short for a zip archive (truncated?)");
    size_t eocd = std::string::npos;
    for (size_t i = n - 22 + 1; i-- > (n > 22 + 65535 ? n - 22 - 65535 : 0);)
      if (read_le<uint32_t>(bytes_, i) == 0x06054b50u) {
        eocd = i;
        break;
      }
    if (eocd == std::string::npos) throw std::runtime_error("no zip end-of-directory record (truncated file?)");
    uint64_t entries = read_le<uint16_t>(bytes_, eocd + 10);
    uint64_t dir = read_le<uint32_t>(bytes_, eocd + 16);
    if (dir == 0xFFFFFFFFu || entries == 0xFFFFu) {  // zip64: its end record precedes the locator
      if (eocd < 20 || read_le<uint32_t>(bytes_, eocd - 20) != 0x07064b50u) throw std::runtime_error("a zip64 archive without its locator");
      const uint64_t z64 = read_le<uint64_t>(bytes_, eocd - 20 + 8);
      if (read_le<uint32_t>(bytes_, size_t(z64)) != 0x06064b50u) throw std::runtime_error("a damaged zip64 end record");
      entries = read_le<uint64_t>(bytes_, size_t(z64) + 32);
      dir = read_le<uint64_t>(bytes_, size_t(z64) + 48);
    }
    size_t at = size_t(dir);
    for (uint64_t e = 0; e < entries; ++e) {
      if (read_le<uint32_t>(bytes_, at) != 0x02014b50u) throw std::runtime_error("byte " + std::to_string(at) + ": a damaged zip directory");
      Record r;
      r.method = read_le<uint16_t>(bytes_, at + 10);
      r.crc = read_le<uint32_t>(bytes_, at + 16);
      uint64_t size = read_le<uint32_t>(bytes_, at + 20);
      const uint16_t name_len = read_le<uint16_t>(bytes_, at + 28), extra_len = read_le<uint16_t>(bytes_, at + 30),
                     comment_len = read_le<uint16_t>(bytes_, at + 32);
      uint64_t local = read_le<uint32_t>(bytes_, at + 42);
      if (at + 46 + name_len > n) throw std::runtime_error("a zip directory entry runs past the end of the file");
      const std::string name = bytes_.substr(at + 46, name_len);
      // zip64 extra field: 64-bit values for the fields saturated above, in this order
      for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
        const uint16_t id = read_le<uint16_t>(bytes_, x), len = read_le<uint16_t>(bytes_, x + 2);
        if (id == 0x0001) {
          size_t f = x + 4;
          if (read_le<uint32_t>(bytes_, at + 24) == 0xFFFFFFFFu) f += 8;  // uncompressed size (= size: stored)
          if (size == 0xFFFFFFFFu) size = read_le<uint64_t>(bytes_, f), f += 8;
          if (local == 0xFFFFFFFFu) local = read_le<uint64_t>(bytes_, f);
        }
        x += 4 + len;
      }
      if (read_le<uint32_t>(bytes_, size_t(local)) != 0x04034b50u)
        throw std::runtime_error("record " + name + ": no local header at byte " + std::to_string(local));
      r.offset = local + 30 + read_le<uint16_t>(bytes_, size_t(local) + 26) + read_le<uint16_t>(bytes_, size_t(local) + 28);
      r.size = size;
      if (r.offset > n || r.size > n - r.offset) throw std::runtime_error("record " + name + " runs past the end of the file (truncated)");
      // "<folder>/data.pkl" -> "data.pkl": torch.save puts everything under one folder
      const size_t slash = name.find('/');
      records_[slash == std::string::npos ? name : name.substr(slash + 1)] = r;
      at += 46 + name_len + extra_len + comment_len;
    }
  }

  bool has(const std::string& name) const { return records_.count(name) > 0; }
  // The record's bytes, checked against its CRC-32 (unless 0: torch.save writes none under
  // torch.serialization.set_crc32_options(False), and torch.load reads such files).
  std::pair<const char*, size_t> get(const std::string& name) const {
    const auto it = records_.find(name);
    if (it == records_.end()) throw std::runtime_error("the archive has no record " + name);
    const Record& r = it->second;
    if (r.method != 0) throw std::runtime_error("record " + name + " is compressed; torch.save stores records uncompressed");
    const char* data = bytes_.data() + r.offset;
    if (r.crc != 0 && crc32(data, size_t(r.size)) != r.crc) throw std::runtime_error("record " + name + " is damaged (CRC-32 mismatch)");
    return {data, size_t(r.size)};
  }

 private:
  struct Record {
    uint64_t offset = 0, size = 0;
    uint32_t crc = 0;
    uint16_t method = 0;
  };
  std::string bytes_;
  std::map<std::string, Record> records_;
};

TorchFile read_zip(const std::string& path) {
  const ZipRecords zip(read_file(path));
  if (zip.has("byteorder")) {
    const auto [data, size] = zip.get("byteorder");
    if (std::string(data, size) != "little") throw std::runtime_error("big-endian data, which this reader does not read");
  }
  if (!zip.has("data.pkl")) throw std::runtime_error("a zip archive without data.pkl (not written by torch.save)");
  const auto [pkl, pkl_size] = zip.get("data.pkl");
  const PyRef root = unpickle(pkl, pkl_size, [&](const std::string& key, at::ScalarType dtype, int64_t) {
    const auto [data, size] = zip.get("data/" + key);
    return storage_from_bytes(data, size, dtype);
  });
  return TorchFile{root, "zip"};
}

// The legacy format: pickles one after another, then the raw storages in the order of the
// storage-key list.
TorchFile read_legacy(const std::string& path) {
  const std::string bytes = read_file(path);
  size_t pos = 0;
  std::map<std::string, at::ScalarType> wanted;  // key -> dtype, from the main pickle's persistent ids
  const auto next_pickle = [&](StorageLoader loader) {
    size_t consumed = 0;
    PyRef v = unpickle(bytes.data() + pos, bytes.size() - pos, std::move(loader), &consumed);
    pos += consumed;
    return v;
  };
  const auto no_storage = [](const std::string&, at::ScalarType, int64_t) -> at::Tensor {
    throw std::runtime_error("a storage outside the object pickle");
  };
  const PyRef magic = next_pickle(no_storage);  // 0x1950a86a20f9469cfc6c, little-endian bytes
  if (magic->kind != Kind::bytes || magic->text != std::string("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10))
    throw std::runtime_error("a pickle, but not a torch.save file (no magic number)");
  const PyRef protocol = next_pickle(no_storage);
  if (protocol->kind != Kind::integer || protocol->integer != 1001)
    throw std::runtime_error("not a torch.save file (protocol " + protocol->describe() + ", expected 1001)");
  next_pickle(no_storage);  // sys_info
  // The raw storages follow the object pickle: allocate each at the size its persistent id
  // states, fill it in once its bytes are reached.
  // Together they must fit in the file: each storage alone could claim the whole file.
  std::map<std::string, at::Tensor> storages;
  uint64_t claimed = 0;
  const PyRef root = next_pickle([&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    if (numel < 0 || uint64_t(numel) > (bytes.size() - claimed) / c10::elementSize(dtype))
      throw std::runtime_error("storage " + key + " claims " + std::to_string(numel) + " elements, more than the file holds" +
                               (claimed > 0 ? " beside the storages before it" : ""));
    claimed += uint64_t(numel) * c10::elementSize(dtype);
    wanted[key] = dtype;
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
    storages[key] = t;
    return t;
  });
  const PyRef keys = next_pickle(no_storage);
  if (keys->kind != Kind::list) throw std::runtime_error("no storage key list after the object");
  std::set<std::string> filled;
  for (const auto& k : keys->items) {
    const std::string key = k->text;
    const auto it = wanted.find(key);
    if (it == wanted.end()) throw std::runtime_error("storage " + key + " listed but never used");
    if (!filled.insert(key).second) throw std::runtime_error("storage " + key + " listed twice");
    if (bytes.size() - pos < 8) throw std::runtime_error("byte " + std::to_string(pos) + ": the file ends before storage " + key);
    int64_t numel = 0;
    std::memcpy(&numel, bytes.data() + pos, 8);
    pos += 8;
    at::Tensor& t = storages[key];
    if (numel != t.numel())
      throw std::runtime_error("byte " + std::to_string(pos) + ": storage " + key + " holds " + std::to_string(numel) +
                               " elements, its tensors expect " + std::to_string(t.numel()));
    const size_t nbytes = size_t(numel) * c10::elementSize(it->second);
    if (bytes.size() - pos < nbytes)
      throw std::runtime_error("byte " + std::to_string(pos) + ": the file ends inside storage " + key + " (truncated)");
    if (nbytes) std::memcpy(t.data_ptr(), bytes.data() + pos, nbytes);  // the rebuilt tensors view it
    pos += nbytes;
  }
  if (filled.size() != storages.size()) throw std::runtime_error("the storage key list misses storages of the object");
  return TorchFile{root, "legacy"};
}

}  // namespace

const PyValue* PyValue::get(const std::string& key) const {
  // An object's attributes are its state's entries (one level: a crafted file may make values cyclic).
  const PyValue* d = kind == Kind::object ? state.get() : this;
  if (!d || d->kind != Kind::dict) return nullptr;
  for (const auto& [k, v] : d->entries)
    if (k->kind == Kind::string && k->text == key) return v.get();
  return nullptr;
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return boolean ? "True" : "False";
    case Kind::integer: return std::to_string(integer);
    case Kind::real: return std::to_string(real);
    case Kind::string: return "'" + text + "'";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::tensor: return "tensor";
    case Kind::global: return "class " + text;
    case Kind::object: return "object " + text;
  }
  return "?";
}

bool looks_like_torch_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[2] = {};
  if (!f.read(head, 2)) return false;
  return (head[0] == 'P' && head[1] == 'K') || uint8_t(head[0]) == 0x80;
}

TorchFile read_torch_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open the file");
  char head[2] = {};
  f.read(head, 2);
  f.close();
  try {
    if (head[0] == 'P' && head[1] == 'K') return read_zip(path);
    if (uint8_t(head[0]) == 0x80) return read_legacy(path);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(path + ": cannot read it as a torch.save file: " + e.what());
  }
  throw InputError(path + ": not a torch.save file (neither a zip archive nor a pickle)");
}

std::vector<std::pair<std::string, at::Tensor>> module_state(const PyValue& v) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::function<void(const PyValue&, const std::string&, int)> walk = [&](const PyValue& m, const std::string& prefix, int depth) {
    if (depth > 64) throw InputError("module tree deeper than 64 levels at " + prefix + " (a cyclic or damaged file?)");
    const PyValue* params = m.get("_parameters");
    const PyValue* buffers = m.get("_buffers");
    const PyValue* children = m.get("_modules");
    std::set<std::string> transient;
    if (const PyValue* np = m.get("_non_persistent_buffers_set"))
      for (const auto& n : np->items) transient.insert(n->text);
    for (const PyValue* group : {params, buffers}) {
      if (!group) continue;
      for (const auto& [k, t] : group->entries)
        if (t->kind == Kind::tensor && !(group == buffers && transient.count(k->text))) out.emplace_back(prefix + k->text, t->tensor);
    }
    if (children)
      for (const auto& [k, c] : children->entries)
        if (c->kind == Kind::object) walk(*c, prefix + k->text + ".", depth + 1);
  };
  if (v.is_object() && v.get("_modules")) {
    walk(v, "", 0);
  } else if (v.is_dict()) {
    for (const auto& [k, t] : v.entries)
      if (k->kind == Kind::string && t->kind == Kind::tensor) out.emplace_back(k->text, t->tensor);
  }
  return out;
}

}  // namespace headroom::interop
