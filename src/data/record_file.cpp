#include "headroom/data/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "headroom/core/checksum.h"

namespace headroom::data {

RecordError::RecordError(const std::string& file, int64_t offset, const std::string& reason)
    : InputError(file + ": record at byte " + std::to_string(offset) + ": " + reason), offset_(offset), reason_(reason) {}

namespace {
constexpr int64_t kHeader = 12, kFooter = 4;

// Reads exactly n bytes at `offset` for the record at `record`: false at the end of the file, a
// RecordError when the system refuses (an I/O error is not a truncated file).
bool read_at(const std::string& path, int fd, void* out, size_t n, int64_t offset, int64_t record) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw RecordError(path, record, std::string("read error: ") + std::strerror(errno));
    if (got == 0) return false;
    p += got, n -= size_t(got), offset += got;
  }
  return true;
}
}  // namespace

RecordReader::RecordReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  const bool opened = fd_ >= 0 && ::fstat(fd_, &st) == 0;
  if (opened && S_ISREG(st.st_mode)) {
    size_ = st.st_size;
    return;
  }
  const std::string why = !opened ? std::strerror(errno) : S_ISDIR(st.st_mode) ? "it is a folder" : "not a regular file";
  if (fd_ >= 0) ::close(fd_);
  throw InputError(path_ + ": cannot open the TFRecord file: " + why);
}

RecordReader::~RecordReader() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t RecordReader::length_at(int64_t offset) const {
  unsigned char h[kHeader];
  if (offset + kHeader > size_ || !read_at(path_, fd_, h, kHeader, offset, offset))
    throw RecordError(path_, offset, "the file ends inside the record's header (truncated file)");
  uint64_t n = 0;
  uint32_t crc = 0;
  std::memcpy(&n, h, 8);
  std::memcpy(&crc, h + 8, 4);
  if (crc != masked_crc32c(h, 8))
    throw RecordError(path_, offset, "bad length CRC (not a TFRecord file, or corrupt)");
  if (n > uint64_t(size_) || offset + kHeader + int64_t(n) + kFooter > size_)
    throw RecordError(path_, offset, "the file ends inside the record's " + std::to_string(n) + " bytes (truncated file)");
  return int64_t(n);
}

std::string RecordReader::read(int64_t offset) const {
  const int64_t n = length_at(offset);
  std::string data(size_t(n) + kFooter, '\0');
  if (!read_at(path_, fd_, data.data(), data.size(), offset + kHeader, offset))
    throw RecordError(path_, offset, "the file ends inside the record (it shrank after it was indexed)");
  uint32_t crc = 0;
  std::memcpy(&crc, data.data() + n, 4);
  data.resize(size_t(n));
  if (crc != masked_crc32c(data.data(), data.size())) throw RecordError(path_, offset, "bad data CRC (corrupt record)");
  return data;
}

RecordReader::Index RecordReader::index() const {
  Index out;
  int64_t offset = 0;
  try {
    while (offset < size_) {
      const int64_t n = length_at(offset);
      out.spans.push_back({offset, n});
      offset += kHeader + n + kFooter;
    }
  } catch (const RecordError& e) {
    out.error = e;
  }
  return out;
}

RecordWriter::RecordWriter(std::string path, int64_t keep_bytes) : path_(std::move(path)) {
  if (keep_bytes >= 0) {
    if (::truncate(path_.c_str(), static_cast<off_t>(keep_bytes)) != 0)
      throw Error(path_ + ": cannot cut the file back to " + std::to_string(keep_bytes) + " bytes: " + std::strerror(errno));
    file_ = std::fopen(path_.c_str(), "ab");
    bytes_ = keep_bytes;
  } else {
    file_ = std::fopen(path_.c_str(), "wb");
  }
  if (!file_) throw Error(path_ + ": cannot write the TFRecord file: " + std::strerror(errno));
}

RecordWriter::~RecordWriter() {
  if (file_) std::fclose(file_);
}

void RecordWriter::write(const std::string& data) {
  unsigned char h[kHeader];
  const uint64_t n = data.size();
  std::memcpy(h, &n, 8);
  const uint32_t hcrc = masked_crc32c(h, 8), dcrc = masked_crc32c(data.data(), data.size());
  std::memcpy(h + 8, &hcrc, 4);
  const bool ok = std::fwrite(h, 1, kHeader, file_) == size_t(kHeader) &&
                  std::fwrite(data.data(), 1, data.size(), file_) == data.size() &&
                  std::fwrite(&dcrc, 1, kFooter, file_) == size_t(kFooter);
  if (!ok) throw Error(path_ + ": writing a record failed (disk full?)");
  bytes_ += kHeader + int64_t(data.size()) + kFooter;
}

void RecordWriter::flush() {
  if (std::fflush(file_) != 0) throw Error(path_ + ": writing the records failed (disk full?)");
}

}  // namespace headroom::data
