// On-device augmentation: boxes agree with the pixels they came from (masks warped with the
// same parameters), the warp agrees with OpenCV's, colour with OpenCV's HSV, draws are
// deterministic and per image, TF crops hold a box, and the CUDA result equals the CPU one.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <opencv2/imgproc.hpp>

#include <set>

#include "headroom/augment/augment.h"
#include "headroom/core/config.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/random.h"
#include "test_util.h"

using namespace headroom;
using augment::AugmentOptions;

namespace {

// A batch of random images with `n` random boxes each, `size` px, content = the whole canvas.
struct Synthetic {
  augment::Batch batch;
  at::Tensor ids, content;
};

Synthetic synthetic(int64_t b, int64_t n, int64_t size, uint64_t seed, double min_box = 30, double max_box = 70) {
  Rng rng(seed);
  Synthetic s;
  at::manual_seed(int64_t(seed));
  // Smooth random images (noise upsampled): bilinear taps a fraction of a pixel apart stay close.
  s.batch.images = at::upsample_bilinear2d(at::randint(0, 256, {b, 3, size / 8, size / 8}).to(at::kFloat), {size, size}, false)
                       .round()
                       .to(at::kByte);
  s.batch.boxes = at::zeros({b, n, 4});
  s.batch.classes = at::zeros({b, n}, at::kLong);
  s.batch.crowd = at::zeros({b, n}, at::kBool);
  auto bx = s.batch.boxes.accessor<float, 3>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t k = 0; k < n; ++k) {
      // whole pixels, so the masks drawn from them are exact
      const double w = std::round(rng.uniform(min_box, max_box)), h = std::round(rng.uniform(min_box, max_box));
      const double x = std::round(rng.uniform(0, size - w)), y = std::round(rng.uniform(0, size - h));
      bx[i][k][0] = float(x), bx[i][k][1] = float(y), bx[i][k][2] = float(x + w), bx[i][k][3] = float(y + h);
      s.batch.classes[i][k] = k % 3;
    }
  s.ids = at::arange(100, 100 + b, at::kLong);
  s.content = at::tensor({0.0f, 0.0f, float(size), float(size)}).repeat({b, 1});
  return s;
}

augment::DrawInputs inputs(const Synthetic& s, int64_t out_size, uint64_t key = 7, bool mosaic = true) {
  augment::DrawInputs d;
  d.images = s.batch.images;
  d.boxes = s.batch.boxes;
  d.classes = s.batch.classes;
  d.sample_ids = s.ids;
  d.content = s.content;
  d.out_size = out_size;
  d.key = key;
  d.mosaic = mosaic;
  return d;
}

double iou(const float* a, const float* b) {
  const double iw = std::max(0.0, double(std::min(a[2], b[2]) - std::max(a[0], b[0])));
  const double ih = std::max(0.0, double(std::min(a[3], b[3]) - std::max(a[1], b[1])));
  const double u = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih;
  return u > 0 ? iw * ih / u : 0;
}

// Draws each box as a filled mask (one channel per box of the batch), warps the masks with the
// parameters, and compares every surviving warped box with the bounding box of its warped mask.
// Returns the IoUs of boxes at least `min_side` px in both directions.
std::vector<double> box_mask_ious(const AugmentOptions& o, const Synthetic& s, int64_t out_size, double min_side) {
  const int64_t B = s.batch.images.size(0), N = s.batch.boxes.size(1), S = s.batch.images.size(2);
  const augment::Params p = augment::draw_params(o, inputs(s, out_size));
  at::Tensor masks = at::zeros({B, B * N, S, S});
  const auto bx = s.batch.boxes.accessor<float, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < N; ++k) {  // pixel centres inside the box
      const int64_t x0 = int64_t(std::ceil(bx[b][k][0] - 0.5)), x1 = int64_t(std::ceil(bx[b][k][2] - 0.5));
      const int64_t y0 = int64_t(std::ceil(bx[b][k][1] - 0.5)), y1 = int64_t(std::ceil(bx[b][k][3] - 0.5));
      masks[b][b * N + k].slice(0, y0, y1).slice(1, x0, x1).fill_(1);
    }
  const at::Tensor warped = augment::warp(p, masks, 0, at::Tensor()) > 0.5;  // [B, B*N, So, So]
  const augment::WarpedBoxes wb = augment::warp_boxes(p, o, s.batch.boxes, s.batch.classes, s.batch.crowd);
  std::vector<double> ious;
  const at::Tensor sources = p.sources.contiguous();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < p.tiles; ++t) {
      const int64_t src = sources[b][t].item<int64_t>();
      if (t > 0 && !p.mosaic[b].item<bool>()) continue;
      int64_t uses = 0;  // a source in two tiles of one mosaic: its mask is their union
      for (int64_t u = 0; u < (p.mosaic[b].item<bool>() ? p.tiles : 1); ++u) uses += sources[b][u].item<int64_t>() == src;
      if (uses > 1) continue;
      for (int64_t k = 0; k < N; ++k) {
        const int64_t row = t * N + k;
        const at::Tensor m = warped[b][src * N + k];
        if (!wb.keep[b][row].item<bool>()) continue;
        const at::Tensor ys = at::nonzero(m.any(1)), xs = at::nonzero(m.any(0));
        EXPECT_GT(ys.numel(), 0) << "a kept box has no pixels: image " << b << " row " << row;
        if (ys.numel() == 0) continue;
        const float mask_box[4] = {float(xs.min().item<int64_t>()), float(ys.min().item<int64_t>()),
                                   float(xs.max().item<int64_t>() + 1), float(ys.max().item<int64_t>() + 1)};
        const at::Tensor box = wb.boxes[b][row].contiguous();
        const float* bp = box.data_ptr<float>();
        if (bp[2] - bp[0] < min_side || bp[3] - bp[1] < min_side) continue;
        ious.push_back(iou(bp, mask_box));
      }
    }
  return ious;
}

