#include "headroom/augment/augment.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "headroom/core/device_constant.h"
#include "headroom/core/random.h"
#include "augment_internal.h"

namespace headroom::augment {
namespace {

constexpr int64_t kMask32 = 0xffffffffLL;
constexpr int64_t kCropAttempts = 100;  // TF's sample_distorted_bounding_box default
constexpr int64_t kSlots = 64 + 4 * kCropAttempts;
constexpr double kPi = 3.14159265358979323846;

// 32-bit integer hash on int64 tensors holding values < 2^32 (products stay below 2^59, so the
// arithmetic is exact on every device).
at::Tensor hash32(at::Tensor x) {
  for (int i = 0; i < 2; ++i) x = at::bitwise_and(at::bitwise_xor(at::bitwise_right_shift(x, 16), x) * 0x45d9f3b, kMask32);
  return at::bitwise_xor(at::bitwise_right_shift(x, 16), x);
}

// Uniform numbers in (0, 1), [B, kSlots]: a function of (key, sample id, slot) only. Every
// parameter has its own slot, drawn whether or not its operation is on, so turning one
// operation on does not change the others' numbers.
class Draws {
 public:
  Draws(const at::Tensor& sample_ids, uint64_t key) {
    const at::Tensor c = sample_ids.to(at::kLong).unsqueeze(1) * kSlots + at::arange(kSlots, sample_ids.options().dtype(at::kLong));
    const int64_t k0 = static_cast<int64_t>(key & kMask32), k1 = static_cast<int64_t>((key >> 32) & kMask32);
    at::Tensor x = hash32(at::bitwise_xor(at::bitwise_and(c, kMask32), k0));
    x = hash32(at::bitwise_xor(at::bitwise_xor(x, at::bitwise_and(at::bitwise_right_shift(c, 32), kMask32)), k1));
    u_ = (at::bitwise_right_shift(x, 8).to(at::kFloat) + 0.5f) * (1.0f / 16777216.0f);  // 24 bits: exact in float
  }
  at::Tensor next() { return take(1).squeeze(1); }  // [B]
  at::Tensor take(int64_t n) {                       // [B, n]
    TORCH_CHECK(used_ + n <= kSlots, "augmentation draws more numbers than it has slots");
    at::Tensor r = u_.narrow(1, used_, n);
    used_ += n;
    return r;
  }
  at::Tensor uniform(double lo, double hi) { return next() * (hi - lo) + lo; }
  at::Tensor chance(double p) { return next() < p; }

