// The warp: images (each output pixel sampled through the inverse map, as a fused CPU loop or as
// tensor ops) and boxes (corners through the map) under the parameters draw_params chose.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "headroom/augment/augment.h"
#include "headroom/core/device_constant.h"
#include "augment_internal.h"

namespace headroom::augment {

namespace {

// Images [b0, b0 + n) of the warp. `source` is the batch [B, C, S, S], or for mosaics the batch
// as one tall image [1, C, B*S, S], so that every output pixel samples its own tile's image in
// a single grid_sample; coordinates are clamped to the source image so bilinear taps never
// reach a neighbour.
// Output pixel centres of images [b0, b0 + n) -> their source points, [n, So*So] each, and
// which of them fall inside a [B, 4] box.
struct SourcePoints {
  at::Tensor sx, sy, w;
  int64_t b0, n, So;
  at::Tensor inside(const at::Tensor& box) const {
    const at::Tensor b = box.narrow(0, b0, n);
    return ((sx >= col(b, 0).unsqueeze(1)) & (sx < col(b, 2).unsqueeze(1)) & (sy >= col(b, 1).unsqueeze(1)) &
            (sy < col(b, 3).unsqueeze(1)) & (w > 0)).view({n, 1, So, So});
  }
};

SourcePoints source_points(const Params& p, int64_t b0, int64_t n, const at::TensorOptions& fopt) {
  const int64_t So = p.out_size;
  const at::Tensor r = at::arange(So, fopt) + 0.5f;
  const at::Tensor pts = at::stack({r.repeat({So}), r.repeat_interleave(So), at::ones({So * So}, fopt)});  // [3, So*So]
  const at::Tensor src = at::matmul(p.inverse.narrow(0, b0, n).to(fopt.dtype()), pts);  // [n, 3, So*So]
  const at::Tensor w = src.select(1, 2);
  return {src.select(1, 0) / w, src.select(1, 1) / w, w, b0, n, So};
}

at::Tensor warp_images(const Params& p, const at::Tensor& source, int64_t b0, int64_t n, double fill, const at::Tensor& pad_colour) {
  const int64_t S = p.in_size, So = p.out_size, C = source.size(1);
  const auto fopt = source.options();
  const SourcePoints pt = source_points(p, b0, n, fopt);
  const at::Tensor &sx = pt.sx, &sy = pt.sy;
  at::Tensor out;
  if (p.tiles == 4) {
    const at::Tensor tx = (sx >= S).to(at::kLong), ty = (sy >= S).to(at::kLong);
    const at::Tensor img = p.sources.narrow(0, b0, n).gather(1, tx + 2 * ty).to(at::kFloat);
    const at::Tensor lx = (sx - tx.to(at::kFloat) * S).clamp(0.5, S - 0.5), ly = (sy - ty.to(at::kFloat) * S).clamp(0.5, S - 0.5);
    const double rows = double(source.size(2));
    const at::Tensor grid = at::stack({lx * (2.0 / S) - 1, (img * S + ly) * (2.0 / rows) - 1}, -1).view({1, n * So, So, 2});
    out = at::grid_sampler(source, grid, /*bilinear*/ 0, /*zeros*/ 0, /*align_corners=*/false).view({C, n, So, So}).transpose(0, 1);
  } else {
    const at::Tensor grid = (at::stack({sx.clamp(0.5, S - 0.5), sy.clamp(0.5, S - 0.5)}, -1) * (2.0 / S) - 1).view({n, So, So, 2});
    out = at::grid_sampler(source.narrow(0, b0, n), grid, 0, 0, false);
  }
  const at::Tensor outside = at::full({1}, fill, fopt);
  const at::Tensor pad = pad_colour.defined() ? pad_colour.narrow(0, b0, n).to(at::kFloat).view({n, C, 1, 1}) : outside;
  return at::where(pt.inside(p.window), out, at::where(pt.inside(p.view), pad, outside));
}

}  // namespace

at::Tensor picture_mask(const Params& p, int64_t b0, int64_t n) {
  return source_points(p, b0, n, p.window.options().dtype(at::kFloat)).inside(p.window);
}

at::Tensor warp_reference(const Params& p, const at::Tensor& images, double fill, const at::Tensor& pad_colour) {
  const int64_t B = images.size(0), C = images.size(1), S = p.in_size;
  const at::Tensor x = images.to(at::kFloat);
  const at::Tensor source = p.tiles == 4 ? x.transpose(0, 1).reshape({1, C, B * S, S}) : x;
  return in_chunks(images, B, C * p.out_size * p.out_size * 4,
                   [&](int64_t b0, int64_t n) { return warp_images(p, source, b0, n, fill, pad_colour); });
}

namespace {

// warp_reference's arithmetic in one pass per output pixel (no full-size temporaries; reads the
// uint8 images directly): on the CPU, memory traffic is what the tensor-op version spends.
template <class T>
void warp_cpu(const Params& p, const at::Tensor& images, double fill, const at::Tensor& pad_colour, at::Tensor& out) {
  const int64_t B = out.size(0), C = out.size(1), So = out.size(2), S = p.in_size, P = So * So;
  const at::Tensor inv_t = p.inverse.to(at::kFloat).contiguous(), win_t = p.window.to(at::kFloat).contiguous();
  const at::Tensor view_t = p.view.to(at::kFloat).contiguous(), src_t = p.sources.contiguous();
  const at::Tensor pad_t = pad_colour.defined() ? pad_colour.to(at::kFloat).contiguous() : at::full({B, C}, fill);
  const float *inv = inv_t.data_ptr<float>(), *win = win_t.data_ptr<float>(), *view = view_t.data_ptr<float>(), *pad = pad_t.data_ptr<float>();
  const int64_t* sources = src_t.data_ptr<int64_t>();
  const T* in = images.data_ptr<T>();
  float* o = out.data_ptr<float>();
  const float lo = 0.5f, hi = float(S) - 0.5f, fillv = float(fill);
  at::parallel_for(0, B * So, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / So, v = row % So;
      const float* m = inv + 9 * b;
      const float* wb = win + 4 * b;
      const float* vb = view + 4 * b;
      const float py = float(v) + 0.5f;
      for (int64_t u = 0; u < So; ++u) {
        const float px = float(u) + 0.5f;
        const float w = m[6] * px + m[7] * py + m[8];
        const float sx = (m[0] * px + m[1] * py + m[2]) / w, sy = (m[3] * px + m[4] * py + m[5]) / w;
        float* dst = o + b * C * P + v * So + u;
        const bool in_view = sx >= vb[0] && sx < vb[2] && sy >= vb[1] && sy < vb[3] && w > 0;
        const bool in_window = sx >= wb[0] && sx < wb[2] && sy >= wb[1] && sy < wb[3] && w > 0;
        if (!in_window) {
          for (int64_t c = 0; c < C; ++c) dst[c * P] = in_view ? pad[b * C + c] : fillv;
          continue;
        }
        int64_t img = b;
        float lx = sx, ly = sy;
        if (p.tiles == 4) {
          const int64_t tx = sx >= S, ty = sy >= S;
          img = sources[b * 4 + tx + 2 * ty];
          lx -= float(tx * S), ly -= float(ty * S);
        }
        const float ix = std::clamp(lx, lo, hi) - 0.5f, iy = std::clamp(ly, lo, hi) - 0.5f;
        const int64_t x0 = int64_t(ix), y0 = int64_t(iy);  // ix, iy >= 0: truncation is floor
        const int64_t x1 = std::min<int64_t>(x0 + 1, S - 1), y1 = std::min<int64_t>(y0 + 1, S - 1);
        const float fx = ix - float(x0), fy = iy - float(y0);
        const T* base = in + img * C * S * S;
        for (int64_t c = 0; c < C; ++c) {
          const T* plane = base + c * S * S;
          const float top = float(plane[y0 * S + x0]) * (1 - fx) + float(plane[y0 * S + x1]) * fx;
          const float bottom = float(plane[y1 * S + x0]) * (1 - fx) + float(plane[y1 * S + x1]) * fx;
          dst[c * P] = top * (1 - fy) + bottom * fy;
        }
      }
    }
  });
}

}  // namespace