void expect_ious(const std::vector<double>& ious, size_t at_least) {
  ASSERT_GE(ious.size(), at_least);
  double worst = 1, sum = 0;
  for (const double v : ious) worst = std::min(worst, v), sum += v;
  std::printf("box-mask IoU over %zu boxes: worst %.4f, mean %.4f\n", ious.size(), worst, sum / double(ious.size()));
  EXPECT_GE(worst, 0.95);
}

}  // namespace

TEST(Augment, BoxesMatchWarpedMasksUnderAffineFlipsAndMosaic) {
  AugmentOptions o;
  o.degrees = 25, o.scale = 0.25, o.shear = 5, o.translate = 0.1, o.perspective = 0.0005;
  o.fliplr = 0.5, o.flipud = 0.5, o.mosaic = 0.6;
  o.box_min_visible = 0.3;
  for (const uint64_t seed : {1, 11, 21}) {
    const Synthetic s = synthetic(6, 3, 160, seed, 40, 90);
    expect_ious(box_mask_ious(o, s, 160, 32), 10);
    expect_ious(box_mask_ious(o, s, 224, 32), 10);  // another output size (multi-scale)
  }
}

TEST(Augment, BoxesMatchWarpedMasksUnderTfCropAndPad) {
  AugmentOptions o;
  o.random_crop_image.enabled = true;
  o.random_crop_image.min_area = 0.3;
  o.random_absolute_pad_image.enabled = true;
  o.random_absolute_pad_image.max_height_padding = 60;
  o.random_absolute_pad_image.max_width_padding = 60;
  o.random_horizontal_flip.enabled = true;
  for (const uint64_t seed : {2, 12, 22}) expect_ious(box_mask_ious(o, synthetic(8, 3, 160, seed, 40, 90), 160, 32), 10);
}

TEST(Augment, CpuWarpLoopEqualsTheTensorOpWarp) {
  AugmentOptions o;
  o.degrees = 20, o.scale = 0.4, o.shear = 3, o.translate = 0.1, o.perspective = 0.0003, o.fliplr = 0.5, o.mosaic = 0.7;
  AugmentOptions tf;
  tf.random_crop_image.enabled = tf.random_absolute_pad_image.enabled = true;
  tf.random_absolute_pad_image.max_height_padding = tf.random_absolute_pad_image.max_width_padding = 40;
  const Synthetic s = synthetic(6, 2, 96, 12);
  for (const AugmentOptions* opts : {&o, &tf})
    for (const int64_t out : {96, 128}) {
      const augment::Params p = augment::draw_params(*opts, inputs(s, out));
      const at::Tensor loop = augment::warp(p, s.batch.images, 114, p.pad_colour);
      const at::Tensor ref = augment::warp_reference(p, s.batch.images, 114, p.pad_colour);
      ASSERT_EQ(loop.sizes(), ref.sizes());
      const at::Tensor diff = (loop - ref).abs();
      EXPECT_LT(diff.mean().item<double>(), 0.01);
      EXPECT_GT((diff < 0.5).to(at::kFloat).mean().item<double>(), 0.999);
    }
}

TEST(Augment, PlainWarpEqualsOpenCvWarpAffine) {
  AugmentOptions o;
  o.degrees = 30, o.scale = 0.3, o.shear = 4, o.translate = 0.1;
  const Synthetic s = synthetic(3, 1, 96, 3);
  const augment::Params p = augment::draw_params(o, inputs(s, 96));
  const at::Tensor ours = augment::warp(p, s.batch.images.to(at::kFloat), 114, at::Tensor());  // [B, 3, S, S]
  for (int64_t b = 0; b < 3; ++b) {
    // OpenCV maps integer pixel coordinates, we map pixel centres: M_cv = T(-0.5) M T(0.5).
    const at::Tensor m = p.matrix[b].to(at::kDouble);
    const at::Tensor shift = at::eye(3, at::kDouble), back = at::eye(3, at::kDouble);
    shift[0][2] = 0.5, shift[1][2] = 0.5, back[0][2] = -0.5, back[1][2] = -0.5;
    const at::Tensor mcv = at::matmul(back, at::matmul(m, shift)).contiguous();
    cv::Mat M(2, 3, CV_64F, mcv.data_ptr<double>());
    const at::Tensor hwc = s.batch.images[b].permute({1, 2, 0}).contiguous();
    cv::Mat src(96, 96, CV_8UC3, hwc.data_ptr<uint8_t>()), dst;
    cv::warpAffine(src, dst, M, cv::Size(96, 96), cv::INTER_LINEAR, cv::BORDER_CONSTANT, cv::Scalar(114, 114, 114));
    const at::Tensor ref = at::from_blob(dst.data, {96, 96, 3}, at::kByte).permute({2, 0, 1}).to(at::kFloat);
    const at::Tensor diff = (ours[b] - ref).abs();
    // Pixels on the image border differ in how the two blend with the fill; the rest agree.
    EXPECT_GT((diff <= 2).to(at::kFloat).mean().item<double>(), 0.98) << "image " << b;
    EXPECT_LT(diff.median().item<double>(), 1.0);
  }
}