 private:
  at::Tensor u_;
  int64_t used_ = 0;
};

// A projective map and its inverse, [B, 3, 3] each; built from closed-form inverses so that no
// matrix inversion (and no device sync for singularity checks) is needed.
struct Map {
  at::Tensor m, inv;
  Map then(const Map& next) const { return {at::bmm(next.m, m), at::bmm(inv, next.inv)}; }
};

at::Tensor mat3(const std::vector<at::Tensor>& e) {  // nine [B] tensors, row-major
  return at::stack(e, 1).view({-1, 3, 3});
}

Map translate(const at::Tensor& tx, const at::Tensor& ty) {
  const at::Tensor z = at::zeros_like(tx), o = at::ones_like(tx);
  return {mat3({o, z, tx, z, o, ty, z, z, o}), mat3({o, z, -tx, z, o, -ty, z, z, o})};
}

Map scale(const at::Tensor& k) {
  const at::Tensor z = at::zeros_like(k), o = at::ones_like(k);
  return {mat3({k, z, z, z, k, z, z, z, o}), mat3({1 / k, z, z, z, 1 / k, z, z, z, o})};
}

// cv2.getRotationMatrix2D(centre (0, 0), degrees, scale), as Ultralytics builds it.
Map rotate_scale(const at::Tensor& degrees, const at::Tensor& s) {
  const at::Tensor a = degrees * (kPi / 180), c = at::cos(a), n = at::sin(a), z = at::zeros_like(a), o = at::ones_like(a);
  return {mat3({s * c, s * n, z, -s * n, s * c, z, z, z, o}), mat3({c / s, -n / s, z, n / s, c / s, z, z, z, o})};
}

Map shear(const at::Tensor& x_degrees, const at::Tensor& y_degrees) {
  const at::Tensor a = at::tan(x_degrees * (kPi / 180)), b = at::tan(y_degrees * (kPi / 180));
  const at::Tensor z = at::zeros_like(a), o = at::ones_like(a), d = 1 / (1 - a * b);
  return {mat3({o, a, z, b, o, z, z, z, o}), mat3({d, -a * d, z, -b * d, d, z, z, z, o})};
}

Map perspective(const at::Tensor& px, const at::Tensor& py) {
  const at::Tensor z = at::zeros_like(px), o = at::ones_like(px);
  return {mat3({o, z, z, z, o, z, px, py, o}), mat3({o, z, z, z, o, z, -px, -py, o})};
}

// x -> size - x where `on` (and likewise y for vertical); its own inverse.
Map flip(const at::Tensor& on_x, const at::Tensor& on_y, double size) {
  const at::Tensor fx = 1 - 2 * on_x.to(at::kFloat), fy = 1 - 2 * on_y.to(at::kFloat);
  const at::Tensor z = at::zeros_like(fx), o = at::ones_like(fx);
  const at::Tensor m = mat3({fx, z, (1 - fx) * (size / 2), z, fy, (1 - fy) * (size / 2), z, z, o});
  return {m, m};
}

// Per image, the first crop of kCropAttempts that fits the content and holds at least
// min_object_covered of some box; TF's sample_distorted_bounding_box with the OD API's
// use_image_if_no_bounding_boxes (an image without boxes must keep that share of itself). As
// TF's GenerateRandomCrop, the height is drawn uniformly between the area range's heights for
// the drawn aspect, its top capped so that the crop fits (an area drawn uniformly would make
// larger crops). Returns [B, 4] xyxy and whether one was found.
std::pair<at::Tensor, at::Tensor> sample_crops(const TfCrop& o, Draws& d, const at::Tensor& content, const at::Tensor& boxes,
                                               const at::Tensor& valid) {
  const at::Tensor u = d.take(4 * kCropAttempts).view({-1, kCropAttempts, 4});  // [B, A, 4]
  const at::Tensor cw = (col(content, 2) - col(content, 0)).unsqueeze(1), ch = (col(content, 3) - col(content, 1)).unsqueeze(1);
  const at::Tensor aspect = col(u, 1) * (o.max_aspect_ratio - o.min_aspect_ratio) + o.min_aspect_ratio;  // w / h
  const at::Tensor h_lo = at::sqrt(o.min_area * cw * ch / aspect);
  const at::Tensor h_hi = at::minimum(at::minimum(at::sqrt(o.max_area * cw * ch / aspect), cw / aspect), ch);
  const at::Tensor h = h_lo + col(u, 0) * (h_hi - h_lo).clamp_min(0), w = h * aspect;
  const at::Tensor fits = h_lo <= h_hi * (1 + 1e-6);
  const at::Tensor x0 = col(content, 0).unsqueeze(1) + col(u, 2) * (cw - w).clamp_min(0);
  const at::Tensor y0 = col(content, 1).unsqueeze(1) + col(u, 3) * (ch - h).clamp_min(0);
  const at::Tensor crops = at::stack({x0, y0, x0 + w, y0 + h}, -1);  // [B, A, 4]
  const at::Tensor itself = w * h / (cw * ch) >= o.min_object_covered - 1e-6;  // [B, A]: the image as its box
  at::Tensor ok = fits & itself;
  if (boxes.size(1) > 0) {
    const at::Tensor c = crops.unsqueeze(2), b = boxes.unsqueeze(1);  // [B, A, 1, 4], [B, 1, N, 4]
    const at::Tensor iw = (at::minimum(col(c, 2), col(b, 2)) - at::maximum(col(c, 0), col(b, 0))).clamp_min(0);
    const at::Tensor ih = (at::minimum(col(c, 3), col(b, 3)) - at::maximum(col(c, 1), col(b, 1))).clamp_min(0);
    const at::Tensor barea = ((col(b, 2) - col(b, 0)) * (col(b, 3) - col(b, 1))).clamp_min(1e-6);
    const at::Tensor covered = (iw * ih / barea >= o.min_object_covered - 1e-6) & valid.unsqueeze(1);
    ok = fits & at::where(valid.any(1, true), covered.any(2), itself);
  }
  const at::Tensor first = ok.to(at::kByte).argmax(1);  // the first attempt that works
  const at::Tensor crop = crops.gather(1, first.view({-1, 1, 1}).expand({-1, 1, 4})).squeeze(1);
  return {crop, ok.any(1)};
}

at::Tensor where4(const at::Tensor& cond, const at::Tensor& a, const at::Tensor& b) { return at::where(cond.unsqueeze(1), a, b); }

}  // namespace

bool enabled(const AugmentOptions& o) {
  return o.hsv_h > 0 || o.hsv_s > 0 || o.hsv_v > 0 || o.degrees > 0 || o.translate > 0 || o.scale > 0 || o.shear > 0 ||
         o.perspective > 0 || o.flipud > 0 || o.fliplr > 0 || o.mosaic > 0 || o.mixup > 0 || o.multi_scale > 0 ||
         o.random_horizontal_flip.enabled || o.random_vertical_flip.enabled || o.random_crop_image.enabled ||
         o.random_absolute_pad_image.enabled || o.random_adjust_hue.enabled || o.random_adjust_brightness.enabled ||
         o.random_adjust_contrast.enabled || o.random_adjust_saturation.enabled;
}

uint64_t epoch_key(int64_t seed, int64_t epoch) {
  return mix_seed(mix_seed(static_cast<uint64_t>(seed) ^ 0x6175676d656e74ULL) + static_cast<uint64_t>(epoch));
}

namespace {

// The batch-wide values every stage of draw_params starts from.
struct BatchConsts {
  int64_t B, S;
  at::TensorOptions fopt;             // float, on the images' device
  at::Tensor zero, one, off, self;    // [B]: 0, 1, false, the image's own batch index
};

BatchConsts batch_consts(const DrawInputs& in) {
  BatchConsts c;
  c.B = in.images.size(0), c.S = in.images.size(2);
  c.fopt = in.images.options().dtype(at::kFloat);
  c.zero = at::zeros({c.B}, c.fopt), c.one = at::ones({c.B}, c.fopt);
  c.off = at::zeros({c.B}, c.fopt.dtype(at::kBool));
  c.self = at::arange(c.B, c.fopt.dtype(at::kLong));
  return c;
}

// Whether this batch makes mosaics at all, and each mosaic canvas's centre, [B] pixels each.
struct MosaicCentre {
  bool on;
  at::Tensor xc, yc;
};

// The three other images of a mosaic ([B, 3] of u [B, 3] uniform in [0, 1)), as offsets 1 ..
// B - 1 from the image. From 4 images on they are distinct (a draw past the ones taken, so each
// is uniform over the rest): a mosaic's rows are then at most the batch's four largest counts.
// With fewer, images repeat.
at::Tensor mosaic_partners(const at::Tensor& u, const at::Tensor& self, int64_t B) {
  const auto pick = [&](int64_t k, int64_t choices) {  // [B] in 0 .. choices - 1
    return (u.select(1, k) * double(choices)).to(at::kLong).clamp_max(choices - 1);
  };
  at::Tensor offsets;
  if (B >= 4) {
    const at::Tensor a = pick(0, B - 1), b0 = pick(1, B - 2), c0 = pick(2, B - 3);
    const at::Tensor b = b0 + (b0 >= a).to(at::kLong);
    const at::Tensor lo = at::minimum(a, b), hi = at::maximum(a, b);
    at::Tensor c = c0 + (c0 >= lo).to(at::kLong);
    c = c + (c >= hi).to(at::kLong);
    offsets = at::stack({a, b, c}, 1);
  } else {
    offsets = (u * double(std::max<int64_t>(B - 1, 1))).to(at::kLong).clamp_max(std::max<int64_t>(B - 2, 0));
  }
  return at::remainder(self.unsqueeze(1) + 1 + offsets, std::max<int64_t>(B, 1));
}

// Mosaic: the image and three others of the batch in a 2x2 tile canvas, the canvas centre
// at (xc, yc) uniform in [S/2, 3S/2] (Ultralytics' mosaic border). Sets tiles, mosaic and sources.
MosaicCentre draw_mosaic(const AugmentOptions& o, const DrawInputs& in, const BatchConsts& c, Draws& d, Params& p) {
  const int64_t B = c.B, S = c.S;
  const at::Tensor& self = c.self;
  const bool mosaic_on = in.mosaic && o.mosaic > 0 && B > 0;
  p.tiles = mosaic_on ? 4 : 1;
  const at::Tensor mosaic_draw = d.chance(o.mosaic);
  p.mosaic = mosaic_on ? mosaic_draw : c.off;
  p.sources = mosaic_on ? at::cat({self.unsqueeze(1), mosaic_partners(d.take(3), self, B)}, 1) : self.unsqueeze(1);
  const at::Tensor xc = d.uniform(0.5 * S, 1.5 * S), yc = d.uniform(0.5 * S, 1.5 * S);
  return {mosaic_on, xc, yc};
}

// The part of each image kept (`window`) and the padded frame around it (`view`), [B, 4] xyxy
// input pixels each; `cropped` [B] marks the images whose TF crop was taken.
struct TfWindow {
  at::Tensor cropped, window, view;
};

// TF random_crop_image, then random_absolute_pad_image, inside the image's letterbox content.
TfWindow draw_tf_crop_and_pad(const AugmentOptions& o, const DrawInputs& in, const BatchConsts& c, const at::Tensor& valid,
                              Draws& d, const Params& p) {
  const at::Tensor& off = c.off;
  const TfCrop& crop = o.random_crop_image;
  const TfPad& pad = o.random_absolute_pad_image;
  at::Tensor cropped = off;
  at::Tensor window = in.content;
  {
    const at::Tensor keep_whole = d.chance(crop.random_coef);
    if (crop.enabled) {
      auto [crops, found] = sample_crops(crop, d, in.content, in.boxes, valid);
      cropped = found & keep_whole.logical_not() & p.mosaic.logical_not();
      window = where4(cropped, crops, in.content);
    } else {
      d.take(4 * kCropAttempts);  // the crop's slots stay reserved: the later draws do not move
    }
  }
  at::Tensor view = window;
  {
    const at::Tensor on = d.chance(pad.probability) & (pad.enabled ? p.mosaic.logical_not() : off);
    // In the image's own pixels, as TF pads before resizing; TF's _random_integer excludes its
    // upper bound: padding in [0, max), offset in [0, padding).
    const at::Tensor ph = at::floor(d.next() * pad.max_height_padding), pw = at::floor(d.next() * pad.max_width_padding);
    const at::Tensor oy = at::floor(d.next() * ph), ox = at::floor(d.next() * pw);
    const at::Tensor k = in.scale.defined() ? in.scale : at::ones_like(ph);  // canvas pixels per image pixel
    const at::Tensor padded = at::stack({col(window, 0) - ox * k, col(window, 1) - oy * k, col(window, 2) + (pw - ox) * k,
                                         col(window, 3) + (ph - oy) * k}, 1);
    view = where4(on, padded, window);
  }
  const bool tf_geometry = crop.enabled || pad.enabled;
  const at::Tensor canvas = (device_constant({0, 0, 1, 1}, at::kFloat, c.fopt.device()) * double(c.S)).expand({c.B, 4});
  if (!tf_geometry) window = view = canvas;  // the loader's letterbox is the picture
  return {cropped, window, view};
}

// The colour between the window and the edge of the view, [B, 3] in 0..255.
at::Tensor pad_colour_of(const AugmentOptions& o, const DrawInputs& in, const BatchConsts& c) {
  const int64_t B = c.B, S = c.S;
  const auto& fopt = c.fopt;
  const TfPad& pad = o.random_absolute_pad_image;
  if (pad.enabled && pad.pad_color.empty()) {  // TF pads with the image's mean colour
    const at::Tensor xs = at::arange(S, fopt) + 0.5f;
    const at::Tensor inside_x = (xs >= col(in.content, 0).unsqueeze(1)) & (xs < col(in.content, 2).unsqueeze(1));  // [B, S]
    const at::Tensor inside_y = (xs >= col(in.content, 1).unsqueeze(1)) & (xs < col(in.content, 3).unsqueeze(1));
    const at::Tensor m = (inside_y.unsqueeze(2) & inside_x.unsqueeze(1)).to(at::kFloat).unsqueeze(1);  // [B, 1, S, S]
    return (in.images.to(at::kFloat) * m).sum({2, 3}) / m.sum({2, 3}).clamp_min(1);
  }
  if (pad.enabled) return device_constant(pad.pad_color, at::kFloat, fopt.device()).expand({B, 3});
  return at::full({B, 3}, o.fill, fopt);
}

// Into an S x S frame centred on the picture: the mosaic canvas centre, or the view fitted
// (keeping its aspect) to the canvas. Sets the window, view, pad colour and box rules of p;
// returns the map from the input (tile canvas) to the frame.
Map place_in_frame(const AugmentOptions& o, const BatchConsts& c, const MosaicCentre& mc, TfWindow tf, Params& p) {
  const int64_t B = c.B, S = c.S;
  const auto& fopt = c.fopt;
  const at::Tensor &xc = mc.xc, &yc = mc.yc;
  at::Tensor &window = tf.window, &view = tf.view;
  const TfCrop& crop = o.random_crop_image;
  const at::Tensor vw = col(view, 2) - col(view, 0), vh = col(view, 3) - col(view, 1);
  const at::Tensor k = S / at::maximum(vw, vh).clamp_min(1);
  const Map fit = translate(-col(view, 0), -col(view, 1)).then(scale(k)).then(translate((S - k * vw) / 2, (S - k * vh) / 2));
  const Map place = translate(xc - 1.5 * S, yc - 1.5 * S);  // tile canvas -> mosaic canvas -> S-frame
  Map frame{at::where(p.mosaic.view({-1, 1, 1}), place.m, fit.m), at::where(p.mosaic.view({-1, 1, 1}), place.inv, fit.inv)};
  if (mc.on) {  // the mosaic canvas is [0, 2S) around (xc, yc); beyond it lies grey
    const at::Tensor mw = at::stack({1.5 * S - xc, 1.5 * S - yc, 3.5 * S - xc, 3.5 * S - yc}, 1) - 0.5 * S;
    const at::Tensor tiles = device_constant({0, 0, 2, 2}, at::kFloat, fopt.device()) * double(S);
    const at::Tensor mwin = at::cat({at::maximum(mw.narrow(1, 0, 2), tiles.narrow(0, 0, 2)), at::minimum(mw.narrow(1, 2, 2), tiles.narrow(0, 2, 2))}, 1);
    window = where4(p.mosaic, mwin, window);
    view = where4(p.mosaic, mwin, view);
    p.pad_colour = at::where(p.mosaic.unsqueeze(1), at::full({B, 3}, o.fill, fopt), p.pad_colour);
  }
  p.window = window;
  p.view = view;
  p.clip_to_window = crop.clip_boxes ? at::ones({B}, fopt.dtype(at::kBool)) : tf.cropped.logical_not();
  // TF keeps a box showing overlap_thresh of itself or more (1.0: whole boxes); Ultralytics'
  // box_candidates keeps one showing more than box_min_visible.
  p.min_visible = at::where(tf.cropped, at::full({B}, crop.overlap_thresh - 1e-6, fopt), at::full({B}, o.box_min_visible, fopt));
  return frame;
}

// Ultralytics' random_perspective about the frame centre: M = T @ Shear @ R @ P @ C. Sets the matrix
// and its inverse: the whole input -> output map, frame and flips included.
void draw_perspective(const AugmentOptions& o, const DrawInputs& in, const BatchConsts& c, const Map& frame, Draws& d,
                      Params& p) {
  const int64_t S = c.S;
  const at::Tensor &zero = c.zero, &one = c.one;
  const at::Tensor aff = d.chance(o.affine_p).to(at::kFloat);
  const at::Tensor deg = d.uniform(-o.degrees, o.degrees) * aff, sc = 1 + d.uniform(-o.scale, o.scale) * aff;
  const at::Tensor shx = d.uniform(-o.shear, o.shear) * aff, shy = d.uniform(-o.shear, o.shear) * aff;
  const at::Tensor px = d.uniform(-o.perspective, o.perspective) * aff, py = d.uniform(-o.perspective, o.perspective) * aff;
  const at::Tensor tx = d.uniform(-o.translate, o.translate) * aff * S, ty = d.uniform(-o.translate, o.translate) * aff * S;
  const double lr_p = o.random_horizontal_flip.enabled ? o.random_horizontal_flip.probability : o.fliplr;
  const double ud_p = o.random_vertical_flip.enabled ? o.random_vertical_flip.probability : o.flipud;
  const at::Tensor flip_lr = d.chance(lr_p), flip_ud = d.chance(ud_p);
  const Map m = frame.then(translate(zero - S / 2.0, zero - S / 2.0))
                    .then(perspective(px, py))
                    .then(rotate_scale(deg, sc))
                    .then(shear(shx, shy))
                    .then(translate(tx + S / 2.0, ty + S / 2.0))
                    .then(flip(flip_lr, flip_ud, S))
                    .then(scale(one * (double(in.out_size) / S)));
  p.matrix = m.m;
  p.inverse = m.inv;
}

// Mixup with another image of the batch, ratio ~ Beta(32, 32) (normal approximation, sd 0.062).
void draw_mixup(const AugmentOptions& o, const DrawInputs& in, const BatchConsts& c, Draws& d, Params& p) {
  const int64_t B = c.B;
  const at::Tensor& self = c.self;
  p.any_mixup = in.mosaic && o.mixup > 0 && B > 1;
  const at::Tensor mix = d.chance(o.mixup) & (p.any_mixup ? at::ones({B}, c.fopt.dtype(at::kBool)) : c.off);
  p.mix_partner = at::where(mix, at::remainder(self + 1 + (d.next() * std::max<int64_t>(B - 1, 1)).to(at::kLong).clamp_max(std::max<int64_t>(B - 2, 0)), std::max<int64_t>(B, 1)), self);
  const at::Tensor u1 = d.next(), u2 = d.next();
  const at::Tensor normal = at::sqrt(-2 * at::log(u1)) * at::cos(2 * kPi * u2);
  p.mix_ratio = at::where(mix, (0.5 + normal * std::sqrt(1.0 / 260)).clamp(0, 1), c.one);
}

// Colour: TF's ops and Ultralytics' HSV gains (both may be on; they multiply).
void draw_colour(const AugmentOptions& o, const BatchConsts& c, Draws& d, Params& p) {
  const int64_t B = c.B;
  const auto& fopt = c.fopt;
  const at::Tensor& off = c.off;
  const auto gated = [&](bool enabled, double prob) { return (d.chance(prob) & (enabled ? at::ones({B}, fopt.dtype(at::kBool)) : off)).to(at::kFloat); };
  // One draw per statement: each takes the next slot, and the operands of one expression are
  // evaluated in an order the compiler chooses. The order is the one GCC gave (right operand
  // first), so runs and their resumes keep their draws.
  const TfDelta& br = o.random_adjust_brightness;
  const at::Tensor br_on = gated(br.enabled, br.probability);
  p.brightness = d.uniform(-br.max_delta, br.max_delta) * br_on;
  const TfFactor& ct = o.random_adjust_contrast;
  const at::Tensor ct_on = gated(ct.enabled, ct.probability);
  p.contrast = 1 + (d.uniform(ct.min_delta, ct.max_delta) - 1) * ct_on;
  const TfDelta& hu = o.random_adjust_hue;
  const TfFactor& sa = o.random_adjust_saturation;
  const at::Tensor hue_on = gated(hu.enabled, hu.probability), sat_on = gated(sa.enabled, sa.probability);
  const at::Tensor hsv_on = gated(o.hsv_h > 0 || o.hsv_s > 0 || o.hsv_v > 0, o.hsv_p);
  const at::Tensor hsv_hue = d.uniform(-o.hsv_h, o.hsv_h);
  p.hue = d.uniform(-hu.max_delta, hu.max_delta) * hue_on + hsv_hue * hsv_on;
  const at::Tensor hsv_sat = d.uniform(-o.hsv_s, o.hsv_s);
  p.saturation = (1 + (d.uniform(sa.min_delta, sa.max_delta) - 1) * sat_on) * (1 + hsv_sat * hsv_on);
  p.value = 1 + d.uniform(-o.hsv_v, o.hsv_v) * hsv_on;
  p.any_contrast = ct.enabled || br.enabled;
  p.any_hsv = hu.enabled || sa.enabled || o.hsv_h > 0 || o.hsv_s > 0 || o.hsv_v > 0;
}

}  // namespace

// The stages draw in this order, each from the next slots of `d`: reordering them would change every
// later parameter.
Params draw_params(const AugmentOptions& o, const DrawInputs& in) {
  const BatchConsts c = batch_consts(in);
  Draws d(in.sample_ids, in.key);
  Params p;
  p.in_size = c.S;
  p.out_size = in.out_size;
  const at::Tensor valid = in.classes >= 0;  // [B, N]
  const MosaicCentre mosaic = draw_mosaic(o, in, c, d, p);
  const TfWindow tf = draw_tf_crop_and_pad(o, in, c, valid, d, p);
  p.pad_colour = pad_colour_of(o, in, c);
  const Map frame = place_in_frame(o, c, mosaic, tf, p);
  draw_perspective(o, in, c, frame, d, p);
  draw_mixup(o, in, c, d, p);
  draw_colour(o, c, d, p);
  return p;
}

at::Tensor shift_hsv_reference(const at::Tensor& x, const at::Tensor& hue_shift, const at::Tensor& sat_gain, const at::Tensor& val_gain) {
  const at::Tensor r = x.select(1, 0), g = x.select(1, 1), b = x.select(1, 2);
  const at::Tensor maxc = x.amax(1), minc = x.amin(1), delta = maxc - minc;
  const at::Tensor dd = at::where(delta > 0, delta, at::ones_like(delta));
  at::Tensor hue = at::where(maxc == r, (g - b) / dd, at::where(maxc == g, 2 + (b - r) / dd, 4 + (r - g) / dd)) / 6;
  hue = at::where(delta > 0, hue, at::zeros_like(hue));
  const auto view3 = [](const at::Tensor& v) { return v.view({-1, 1, 1}); };
  hue = at::remainder(hue + view3(hue_shift), 1.0);
  const at::Tensor sat = (at::where(maxc > 0, delta / at::where(maxc > 0, maxc, at::ones_like(maxc)), at::zeros_like(maxc)) * view3(sat_gain)).clamp(0, 1);
  const at::Tensor val = (maxc * view3(val_gain)).clamp(0, 1);
  std::vector<at::Tensor> rgb;
  for (const double n : {5.0, 3.0, 1.0}) {  // HSV -> RGB: f(n) = v - v s max(0, min(k, 4 - k, 1)), k = (n + 6h) mod 6
    const at::Tensor k = at::remainder(hue * 6 + n, 6.0);
    rgb.push_back(val - val * sat * at::minimum(k, 4 - k).clamp(0, 1));
  }
  return at::stack(rgb, 1);
}

namespace {

// The same arithmetic as shift_hsv_reference, one pass over the pixels in place: the tensor-op
// version makes ~25 passes with full-size temporaries, 10-20x slower on the CPU.
void shift_hsv_cpu(at::Tensor& x, const at::Tensor& hue_shift, const at::Tensor& sat_gain, const at::Tensor& val_gain) {
  const int64_t P = x.size(2) * x.size(3);
  const at::Tensor hs = hue_shift.contiguous(), sg = sat_gain.contiguous(), vg = val_gain.contiguous();
  const float *dh = hs.data_ptr<float>(), *fs = sg.data_ptr<float>(), *fv = vg.data_ptr<float>();
  float* data = x.data_ptr<float>();
  // a mod 1 without a libm call (the baseline x86-64 target has no inline floor)
  const auto frac = [](float a) {
    float f = float(int64_t(a));
    return a - (f > a ? f - 1 : f);
  };
  at::parallel_for(0, x.size(0) * P, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {  // runs of pixels within one image
      const int64_t img = i / P, stop = std::min(end, (img + 1) * P);
      const float shift = dh[img], sat_gain = fs[img], val_gain = fv[img];
      float* r = data + img * 3 * P - img * P;  // r[k] for k = i .. stop within this image
      for (; i < stop; ++i) {
        float* px = r + i;
        const float R = px[0], G = px[P], B = px[2 * P];
        const float maxc = std::max(R, std::max(G, B)), delta = maxc - std::min(R, std::min(G, B));
        const float dd = delta > 0 ? delta : 1.0f;
        float h = maxc == R ? (G - B) / dd : maxc == G ? 2 + (B - R) / dd : 4 + (R - G) / dd;
        h = delta > 0 ? h / 6 : 0.0f;
        h = frac(h + shift);
        const float sat = std::clamp((maxc > 0 ? delta / maxc : 0.0f) * sat_gain, 0.0f, 1.0f);
        const float val = std::clamp(maxc * val_gain, 0.0f, 1.0f);
        const float h6 = h * 6, k5 = h6 + 5 >= 6 ? h6 - 1 : h6 + 5, k3 = h6 + 3 >= 6 ? h6 - 3 : h6 + 3, k1 = h6 + 1 >= 6 ? h6 - 5 : h6 + 1;
        px[0] = val - val * sat * std::clamp(std::min(k5, 4 - k5), 0.0f, 1.0f);
        px[P] = val - val * sat * std::clamp(std::min(k3, 4 - k3), 0.0f, 1.0f);
        px[2 * P] = val - val * sat * std::clamp(std::min(k1, 4 - k1), 0.0f, 1.0f);
      }
    }
  });
}

}  // namespace

