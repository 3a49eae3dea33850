// Checkpoints written behind the training. `write` takes a consistent snapshot of an archive's
// tensors (host copies: a clone on the CPU, a non-blocking copy into reused pinned buffers on
// CUDA, ordered after the tensor's stream so no host sync is needed) and returns; a thread streams
// the snapshot to the file, atomically as models::save_archive_atomic always does, then runs the
// caller's follow-up (copy to best.pt, pruning) in order. One write is in flight at a time: the
// next `write` waits for it, so a run holds at most one snapshot.
//
// On CUDA the copy to the host (2.3 GB for Hourglass-104 with Adam: 50-100 ms over PCIe)
// would hold the compute stream, as the next step changes the state in place. `stage` copies the
// state on the device first (one fast copy on the compute stream) and takes the host copy from
// that on a stream of its own, beside the next steps; the staged copy holds the snapshot's bytes
// on the device until the transfer ends, so the caller stages only where they fit. A staging copy
// that runs out of memory falls back to the transfer on the compute stream, for this write and
// every later one.
#pragma once

#include <c10/core/Stream.h>
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
  void write(torch::serialize::OutputArchive archive, std::string path, std::string meta, std::function<void()> then = {},
             bool stage = false);
  // Waits for the write in flight; throws its failure (once).
  void wait();
  // The write in flight has failed (its failure is thrown by the next wait or write): the trainer
  // looks after every step and stops the run there, not an epoch later at the next checkpoint.
  bool failed() const { return failed_flag_.load(); }
  // A snapshot is alive: its write has not finished (it may not have been waited for yet).
  bool writing() const { return writing_.load(); }

 private:
  std::thread thread_;
  std::atomic<bool> writing_{false}, failed_flag_{false};
  std::exception_ptr failed_;
  std::vector<at::Tensor> pinned_;  // reused host buffers for CUDA tensors, in archive order
  std::vector<c10::Stream> transfer_;  // per device, the staged copies' stream to the host, held for every write
  bool staging_ = true;                // false after staging ran out of memory once
};

}  // namespace headroom::train
