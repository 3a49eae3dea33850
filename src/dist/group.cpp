#include "headroom/dist/group.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if HEADROOM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"

namespace headroom::dist {

namespace {

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const auto n = parse_int(v);
  if (!n || *n < lo || *n > hi)
    throw InputError(std::string("environment variable ") + name + "=" + v + ": expected an integer in " + std::to_string(lo) +
                     " .. " + std::to_string(hi) + " (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT)");
  return int(*n);
}

std::chrono::milliseconds millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

}  // namespace

WorldInfo world_from_env() {
  WorldInfo w;
  w.world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  w.rank = env_int("RANK", 0, 0, w.world - 1);
  w.local_rank = env_int("LOCAL_RANK", w.rank, 0, 1 << 20);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) w.master_addr = a;
  w.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  if (w.world > 1 && !std::getenv("MASTER_ADDR"))
    throw InputError("WORLD_SIZE=" + std::to_string(w.world) + " without MASTER_ADDR: set MASTER_ADDR and MASTER_PORT (torchrun does), or "
                     "start local workers with `trainer train --nproc N`");
  return w;
}

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#if HEADROOM_WITH_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif
};

Group::Group(const WorldInfo& w, GroupOptions o, c10::Device device) : w_(w), o_(std::move(o)), impl_(std::make_unique<Impl>()) {
  const bool cuda = device.is_cuda();
  if (o_.backend() == "nccl" && !cuda)
    throw InputError("distributed.backend nccl needs a CUDA device; the run trains on " + device.str() + " (use gloo or auto)");
  backend_ = cuda && o_.backend() != "gloo" ? "nccl" : "gloo";
#if !HEADROOM_WITH_NCCL
  if (backend_ == "nccl") throw DeviceError("this build of Headroom has no NCCL: set distributed.backend=gloo");
#endif
  const auto timeout = millis(o_.timeout());
  c10d::TCPStoreOptions so;
  so.port = uint16_t(w_.master_port);
  so.isServer = w_.rank == 0;
  so.numWorkers = w_.world;
  so.waitWorkers = false;  // the check-in below names a missing rank
  so.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(w_.master_addr, so);
  } catch (const std::exception& e) {
    throw PeerError("rank " + std::to_string(w_.rank) + ": rendezvous on " + w_.master_addr + ":" + std::to_string(w_.master_port) +
                    " failed within distributed.timeout " + fmt::format("{:g} s", o_.timeout()) + " (" + first_line(e.what()) +
                    "); is rank 0 running, and MASTER_ADDR/MASTER_PORT the same on every rank?");
  }
  impl_->store->set("rank/" + std::to_string(w_.rank), bytes("here"));
  if (w_.rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < w_.world; ++r) keys.push_back("rank/" + std::to_string(r));
    try {
      impl_->store->wait(keys, timeout);
    } catch (const std::exception&) {
      std::string missing;
      int count = 0;
      for (int r = 0; r < w_.world; ++r)
        if (!impl_->store->check({"rank/" + std::to_string(r)})) missing += (count++ ? ", " : "") + std::to_string(r);
      throw PeerError("rendezvous on " + w_.master_addr + ":" + std::to_string(w_.master_port) + ": " + (count > 1 ? "ranks " : "rank ") +
                      missing + " of " +
                      std::to_string(w_.world) + " did not join within distributed.timeout " + fmt::format("{:g} s", o_.timeout()));
    }
  }
  auto go = c10d::ProcessGroupGloo::Options::create();
  go->timeout = timeout;
  go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", impl_->store), w_.rank,
                                                            w_.world, go);
#if HEADROOM_WITH_NCCL
  if (backend_ == "nccl") {
    auto no = c10d::ProcessGroupNCCL::Options::create();
    no->timeout = timeout;
    impl_->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", impl_->store), w_.rank,
                                                              w_.world, no);
  }
#endif
  barrier("the process groups' start");
  spdlog::info("distributed: rank {} of {} (local rank {}), {} for {} tensors, Gloo for host values, rendezvous {}:{}", w_.rank,
               w_.world, w_.local_rank, backend_ == "nccl" ? "NCCL" : "Gloo", device.str(), w_.master_addr, w_.master_port);
}

Group::~Group() = default;