at::Tensor shift_hsv(const at::Tensor& x, const at::Tensor& hue_shift, const at::Tensor& sat_gain, const at::Tensor& val_gain) {
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat) return shift_hsv_reference(x, hue_shift, sat_gain, val_gain);
  at::Tensor out = x.contiguous().clone();
  shift_hsv_cpu(out, hue_shift.to(at::kFloat), sat_gain.to(at::kFloat), val_gain.to(at::kFloat));
  return out;
}

at::Tensor adjust_colour(const Params& p, const at::Tensor& images, const at::Tensor& picture) {
  at::Tensor x = images;
  const auto per_image = [](const at::Tensor& v) { return v.view({-1, 1, 1, 1}); };
  if (p.any_contrast) {  // TF: brightness, then contrast about each channel's mean, clipped each time
    x = (x + per_image(p.brightness)).clamp_(0, 1);
    // TF adjusts the picture before padding it: the padding and bars are not in its mean.
    const at::Tensor mean = picture.defined() ? (x * picture).sum({2, 3}, true) / picture.sum({2, 3}, true).clamp_min(1)
                                              : x.mean({2, 3}, true);
    x = x.sub_(mean).mul_(per_image(p.contrast)).add_(mean).clamp_(0, 1);
  }
  return p.any_hsv ? shift_hsv(x, p.hue, p.saturation, p.value) : x;
}