TEST(Augment, HsvMatchesOpenCvAndTfColourFormulas) {
  const Synthetic s = synthetic(2, 1, 32, 4);
  const at::Tensor x = s.batch.images.to(at::kFloat) / 255;
  augment::Params p;
  p.any_hsv = true;
  p.hue = at::tensor({0.25f, -0.1f});
  p.saturation = at::tensor({0.5f, 1.4f});
  p.value = at::tensor({0.8f, 1.2f});
  const at::Tensor ours = augment::adjust_colour(p, x);
  for (int64_t b = 0; b < 2; ++b) {
    const at::Tensor hwc = x[b].permute({1, 2, 0}).contiguous();
    cv::Mat rgb(32, 32, CV_32FC3, hwc.data_ptr<float>()), hsv, back;
    cv::cvtColor(rgb, hsv, cv::COLOR_RGB2HSV);  // H in degrees, S and V in [0, 1]
    std::vector<cv::Mat> ch;
    cv::split(hsv, ch);
    const float dh = p.hue[b].item<float>() * 360, fs = p.saturation[b].item<float>(), fv = p.value[b].item<float>();
    for (int i = 0; i < ch[0].rows * ch[0].cols; ++i) {
      float& h = ch[0].ptr<float>()[i];
      h = std::fmod(h + dh + 360.0f, 360.0f);
      ch[1].ptr<float>()[i] = std::min(1.0f, ch[1].ptr<float>()[i] * fs);
      ch[2].ptr<float>()[i] = std::min(1.0f, ch[2].ptr<float>()[i] * fv);
    }
    cv::merge(ch, hsv);
    cv::cvtColor(hsv, back, cv::COLOR_HSV2RGB);
    const at::Tensor ref = at::from_blob(back.data, {32, 32, 3}, at::kFloat).permute({2, 0, 1});
    EXPECT_LT((ours[b] - ref).abs().max().item<double>(), 1e-4) << "image " << b;
  }
  // The CPU's fused loop against the tensor-op version (what CUDA runs), on random colours.
  const at::Tensor noise = at::rand({3, 3, 40, 40});
  const at::Tensor hs = at::tensor({0.3f, -0.7f, 0.01f}), sg = at::tensor({0.2f, 1.7f, 1.0f}), vg = at::tensor({1.3f, 0.6f, 1.0f});
  EXPECT_LT((augment::shift_hsv(noise, hs, sg, vg) - augment::shift_hsv_reference(noise, hs, sg, vg)).abs().max().item<double>(), 1e-5);
  // Identity gains leave the image alone (HSV round trip).
  p.hue = at::zeros({2}), p.saturation = at::ones({2}), p.value = at::ones({2});
  EXPECT_LT((augment::adjust_colour(p, x) - x).abs().max().item<double>(), 1e-5);
  // TF brightness then contrast: clip(x + d), then (x - mean) * f + mean per channel, clipped.
  p.any_hsv = false;
  p.any_contrast = true;
  p.brightness = at::tensor({0.1f, -0.2f});
  p.contrast = at::tensor({1.2f, 0.8f});
  const at::Tensor bright = (x + p.brightness.view({2, 1, 1, 1})).clamp(0, 1);
  const at::Tensor mean = bright.mean({2, 3}, true);
  const at::Tensor ref = ((bright - mean) * p.contrast.view({2, 1, 1, 1}) + mean).clamp(0, 1);
  EXPECT_LT((augment::adjust_colour(p, x) - ref).abs().max().item<double>(), 1e-6);
}

TEST(Augment, DrawsAreDeterministicPerImageAndChangeWithTheEpoch) {
  AugmentOptions o;
  o.degrees = 10, o.scale = 0.5, o.translate = 0.1, o.fliplr = 0.5, o.hsv_h = 0.015, o.hsv_s = 0.7, o.hsv_v = 0.4;
  const Synthetic s = synthetic(4, 2, 64, 5);
  const augment::Params a = augment::draw_params(o, inputs(s, 64));
  const augment::Params again = augment::draw_params(o, inputs(s, 64));
  EXPECT_TRUE(at::equal(a.matrix, again.matrix));
  EXPECT_TRUE(at::equal(a.saturation, again.saturation));
  // The same image in another batch, at another position, gets the same parameters.
  Synthetic other = synthetic(4, 2, 64, 6);
  other.ids = at::tensor({7L, 102L, 9L, 11L});
  const augment::Params moved = augment::draw_params(o, inputs(other, 64));
  EXPECT_TRUE(at::allclose(moved.matrix[1], a.matrix[2]));
  EXPECT_FLOAT_EQ(moved.hue[1].item<float>(), a.hue[2].item<float>());
  // Images differ from each other, and epochs from epochs.
  EXPECT_FALSE(at::allclose(a.matrix[0], a.matrix[1]));
  const augment::Params next = augment::draw_params(o, inputs(s, 64, augment::epoch_key(0, 1)));
  const augment::Params first = augment::draw_params(o, inputs(s, 64, augment::epoch_key(0, 0)));
  EXPECT_FALSE(at::allclose(next.matrix, first.matrix));
  // Probabilities hold over many images: fliplr 0.5 flips about half.
  Synthetic many = synthetic(1, 1, 64, 7);
  augment::DrawInputs d = inputs(many, 64);
  d.images = at::zeros({4000, 3, 8, 8}, at::kByte);
  d.boxes = at::zeros({4000, 0, 4});
  d.classes = at::zeros({4000, 0}, at::kLong);
  d.sample_ids = at::arange(4000, at::kLong);
  d.content = at::tensor({0.0f, 0.0f, 8.0f, 8.0f}).repeat({4000, 1});
  AugmentOptions flips;
  flips.fliplr = 0.3;
  const augment::Params pf = augment::draw_params(flips, d);
  const double flipped = (pf.matrix.select(1, 0).select(1, 0) < 0).to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(flipped, 0.3, 0.03);
}