at::Tensor warp(const Params& p, const at::Tensor& images, double fill, const at::Tensor& pad_colour) {
  if (!images.device().is_cpu()) return warp_reference(p, images, fill, pad_colour);
  const at::Tensor x = images.contiguous();
  at::Tensor out = at::empty({x.size(0), x.size(1), p.out_size, p.out_size}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kByte)
    warp_cpu<uint8_t>(p, x, fill, pad_colour, out);
  else
    warp_cpu<float>(p, x.to(at::kFloat), fill, pad_colour, out);
  return out;
}

namespace {

// The bounding box of the part of each convex quadrilateral [.., 4, 2] inside [0, size]^2:
// of its corners inside the square, the square's corners inside it, and the crossings of its
// edges with the square's sides. Clipping the corner box instead would keep the full width of
// a rotated box whose widest corner lies outside the image.
at::Tensor visible_bbox(const at::Tensor& q, double size) {
  const at::Tensor a = q, b = q.roll(-1, -2);  // edges a -> b
  const auto in_range = [&](const at::Tensor& v) { return (v >= -1e-3) & (v <= size + 1e-3); };
  std::vector<at::Tensor> pts{q}, ok{in_range(q.select(-1, 0)) & in_range(q.select(-1, 1))};
  // square corners inside the quadrilateral: on the same side of all four edges
  const at::Tensor sq = device_constant({0, 0, 1, 0, 1, 1, 0, 1}, q.scalar_type(), q.device()).view({4, 2}) * size;
  const at::Tensor e = (b - a).unsqueeze(-2), r = sq - a.unsqueeze(-2);  // [.., 4 edges, 4 corners, 2]
  const at::Tensor cross = e.select(-1, 0) * r.select(-1, 1) - e.select(-1, 1) * r.select(-1, 0);
  pts.push_back(sq.expand(q.sizes()));
  ok.push_back((cross >= 0).all(-2) | (cross <= 0).all(-2));
  // edges crossing the lines x = 0, x = size, y = 0, y = size
  for (int64_t axis = 0; axis < 2; ++axis)
    for (const double c : {0.0, size}) {
      const at::Tensor da = a.select(-1, axis), db = b.select(-1, axis);
      const at::Tensor denom = db - da;
      const at::Tensor t = (c - da) / at::where(denom.abs() > 1e-9, denom, at::ones_like(denom));
      const at::Tensor point = a + (b - a) * t.unsqueeze(-1);
      pts.push_back(point);
      ok.push_back((denom.abs() > 1e-9) & (t >= 0) & (t <= 1) & in_range(point.select(-1, 1 - axis)));
    }
  const at::Tensor all = at::cat(pts, -2).clamp(0, size), valid = at::cat(ok, -1).unsqueeze(-1);
  const at::Tensor big = at::full({1}, 1e9, q.options());
  const at::Tensor lo = std::get<0>(at::where(valid, all, big).min(-2)), hi = std::get<0>(at::where(valid, all, -big).max(-2));
  return at::where(valid.any(-2), at::cat({lo, hi}, -1), at::zeros({1}, q.options()));
}

// Ultralytics' box_candidates drops boxes under box_min_size or past box_max_aspect in its
// random_perspective, which every Ultralytics pipeline runs. TF's options prune a box only by
// what of it a crop keeps: a pipeline of TF options alone keeps a 1-px box, as TF does.
bool box_candidates_run(const AugmentOptions& o) {
  const bool ultralytics_geometry = o.mosaic > 0 || o.degrees > 0 || o.translate > 0 || o.scale > 0 || o.shear > 0 || o.perspective > 0;
  const bool tf = o.random_horizontal_flip.enabled || o.random_vertical_flip.enabled || o.random_crop_image.enabled ||
                  o.random_absolute_pad_image.enabled || o.random_adjust_hue.enabled || o.random_adjust_brightness.enabled ||
                  o.random_adjust_contrast.enabled || o.random_adjust_saturation.enabled;
  return ultralytics_geometry || !tf;
}

}  // namespace

