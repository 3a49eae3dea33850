#include "headroom/interop/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"

namespace headroom::interop {

namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> d = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
  return d;
}

constexpr uint64_t kMaxHeader = 100 << 20;  // the reference implementation's limit

}  // namespace

bool looks_like_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[9] = {};
  if (!f.read(head, 9)) return false;
  uint64_t n = 0;
  std::memcpy(&n, head, 8);
  return n >= 2 && n <= kMaxHeader && head[8] == '{';
}

SafeTensors read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  const auto fail = [&](const std::string& why) -> InputError { return InputError(path + ": damaged safetensors file: " + why); };
  if (bytes.size() < 8) throw fail("shorter than its 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader || n > bytes.size() - 8) throw fail("the header length (" + std::to_string(n) + " bytes) runs past the end of the file");
  Json header;
  try {
    header = Json::parse(std::string_view(bytes).substr(8, n), path + " (safetensors header)");
  } catch (const InputError& e) {
    throw fail(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("the header is not a JSON object");
  const uint64_t data_begin = 8 + n, data_size = bytes.size() - data_begin;
  SafeTensors st;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.members()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.members())
        if (v.is_string()) st.metadata[k] = v.as_string();
      continue;
    }
    const Json* dtype = entry.find("dtype");
    const Json* shape = entry.find("shape");
    const Json* offsets = entry.find("data_offsets");
    if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !offsets || !offsets->is_array() || offsets->size() != 2)
      throw fail("tensor '" + name + "' lacks dtype, shape or data_offsets");
    const auto d = std::find_if(dtypes().begin(), dtypes().end(), [&](const auto& p) { return p.first == dtype->as_string(); });
    if (d == dtypes().end()) throw fail("tensor '" + name + "' has dtype " + dtype->as_string() + ", which this reader does not read");
    // Every number is a whole one in [0, 2^53) and the byte count is computed without overflow.
    const auto whole = [](const Json& v) { return v.is_number() && v.as_number() >= 0 && v.as_number() < 9007199254740992.0 && v.as_number() == std::floor(v.as_number()); };
    std::vector<int64_t> sizes;
    uint64_t nbytes = c10::elementSize(d->second);
    for (const auto& s : shape->items()) {
      if (!whole(s)) throw fail("tensor '" + name + "' has a negative or non-integer dimension");
      sizes.push_back(int64_t(s.as_number()));
      if (__builtin_mul_overflow(nbytes, uint64_t(s.as_number()), &nbytes)) throw fail("tensor '" + name + "' is larger than any file");
    }
    if (!whole(offsets->items()[0]) || !whole(offsets->items()[1])) throw fail("tensor '" + name + "' has non-integer data_offsets");
    const uint64_t b = uint64_t(offsets->items()[0].as_number()), e = uint64_t(offsets->items()[1].as_number());
    if (b > e || e > data_size || e - b != nbytes)
      throw fail("tensor '" + name + "' has byte range [" + std::to_string(b) + ", " + std::to_string(e) + ") but needs " +
                 std::to_string(nbytes) + " bytes within the " + std::to_string(data_size) + " bytes of data");
    ranges.emplace_back(b, e);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(d->second));
    if (nbytes) std::memcpy(t.data_ptr(), bytes.data() + data_begin + b, nbytes);
    st.tensors.emplace_back(name, t);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) throw fail("two tensors share bytes");
  return st;
}

void write_safetensors(const std::string& path, const SafeTensors& st) {
  Json header = Json::object();
  if (!st.metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : st.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : st.tensors) {
    const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const auto d = std::find_if(dtypes().begin(), dtypes().end(), [&](const auto& p) { return p.second == t.scalar_type(); });
    if (d == dtypes().end()) throw Error(path + ": tensor '" + name + "' has a dtype safetensors does not store");
    Json entry = Json::object();
    entry["dtype"] = d->first;
    Json shape = Json::array();
    for (int64_t s : t.sizes()) shape.push_back(s);
    entry["shape"] = shape;
    Json offsets = Json::array();
    offsets.push_back(offset);
    offset += uint64_t(t.nbytes());
    offsets.push_back(offset);
    entry["data_offsets"] = offsets;
    header[name] = entry;
    data.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference pads it
  const uint64_t n = text.size();
  AtomicFile file(path);
  file.write(&n, 8);
  file.write(text.data(), text.size());
  for (const auto& t : data)
    if (t.nbytes()) file.write(t.data_ptr(), t.nbytes());
  file.commit();
}

}  // namespace headroom::interop
