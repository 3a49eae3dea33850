// File helpers with the guarantees the rest relies on: whole-or-nothing writes.
#pragma once

#include <cstddef>
#include <string>

namespace headroom {

// A file written whole or not at all, streamed: bytes go to a temporary file in the target's
// folder; commit() fsyncs it, renames it over the target and fsyncs the folder, so readers see
// the old file or the new one, never a torn one. Destroyed without commit (an exception while
// writing), the temporary file is removed and the target is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t size);  // Error naming the target when the disk refuses
  void commit();
  const std::string& path() const { return path_; }

 private:
  void discard();
  std::string path_, tmp_;
  int fd_ = -1;
};

// InputError when the folder `path` would be written into is not there or `path` is a folder:
// a command checks its output before the work whose result it would lose.
void check_output_file(const std::string& path);

// This machine's host name ("" when it has none).
std::string host_name();

// A fresh name beside `target` for writing it before the rename: the name AtomicFile uses, which
// remove_abandoned_temporaries recognises (".<name>.tmp<pid>@<host>.<random>").
std::string temporary_path(const std::string& target);

// Removes from `dir` the temporary files of AtomicFiles whose process is gone (killed while it
// wrote: a checkpoint's can be gigabytes); those of live processes stay, and those of other
// hosts (a shared file system: their pids mean nothing here). Returns how many.
int remove_abandoned_temporaries(const std::string& dir);

// An exclusive flock on `path` (created when missing), held until destroyed; the kernel drops it
// when the process ends, killed too. `wait` blocks while another process holds it; without wait
// that is state() busy. A file system without flock (NFS nolock, some FUSE) gives unsupported
// (error() says why): the caller decides whether to go on unlocked. Throws Error naming the file
// when it cannot be opened.
class FileLock {
 public:
  enum class State { held, busy, unsupported };
  FileLock(const std::string& path, bool wait);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  State state() const { return state_; }
  int error() const { return error_; }
  int fd() const { return fd_; }  // the lock file, open read-write

 private:
  int fd_ = -1;
  State state_ = State::held;
  int error_ = 0;
};

// The same for contents already in memory.
void write_file_atomic(const std::string& path, const std::string& contents);

// A copy of `from` at `to`, streamed, whole or not at all.
void copy_file_atomic(const std::string& from, const std::string& to);

// The whole file; throws InputError naming the file when it cannot be read.
std::string read_file(const std::string& path);

// fsync of a file or folder by path (throws on failure).
void fsync_path(const std::string& path, bool is_directory);

}  // namespace headroom