namespace {

// The colour parameters of images [b0, b0 + n).
Params colour_slice(const Params& p, int64_t b0, int64_t n) {
  Params s;
  s.any_contrast = p.any_contrast;
  s.any_hsv = p.any_hsv;
  s.brightness = p.brightness.narrow(0, b0, n);
  s.contrast = p.contrast.narrow(0, b0, n);
  s.hue = p.hue.narrow(0, b0, n);
  s.saturation = p.saturation.narrow(0, b0, n);
  s.value = p.value.narrow(0, b0, n);
  return s;
}

}  // namespace

Batch apply(const Params& p, const AugmentOptions& o, const Batch& in, int64_t max_boxes) {
  at::Tensor x = warp(p, in.images, o.fill, p.pad_colour).div_(255.0);  // [B, 3, So, So] in [0, 1]
  WarpedBoxes wb = warp_boxes(p, o, in.boxes, in.classes, in.crowd);
  if (p.any_mixup) {
    const at::Tensor r = p.mix_ratio.view({-1, 1, 1, 1});
    x = x * r + x.index_select(0, p.mix_partner) * (1 - r);
    const at::Tensor mixed = p.mix_partner != at::arange(x.size(0), p.mix_partner.options());
    wb.keep = at::cat({wb.keep, wb.keep.index_select(0, p.mix_partner) & mixed.unsqueeze(1)}, 1);
    wb.boxes = at::cat({wb.boxes, wb.boxes.index_select(0, p.mix_partner)}, 1);
    wb.classes = at::cat({wb.classes, wb.classes.index_select(0, p.mix_partner)}, 1);
    wb.crowd = at::cat({wb.crowd, wb.crowd.index_select(0, p.mix_partner)}, 1);
  }
  if (p.any_contrast || p.any_hsv)
    x = in_chunks(x, x.size(0), x[0].numel() * 4, [&](int64_t b0, int64_t n) {
      return adjust_colour(colour_slice(p, b0, n), x.narrow(0, b0, n), p.any_contrast ? picture_mask(p, b0, n) : at::Tensor());
    });
  // Surviving rows first (stable), then the first max_boxes of them: fixed shapes, no sync.
  const at::Tensor order = std::get<1>(at::sort(wb.keep.to(at::kInt), /*stable=*/true, /*dim=*/1, /*descending=*/true));
  const int64_t n = std::min<int64_t>(max_boxes, order.size(1));
  const at::Tensor idx = order.narrow(1, 0, n);
  const at::Tensor keep = wb.keep.gather(1, idx);
  Batch out;
  out.images = x;
  out.boxes = at::where(keep.unsqueeze(2), wb.boxes.gather(1, idx.unsqueeze(2).expand({-1, -1, 4})), at::zeros({1}, wb.boxes.options()));
  out.classes = at::where(keep, wb.classes.gather(1, idx), at::full({1}, -1, wb.classes.options()));
  out.crowd = wb.crowd.gather(1, idx) & keep;
  return out;
}

