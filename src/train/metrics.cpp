#include "headroom/train/metrics.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "headroom/core/checksum.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"

namespace headroom::train {

namespace {
// The file's lines, the header first; empty when there is no file.
std::vector<std::string> csv_lines(const std::string& path) {
  std::vector<std::string> lines;
  if (!std::filesystem::exists(path)) return lines;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  return lines;
}
}  // namespace

CsvWriter::CsvWriter(std::string path) : path_(std::move(path)) {
  const std::vector<std::string> lines = csv_lines(path_);
  rows_ = lines.empty() ? 0 : int64_t(lines.size()) - 1;
}

void CsvWriter::keep_rows(int64_t rows) {
  const std::vector<std::string> lines = csv_lines(path_);
  const int64_t have = lines.empty() ? 0 : int64_t(lines.size()) - 1;
  if (have <= rows) {
    if (have < rows) spdlog::warn("{}: {} rows, the checkpoint recorded {}; rows are appended after them", path_, have, rows);
    rows_ = have;
    return;
  }
  std::string text;
  for (int64_t i = 0; i <= rows; ++i) text += lines[size_t(i)] + "\n";
  write_file_atomic(path_, text);
  spdlog::info("{}: {} rows written after the checkpoint (by the run it replaces) dropped", path_, have - rows);
  rows_ = rows;
}

void CsvWriter::append(const Scalars& row) {
  const bool fresh = !std::filesystem::exists(path_) || std::filesystem::file_size(path_) == 0;
  std::ofstream out(path_, std::ios::app);
  if (!out) throw Error(path_ + ": cannot append to the results file");
  if (fresh) {
    for (size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << row[i].first;
    out << "\n";
  }
  char buf[32];
  for (size_t i = 0; i < row.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.6g", row[i].second);
    out << (i ? "," : "") << buf;
  }
  out << "\n";
  out.flush();
  if (!out) throw Error(path_ + ": writing the results row failed");
  ++rows_;
}

std::pair<std::vector<std::string>, std::vector<std::vector<double>>> read_csv(const std::string& path) {
  std::istringstream in(read_file(path));
  std::pair<std::vector<std::string>, std::vector<std::vector<double>>> out;
  std::string line;
  if (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) out.first.push_back(cell);
  }
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string cell;
    std::vector<double> row;
    while (std::getline(ss, cell, ',')) row.push_back(std::strtod(cell.c_str(), nullptr));
    out.second.push_back(std::move(row));
  }
  return out;
}

// --- the masked CRC-32C of TFRecord framing ---