TEST(Augment, TfCropHoldsAWholeBoxAndItsArea) {
  AugmentOptions o;
  o.random_crop_image.enabled = true;
  o.random_crop_image.min_area = o.random_crop_image.max_area = 0.5;
  o.random_crop_image.min_aspect_ratio = o.random_crop_image.max_aspect_ratio = 1.0;
  const Synthetic s = synthetic(16, 2, 128, 8, 10, 30);
  const augment::Params p = augment::draw_params(o, inputs(s, 128));
  const at::Tensor w = p.window;
  EXPECT_TRUE(at::allclose((w.select(1, 2) - w.select(1, 0)) * (w.select(1, 3) - w.select(1, 1)),
                           at::full({16}, 0.5f * 128 * 128), 1e-3, 1e-1));
  for (int64_t b = 0; b < 16; ++b) {
    bool holds = false;
    for (int64_t k = 0; k < 2; ++k) {
      const at::Tensor box = s.batch.boxes[b][k];
      holds = holds || (box[0].item<float>() >= w[b][0].item<float>() - 1e-3 && box[1].item<float>() >= w[b][1].item<float>() - 1e-3 &&
                        box[2].item<float>() <= w[b][2].item<float>() + 1e-3 && box[3].item<float>() <= w[b][3].item<float>() + 1e-3);
    }
    EXPECT_TRUE(holds) << "crop of image " << b << " holds no whole box";
  }
  // random_coef 1 keeps every image whole.
  o.random_crop_image.random_coef = 1;
  const augment::Params whole = augment::draw_params(o, inputs(s, 128));
  EXPECT_TRUE(at::allclose(whole.window, s.content));
}

// TF's random_crop_image prunes by what the crop window shows of a box, whatever clip_boxes
// says; clip_boxes false then keeps the survivors' own extent. A box outside the window, on the
// frame's bars beside the fitted crop, is dropped either way.
TEST(Augment, TfCropPrunesByTheWindowAndClipBoxesOnlyDecidesTheExtent) {
  AugmentOptions o;
  o.random_crop_image.enabled = true;
  o.random_crop_image.min_area = o.random_crop_image.max_area = 0.5;
  o.random_crop_image.min_aspect_ratio = o.random_crop_image.max_aspect_ratio = 2.0;  // 128 x 64: bars above and below
  const Synthetic s = synthetic(8, 1, 128, 11, 10, 20);
  at::Tensor boxes = at::zeros({8, 3, 4}), classes = at::zeros({8, 3}, at::kLong), crowd = at::zeros({8, 3}, at::kBool);
  for (bool clip : {true, false}) {
    o.random_crop_image.clip_boxes = clip;
    const augment::Params p = augment::draw_params(o, inputs(s, 128));
    int64_t checked = 0;
    for (int64_t b = 0; b < 8; ++b) {
      const float y1 = p.window[b][1].item<float>(), y2 = p.window[b][3].item<float>();
      const bool top = y1 >= 14;
      // 0: 12 of its 20 px inside the window; 1: wholly outside it; 2: wholly inside.
      boxes[b][0] = top ? at::tensor({40.0f, y1 - 8, 80.0f, y1 + 12}) : at::tensor({40.0f, y2 - 12, 80.0f, y2 + 8});
      boxes[b][1] = top ? at::tensor({40.0f, y1 - 12, 80.0f, y1 - 2}) : at::tensor({40.0f, y2 + 2, 80.0f, y2 + 12});
      boxes[b][2] = at::tensor({40.0f, y1 + 20, 80.0f, y1 + 40});
    }
    const augment::WarpedBoxes wb = augment::warp_boxes(p, o, boxes, classes, crowd);
    for (int64_t b = 0; b < 8; ++b) {
      if (std::abs(p.window[b][3].item<float>() - p.window[b][1].item<float>() - 64) > 1) continue;  // not cropped
      ++checked;
      EXPECT_TRUE(wb.keep[b][0].item<bool>()) << b;
      EXPECT_FALSE(wb.keep[b][1].item<bool>()) << b << " clip_boxes " << clip;
      EXPECT_TRUE(wb.keep[b][2].item<bool>()) << b;
      const float h = wb.boxes[b][0][3].item<float>() - wb.boxes[b][0][1].item<float>();
      EXPECT_NEAR(h, clip ? 12.0f : 20.0f, 0.01) << b;  // the crop is fitted at scale 1
    }
    EXPECT_GE(checked, 4);
  }
  // overlap_thresh 1.0 keeps whole boxes only (TF's prune keeps an overlap >= the threshold).
  o.random_crop_image.overlap_thresh = 1.0;
  const augment::Params p = augment::draw_params(o, inputs(s, 128));
  const augment::WarpedBoxes wb = augment::warp_boxes(p, o, boxes, classes, crowd);
  for (int64_t b = 0; b < 8; ++b) {
    if (std::abs(p.window[b][3].item<float>() - p.window[b][1].item<float>() - 64) > 1) continue;
    EXPECT_FALSE(wb.keep[b][0].item<bool>()) << b;
    EXPECT_TRUE(wb.keep[b][2].item<bool>()) << b;
  }
}

