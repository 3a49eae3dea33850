// CUDA NMS: tensor checks and the launch on the current stream (compiled with CUDA only).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "nms_cuda.h"

namespace headroom::eval {

at::Tensor nms_keep_cuda(const at::Tensor& boxes_in, const at::Tensor& valid_in, double iou) {
  const c10::cuda::CUDAGuard guard(boxes_in.device());
  const at::Tensor boxes = boxes_in.to(at::kFloat).contiguous(), valid = valid_in.to(at::kBool).contiguous();
  const int64_t B = boxes.size(0), K = boxes.size(1);
  at::Tensor keep = at::zeros({B, K}, valid.options());
  at::Tensor removed = at::zeros({B, K}, valid.options().dtype(at::kByte));
  launch_nms_greedy(boxes.data_ptr<float>(), valid.data_ptr<bool>(), B, K, iou, keep.data_ptr<bool>(),
                    removed.data_ptr<uint8_t>(), c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return keep;
}

}  // namespace headroom::eval
