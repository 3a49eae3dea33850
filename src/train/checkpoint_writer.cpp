#include "headroom/train/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/jit/api/module.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "headroom/core/logging.h"
#include "headroom/core/memory_errors.h"
#include "headroom/models/weights.h"

namespace headroom::train {

namespace {

// OutputArchive keeps its module private and offers no way to read it back, yet a snapshot has
// to replace the tensors the parts wrote (the live parameters and moments) by copies. An explicit
// instantiation may name a private member (C++17 [temp.spec]/6); this one exports it to a friend.
torch::jit::Module& archive_module(torch::serialize::OutputArchive& archive);
template <torch::jit::Module torch::serialize::OutputArchive::*Member>
struct ArchiveModule {
  friend torch::jit::Module& archive_module(torch::serialize::OutputArchive& archive) { return archive.*Member; }
};
template struct ArchiveModule<&torch::serialize::OutputArchive::module_>;

// Every tensor slot of an archive's object and of the archives nested in it, in a fixed order.
// A tensor inside another container would escape the snapshot: refused, so a new part cannot
// make checkpoints silently inconsistent.
template <typename Visit>
void for_each_tensor(c10::ivalue::Object& object, Visit&& visit) {
  for (size_t i = 0; i < object.slots().size(); ++i) {
    const c10::IValue& v = object.getSlot(i);
    if (v.isTensor()) {
      visit(object, i, v.toTensor());
    } else if (v.isObject()) {
      for_each_tensor(*v.toObject(), visit);
    } else {
      c10::IValue::HashAliasedIValues inner;
      v.getSubValues(inner);
      for (const c10::IValue& s : inner)
        TORCH_CHECK(!s.isTensor(), "checkpoint entry ", object.type()->getAttributeName(i),
                    " holds tensors inside a container: write them one by one");
    }
  }
}

// The whole storage under a tensor, as one flat tensor of its type.
at::Tensor whole_storage(const at::Tensor& t) {
  const int64_t n = int64_t(t.storage().nbytes() / t.element_size());
  return at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
}

}  // namespace

int64_t archive_tensor_bytes(torch::serialize::OutputArchive& archive) {
  std::unordered_set<const void*> seen;  // tensors sharing a storage are written once
  int64_t bytes = 0;
  for_each_tensor(*archive_module(archive)._ivalue(), [&](c10::ivalue::Object&, size_t, const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += int64_t(t.storage().nbytes());
  });
  return bytes;
}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  failed_flag_ = false;
  if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
}

