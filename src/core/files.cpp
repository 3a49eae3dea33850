#include "headroom/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "headroom/core/errors.h"

namespace headroom {

namespace fs = std::filesystem;

void fsync_path(const std::string& path, bool is_directory) {
  const int fd = ::open(path.c_str(), is_directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(err));
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp =
      (dir / ("." + target.filename().string() + ".tmp" + std::to_string(::getpid()) + "." +
              std::to_string(std::random_device{}())))
          .string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(path + ": write failed (" + std::strerror(err) + "); the previous file is untouched");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": flush failed (" + std::strerror(err) + "); the previous file is untouched");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": rename failed (" + std::strerror(err) + ")");
  }
  fsync_path(dir.string(), true);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the file (does it exist, is it readable?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace headroom