namespace {

uint32_t masked_crc(const std::string& s) {
  const uint32_t crc = crc32c(s.data(), s.size());
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// --- protobuf wire format: the few field kinds an Event uses ---

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, (uint64_t(field) << 3) | uint64_t(wire)); }
template <class T>
void put_fixed(std::string& out, int field, int wire, T v) {
  put_tag(out, field, wire);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string event(double wall_time, int64_t step, const std::string* file_version, const Scalars* values) {
  std::string e;
  put_fixed<double>(e, 1, 1, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  if (file_version) put_bytes(e, 3, *file_version);
  if (values) {
    std::string summary;
    for (const auto& [tag, v] : *values) {
      std::string value;
      put_bytes(value, 1, tag);
      put_fixed<float>(value, 2, 5, static_cast<float>(v));
      put_bytes(summary, 1, value);
    }
    put_bytes(e, 5, summary);
  }
  return e;
}

struct WireReader {
  const std::string& s;
  size_t pos = 0, end = 0;
  const std::string& file;
  bool done() const { return pos >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= end) throw Error(file + ": truncated protobuf varint");
      const uint8_t b = static_cast<uint8_t>(s[pos++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Error(file + ": malformed protobuf varint");
  }
  template <class T>
  T fixed() {
    if (pos + sizeof(T) > end) throw Error(file + ": truncated protobuf field");
    T v;
    std::memcpy(&v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  WireReader sub() {
    const uint64_t n = varint();
    if (pos + n > end) throw Error(file + ": truncated protobuf message");
    WireReader r{s, pos, pos + n, file};
    pos += n;
    return r;
  }
  void skip(int wire) {
    if (wire == 0) varint();
    else if (wire == 1) pos += 8;
    else if (wire == 5) pos += 4;
    else if (wire == 2) sub();
    else throw Error(file + ": unsupported protobuf wire type " + std::to_string(wire));
  }
};

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) { create(dir); }

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& file, int64_t bytes) {
  const std::string path = dir + "/" + file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || int64_t(size) < bytes || bytes <= 0) {
    spdlog::warn("{}: not there as the checkpoint left it; the run continues in a new event file", path);
    create(dir);
    return;
  }
  if (int64_t(size) > bytes) {
    std::filesystem::resize_file(path, uintmax_t(bytes));
    spdlog::info("{}: events written after the checkpoint (by the run it replaces) cut off", path);
  }
  path_ = path;
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw Error(path_ + ": cannot append to the TensorBoard event file");
  bytes_ = bytes;
}

void TensorBoardWriter::create(const std::string& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = dir + "/events.out.tfevents." + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
          "." + host + "." + std::to_string(::getpid());
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw Error(path_ + ": cannot create the TensorBoard event file");
  const std::string version = "brain.Event:2";
  write_record(event(std::chrono::duration<double>(now).count(), 0, &version, nullptr));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string header(8, '\0');
  const uint64_t n = data.size();
  std::memcpy(header.data(), &n, 8);
  const uint32_t hcrc = masked_crc(header), dcrc = masked_crc(data);
  std::fwrite(header.data(), 1, 8, file_);
  std::fwrite(&hcrc, 1, 4, file_);
  std::fwrite(data.data(), 1, data.size(), file_);
  std::fwrite(&dcrc, 1, 4, file_);
  bytes_ += int64_t(16 + data.size());
}

void TensorBoardWriter::add_scalars(const Scalars& values, int64_t step, double wall_time) {
  write_record(event(wall_time, step, nullptr, &values));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) throw Error(path_ + ": writing the TensorBoard events failed");
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<TensorBoardScalar> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (pos + 12 > bytes.size()) throw Error(path + ": torn record header at byte " + std::to_string(pos));
    const std::string header = bytes.substr(pos, 8);
    uint64_t n = 0;
    uint32_t hcrc = 0, dcrc = 0;
    std::memcpy(&n, header.data(), 8);
    std::memcpy(&hcrc, bytes.data() + pos + 8, 4);
    if (hcrc != masked_crc(header)) throw Error(path + ": bad length CRC at byte " + std::to_string(pos));
    if (pos + 12 + n + 4 > bytes.size()) throw Error(path + ": torn record at byte " + std::to_string(pos));
    const std::string data = bytes.substr(pos + 12, n);
    std::memcpy(&dcrc, bytes.data() + pos + 12 + n, 4);
    if (dcrc != masked_crc(data)) throw Error(path + ": bad data CRC at byte " + std::to_string(pos));
    pos += 12 + n + 4;

    WireReader ev{data, 0, data.size(), path};
    double wall = 0;
    int64_t step = 0;
    std::vector<std::pair<std::string, double>> values;
    while (!ev.done()) {
      const uint64_t key = ev.varint();
      const int field = int(key >> 3), wire = int(key & 7);
      if (field == 1 && wire == 1) {
        wall = ev.fixed<double>();
      } else if (field == 2 && wire == 0) {
        step = static_cast<int64_t>(ev.varint());
      } else if (field == 5 && wire == 2) {
        WireReader summary = ev.sub();
        while (!summary.done()) {
          const uint64_t k = summary.varint();
          if ((k >> 3) != 1 || (k & 7) != 2) {
            summary.skip(int(k & 7));
            continue;
          }
          WireReader value = summary.sub();
          std::string tag;
          double v = NAN;
          while (!value.done()) {
            const uint64_t vk = value.varint();
            if ((vk >> 3) == 1 && (vk & 7) == 2) {
              WireReader t = value.sub();
              tag = data.substr(t.pos, t.end - t.pos);
            } else if ((vk >> 3) == 2 && (vk & 7) == 5) {
              v = value.fixed<float>();
            } else {
              value.skip(int(vk & 7));
            }
          }
          values.emplace_back(tag, v);
        }
      } else {
        ev.skip(wire);
      }
    }
    for (auto& [tag, v] : values) out.push_back({tag, v, step, wall});
  }
  return out;
}

}  // namespace headroom::train
