// Checkpoints written behind the training: a file holds the state of the moment it was asked
// for while the next steps change that state, failures surface, a snapshot that does not fit
// the budget is not taken, and a process killed while a file is being written leaves every
// checkpoint loadable and the run resumable.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <signal.h>
#include <torch/serialize/input-archive.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "headroom/core/errors.h"
#include "headroom/models/weights.h"
#include "headroom/train/checkpoint_writer.h"
#include "headroom/train/checkpoints.h"
#include "headroom/train/trainer.h"
#include "test_util.h"
#include "train_util.h"

#ifdef HEADROOM_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "headroom/core/device.h"
#include "headroom/memory/monitor.h"
#endif

using namespace headroom;
using namespace headroom::test;
namespace fs = std::filesystem;

namespace {

at::Tensor read_tensor(torch::serialize::InputArchive& a, const std::string& key) {
  at::Tensor t;
  a.read(key, t);
  return t;
}

}  // namespace

TEST(Checkpoint, AFileHoldsTheTensorsAsTheyWereWhenWriteReturned) {
  const std::string dir = temp_dir("ck-snapshot"), path = dir + "/a.pt";
  at::Tensor big = at::arange(int64_t{8} << 20, at::kFloat), small = at::ones({3});
  {
    torch::serialize::OutputArchive root, nested;
    root.write("big", big);
    nested.write("small", small, /*is_buffer=*/true);
    root.write("nested", nested);
    root.write("alias", big.narrow(0, 16, 4));  // a view of the same storage: written once, still a view
    EXPECT_EQ(train::archive_tensor_bytes(root), (int64_t{8} << 20) * 4 + 12);
    train::CheckpointWriter w;
    w.write(std::move(root), path, "{}");
    // What the next steps do to the live state while the thread writes.
    for (int i = 0; i < 20; ++i) big.add_(1), small.mul_(2);
    w.wait();
  }
  torch::serialize::InputArchive in, nested;
  models::load_archive_verified(in, path, c10::Device(c10::kCPU), "checkpoint");
  const at::Tensor read_big = read_tensor(in, "big"), alias = read_tensor(in, "alias");
  EXPECT_TRUE(at::equal(read_big, at::arange(int64_t{8} << 20, at::kFloat)));
  EXPECT_TRUE(at::equal(alias, at::arange(16, 20, at::kFloat)));
  EXPECT_EQ(alias.storage().unsafeGetStorageImpl(), read_big.storage().unsafeGetStorageImpl());
  EXPECT_LT(fs::file_size(path), size_t(8 << 20) * 4 + 4096) << "the shared storage was written twice";
  in.read("nested", nested);
  at::Tensor s;
  nested.read("small", s, /*is_buffer=*/true);
  EXPECT_TRUE(at::equal(s, at::ones({3})));
}

#ifdef HEADROOM_WITH_CUDA
namespace {

// A CUDA write with sync-debug mode set to error (a host sync throws), then the next steps'
// kernels queued behind it, changing the tensor in place (x 1.5 rounds the same on both devices).
void write_then_change(train::CheckpointWriter& w, at::Tensor& big, const std::string& path, bool stage) {
  torch::serialize::OutputArchive root;
  root.write("big", big);
  root.write("alias", big.narrow(0, 16, 4));  // the same storage: copied once
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  try {
    w.write(std::move(root), path, "{}", {}, stage);
    for (int i = 0; i < 20; ++i) big.mul_(1.5);
  } catch (...) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    throw;
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  w.wait();
}

void expect_file_holds(const std::string& path, const at::Tensor& expected) {
  torch::serialize::InputArchive in;
  models::load_archive_verified(in, path, c10::Device(c10::kCPU), "checkpoint");
  EXPECT_TRUE(at::equal(read_tensor(in, "big"), expected)) << path;
  EXPECT_TRUE(at::equal(read_tensor(in, "alias"), expected.narrow(0, 16, 4))) << path;
}

}  // namespace

