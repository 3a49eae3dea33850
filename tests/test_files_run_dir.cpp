#include <gtest/gtest.h>

#include <filesystem>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/run_dir.h"
#include "test_util.h"

using namespace headroom;
namespace fs = std::filesystem;

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

TEST(RunDir, PicksAFreshNameUnlessReuseIsAsked) {
  const std::string project = test::temp_dir("runs");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp2");
  EXPECT_EQ(create_run_dir(project, "exp", false), project + "/exp3");
  EXPECT_EQ(create_run_dir(project, "exp", true), project + "/exp");
}

TEST(RunDir, HoldsTheResolvedConfigAndTheLog) {
  init_logging("info");
  const std::string project = test::temp_dir("runs");
  const Config c = load_config("", {"project=" + project, "name=demo", "train.batch=5"});
  const std::string dir = open_run_dir(c);
  spdlog::info("a line for the log file");
  spdlog::default_logger()->flush();
  EXPECT_EQ(dir, project + "/demo");
  const Config back = load_config(dir + "/config.yaml");
  EXPECT_EQ(back.train.batch, 5);
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(c));
  EXPECT_NE(read_file(dir + "/train.log").find("a line for the log file"), std::string::npos);
  init_logging("info");  // detach the file sink
}
