// Several processes training one model, on the engine PyTorch users already trust: c10d process
// groups (ProcessGroupGloo for host values and CPU tensors, ProcessGroupNCCL for CUDA tensors)
// over a TCPStore rendezvous. A run learns its place from torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which `trainer train --nproc N` sets for
// its local workers (dist/launch.h). docs/distributed.md says what each rank does.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace headroom::dist {

struct WorldInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool distributed() const { return world > 1; }
};
// torchrun's variables; a single process when WORLD_SIZE is unset. A malformed one is an
// InputError naming the variable.
WorldInfo world_from_env();

struct GroupOptions {
  TORCH_ARG(std::string, backend) = "auto";  // auto | nccl | gloo: the backend of device tensors
  TORCH_ARG(double, timeout) = 300;          // seconds: rendezvous and each collective
};

// A collective or the rendezvous did not complete: a rank stopped, or did not answer in time.
class PeerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Group {
 public:
  // Rendezvous: rank 0 hosts the store on MASTER_ADDR:MASTER_PORT, every rank checks in, and a
  // rank missing after the timeout is named. Then the process groups: Gloo always (host values),
  // NCCL for a CUDA device unless the backend is gloo.
  Group(const WorldInfo& w, GroupOptions o, c10::Device device);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return w_.rank; }
  int world() const { return w_.world; }
  const std::string& backend() const { return backend_; }  // of device tensors: "nccl" or "gloo"
  double timeout() const { return o_.timeout(); }

  // Device tensors, in place. `what` names the collective in errors ("the step's gradients").
  void all_reduce_sum(at::Tensor& t, const std::string& what);
  void broadcast(std::vector<at::Tensor> tensors, const std::string& what);  // rank 0's values
  // Host values over Gloo (no device sync): every rank's vector (all of one length), by rank.
  std::vector<std::vector<double>> all_gather(const std::vector<double>& mine, const std::string& what);
  // Host rows of any count per rank ([n, k] double on the CPU), concatenated in rank order.
  at::Tensor all_gather_rows(const at::Tensor& rows, const std::string& what);
  // Rank 0's text, through the store.
  std::string broadcast_text(const std::string& text, const std::string& key);
  void barrier(const std::string& what);

 private:
  struct Impl;
  WorldInfo w_;
  GroupOptions o_;
  std::string backend_;
  std::unique_ptr<Impl> impl_;
};

// A differentiable all-reduce (sum) over the group's ranks: the backward all-reduces the
// gradient, so each rank's loss reaches the statistics of every rank (SyncBatchNorm).
std::function<at::Tensor(const at::Tensor&)> differentiable_sum(Group& g);

}  // namespace headroom::dist
