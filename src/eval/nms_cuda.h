// Internal: the CUDA NMS kernel's launcher (plain pointers, so the .cu needs no torch headers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace headroom::eval {

// One block per image walks its score-sorted candidates in order; the block's threads suppress
// the rest of the list against each kept box in parallel. `removed` is [B, K] scratch, zeroed.
void launch_nms_greedy(const float* boxes, const bool* valid, int64_t images, int64_t candidates, double iou, bool* keep,
                       uint8_t* removed, cudaStream_t stream);

}  // namespace headroom::eval