// Ultralytics' box_candidates (box_min_size, box_max_aspect) runs in its random_perspective, so
// in every Ultralytics pipeline; TF's options never drop a box for being small: the seed user's
// TF pipeline trained on 1-px boxes that Headroom dropped.
TEST(Augment, TfPipelinesKeepEveryBoxWithAnArea) {
  const Synthetic s = synthetic(4, 2, 64, 5);
  at::Tensor boxes = at::zeros({4, 2, 4}), classes = at::zeros({4, 2}, at::kLong), crowd = at::zeros({4, 2}, at::kBool);
  boxes.select(1, 0).copy_(at::tensor({10.0f, 10.0f, 11.0f, 40.0f}));  // 1 x 30 px
  boxes.select(1, 1).copy_(at::tensor({30.0f, 20.0f, 50.0f, 40.0f}));  // 20 x 20 px
  const auto kept = [&](const AugmentOptions& o) {
    const augment::Params p = augment::draw_params(o, inputs(s, 64, 7, false));
    const at::Tensor keep = augment::warp_boxes(p, o, boxes, classes, crowd).keep;
    EXPECT_TRUE(keep.select(1, 1).all().item<bool>());
    return keep.select(1, 0).sum().item<int64_t>();
  };
  AugmentOptions tf;
  tf.random_adjust_brightness.enabled = true;
  tf.random_horizontal_flip.enabled = true;
  EXPECT_EQ(kept(tf), 4);
  AugmentOptions ultralytics;
  ultralytics.hsv_v = 0.4;
  ultralytics.fliplr = 0.5;
  EXPECT_EQ(kept(ultralytics), 0);
  EXPECT_EQ(kept(AugmentOptions()), 0);  // no augmentation: Ultralytics' RandomPerspective still runs
  AugmentOptions mixed = tf;  // TF colour with Ultralytics' affine: box_candidates runs
  mixed.translate = 0.1;
  EXPECT_EQ(kept(mixed), 0);
}

// Inputs for n images without boxes whose content is the whole 8 px canvas.
augment::DrawInputs boxless(int64_t n) {
  augment::DrawInputs d = inputs(synthetic(1, 1, 8, 3), 8);
  d.images = at::zeros({n, 3, 8, 8}, at::kByte);
  d.boxes = at::zeros({n, 0, 4});
  d.classes = at::zeros({n, 0}, at::kLong);
  d.sample_ids = at::arange(n, at::kLong);
  d.content = at::tensor({0.0f, 0.0f, 8.0f, 8.0f}).repeat({n, 1});
  return d;
}

at::Tensor window_area(const augment::Params& p) {
  const at::Tensor& w = p.window;
  return (w.select(1, 2) - w.select(1, 0)) * (w.select(1, 3) - w.select(1, 1));
}

// TF's sample_distorted_bounding_box draws the crop's height uniformly for the drawn aspect (not
// its area), and the OD API makes an image without boxes its own box. The mean kept area 0.376
// is TF's GenerateRandomCrop simulated on 512 x 512 images (tests/fixtures has no TF: the
// figure came from a transcription of the kernel, 20000 crops); an area drawn uniformly gives 0.45.
TEST(Augment, TfCropDrawsTheSizesTfDraws) {
  AugmentOptions o;
  o.random_crop_image.enabled = true;
  const augment::DrawInputs d = boxless(4000);
  // min_object_covered 1.0 (TF's default): an image without boxes is never cropped.
  EXPECT_TRUE(at::allclose(window_area(augment::draw_params(o, d)), at::full({4000}, 64.0f)));
  o.random_crop_image.min_object_covered = 0.1;
  o.random_crop_image.min_aspect_ratio = 0.5, o.random_crop_image.max_aspect_ratio = 1.7;
  const at::Tensor kept = window_area(augment::draw_params(o, d)) / 64;
  EXPECT_NEAR(kept.mean().item<double>(), 0.376, 0.015);
  EXPECT_NEAR((kept < 0.3).to(at::kFloat).mean().item<double>(), 0.43, 0.03);
  EXPECT_GE(kept.min().item<double>(), 0.1 - 1e-4);
}

// TF pads before resizing, by less than max_*_padding pixels of the image: an image shown at
// half size in the canvas gets half as many canvas pixels.
TEST(Augment, TfPadIsInTheImagesOwnPixels) {
  AugmentOptions o;
  o.random_absolute_pad_image.enabled = true;
  o.random_absolute_pad_image.max_height_padding = o.random_absolute_pad_image.max_width_padding = 40;
  augment::DrawInputs d = boxless(4000);
  for (const float scale : {1.0f, 0.5f}) {
    d.scale = at::full({4000}, scale);
    const augment::Params p = augment::draw_params(o, d);
    const at::Tensor extra = (p.view.select(1, 2) - p.view.select(1, 0)) - (p.window.select(1, 2) - p.window.select(1, 0));
    EXPECT_GE(extra.min().item<double>(), 0);
    EXPECT_LE(extra.max().item<double>(), 39 * scale + 1e-4) << scale;
    EXPECT_GE(extra.max().item<double>(), 38 * scale - 1e-4) << scale;
    const at::Tensor left = p.window.select(1, 0) - p.view.select(1, 0);
    EXPECT_TRUE(((left <= extra - scale + 1e-4) | (extra == 0)).all().item<bool>()) << scale;  // offset in [0, padding)
  }
}

