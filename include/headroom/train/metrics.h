// What a run records per epoch: results.csv (one row per epoch, columns fixed by the first row)
// and TensorBoard event files (TFRecord framing around Event protocol buffers).
// Both know their position, so a checkpoint can record it and a resume continue from there.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace headroom::data {
class RecordWriter;
}

namespace headroom::train {

using Scalars = std::vector<std::pair<std::string, double>>;  // name -> value, in column order

class CsvWriter {
 public:
  // Appends to `path` (a resumed run continues its file); counts the rows already there.
  explicit CsvWriter(std::string path);
  // Appends a row; the first row fixes the header.
  void append(const Scalars& row);
  // Rows in the file (not counting the header): what a checkpoint records.
  int64_t rows() const { return rows_; }
  // A resume from a checkpoint that recorded `rows`: rows written after it belong to the run
  // being replaced and are dropped (the file is rewritten whole or not at all).
  void keep_rows(int64_t rows);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t rows_ = 0;
};

// Reads results.csv back: header and rows.
std::pair<std::vector<std::string>, std::vector<std::vector<double>>> read_csv(const std::string& path);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid> and writes the file-version event.
  explicit TensorBoardWriter(const std::string& dir);
  // Continues `file` (a name in `dir`) of a resumed run from byte `bytes`, where its checkpoint
  // left it: events written after that belong to the run being replaced and are cut off. A new
  // file when that one is gone or shorter.
  TensorBoardWriter(const std::string& dir, const std::string& file, int64_t bytes);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void add_scalars(const Scalars& values, int64_t step, double wall_time);
  void flush();
  const std::string& path() const;
  int64_t bytes() const;  // written so far, all flushed

 private:
  void create(const std::string& dir);
  std::unique_ptr<data::RecordWriter> file_;
};

struct TensorBoardScalar {
  std::string tag;
  double value = 0;
  int64_t step = 0;
  double wall_time = 0;
};
// Every scalar of an event file; throws Error naming the file at a bad CRC or a torn record.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path);

}  // namespace headroom::train
