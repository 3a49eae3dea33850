// On-device augmentation of whole batches, in two halves (as detectron2 splits them):
//   draw_params  the random policy: per-image parameters drawn on the batch's device from a
//                counter-based hash of (seed, epoch, sample index, slot), so the CPU and CUDA
//                draw the same numbers and an image's parameters do not depend on its batch;
//   apply        the deterministic transform: one projective warp per image (crop, pad, fit,
//                mosaic placement, affine, flips and the multi-scale size composed into one
//                3x3 matrix), boxes through the same matrices, mixup, colour in HSV.
// Both run on CPU or CUDA tensors with the same code (ATen ops only).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>

#include "headroom/core/config.h"
#include "headroom/data/batch.h"

namespace headroom::augment {

using AugmentOptions = AugmentConfig;  // defaults and meanings in core/config.h

// True when the options change anything (the trainer skips augmentation otherwise).
bool enabled(const AugmentOptions& o);

// Images and padded boxes on one device.
struct Batch {
  at::Tensor images;   // [B, 3, S, S] float in [0, 1] (apply's output) or uint8 (input)
  at::Tensor boxes;    // [B, N, 4] float xyxy pixels; rows with class -1 are padding
  at::Tensor classes;  // [B, N] int64
  at::Tensor crowd;    // [B, N] bool
};

// Everything random about one batch. Source coordinates are canvas pixels of the input images,
// or of the 2x2 tile canvas [0, 2S) of sources[b, 0..3] when the batch holds mosaics.
struct Params {
  int64_t in_size = 0, out_size = 0;
  int64_t tiles = 1;          // 4 when a mosaic is possible in this batch
  at::Tensor matrix;          // [B, 3, 3] source pixels -> output pixels
  at::Tensor inverse;         // [B, 3, 3] output pixels -> source pixels
  at::Tensor mosaic;          // [B] bool
  at::Tensor sources;         // [B, tiles] int64: image of each tile (tile 0 is the image itself)
  at::Tensor window;          // [B, 4] xyxy source region with image content
  at::Tensor view;            // [B, 4] xyxy source region of the picture; window..view is pad colour
  at::Tensor pad_colour;      // [B, 3] 0..255
  at::Tensor clip_to_window;  // [B] bool: boxes clipped to the window before the transform
  at::Tensor min_visible;     // [B] share of a transformed box that must stay in the image
  at::Tensor mix_partner;     // [B] int64 (itself without mixup)
  at::Tensor mix_ratio;       // [B] share of the image itself; 1 = no mixup
  at::Tensor brightness;      // [B] added on the 0..1 scale
  at::Tensor contrast;        // [B] factor about each channel's mean
  at::Tensor hue;             // [B] turns added to the hue
  at::Tensor saturation;      // [B] factor
  at::Tensor value;           // [B] factor
  bool any_mixup = false, any_contrast = false, any_hsv = false;
};

struct DrawInputs {
  at::Tensor images;      // [B, 3, S, S] uint8 (for the mean pad colour)
  at::Tensor boxes;       // [B, N, 4] and classes [B, N] (for crops that must cover a box)
  at::Tensor classes;
  at::Tensor sample_ids;  // [B] int64, the images' indices in their split
  at::Tensor content;     // [B, 4] float xyxy: where the image lies in its letterboxed canvas
  at::Tensor scale;       // [B] float: canvas pixels per pixel of the image (TF's padding); undefined = 1
  int64_t out_size = 0;
  uint64_t key = 0;       // seed and epoch mixed (epoch_key)
  bool mosaic = true;     // false in the close_mosaic epochs
};

uint64_t epoch_key(int64_t seed, int64_t epoch);

Params draw_params(const AugmentOptions& o, const DrawInputs& in);

// Resamples [B, C, S, S] uint8 or float images (any channels: masks too) through the
// parameters' warp into float [B, C, So, So]: bilinear, outside the window the pad colour
// ([B, C]; undefined = fill), outside the view `fill`. warp runs a fused per-pixel loop on the
// CPU and warp_reference (coordinates as tensors, one grid_sample) elsewhere.
at::Tensor warp(const Params& p, const at::Tensor& images, double fill, const at::Tensor& pad_colour);
at::Tensor warp_reference(const Params& p, const at::Tensor& images, double fill, const at::Tensor& pad_colour);

// Boxes through the warp, before compaction: [B, tiles * N] rows, tile-major (tile t's rows
// are boxes of sources[b, t]), and which of them survive (box_min_size, min_visible, aspect).
struct WarpedBoxes {
  at::Tensor boxes;    // [B, M, 4] xyxy output pixels, clipped to the image
  at::Tensor classes;  // [B, M]
  at::Tensor crowd;    // [B, M]
  at::Tensor keep;     // [B, M] bool
};
WarpedBoxes warp_boxes(const Params& p, const AugmentOptions& o, const at::Tensor& boxes, const at::Tensor& classes,
                       const at::Tensor& crowd);

// Colour changes of [B, 3, H, W] float images in [0, 1]: brightness, contrast, then one HSV
// round trip for hue, saturation and value. `picture` ([B, 1, H, W] bool, undefined = every
// pixel) is where the image is: contrast turns about its mean.
at::Tensor adjust_colour(const Params& p, const at::Tensor& images, const at::Tensor& picture = at::Tensor());

// The output pixels of images [b0, b0 + n) that show the picture (inside the window, not the
// padding, bars or fill): [n, 1, So, So] bool.
at::Tensor picture_mask(const Params& p, int64_t b0, int64_t n);

// The HSV round trip: hue + shift (turns), saturation and value times their gains ([B] each).
// shift_hsv runs a fused per-pixel loop on the CPU and the tensor-op reference elsewhere.
at::Tensor shift_hsv(const at::Tensor& x, const at::Tensor& hue_shift, const at::Tensor& sat_gain, const at::Tensor& val_gain);
at::Tensor shift_hsv_reference(const at::Tensor& x, const at::Tensor& hue_shift, const at::Tensor& sat_gain, const at::Tensor& val_gain);

// The whole transform. max_boxes bounds the rows kept per image (valid rows first, padding -1).
Batch apply(const Params& p, const AugmentOptions& o, const Batch& in, int64_t max_boxes);
// The rows an image of the batch can end with, from the loader's host counts ([B] int64): its
// own count; with mosaics the four largest (partners are distinct from 4 images on), four times
// the largest in a batch of fewer; twice that with mixup. Known without a device sync, and never
// below what survives, so apply drops no box.
int64_t row_bound(const Params& p, const at::Tensor& counts);

struct AugmenterOptions {
  TORCH_ARG(AugmentOptions, policy) = {};   // what to draw, in either vocabulary
  TORCH_ARG(int64_t, seed) = 0;             // the run's: draws are a hash of (seed, epoch, image, slot)
  TORCH_ARG(int64_t, input_multiple) = 32;  // multi-scale sizes are multiples of the model's
  TORCH_ARG(int64_t, epochs) = 1;           // the run's, for close_mosaic (the last epochs)
};
// The augment section and the seed, with what the model and the run's length decide.
AugmenterOptions augmenter_options(const Config& c, int64_t input_multiple, int64_t epochs);

// The trainer's entry point.
class Augmenter {
 public:
  explicit Augmenter(AugmenterOptions o);

  // Output side of a batch: the input side, or a multi-scale size drawn per (epoch, batch).
  int64_t output_size(int64_t in_size, int64_t epoch, int64_t batch_index) const;
  int64_t max_output_size(int64_t in_size) const;
  int64_t min_output_size(int64_t in_size) const;
  bool mosaic_in_epoch(int64_t epoch) const;

  // Moves the loader's batch to `device` (non-blocking) and augments it there.
  Batch operator()(const data::HostBatch& batch, c10::Device device) const;

 private:
  AugmentOptions o_;
  int64_t seed_, multiple_, epochs_;
};

// Float [0, 1] images and boxes back into a host batch (uint8), for plots and previews.
data::HostBatch to_host_batch(const Batch& b, const data::HostBatch& like);

}  // namespace headroom::augment