// TF adjusts contrast before padding: about the picture's mean. The padding (black here) is not
// in it, so the picture's mean stays where it was.
TEST(Augment, TfContrastTurnsAboutThePicturesMean) {
  AugmentOptions o;
  o.random_absolute_pad_image.enabled = true;
  o.random_absolute_pad_image.max_height_padding = o.random_absolute_pad_image.max_width_padding = 48;
  o.random_absolute_pad_image.pad_color = {0, 0, 0};
  o.random_adjust_contrast.enabled = true;
  Synthetic s = synthetic(6, 1, 64, 12);
  s.batch.images = (s.batch.images.to(at::kFloat) * (70.0 / 255) + 90).to(at::kByte);  // 90..160: no clipping at 1.25
  const augment::Params p = augment::draw_params(o, inputs(s, 64));
  augment::Params flat = p;
  flat.any_contrast = false;
  const at::Tensor adjusted = augment::apply(p, o, s.batch, 4).images, plain = augment::apply(flat, o, s.batch, 4).images;
  const at::Tensor picture = augment::picture_mask(p, 0, 6).to(at::kFloat);
  ASSERT_TRUE((picture.sum({1, 2, 3}) < 64 * 64).all().item<bool>());  // every image padded
  const auto mean = [&](const at::Tensor& x) { return (x * picture).sum({2, 3}) / picture.sum({2, 3}); };
  EXPECT_LT((mean(adjusted) - mean(plain)).abs().max().item<double>(), 1e-4);
  EXPECT_GT((adjusted - plain).abs().max().item<double>(), 0.02);
}

TEST(Augment, ApplyKeepsSurvivorsFirstWithinTheRowBound) {
  AugmentOptions o;
  o.mosaic = 1, o.mixup = 0.5, o.translate = 0.2, o.scale = 0.5;
  const Synthetic s = synthetic(4, 3, 96, 9, 8, 30);
  const augment::Params p = augment::draw_params(o, inputs(s, 96));
  const augment::Batch out = augment::apply(p, o, s.batch, 20);
  ASSERT_EQ(out.classes.size(1), 20);
  EXPECT_EQ(out.images.sizes(), (at::IntArrayRef{4, 3, 96, 96}));
  EXPECT_GE(out.images.min().item<float>(), 0);
  EXPECT_LE(out.images.max().item<float>(), 1);
  const at::Tensor valid = out.classes >= 0;
  // valid rows form a prefix; padding rows are zero boxes
  EXPECT_TRUE(at::equal(valid, std::get<0>(at::sort(valid.to(at::kInt), true, 1, true)).to(at::kBool)));
  EXPECT_EQ(out.boxes.masked_select(valid.logical_not().unsqueeze(2)).abs().sum().item<float>(), 0);
  EXPECT_GT(valid.sum().item<int64_t>(), 12);  // mosaics gather boxes of four images
  // Images without boxes go through too.
  Synthetic empty = synthetic(3, 0, 64, 13);
  const augment::Batch none_out = augment::apply(augment::draw_params(o, inputs(empty, 64)), o, empty.batch, 0);
  EXPECT_EQ(none_out.boxes.sizes(), (at::IntArrayRef{3, 0, 4}));
  EXPECT_EQ(none_out.images.size(0), 3);
  // Everything off: the images come through unchanged.
  const augment::Params none = augment::draw_params(AugmentOptions(), inputs(s, 96));
  const augment::Batch same = augment::apply(none, AugmentOptions(), s.batch, 3);
  EXPECT_LT((same.images * 255 - s.batch.images.to(at::kFloat)).abs().max().item<double>(), 0.01);
  EXPECT_TRUE(at::allclose(same.boxes, s.batch.boxes));
}

// No box is dropped for want of rows: what survives the transform with no row limit fits the
// bound the trainer computes from the host counts, over many draws, for batches of 1 to 5
// images with one crowded image (partners repeat below 4), mosaics zoomed out to show every
// tile, and mixup. The four largest counts alone are not enough below 4 images: a crowded
// partner fills three tiles; from 4 images on the partners are distinct.
TEST(Augment, TheRowBoundHoldsEverySurvivor) {
  AugmentOptions o;
  o.mosaic = 1, o.mixup = 0.5, o.scale = 0.5;
  bool repeats_overflowed_four_largest = false;
  for (int64_t B = 1; B <= 5; ++B) {
    Synthetic s = synthetic(B, 12, 96, 20 + uint64_t(B), 4, 10);  // 12 small boxes on image 0, 2 on the others
    at::Tensor counts = at::full({B}, 2, at::kLong);
    counts[0] = 12;
    for (int64_t b = 1; b < B; ++b) {
      s.batch.classes[b].narrow(0, 2, 10).fill_(-1);
      s.batch.boxes[b].narrow(0, 2, 10).zero_();
    }
    for (uint64_t key = 0; key < 40; ++key) {
      const augment::Params p = augment::draw_params(o, inputs(s, 96, key));
      const augment::Batch out = augment::apply(p, o, s.batch, int64_t(1) << 20);
      const int64_t survivors = (out.classes >= 0).sum(1).max().item<int64_t>();
      const int64_t bound = augment::row_bound(p, counts);
      EXPECT_LE(survivors, bound) << B << " images, key " << key;
      const int64_t four_largest = std::min<int64_t>(12 + 2 * std::min<int64_t>(B - 1, 3), 12 + 2 * (p.tiles - 1)) * (p.any_mixup ? 2 : 1);
      if (B < 4 && survivors > four_largest) repeats_overflowed_four_largest = true;
      if (B >= 4) {  // a mosaic's four images are distinct
        for (int64_t b = 0; b < B; ++b) {
          const at::Tensor row = p.sources[b];
          EXPECT_EQ(std::get<0>(at::_unique(row)).numel(), 4) << B << " images, key " << key << ": " << row;
        }
      }
    }
  }
  EXPECT_TRUE(repeats_overflowed_four_largest) << "no draw reached the edge this test is for";
}