// On CUDA the snapshot is queued on the stream behind the work that made the tensors and ahead
// of the kernels that change them next, with no host sync, into pinned buffers that the next
// write reuses. Staged, the state is first copied on the device (held there until the transfer
// is done, then given back) and the transfer runs on a stream of its own.
TEST(Checkpoint, ACudaSnapshotIsQueuedOnTheStreamWithoutAHostSync) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const std::string dir = temp_dir("ck-cuda");
  const c10::Device cuda(c10::kCUDA, 0);
  const int64_t n = int64_t{8} << 20, bytes = n * 4;
  at::Tensor big = at::arange(n, at::TensorOptions().dtype(at::kFloat).device(cuda)), expected = at::arange(n, at::kFloat);
  const auto monitor = memory::make_memory_monitor(cuda);
  train::CheckpointWriter w;
  for (int round = 0; round < 4; ++round) {
    const bool stage = round >= 2;
    const std::string path = dir + "/" + std::to_string(round) + ".pt";
    monitor->release_cache();
    monitor->reset_peak();
    const MemoryStats before = monitor->sample();
    write_then_change(w, big, path, stage);
    const MemoryStats after = monitor->sample();
    if (stage) {  // one copy of the storage; the allocator may round a block up
      EXPECT_GE(after.peak_allocated - before.allocated, bytes) << "round " << round << ": not staged";
      EXPECT_LT(after.peak_allocated - before.allocated, bytes + (2 << 20)) << "round " << round;
    } else {
      EXPECT_EQ(after.peak_allocated, before.allocated) << "round " << round;
    }
    EXPECT_EQ(after.allocated, before.allocated) << "round " << round << ": the staged copy was not given back";
    expect_file_holds(path, expected);
    for (int i = 0; i < 20; ++i) expected.mul_(1.5);
  }
  // No room on the device for the staged copy: the transfer goes on the compute stream, for this
  // write and every later one (an out-of-memory error costs the allocator's cache each time).
  for (int round = 0; round < 2; ++round) {
    monitor->release_cache();
    monitor->reset_peak();
    const MemoryStats before = monitor->sample();
    if (round == 0) monitor->set_limit(before.reserved + bytes / 2);
    try {
      write_then_change(w, big, dir + "/tight" + std::to_string(round) + ".pt", /*stage=*/true);
    } catch (...) {
      monitor->set_limit(0);
      throw;
    }
    monitor->set_limit(0);
    EXPECT_EQ(monitor->sample().peak_allocated, before.allocated) << "tight round " << round << ": staged";
    expect_file_holds(dir + "/tight" + std::to_string(round) + ".pt", expected);
    for (int i = 0; i < 20; ++i) expected.mul_(1.5);
  }
}
#endif

