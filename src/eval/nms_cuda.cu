#include "nms_cuda.h"

namespace headroom::eval {

namespace {

__global__ void nms_greedy_kernel(const float* __restrict__ boxes, const bool* __restrict__ valid, int64_t K, double thr,
                                  bool* __restrict__ keep, uint8_t* removed) {
  const int64_t b = blockIdx.x;
  const float* p = boxes + b * K * 4;
  const bool* v = valid + b * K;
  uint8_t* rm = removed + b * K;
  bool* kp = keep + b * K;
  // The arithmetic is the CPU kernel's, rounded the same way: _rn intrinsics, which nvcc does
  // not contract into FMAs (an FMA moves an IoU at the threshold across it).
  for (int64_t i = 0; i < K; ++i) {
    if (!v[i] || rm[i]) continue;  // the same for every thread: no thread skips the barrier alone
    if (threadIdx.x == 0) kp[i] = true;
    const float ax1 = p[4 * i], ay1 = p[4 * i + 1], ax2 = p[4 * i + 2], ay2 = p[4 * i + 3];
    const float area_a = __fmul_rn(__fsub_rn(ax2, ax1), __fsub_rn(ay2, ay1));
    for (int64_t j = i + 1 + threadIdx.x; j < K; j += blockDim.x) {
      if (rm[j] || !v[j]) continue;
      const float w = __fsub_rn(fminf(ax2, p[4 * j + 2]), fmaxf(ax1, p[4 * j]));
      const float h = __fsub_rn(fminf(ay2, p[4 * j + 3]), fmaxf(ay1, p[4 * j + 1]));
      if (w <= 0.f || h <= 0.f) continue;
      const float inter = __fmul_rn(w, h);
      const float area_b = __fmul_rn(__fsub_rn(p[4 * j + 2], p[4 * j]), __fsub_rn(p[4 * j + 3], p[4 * j + 1]));
      if (double(__fdiv_rn(inter, __fsub_rn(__fadd_rn(area_a, area_b), inter))) > thr) rm[j] = 1;  // in double, as there
    }
    __syncthreads();  // this round's suppressions are seen by every thread before the next box
  }
}

}  // namespace

void launch_nms_greedy(const float* boxes, const bool* valid, int64_t images, int64_t candidates, double iou, bool* keep,
                       uint8_t* removed, cudaStream_t stream) {
  if (images == 0 || candidates == 0) return;
  nms_greedy_kernel<<<static_cast<unsigned>(images), 256, 0, stream>>>(boxes, valid, candidates, iou, keep, removed);
}

}  // namespace headroom::eval
