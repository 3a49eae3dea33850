#include "headroom/core/memory_errors.h"

#include <string>

namespace headroom {

MemoryFailure memory_failure(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return MemoryFailure::out_of_memory;
  const std::string what = e.what_without_backtrace();
  for (const char* s : {"CUDA out of memory", "CUDA error: out of memory", "DefaultCPUAllocator: can't allocate memory",
                        "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"})
    if (what.find(s) != std::string::npos) return MemoryFailure::out_of_memory;
  for (const char* s : {"CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input",
                        "CUDNN_STATUS_INTERNAL_ERROR", "Unable to find an engine", "unable to find an engine"})
    if (what.find(s) != std::string::npos) return MemoryFailure::library;
  return MemoryFailure::none;
}

bool is_batch_too_small(const c10::Error& e) {
  return std::string(e.what_without_backtrace()).find("Expected more than 1 value per channel when training") != std::string::npos;
}

}  // namespace headroom
