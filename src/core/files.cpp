#include "headroom/core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <vector>

#include "headroom/core/errors.h"

namespace headroom {

namespace fs = std::filesystem;

namespace {
// close() after a failed fsync still releases the descriptor; its own error is secondary.
int close_keeping_errno(int fd) {
  const int err = errno;
  const int rc = ::close(fd);
  errno = err;
  return rc;
}
}  // namespace

void fsync_path(const std::string& path, bool is_directory) {
  const int fd = ::open(path.c_str(), is_directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(err));
}

FileLock::FileLock(const std::string& path, bool wait) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot open the lock file: " + std::strerror(errno));
  int r;
  do r = ::flock(fd_, LOCK_EX | (wait ? 0 : LOCK_NB));
  while (r != 0 && errno == EINTR);
  if (r == 0) return;
  error_ = errno;
  if (error_ == EWOULDBLOCK) {
    state_ = State::busy;
  } else if (error_ == ENOLCK || error_ == ENOSYS || error_ == EOPNOTSUPP || error_ == EINVAL) {
    state_ = State::unsupported;
  } else {
    ::close(fd_);
    throw Error(path + ": cannot lock: " + std::strerror(error_));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

std::string host_name() {
  char host[256] = {};
  return ::gethostname(host, sizeof host - 1) == 0 ? std::string(host) : std::string();
}

std::string temporary_path(const std::string& target) {
  const fs::path t(target);
  const fs::path dir = t.has_parent_path() ? t.parent_path() : fs::path(".");
  return (dir / ("." + t.filename().string() + ".tmp" + std::to_string(::getpid()) + "@" + host_name() + "." +
                 std::to_string(std::random_device{}())))
      .string();
}

void check_output_file(const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(target, ec)) throw InputError(path + ": a folder is there; give a file name");
  if (!fs::is_directory(dir, ec))
    throw InputError(path + ": cannot create it: its folder " + dir.string() + " does not exist (create it, or write elsewhere)");
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(temporary_path(path_)) {
  check_output_file(path_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd_ < 0) {
    const int err = errno;
    tmp_.clear();
    check_output_file(path_);  // the folder may have gone since
    const fs::path target(path_);
    throw Error(path_ + ": cannot create it in " + (target.has_parent_path() ? target.parent_path() : fs::path(".")).string() + ": " +
                std::strerror(err));
  }
}

AtomicFile::~AtomicFile() { discard(); }

int remove_abandoned_temporaries(const std::string& dir) {
  static const std::regex kTemporary(R"(\..+\.tmp([0-9]+)(@(.*))?\.[0-9]+)");  // AtomicFile's names (earlier ones without a host)
  const std::string here = host_name();
  int removed = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = f.path().filename().string();
    if (!std::regex_match(name, m, kTemporary) || (m[2].matched && m[3].str() != here)) continue;
    const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
    if (pid <= 0 || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH)) removed += fs::remove(f.path(), ec) ? 1 : 0;
  }
  return removed;
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void AtomicFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      discard();
      throw Error(path_ + ": write failed (" + std::strerror(err) + "); the previous file is untouched");
    }
    p += n;
    size -= size_t(n);
  }
}

void AtomicFile::commit() {
  const int synced = ::fsync(fd_);
  const int closed = synced == 0 ? ::close(fd_) : close_keeping_errno(fd_);
  fd_ = -1;
  if (synced != 0 || closed != 0) {
    const int err = errno;
    discard();
    throw Error(path_ + ": flush failed (" + std::strerror(err) + "); the previous file is untouched");
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    throw Error(path_ + ": rename failed (" + std::strerror(err) + ")");
  }
  tmp_.clear();
  const fs::path target(path_);
  fsync_path(target.has_parent_path() ? target.parent_path().string() : std::string("."), true);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

void copy_file_atomic(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw Error(from + ": cannot open the file to copy it");
  AtomicFile out(to);
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    if (in.gcount() > 0) out.write(buf.data(), size_t(in.gcount()));
  }
  if (in.bad()) throw Error(from + ": reading failed while copying it to " + to);
  out.commit();
}

std::string read_file(const std::string& path) {
  // A pipe (a config given as <(...)) gives its bytes once: what it gave is kept for the next
  // reader, or the config sniffed first as a pipeline.config would then read as empty.
  // Keyed by the pipe itself (device and inode), not its name: /dev/fd/N is reused by later pipes.
  static std::mutex mutex;
  static std::map<std::pair<dev_t, ino_t>, std::string> pipes;
  struct stat st {};
  const bool pipe = ::stat(path.c_str(), &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode));
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (pipe) {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = pipes.find(id); it != pipes.end()) return it->second;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the file (does it exist, is it readable?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (pipe) {
    std::lock_guard<std::mutex> lock(mutex);
    pipes[id] = ss.str();
  }
  return ss.str();
}

}  // namespace headroom
