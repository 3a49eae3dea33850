// The errors that mean memory ran out, whoever meets them: the loader's threads, the model's
// smallest-batch probe, the trainer and the memory governor.
#pragma once

#include <c10/util/Exception.h>

namespace headroom {

// How an error relates to memory:
//   out_of_memory  an allocator's c10::OutOfMemoryError, or a CUDA / cuBLAS / cuDNN failure that
//                  says it could not allocate;
//   library        a cuDNN failure that is often an allocation failure in disguise ("NOT_SUPPORTED
//                  ... non-contiguous input", INTERNAL_ERROR, "unable to find an engine"), which
//                  Ultralytics retries too: worth one smaller try, but not to be called an OOM
//                  when it persists.
enum class MemoryFailure { none, out_of_memory, library };
MemoryFailure memory_failure(const c10::Error& e);
inline bool is_out_of_memory(const c10::Error& e) { return memory_failure(e) != MemoryFailure::none; }
// BatchNorm in training refused a batch with one value per channel (a micro-batch of 1 over a
// 1x1 map, as Hourglass-104's bottom at 128 px): not memory, a batch too small for the model.
bool is_batch_too_small(const c10::Error& e);

}  // namespace headroom
