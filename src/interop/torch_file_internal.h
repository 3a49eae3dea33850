// Internal: the pickle machine (torch_pickle.cpp) that torch_file.cpp reads both torch.save
// formats with.
#pragma once

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "headroom/interop/torch_file.h"

namespace headroom::interop {

// Where a persistent id's storage lives: the zip record or the legacy file's raw section.
// numel: the element count the persistent id states.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// Runs the pickle at `data` up to its STOP and returns the value it leaves on top; `consumed`, when
// given, is set to the bytes read (the legacy format's next pickle starts there). std::runtime_error
// naming the byte when the pickle is damaged or uses something this reader does not read.
PyRef unpickle(const char* data, size_t size, StorageLoader storages, size_t* consumed = nullptr);

}  // namespace headroom::interop
