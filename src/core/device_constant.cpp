#include "headroom/core/device_constant.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <tuple>

namespace headroom {

at::Tensor device_constant(const std::vector<double>& values, at::ScalarType dtype, c10::Device device) {
  using Key = std::tuple<int, int, int, std::vector<double>>;
  static std::mutex mutex;
  // Never destroyed: CUDA tensors must not be freed after the runtime has shut down at exit.
  static auto* cache = new std::map<Key, at::Tensor>();
  const Key key{int(device.type()), int(device.has_index() ? device.index() : -1), int(dtype), values};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache->find(key);
  if (it == cache->end()) {
    const at::Tensor host = at::tensor(values, at::kDouble).to(dtype);
    it = cache->emplace(key, host.to(device)).first;
  }
  return it->second;
}

}  // namespace headroom
