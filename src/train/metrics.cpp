#include "headroom/train/metrics.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "headroom/data/record_file.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/proto/event.pb.h"

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

// --- TensorBoard events: Event messages in TFRecord framing ---

namespace {

std::string event(double wall_time, int64_t step, const std::string* file_version, const Scalars* values) {
  tf::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  if (file_version) e.set_file_version(*file_version);
  if (values) {
    tf::Summary* summary = e.mutable_summary();
    for (const auto& [tag, v] : *values) {
      tf::Summary::Value* value = summary->add_value();
      value->set_tag(tag);
      value->set_simple_value(static_cast<float>(v));
    }
  }
  return e.SerializeAsString();
}

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
  if (int64_t(size) > bytes)
    spdlog::info("{}: events written after the checkpoint (by the run it replaces) cut off", path);
  file_ = std::make_unique<data::RecordWriter>(path, bytes);
}

void TensorBoardWriter::create(const std::string& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  file_ = std::make_unique<data::RecordWriter>(
      dir + "/events.out.tfevents." + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
      "." + host + "." + std::to_string(::getpid()));
  const std::string version = "brain.Event:2";
  file_->write(event(std::chrono::duration<double>(now).count(), 0, &version, nullptr));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() = default;

void TensorBoardWriter::add_scalars(const Scalars& values, int64_t step, double wall_time) {
  file_->write(event(wall_time, step, nullptr, &values));
}

void TensorBoardWriter::flush() { file_->flush(); }

const std::string& TensorBoardWriter::path() const { return file_->path(); }
int64_t TensorBoardWriter::bytes() const { return file_->bytes(); }

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path) {
  const data::RecordReader reader(path);
  const data::RecordReader::Index index = reader.index();
  if (index.error) throw *index.error;
  std::vector<TensorBoardScalar> out;
  for (const data::RecordSpan& span : index.spans) {
    tf::Event e;
    if (!e.ParseFromString(reader.read(span.offset)))
      throw data::RecordError(path, span.offset, "not a TensorBoard Event message");
    if (!e.has_summary()) continue;
    for (const auto& v : e.summary().value())
      out.push_back({v.tag(), v.has_simple_value() ? double(v.simple_value()) : double(NAN), e.step(), e.wall_time()});
  }
  return out;
}

}  // namespace headroom::train
