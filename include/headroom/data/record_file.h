// TFRecord files: the record framing TensorFlow data sets and TensorBoard event files share.
// Each record is [u64 length][u32 masked CRC-32C of the length][data][u32 masked CRC-32C of
// the data], little-endian. Readers check both checksums and name the file and byte offset of
// anything wrong; writers append whole records.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "headroom/core/errors.h"

namespace headroom::data {

// A record that cannot be used: bad length CRC, bad data CRC, or the file ends inside it. The
// message names the file and the record's byte offset.
class RecordError : public InputError {
 public:
  RecordError(const std::string& file, int64_t offset, const std::string& reason);
  int64_t offset() const { return offset_; }
  const std::string& reason() const { return reason_; }  // what is wrong, without file and offset

 private:
  int64_t offset_;
  std::string reason_;
};


// Where one record lies in its file.
struct RecordSpan {
  int64_t offset = 0;  // of the length field
  int64_t length = 0;  // of the data
};

// Random access to the records of one file: reads are preads at the record's offset, so threads
// may share a reader.
class RecordReader {
 public:
  explicit RecordReader(std::string path);  // InputError when the file cannot be opened
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // The data of the record at `offset`, both checksums checked. RecordError otherwise.
  std::string read(int64_t offset) const;
  // Every record's span, from the headers alone (the data is skipped, not read): the index of
  // a file. A bad length CRC or a record cut off by the end of the file ends it: framing is
  // lost there, so `error` says where and the spans before it are kept.
  struct Index {
    std::vector<RecordSpan> spans;
    std::optional<RecordError> error;  // empty when the whole file was read
  };
  Index index() const;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }

 private:
  // The data length of the record at `offset`, its header checked.
  int64_t length_at(int64_t offset) const;
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Appends records to a file (created, or continued from `keep_bytes` bytes when >= 0: what
// followed is cut off). Error naming the file when the disk refuses.
class RecordWriter {
 public:
  explicit RecordWriter(std::string path, int64_t keep_bytes = -1);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  void write(const std::string& data);
  void flush();
  int64_t bytes() const { return bytes_; }  // the file's length after the last write
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace headroom::data