void CheckpointWriter::write(torch::serialize::OutputArchive archive, std::string path, std::string meta,
                             std::function<void()> then, bool stage) {
  wait();  // the buffers below are the previous snapshot's until its file is written
  c10::ivalue::Object& root = *archive_module(archive)._ivalue();
  // Staged: each CUDA storage copied on the device, on the compute stream behind the step that
  // produced it; the transfer streams wait for those copies only.
  std::unordered_map<const void*, at::Tensor> staged;
  std::vector<c10::Device> devices;  // CUDA devices the archive holds tensors on
  for_each_tensor(root, [&](c10::ivalue::Object&, size_t, const at::Tensor& t) {
    if (t.defined() && t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  });
  if (stage && staging_ && !devices.empty()) {
    try {
      for_each_tensor(root, [&](c10::ivalue::Object&, size_t, const at::Tensor& t) {
        if (!t.defined() || !t.is_cuda()) return;
        at::Tensor& copy = staged[t.storage().unsafeGetStorageImpl()];
        if (!copy.defined()) copy = whole_storage(t).clone();
      });
    } catch (const c10::Error& e) {
      if (!is_out_of_memory(e)) throw;
      staged.clear();  // gives the partial copies back
      // Not tried again: the allocator's way to an out-of-memory error (cached blocks freed,
      // the device synced) would be paid at every checkpoint, and the next steps re-allocate.
      staging_ = false;
      spdlog::info("checkpoints: no room on the device to stage the snapshot; from now on its copy to the host holds "
                   "the step's stream");
    }
  }
  std::vector<c10::Stream> streams;  // per device: where its copies to the host are queued
  const auto stream_of = [&](const at::Tensor& t) -> const c10::Stream& {
    return streams[size_t(std::find(devices.begin(), devices.end(), t.device()) - devices.begin())];
  };
  const auto cuda = [] { return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA); };  // only with CUDA tensors: a CPU build has none
  for (const c10::Device& d : devices) {
    if (staged.empty()) {
      streams.push_back(cuda().getStream(d));
      continue;
    }
    // From the high-priority pool, which the side stream and the graphs (low priority) do not
    // draw from: the next step's input is not queued behind the transfer.
    auto held = std::find_if(transfer_.begin(), transfer_.end(), [&](const c10::Stream& s) { return s.device() == d; });
    if (held == transfer_.end()) held = transfer_.insert(transfer_.end(), cuda().getStreamFromGlobalPool(d, /*isHighPriority=*/true));
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(cuda().getStream(d));
    ready.block(*held);
    streams.push_back(*held);
  }
  // The staged copies are read on the transfer streams: their blocks are not handed out again
  // before those are done, even if they are dropped early (an error below).
  for (const auto& [key, t] : staged) cuda().recordDataPtrOnStream(t.storage().data_ptr(), stream_of(t));
  // The snapshot. CUDA: queued behind the step that produced the state and ahead of the next one
  // that changes it in place (or, staged, from the staged copies beside it); the thread waits on
  // an event, the host never does. CPU: a copy now (the training thread is the only one changing
  // the tensors). Storages are copied whole, once each, and the tensors rebuilt on the copies with
  // their own offsets and strides: tensors that share a storage (the EMA weights at the root and
  // in its entry) still share it, and the file is the one a direct write makes.
  std::unordered_map<const void*, at::Tensor> copies;
  size_t n = 0;
  try {
    for_each_tensor(root, [&](c10::ivalue::Object& object, size_t slot, const at::Tensor& t) {
      if (!t.defined()) return;
      const void* key = t.storage().unsafeGetStorageImpl();
      at::Tensor& storage = copies[key];
      if (!storage.defined()) {
        const at::Tensor source = staged.empty() || !t.is_cuda() ? whole_storage(t) : staged.at(key);
        if (t.is_cuda()) {
          if (n >= pinned_.size()) pinned_.resize(n + 1);
          at::Tensor& buffer = pinned_[n++];
          if (!buffer.defined() || buffer.sizes() != source.sizes() || buffer.scalar_type() != source.scalar_type())
            buffer = at::empty(source.sizes(), source.options().device(c10::kCPU).pinned_memory(true));
          const c10::StreamGuard on(stream_of(t));
          buffer.copy_(source, /*non_blocking=*/true);
          storage = buffer;
        } else {
          storage = source.clone();
        }
      }
      at::Tensor copy = at::empty({0}, storage.options()).set_(storage.storage(), t.storage_offset(), t.sizes(), t.strides());
      if (copy.is_floating_point()) copy.requires_grad_(t.requires_grad());
      object.setSlot(slot, copy);
    });
  } catch (...) {
    // Copies already queued on a transfer stream write into pinned buffers a later snapshot
    // reuses from the compute stream: that one waits for them.
    for (const c10::Stream& s : streams) {
      c10::Event queued(c10::DeviceType::CUDA);
      queued.record(s);
      queued.block(cuda().getStream(s.device()));
    }
    throw;
  }
  std::vector<c10::Event> copied;  // one per device, after its last copy
  for (const c10::Stream& s : streams) {
    copied.emplace_back(c10::DeviceType::CUDA);
    copied.back().record(s);
  }
  writing_ = true;
  thread_ = std::thread([this, archive = std::move(archive), path = std::move(path), meta = std::move(meta),
                         then = std::move(then), copied = std::move(copied), staged = std::move(staged)]() mutable {
    try {
      for (const c10::Event& e : copied)
        while (!e.query()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      staged.clear();  // read by the transfers, which are done: its blocks may be reused
      models::save_archive_atomic(archive, path, meta);
      if (then) then();
    } catch (...) {
      failed_ = std::current_exception();
      failed_flag_ = true;
    }
    staged.clear();
    archive = torch::serialize::OutputArchive();  // the snapshot's memory goes back before the flag says so
    writing_ = false;
  });
}

}  // namespace headroom::train