// Each parameter has its slot whatever the compiler: the colour draws of a fixed key, with
// every colour option on, as GCC's builds have drawn them since the draws were named (operands
// of one expression evaluate in an order the compiler chooses).
TEST(Augment, TheColourDrawsAreTheSameOnEveryCompiler) {
  AugmentOptions o;
  o.hsv_h = 0.015, o.hsv_s = 0.7, o.hsv_v = 0.4, o.hsv_p = 1;
  o.random_adjust_brightness.enabled = o.random_adjust_contrast.enabled = true;
  o.random_adjust_hue.enabled = o.random_adjust_saturation.enabled = true;
  const Synthetic s = synthetic(3, 1, 64, 5);
  const augment::Params p = augment::draw_params(o, inputs(s, 64, 11, false));
  const auto near = [](const at::Tensor& got, std::vector<double> want) {
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[int64_t(i)].item<double>(), want[i], 1e-6) << "image " << i;
  };
  near(p.brightness, {-0.0063257, -0.1324019, -0.0661830});
  near(p.hue, {0.0221304, -0.0036881, -0.0050730});
  near(p.saturation, {1.1067337, 0.6947891, 0.8367321});
}

// TF's absolute pad without pad_color pads with the image's mean colour: of its letterbox
// content, the grey bars left out; a pad_color given is used as it is.
TEST(Augment, ThePadColourIsTheContentsMeanOrTheGivenOne) {
  AugmentOptions o;
  o.random_absolute_pad_image.enabled = true;
  o.random_absolute_pad_image.max_height_padding = o.random_absolute_pad_image.max_width_padding = 16;
  Synthetic s = synthetic(2, 1, 64, 3);
  s.batch.images.fill_(114);  // the bars
  for (int64_t ch = 0; ch < 3; ++ch) s.batch.images.select(1, ch).narrow(1, 16, 32).fill_(10 * (ch + 1));  // rows 16..47: the picture
  s.content = at::tensor({0.0f, 16.0f, 64.0f, 48.0f}).repeat({2, 1});
  const augment::Params mean = augment::draw_params(o, inputs(s, 64, 5, false));
  EXPECT_TRUE(at::allclose(mean.pad_colour, at::tensor({10.0f, 20.0f, 30.0f}).repeat({2, 1}))) << mean.pad_colour;
  o.random_absolute_pad_image.pad_color = {1, 2, 3};
  const augment::Params given = augment::draw_params(o, inputs(s, 64, 5, false));
  EXPECT_TRUE(at::allclose(given.pad_colour, at::tensor({1.0f, 2.0f, 3.0f}).repeat({2, 1}))) << given.pad_colour;
}

// close_mosaic epochs turn mixup off too: with mixup certain (1.0), an epoch with mosaics mixes
// every image with another, a closing epoch none.
TEST(Augment, MixupIsOffInTheCloseMosaicEpochs) {
  AugmentOptions o;
  o.mosaic = 1, o.mixup = 1;
  const Synthetic s = synthetic(4, 3, 64, 17);
  const augment::Params open = augment::draw_params(o, inputs(s, 64, 3, /*mosaic=*/true));
  EXPECT_TRUE(open.any_mixup);
  EXPECT_LT(open.mix_ratio.max().item<double>(), 1.0);
  const augment::Params closing = augment::draw_params(o, inputs(s, 64, 3, /*mosaic=*/false));
  EXPECT_FALSE(closing.any_mixup);
  EXPECT_EQ(closing.mix_ratio.min().item<double>(), 1.0);
  const augment::Batch out = augment::apply(closing, o, s.batch, int64_t(1) << 20);
  EXPECT_EQ(out.classes.size(1), 3);  // no partner's rows, no other tile's
  EXPECT_EQ(closing.tiles, 1);
}

TEST(Augment, MultiScaleSizesAreMultiplesInRange) {
  AugmentOptions o;
  o.multi_scale = 0.5;
  const augment::Augmenter a(augment::AugmenterOptions().policy(o).epochs(10));
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 200; ++i) {
    const int64_t s = a.output_size(640, 0, i);
    EXPECT_EQ(s % 32, 0);
    EXPECT_GE(s, 320);
    EXPECT_LE(s, 960);
    seen.insert(s);
  }
  EXPECT_GT(seen.size(), 10u);
  EXPECT_EQ(a.output_size(640, 0, 3), a.output_size(640, 0, 3));
  EXPECT_EQ(a.max_output_size(640), 960);
  o.close_mosaic = 3;
  const augment::Augmenter closing(augment::AugmenterOptions().policy(o).epochs(10));
  EXPECT_TRUE(closing.mosaic_in_epoch(6));
  EXPECT_FALSE(closing.mosaic_in_epoch(7));
  // A run no longer than close_mosaic trains without mosaic throughout (docs/augmentation.md).
  o.close_mosaic = 10;
  const augment::Augmenter short_run(augment::AugmenterOptions().policy(o).epochs(4));
  for (int64_t epoch = 0; epoch < 4; ++epoch) EXPECT_FALSE(short_run.mosaic_in_epoch(epoch)) << epoch;
}