AugmenterOptions augmenter_options(const Config& c, int64_t input_multiple, int64_t epochs) {
  return AugmenterOptions().policy(c.augment).seed(c.seed).input_multiple(input_multiple).epochs(epochs);
}

Augmenter::Augmenter(AugmenterOptions o)
    : o_(o.policy()), seed_(o.seed()), multiple_(std::max<int64_t>(o.input_multiple(), 1)), epochs_(o.epochs()) {}

bool Augmenter::mosaic_in_epoch(int64_t epoch) const { return epoch < epochs_ - o_.close_mosaic; }

int64_t Augmenter::output_size(int64_t in_size, int64_t epoch, int64_t batch_index) const {
  if (o_.multi_scale <= 0) return in_size;
  // Host-side: the size is a shape, needed before any kernel is launched.
  Rng rng(mix_seed(epoch_key(seed_, epoch) ^ mix_seed(static_cast<uint64_t>(batch_index) + 1)));
  const int64_t lo = min_output_size(in_size);
  const int64_t hi = std::max<int64_t>(lo, max_output_size(in_size));
  return lo + rng.integer(0, (hi - lo) / multiple_) * multiple_;
}

int64_t Augmenter::min_output_size(int64_t in_size) const {
  if (o_.multi_scale <= 0) return in_size;
  return std::max<int64_t>(multiple_, int64_t(std::ceil(in_size * (1 - o_.multi_scale) / multiple_)) * multiple_);
}

