#include "headroom/core/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"

namespace headroom {

namespace fs = std::filesystem;

std::string create_run_dir(const std::string& project, const std::string& name, bool exist_ok) {
  std::error_code ec;
  if (fs::exists(project, ec) && !fs::is_directory(project, ec))
    throw InputError(project + ": the project is a file, not a folder; give project=<a folder>");
  fs::create_directories(project, ec);
  if (ec) throw InputError(project + ": cannot create the project folder: " + ec.message() + "; give project=<a folder you can write>");
  fs::path dir = fs::path(project) / name;
  if (exist_ok) {
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
      throw InputError(dir.string() + ": a file is there, not a run folder; give another name=");
    fs::create_directories(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot create the run folder: " + ec.message());
    return dir.string();
  }
  // create_directory is atomic: two runs started together never share a folder. A file of the
  // name is passed over, as a folder is.
  for (int n = 1; n < 100000; ++n) {
    dir = fs::path(project) / (n == 1 ? name : name + std::to_string(n));
    if (fs::create_directory(dir, ec)) return dir.string();
    if (ec && !fs::exists(dir)) throw Error(dir.string() + ": cannot create the run folder: " + ec.message());
  }
  throw Error(project + ": no free run name for '" + name + "'");
}

RunDirLock::RunDirLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  lock_ = std::make_unique<FileLock>(path, false);
  const int fd = lock_->fd();
  switch (lock_->state()) {
    case FileLock::State::unsupported:
      spdlog::warn("{}: this file system cannot lock the run folder ({}); nothing stops a second trainer from writing here",
                   path, std::strerror(lock_->error()));
      lock_.reset();
      return;
    case FileLock::State::busy: {
      char holder[256] = {};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string();
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      throw InputError(dir + ": another trainer is writing in this run folder" + (who.empty() ? "" : " (" + who + ")") +
                       ", and two runs in one folder would write over each other's checkpoints and log. Wait for it to end "
                       "or stop it, or give this run another name (name=...; exist_ok=false picks a fresh folder)");
    }
    case FileLock::State::held: break;
  }
  const std::string me = "process " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  // Only a note for the message above: the flock is the lock, so a failed write is harmless.
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size()))
    spdlog::debug("{}: could not record the lock's holder", path);
}

std::string open_run_dir(const Config& c, std::unique_ptr<RunDirLock>& lock) {
  const std::string dir = create_run_dir(c.project, c.name, c.exist_ok);
  lock = std::make_unique<RunDirLock>(dir);  // before config.yaml: a run already there keeps its own
  write_file_atomic((fs::path(dir) / "config.yaml").string(), config_to_yaml(c));
  add_log_file((fs::path(dir) / "train.log").string());
  spdlog::info("run directory: {}", dir);
  return dir;
}

}  // namespace headroom