TEST(Augment, CudaEqualsCpu) {
  if (!query_cuda().available) GTEST_SKIP() << "no CUDA device: " << query_cuda().reason;
  AugmentOptions o;
  o.degrees = 20, o.scale = 0.4, o.shear = 3, o.translate = 0.1, o.perspective = 0.0003, o.fliplr = 0.5, o.mosaic = 0.7, o.mixup = 0.3;
  o.hsv_h = 0.015, o.hsv_s = 0.7, o.hsv_v = 0.4;
  o.random_adjust_contrast.enabled = true;
  const Synthetic s = synthetic(8, 4, 128, 10, 10, 40);
  const c10::Device cuda(c10::kCUDA, 0);
  Synthetic g = s;
  g.batch = {s.batch.images.to(cuda), s.batch.boxes.to(cuda), s.batch.classes.to(cuda), s.batch.crowd.to(cuda)};
  g.ids = s.ids.to(cuda);
  g.content = s.content.to(cuda);
  const augment::Params pc = augment::draw_params(o, inputs(s, 160)), pg = augment::draw_params(o, inputs(g, 160));
  EXPECT_TRUE(at::equal(pc.mosaic, pg.mosaic.cpu()));
  EXPECT_TRUE(at::equal(pc.sources, pg.sources.cpu()));
  EXPECT_TRUE(at::allclose(pc.matrix, pg.matrix.cpu(), 1e-5, 1e-4));
  const augment::Batch c = augment::apply(pc, o, s.batch, 64), d = augment::apply(pg, o, g.batch, 64);
  const at::Tensor diff = (c.images - d.images.cpu()).abs();
  EXPECT_LT(diff.mean().item<double>(), 1e-4);
  EXPECT_GT((diff < 1.0 / 255).to(at::kFloat).mean().item<double>(), 0.999);
  EXPECT_TRUE(at::equal(c.classes, d.classes.cpu()));
  EXPECT_TRUE(at::allclose(c.boxes, d.boxes.cpu(), 1e-4, 1e-2));
}

TEST(Augment, ConfigTakesBothVocabulariesAndNamesBadFields) {
  const std::string dir = test::temp_dir("augcfg");
  test::write_bytes(dir + "/a.yaml",
                    "augment:\n  hsv_h: 0.015\n  mosaic: 1.0\n  multi_scale: true\n  random_adjust_hue: {}\n"
                    "  random_crop_image:\n    min_area: 0.3\n    random_coef: 0.25\n  random_adjust_contrast: {min_delta: 0.7}\n");
  const Config c = load_config(dir + "/a.yaml");
  EXPECT_DOUBLE_EQ(c.augment.hsv_h, 0.015);
  EXPECT_DOUBLE_EQ(c.augment.multi_scale, 0.5);
  EXPECT_TRUE(c.augment.random_adjust_hue.enabled);
  EXPECT_DOUBLE_EQ(c.augment.random_adjust_hue.max_delta, 0.02);
  EXPECT_TRUE(c.augment.random_crop_image.enabled);
  EXPECT_DOUBLE_EQ(c.augment.random_crop_image.min_area, 0.3);
  EXPECT_DOUBLE_EQ(c.augment.random_crop_image.random_coef, 0.25);
  EXPECT_DOUBLE_EQ(c.augment.random_adjust_contrast.min_delta, 0.7);
  EXPECT_FALSE(c.augment.random_vertical_flip.enabled);
  // The resolved YAML reads back the same (ops as flow mappings, off ones as false).
  test::write_bytes(dir + "/b.yaml", config_to_yaml(c));
  EXPECT_EQ(config_to_yaml(load_config(dir + "/b.yaml")), config_to_yaml(c));

  const auto error = [&](const std::string& text) {
    test::write_bytes(dir + "/bad.yaml", text);
    try {
      load_config(dir + "/bad.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error("augment:\n  random_crop_image:\n    min_ara: 0.3\n");
  EXPECT_NE(e.find("bad.yaml:2:3"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown field 'min_ara' (line 3); did you mean 'min_area'?"), std::string::npos) << e;
  e = error("augment:\n  random_crop_image: {min_area: 0.3, min_area: 0.5}\n");  // the second was taken silently
  EXPECT_NE(e.find("min_area (line 2) is given twice"), std::string::npos) << e;
  e = error("augment:\n  random_adjust_hue: {max_delta: 2}\n");
  EXPECT_NE(e.find("max_delta (line 2): value 2 is out of range"), std::string::npos) << e;
  e = error("augment:\n  fliplr: 0.5\n  random_horizontal_flip: {}\n");
  EXPECT_NE(e.find("same flip in two vocabularies"), std::string::npos) << e;
  e = error("augment:\n  random_crop_image: {min_area: 0.9, max_area: 0.5}\n");
  EXPECT_NE(e.find("min_area (0.900000) is above its maximum"), std::string::npos) << e;
  e = error("augment:\n  random_absolute_pad_image: {pad_color: [1, 2]}\n");
  EXPECT_NE(e.find("pad_color needs 3 values"), std::string::npos) << e;
  e = error("augment:\n  mosiac: 1\n");
  EXPECT_NE(e.find("did you mean augment.mosaic"), std::string::npos) << e;
}
