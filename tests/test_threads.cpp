#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <stdexcept>

#include "headroom/core/threads.h"

using namespace headroom;

TEST(Threads, IntraOpThreadsAreSetExplicitly) {
  EXPECT_EQ(set_intra_op_threads(AutoInt{false, 1}), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(set_intra_op_threads(AutoInt{}), available_cores());
  EXPECT_EQ(at::get_num_threads(), available_cores());
  EXPECT_EQ(resolve_workers(AutoInt{false, 0}), 0);
  EXPECT_EQ(resolve_workers(AutoInt{}), std::min(available_cores(), 8));
}

TEST(Threads, ParallelForCoversEveryIndexAndRethrows) {
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, 4, [&](int64_t i) { ++hits[size_t(i)]; });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(parallel_for(100, 3, [](int64_t i) { if (i == 42) throw std::runtime_error("x"); }), std::runtime_error);
}