TEST(Checkpoint, AFailedWriteIsThrownOnceAndTheFileBeforeItStays) {
  const std::string dir = temp_dir("ck-failure"), path = dir + "/last.pt";
  train::CheckpointWriter w;
  {
    torch::serialize::OutputArchive a;
    a.write("x", at::ones({4}));
    w.write(std::move(a), path, "{}");
    w.wait();
  }
  const std::string before = read_bytes(path);
  // A folder where the file's temporary would go: the write fails on the thread.
  write_bytes(dir + "/blocked", "a file, not a folder");
  torch::serialize::OutputArchive b;
  b.write("x", at::zeros({4}));
  w.write(std::move(b), dir + "/blocked/last.pt", "{}");
  try {
    w.wait();
    ADD_FAILURE() << "a write into a missing folder succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/blocked"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(w.wait());  // reported once
  EXPECT_EQ(read_bytes(path), before);

  // The failure is also what the next checkpoint meets first, before it writes anything.
  torch::serialize::OutputArchive c, d;
  c.write("x", at::zeros({4}));
  w.write(std::move(c), dir + "/blocked/again.pt", "{}");
  d.write("x", at::zeros({4}));
  EXPECT_THROW(w.write(std::move(d), path, "{}"), std::exception);
  EXPECT_EQ(read_bytes(path), before);

  // Tensors inside a container would escape the snapshot: refused.
  torch::serialize::OutputArchive e;
  e.write("list", c10::IValue(c10::List<at::Tensor>({at::ones({2})})));
  EXPECT_THROW(w.write(std::move(e), dir + "/list.pt", "{}"), c10::Error);
}

namespace {

// Saves a checkpoint after step `at` and keeps what the model and its EMA held then.
class SaveAt : public train::Hook {
 public:
  SaveAt(int64_t at, std::string path) : at_(at), path_(std::move(path)) {}
  void after_step(train::Trainer& t) override {
    if (t.state().step != at_) return;
    raw = params_of(t.model());
    ema = params_of(t.eval_model());
    t.save_checkpoint(path_);
    written_on_return = fs::exists(path_);
  }
  std::vector<at::Tensor> raw, ema;
  bool written_on_return = false;

 private:
  int64_t at_;
  std::string path_;
};

bool equal_lists(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST(Checkpoint, ATrainersCheckpointIsItsStepWhileTheNextStepsRun) {
  const std::string dir = temp_dir("ck-trainer"), path = dir + "/step2.pt";
  const Config c = load_config("", tiny_run({"train.steps=5", "train.val_every=0"}));
  train::Trainer t(parts_for(c, dir));
  auto hook = std::make_unique<SaveAt>(2, path);
  SaveAt& save = *hook;
  t.register_hook(std::move(hook));
  t.train();
  ASSERT_FALSE(save.raw.empty());
  EXPECT_FALSE(equal_lists(params_of(t.model()), save.raw)) << "the steps after the checkpoint changed nothing";
  auto [raw, ema] = checkpoint_models(path);
  EXPECT_TRUE(equal_lists(params_of(*raw), save.raw)) << "the file holds weights of a later step";
  EXPECT_TRUE(equal_lists(params_of(*ema), save.ema)) << "the file holds an EMA of a later step";
}

// A write that fails on the writer thread (here its copy to best.pt, on a full disk) stops the
// run after the step during which it failed, naming the file; before, the run trained on without
// checkpoints until the next one (here: none before the run's end, step 40).
TEST(Checkpoint, AFailedWriteStopsTheRunAfterItsStep) {
  const std::string dir = temp_dir("ck-fail-run");
  const Config c = load_config("", tiny_run({"train.steps=40", "train.val_every=0"}));
  train::Trainer t(parts_for(c, dir));
  struct FailingCopy : train::Hook {
    std::string dir;
    explicit FailingCopy(std::string dir) : dir(std::move(dir)) {}
    void after_step(train::Trainer& tr) override {
      if (tr.state().step == 2)
        tr.save_checkpoint(dir + "/step2.pt", [this] { throw Error(dir + "/best.pt: write failed (No space left on device)"); });
    }
  };
  t.register_hook(std::make_unique<FailingCopy>(dir));
  try {
    t.train();
    ADD_FAILURE() << "the run ended without the failed write";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/best.pt: write failed"), std::string::npos) << e.what();
  }
  EXPECT_LT(t.state().step, 40);
  EXPECT_NO_THROW(train::checkpoint_meta(dir + "/step2.pt"));  // the file itself was written
}

TEST(Checkpoint, ASnapshotThatDoesNotFitTheBudgetIsNotTaken) {
  const std::string dir = temp_dir("ck-fit"), path = dir + "/step1.pt";
  const Config c = load_config("", tiny_run({"train.steps=2", "train.val_every=0"}));
  train::TrainerParts p = parts_for(c, dir);
  p.options.memory_usable(1 << 20);  // far below a step's peak plus the state
  train::Trainer t(std::move(p));
  auto hook = std::make_unique<SaveAt>(1, path);
  SaveAt& save = *hook;
  t.register_hook(std::move(hook));
  t.train();
  EXPECT_TRUE(save.written_on_return) << "the checkpoint was left to a thread with no room for its snapshot";
  auto [raw, ema] = checkpoint_models(path);
  EXPECT_TRUE(equal_lists(params_of(*raw), save.raw));
}

// Before any step (a resume's first write comes before its first step) nothing says how much of
// the budget a step leaves: the snapshot is not taken, however roomy the budget. Taken, it sat
// beside the next step and the governor shrank the batch for it (a resumed run at 26.8 MiB
// went out of memory at 26.3 MiB in use where the run it resumed held 19.7 MiB).
TEST(Checkpoint, TheFirstWriteBeforeAnyStepUnderABudgetIsNotTaken) {
  const std::string dir = temp_dir("ck-first"), path = dir + "/step0.pt";
  const Config c = load_config("", tiny_run({"train.steps=1", "train.val_every=0"}));
  train::TrainerParts p = parts_for(c, dir);
  p.options.memory_usable(int64_t{1} << 40);
  train::Trainer t(std::move(p));
  t.save_checkpoint(path);
  EXPECT_TRUE(fs::exists(path)) << "the checkpoint was left to a thread before any step had said what room it has";
  t.train();
}

// A governor decision makes the peaks of the steps before it stale. Step 2 holds 150 MiB beside
// its own and crosses budget - headroom (128 MiB): the micro-batch halves, and the checkpoint
// after step 4 fits beside the smaller steps, so it is written behind the training (its `then`
// runs on the writer's thread). Judged by step 2's peak, every later one stopped the training.
TEST(Checkpoint, AfterTheGovernorShrinksASnapshotThatFitsTheSmallerStepsIsTaken) {
  const std::string dir = temp_dir("ck-shrunk");
  const Config c = load_config("", tiny_run({"train.steps=4", "train.val_every=0", "memory.budget=256MiB", "memory.headroom=0.5"}));
  cli::Run run = run_for(c, dir);
  struct Crowded : train::Hook {
    void before_step(train::Trainer& t) override { held = t.state().step == 1 ? at::ones({150 << 20}, at::kByte) : at::Tensor(); }
    at::Tensor held;
  };
  struct SaveAfterStep4 : train::Hook {
    explicit SaveAfterStep4(std::string p) : path(std::move(p)) {}
    void after_step(train::Trainer& t) override {
      if (t.state().step != 4) return;
      t.save_checkpoint(path, [this] { written_by = std::this_thread::get_id(); });
      t.wait_for_checkpoints();
    }
    std::string path;
    std::thread::id written_by;
  };
  run.trainer->register_hook(std::make_unique<Crowded>());
  auto save = std::make_unique<SaveAfterStep4>(dir + "/step4.pt");
  SaveAfterStep4* saved = save.get();
  run.trainer->register_hook(std::move(save));
  run.trainer->train();
  ASSERT_EQ(run.governor->decisions().size(), 1u);
  EXPECT_EQ(run.governor->decisions()[0].action, "micro_batch 4 -> 2");
  EXPECT_EQ(run.governor->decisions()[0].step, 3);
  EXPECT_NE(saved->written_by, std::thread::id());
  EXPECT_NE(saved->written_by, std::this_thread::get_id()) << "the training waited for a snapshot that fitted";
  EXPECT_FALSE(train::checkpoint_config_yaml(dir + "/step4.pt").empty());
  run.monitor->set_limit(0);  // the allocator is the process's: the next test has no budget
}

#ifdef HEADROOM_WITH_CUDA
namespace {

// Saves a checkpoint after step `at` and measures what the save added to the device's peak.
class MeasuredSaveAt : public train::Hook {
 public:
  MeasuredSaveAt(int64_t at, std::string path, std::shared_ptr<MemoryMonitor> monitor)
      : at_(at), path_(std::move(path)), monitor_(std::move(monitor)) {}
  void after_step(train::Trainer& t) override {
    if (t.state().step != at_) return;
    raw = params_of(t.model());
    monitor_->reset_peak();
    const int64_t before = monitor_->sample().allocated;
    t.save_checkpoint(path_);
    t.wait_for_checkpoints();
    added = monitor_->sample().peak_allocated - before;
  }
  std::vector<at::Tensor> raw;
  int64_t added = -1;

 private:
  int64_t at_;
  std::string path_;
  std::shared_ptr<MemoryMonitor> monitor_;
};

}  // namespace

// A CUDA trainer stages its snapshot on the device where it fits beside its largest step under
// the budget (the device holds one more copy of the state while it goes to the host), and queues
// the transfer on the step's stream where it does not; the file holds its step either way.
TEST(Checkpoint, ACudaTrainerStagesItsSnapshotWhereItFits) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  const c10::Device cuda(c10::kCUDA, 0);
  for (const bool room : {true, false}) {
    const std::string dir = temp_dir(room ? "ck-cuda-room" : "ck-cuda-tight"), path = dir + "/step2.pt";
    const Config c = load_config("", tiny_run({"train.steps=4", "train.val_every=0", "device=cuda"}));
    at::manual_seed(0);
    train::TrainerParts p = train::make_trainer_parts(c, cuda, dir);
    const std::shared_ptr<MemoryMonitor> monitor = memory::make_memory_monitor(cuda);
    p.monitor = monitor;
    p.options.memory_usable(room ? int64_t{1} << 40 : 1);
    train::Trainer t(std::move(p));
    auto hook = std::make_unique<MeasuredSaveAt>(2, path, monitor);
    MeasuredSaveAt& save = *hook;
    t.register_hook(std::move(hook));
    t.train();
    ASSERT_GE(save.added, 0);
    const int64_t state = int64_t(fs::file_size(path));
    if (room)
      EXPECT_GE(save.added, state * 9 / 10) << "not staged: the device held " << save.added << " bytes more for a " << state << "-byte file";
    else
      EXPECT_LT(save.added, state / 2) << "staged with no room for it";
    auto [raw, ema] = checkpoint_models(path);
    std::vector<at::Tensor> saved;
    for (const at::Tensor& w : save.raw) saved.push_back(w.cpu());
    EXPECT_TRUE(equal_lists(params_of(*raw), saved)) << "room " << room << ": the file holds weights of a later step";
  }
}
#endif

TEST(Checkpoint, AProcessKilledWhileAFileIsWrittenLeavesEveryCheckpointLoadable) {
  const std::string dir = temp_dir("ck-kill"), weights = dir + "/runs/r/weights";
  const std::string cfg = config_file(dir, tiny_run({"project=" + dir + "/runs", "name=r", "train.steps=40",
                                                     "train.save_every_steps=1", "train.keep=100", "train.val_every=0"}));
  const pid_t pid = spawn_trainer("--config " + cfg, dir + "/log");
  // Killed the moment a file's temporary appears, after at least one checkpoint is complete.
  bool caught = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (!caught && std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    bool complete = false, partial = false;
    for (const auto& f : fs::directory_iterator(weights, ec)) {
      const std::string name = f.path().filename().string();
      complete |= name.rfind("step_", 0) == 0;
      partial |= name.find(".tmp") != std::string::npos;
    }
    if (complete && partial) {
      ::kill(pid, SIGKILL);
      caught = true;
    }
  }
  ASSERT_TRUE(caught) << read_bytes(dir + "/log");
  EXPECT_EQ(wait_exit_code(pid), 128 + SIGKILL);
  int loadable = 0;
  for (const auto& f : fs::directory_iterator(weights)) {
    const std::string name = f.path().filename().string();
    if (name.find(".tmp") != std::string::npos) continue;
    EXPECT_NO_THROW(train::checkpoint_meta(f.path().string())) << name;
    ++loadable;
  }
  EXPECT_GT(loadable, 0);
  const RunResult resumed = run_trainer("train --config " + cfg + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_EQ(train::checkpoint_meta(weights + "/last.pt").find("step")->as_number(), 40);
  for (const auto& f : fs::directory_iterator(weights))  // the killed process's temporary went at the resume
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
}
