// CPU threads: what this process may use, LibTorch's intra-op setting, a parallel loop.
#pragma once

#include <cstdint>
#include <functional>

#include "headroom/core/config.h"

namespace headroom {

// Cores this process may run on (affinity mask), at least 1.
int available_cores();

// Sets LibTorch's intra-op threads (Debian's 1.13 defaults to 1 unless told); auto = all
// available cores. Returns the number set.
int set_intra_op_threads(const AutoInt& threads);

// Decode threads for data.workers: auto = min(cores, 8).
int resolve_workers(const AutoInt& workers);

// Runs fn(i) for i in [0, n) on `threads` threads (the caller's thread when threads <= 1).
// The first exception thrown stops the remaining work and is rethrown here.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

}  // namespace headroom