WarpedBoxes warp_boxes(const Params& p, const AugmentOptions& o, const at::Tensor& boxes, const at::Tensor& classes,
                       const at::Tensor& crowd) {
  const int64_t S = p.in_size;
  std::vector<at::Tensor> bs, cs, ws;
  for (int64_t t = 0; t < p.tiles; ++t) {
    const at::Tensor src = p.sources.select(1, t);
    const float ox = float(S * (t % 2)), oy = float(S * (t / 2));
    bs.push_back(boxes.index_select(0, src) + device_constant({ox, oy, ox, oy}, boxes.scalar_type(), boxes.device()));
    const at::Tensor used = t == 0 ? at::ones_like(p.mosaic) : p.mosaic;
    cs.push_back(at::where(used.unsqueeze(1), classes.index_select(0, src), at::full({1}, -1, classes.options())));
    ws.push_back(crowd.index_select(0, src));
  }
  const at::Tensor b = at::cat(bs, 1), cls = at::cat(cs, 1);  // [B, M, 4], [B, M]
  const at::Tensor win = p.window.unsqueeze(1);
  // The part of each box inside the window is what the image shows of it: it decides whether the
  // box stays. TF's crop prunes by it whether or not clip_boxes then clips the box itself.
  const at::Tensor in_window = at::cat({at::maximum(b.narrow(2, 0, 2), win.narrow(2, 0, 2)), at::minimum(b.narrow(2, 2, 2), win.narrow(2, 2, 2))}, 2);
  const bool unclipped = !o.random_crop_image.clip_boxes;  // else every box is clipped (clip_to_window)
  const at::Tensor clipped = unclipped ? at::where(p.clip_to_window.view({-1, 1, 1}), in_window, b) : in_window;
  // Corners through the matrices: [B, M, 4, 2] in cyclic order (a convex quadrilateral).
  const auto quad = [&](const at::Tensor& x) {
    const at::Tensor x1 = col(x, 0), y1 = col(x, 1), x2 = col(x, 2), y2 = col(x, 3), one = at::ones_like(x1);
    const at::Tensor corners = at::stack({at::stack({x1, y1, one}, -1), at::stack({x2, y1, one}, -1), at::stack({x2, y2, one}, -1),
                                          at::stack({x1, y2, one}, -1)}, 2);
    const at::Tensor q = at::matmul(corners, p.matrix.transpose(1, 2).unsqueeze(1));  // [B, M, 4, 3]
    return q.narrow(3, 0, 2) / q.narrow(3, 2, 1);
  };
  // The box before the warp, to measure what it keeps: in a mosaic, its part on the mosaic canvas
  // (Ultralytics clips to the canvas before random_perspective); elsewhere the whole box.
  const at::Tensor qb = quad(at::where(p.mosaic.view({-1, 1, 1}), in_window, b));
  const at::Tensor full = at::cat({std::get<0>(qb.min(-2)), std::get<0>(qb.max(-2))}, -1);
  const at::Tensor out = visible_bbox(quad(clipped), double(p.out_size));
  const at::Tensor seen = unclipped ? visible_bbox(quad(in_window), double(p.out_size)) : out;
  const at::Tensor w = col(out, 2) - col(out, 0), h = col(out, 3) - col(out, 1);
  const at::Tensor seen_area = (col(seen, 2) - col(seen, 0)) * (col(seen, 3) - col(seen, 1));
  const at::Tensor full_area = ((col(full, 2) - col(full, 0)) * (col(full, 3) - col(full, 1))).clamp_min(1e-9);
  const at::Tensor aspect = at::maximum(w / (h + 1e-9), h / (w + 1e-9));
  // Boxes outside the window (x2 <= x1 once clipped to it) show nothing and are dropped.
  const at::Tensor nonempty = (col(in_window, 2) > col(in_window, 0)) & (col(in_window, 3) > col(in_window, 1));
  at::Tensor keep = (cls >= 0) & nonempty & (w > 0) & (h > 0) & (seen_area / full_area > p.min_visible.unsqueeze(1));
  if (box_candidates_run(o)) keep = keep & (w > o.box_min_size) & (h > o.box_min_size) & (aspect < o.box_max_aspect);
  return {out, cls, at::cat(ws, 1), keep};
}

}  // namespace headroom::augment