int64_t Augmenter::max_output_size(int64_t in_size) const {
  if (o_.multi_scale <= 0) return in_size;
  return std::max<int64_t>(multiple_, int64_t(std::floor(in_size * (1 + o_.multi_scale) / multiple_)) * multiple_);
}

Batch Augmenter::operator()(const data::HostBatch& batch, c10::Device device) const {
  const int64_t S = batch.images.size(2);
  // Everything comes from the loader's (pinned, on CUDA runs) host tensors: no copy blocks.
  Batch in{batch.images.to(device, true), batch.boxes.to(device, true), batch.classes.to(device, true), batch.crowd.to(device, true)};
  DrawInputs d;
  d.images = in.images;
  d.boxes = in.boxes;
  d.classes = in.classes;
  d.sample_ids = batch.sample_ids.to(device, true);
  d.content = batch.content.to(device, true);
  d.scale = batch.scale.to(device, true);
  d.out_size = output_size(S, batch.epoch, batch.index);
  d.key = epoch_key(seed_, batch.epoch);
  d.mosaic = mosaic_in_epoch(batch.epoch);
  const Params p = draw_params(o_, d);
  return apply(p, o_, in, row_bound(p, batch.counts));
}

int64_t row_bound(const Params& p, const at::Tensor& counts) {
  std::vector<int64_t> c(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
  std::sort(c.rbegin(), c.rend());
  const int64_t B = int64_t(c.size());
  int64_t rows = 0;
  if (B > 0 && p.tiles > 1 && B < p.tiles)
    rows = p.tiles * c[0];  // partners repeat: any tile may be the most crowded image
  else
    for (int64_t i = 0; i < std::min<int64_t>(p.tiles, B); ++i) rows += c[size_t(i)];
  return p.any_mixup ? 2 * rows : rows;
}

data::HostBatch to_host_batch(const Batch& b, const data::HostBatch& like) {
  data::HostBatch h;
  h.images = b.images.mul(255).round_().clamp_(0, 255).to(at::kByte).cpu();
  h.boxes = b.boxes.to(at::kFloat).cpu();
  h.classes = b.classes.cpu();
  h.crowd = b.crowd.cpu();
  h.counts = (h.classes >= 0).sum(1);
  h.meta = like.meta;
  h.epoch = like.epoch;
  h.index = like.index;
  return h;
}

}  // namespace headroom::augment
