#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/run_dir.h"
#include "test_util.h"

using namespace headroom;
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_fail_fsync{false};

int open_descriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}
}  // namespace

// The C library's fsync as this test binary sees it: Headroom's files.cpp (linked statically)
// calls this one, which fails on request like a disk that reports EIO, and passes through
// otherwise.
extern "C" int fsync(int fd) {
  if (g_fail_fsync.load()) {
    errno = EIO;
    return -1;
  }
  return int(::syscall(SYS_fsync, fd));
}

TEST(Files, AtomicWriteReplacesWholeAndLeavesNoTemporaries) {
  const std::string dir = test::temp_dir("atomic");
  const std::string path = dir + "/f.txt";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_file_atomic(dir + "/missing/f.txt", "x"), Error);
  EXPECT_EQ(read_file(path), "second, longer");
}

// A failed fsync leaves the previous file whole, no temporary file, and no descriptor open.
TEST(Files, AFailedFsyncKeepsTheOldFileAndLeaksNoDescriptor) {
  const std::string dir = test::temp_dir("fsync");
  const std::string path = dir + "/f.txt";
  write_file_atomic(path, "kept");
  const int before = open_descriptors();
  g_fail_fsync = true;
  for (int i = 0; i < 3; ++i) EXPECT_THROW(write_file_atomic(path, "lost"), Error);
  try {
    AtomicFile f(dir + "/g.txt");
    f.write("abc", 3);
    f.commit();
    ADD_FAILURE() << "commit succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flush failed"), std::string::npos) << e.what();
  }
  g_fail_fsync = false;
  EXPECT_EQ(open_descriptors(), before);
  EXPECT_EQ(read_file(path), "kept");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

// Streamed writes, a copy, and a writer dropped before its commit.
TEST(Files, AtomicFilesStreamCopyAndVanishWhenNotCommitted) {
  const std::string dir = test::temp_dir("stream");
  {
    AtomicFile f(dir + "/a.bin");
    for (int i = 0; i < 1000; ++i) f.write("0123456789", 10);
    f.commit();
  }
  EXPECT_EQ(fs::file_size(dir + "/a.bin"), 10000u);
  copy_file_atomic(dir + "/a.bin", dir + "/b.bin");
  EXPECT_EQ(read_file(dir + "/b.bin"), read_file(dir + "/a.bin"));
  {
    AtomicFile f(dir + "/b.bin");
    f.write("x", 1);
  }  // not committed: b.bin keeps its contents, and no temporary file remains
  EXPECT_EQ(fs::file_size(dir + "/b.bin"), 10000u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

// The temporaries of processes that are gone (killed while they wrote) are removed; a live
// process's, another host's on a shared file system (its pid means nothing here), and every
// other file stay.
TEST(Files, RemovesTheTemporariesOfProcessesThatAreGone) {
  const std::string dir = test::temp_dir("abandoned");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // gone
  const std::string gone = std::to_string(child);
  const std::string dead = dir + "/.last.pt.tmp" + gone + "@" + host_name() + ".123",
                    earlier = dir + "/.step_1.pt.tmp" + gone + ".5",  // named before the host was
                    live = dir + "/.best.pt.tmp" + std::to_string(::getpid()) + "@" + host_name() + ".7",
                    elsewhere = dir + "/.val.64.hrcache.tmp" + gone + "@another-host.9";
  for (const std::string& f : {dead, earlier, live, elsewhere, dir + "/last.pt", dir + "/.hidden.tmp"}) test::write_bytes(f, "x");
  EXPECT_EQ(remove_abandoned_temporaries(dir), 2);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(earlier));
  for (const std::string& f : {live, elsewhere, dir + "/last.pt", dir + "/.hidden.tmp"}) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_NE(temporary_path(dir + "/last.pt").find("/.last.pt.tmp" + std::to_string(::getpid()) + "@" + host_name() + "."),
            std::string::npos);
}

TEST(RunDir, PicksAFreshNameUnlessReuseIsAsked) {
  const std::string project = test::temp_dir("runs");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp2");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp3");
  EXPECT_EQ(create_run_dir(project, "exp", true), project + "/exp");
  // A file of the name is passed over as a folder is; a file as the project or the reused run
  // folder is the user's input, said so (exit code 2), not an I/O error.
  test::write_bytes(project + "/file", "");
  EXPECT_EQ(create_run_dir(project, "file", false), project + "/file2");
  EXPECT_NE(test::input_error_of([&] { create_run_dir(project, "file", true); }).find("a file is there"), std::string::npos);
  EXPECT_NE(test::input_error_of([&] { create_run_dir(project + "/file", "exp", false); }).find("the project is a file"), std::string::npos);
}

// One holder at a time, named to the next; released with its owner, as the kernel releases a
// killed process's (the kill-and-resume tests resume into the folder of a killed run).
TEST(RunDir, OneRunHoldsItsFolderAtATime) {
  const std::string dir = test::temp_dir("run-lock");
  {
    RunDirLock held(dir);
    const std::string error = test::input_error_of([&] { RunDirLock again(dir); });
    EXPECT_NE(error.find(dir + ": another trainer is writing in this run folder (process " + std::to_string(::getpid()) + " on "),
              std::string::npos) << error;
    EXPECT_NE(error.find("give this run another name"), std::string::npos) << error;
  }
  EXPECT_EQ(test::input_error_of([&] { RunDirLock again(dir); }), "");
}

TEST(RunDir, HoldsTheResolvedConfigAndTheLog) {
  init_logging("info");
  const std::string project = test::temp_dir("runs");
  const Config c = load_config("", {"project=" + project, "name=demo", "train.batch=5"});
  std::unique_ptr<RunDirLock> lock;
  const std::string dir = open_run_dir(c, lock);
  ASSERT_TRUE(lock);
  spdlog::info("a line for the log file");
  spdlog::default_logger()->flush();
  EXPECT_EQ(dir, project + "/demo");
  const Config back = load_config(dir + "/config.yaml");
  EXPECT_EQ(back.train.batch, 5);
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(c));
  EXPECT_NE(read_file(dir + "/train.log").find("a line for the log file"), std::string::npos);
  init_logging("info");  // detach the file sink
}

// LibTorch's warnings reach the run's log, each message once and named as LibTorch's; the
// beta notice LibTorch 1.13 gives for the assigner's scatter_reduce does not.
TEST(RunDir, TheLogTakesLibTorchsWarningsOnceEach) {
  init_logging("info");
  const std::string path = test::temp_dir("torch-warnings") + "/train.log";
  add_log_file(path);
  for (int i = 0; i < 3; ++i) TORCH_WARN("a warning raised ", "in LibTorch");
  const at::Tensor summed = at::zeros({2}).scatter_reduce(0, at::tensor(std::vector<int64_t>{0, 0, 1}), at::ones({3}), "sum");
  spdlog::default_logger()->flush();
  init_logging("info");  // detach the file sink
  EXPECT_EQ(summed[0].item<float>(), 2.0f);
  const std::string text = read_file(path);
  const std::string line = "LibTorch: a warning raised in LibTorch (";
  const size_t first = text.find(line);
  EXPECT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find(line, first + 1), std::string::npos) << text;
  EXPECT_EQ(text.find("scatter_reduce"), std::string::npos) << text;
}
