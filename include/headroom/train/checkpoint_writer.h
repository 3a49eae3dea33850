// Checkpoints written behind the training. `write` takes a consistent snapshot of an archive's
// tensors (host copies: a clone on the CPU, a non-blocking copy into reused pinned buffers on
// CUDA, ordered on the tensor's stream so no host sync is needed) and returns; a thread streams
// the snapshot to the file, atomically as models::save_archive_atomic always does, then runs the
// caller's follow-up (copy to best.pt, pruning) in order. One write is in flight at a time: the
// next `write` waits for it, so a run holds at most one snapshot.
#pragma once

#include <torch/serialize/output-archive.h>

#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace headroom::train {

// Bytes of the tensors an archive holds (nested archives included).
int64_t archive_tensor_bytes(torch::serialize::OutputArchive& archive);

class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  ~CheckpointWriter();  // waits for the write in flight; a failure is logged (a destructor cannot throw)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Snapshots `archive` (its tensors are replaced by copies), then writes it to `path` with
  // `meta` on the writer thread and runs `then` there once the file is committed. A previous
  // write's failure is thrown here, before anything else is written.
  void write(torch::serialize::OutputArchive archive, std::string path, std::string meta, std::function<void()> then = {});
  // Waits for the write in flight; throws its failure (once).
  void wait();
  // A snapshot is alive: its write has not finished (it may not have been waited for yet).
  bool writing() const { return writing_.load(); }

 private:
  std::thread thread_;
  std::atomic<bool> writing_{false};
  std::exception_ptr failed_;
  std::vector<at::Tensor> pinned_;  // reused host buffers for CUDA tensors, in archive order
};

}  // namespace headroom::train