namespace {
template <class W>
void wait(const W& work, const Group& g, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw PeerError("rank " + std::to_string(g.rank()) + ": " + what + " did not complete across the " + std::to_string(g.world()) +
                    " ranks (another rank stopped, or none answered within distributed.timeout " + fmt::format("{:g} s", g.timeout()) +
                    "): " + first_line(e.what()));
  }
}
}  // namespace

void Group::all_reduce_sum(at::Tensor& t, const std::string& what) {
  std::vector<at::Tensor> v{t};
#if HEADROOM_WITH_NCCL
  if (impl_->nccl && t.is_cuda()) return wait(impl_->nccl->allreduce(v), *this, what);
#endif
  wait(impl_->gloo->allreduce(v), *this, what);
}

void Group::broadcast(std::vector<at::Tensor> tensors, const std::string& what) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> v{t};
#if HEADROOM_WITH_NCCL
    if (impl_->nccl && t.is_cuda()) {
      wait(impl_->nccl->broadcast(v), *this, what);
      continue;
    }
#endif
    wait(impl_->gloo->broadcast(v), *this, what);
  }
}

std::vector<std::vector<double>> Group::all_gather(const std::vector<double>& mine, const std::string& what) {
  std::vector<at::Tensor> in{at::tensor(mine, at::kDouble)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < w_.world; ++r) out[0].push_back(at::empty_like(in[0]));
  wait(impl_->gloo->allgather(out, in), *this, what);
  std::vector<std::vector<double>> values;
  for (const auto& t : out[0]) values.emplace_back(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  return values;
}

at::Tensor Group::all_gather_rows(const at::Tensor& rows, const std::string& what) {
  const at::Tensor r = rows.to(at::kDouble).contiguous();
  const int64_t k = r.size(1);
  int64_t most = 0;
  std::vector<int64_t> counts;
  for (const auto& n : all_gather({double(r.size(0))}, what)) {
    counts.push_back(int64_t(n[0]));
    most = std::max(most, counts.back());
  }
  if (most == 0) return at::empty({0, k}, at::kDouble);  // every rank knows: Gloo takes no empty buffers
  std::vector<at::Tensor> in{at::zeros({most, k}, at::kDouble)};
  in[0].narrow(0, 0, r.size(0)).copy_(r);
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < w_.world; ++i) out[0].push_back(at::empty_like(in[0]));
  wait(impl_->gloo->allgather(out, in), *this, what);
  std::vector<at::Tensor> parts;
  for (int i = 0; i < w_.world; ++i) parts.push_back(out[0][size_t(i)].narrow(0, 0, counts[size_t(i)]));
  return at::cat(parts);
}

std::string Group::broadcast_text(const std::string& text, const std::string& key) {
  if (w_.rank == 0) impl_->store->set("text/" + key, bytes(text));
  try {
    const std::vector<uint8_t> v = impl_->store->get("text/" + key);  // waits for rank 0 up to the timeout
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    throw PeerError("rank " + std::to_string(w_.rank) + ": rank 0 did not publish " + key + " within distributed.timeout " +
                    fmt::format("{:g} s", o_.timeout()) + ": " + first_line(e.what()));
  }
}

void Group::barrier(const std::string& what) {
  std::vector<at::Tensor> v{at::zeros({1})};  // an all-reduce: Gloo's barrier has no timeout of its own in 1.13
  wait(impl_->gloo->allreduce(v), *this, what);
}

namespace {
// The group rides in the autograd context as an integer: IValues hold no plain pointers.
struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    at::Tensor y = x.clone();
    reinterpret_cast<Group*>(group)->all_reduce_sum(y, "SyncBatchNorm's statistics");
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    at::Tensor g = grads[0].contiguous().clone();
    reinterpret_cast<Group*>(ctx->saved_data["group"].toInt())->all_reduce_sum(g, "SyncBatchNorm's statistics gradient");
    return {g, at::Tensor()};
  }
};
}  // namespace

std::function<at::Tensor(const at::Tensor&)> differentiable_sum(Group& g) {
  const int64_t id = reinterpret_cast<int64_t>(&g);
  return [id](const at::Tensor& x) { return AllReduceSum::apply(x, id); };
}

}  // namespace headroom::dist
