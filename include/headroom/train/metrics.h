// What a run records per epoch: results.csv (one row per epoch, columns fixed by the first row)
// and TensorBoard event files (TFRecord framing with masked CRC-32C around Event protocol
// buffers, encoded here in the protobuf wire format: no protobuf library to match versions with).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace headroom::train {

using Scalars = std::vector<std::pair<std::string, double>>;  // name -> value, in column order

class CsvWriter {
 public:
  explicit CsvWriter(std::string path) : path_(std::move(path)) {}
  // Appends a row; the first row fixes the header (a resumed run appends to the same file).
  void append(const Scalars& row);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Reads results.csv back: header and rows.
std::pair<std::vector<std::string>, std::vector<std::vector<double>>> read_csv(const std::string& path);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host> and writes the file-version event.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void add_scalars(const Scalars& values, int64_t step, double wall_time);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

struct TensorBoardScalar {
  std::string tag;
  double value = 0;
  int64_t step = 0;
  double wall_time = 0;
};
// Every scalar of an event file; throws Error naming the file at a bad CRC or a torn record.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path);

uint32_t crc32c(const uint8_t* data, size_t size);

}  // namespace headroom::train
