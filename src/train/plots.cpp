#include "headroom/train/plots.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>

#include "headroom/core/files.h"
#include "headroom/data/image.h"
#include "headroom/eval/draw.h"

namespace headroom::train {

namespace {

const cv::Scalar kInk(40, 40, 40), kGrid(225, 225, 225), kLine(0x1f, 0x77, 0xb4);  // RGB

// PNG or JPEG by the file's extension.
void write_image(const data::Image& im, const std::string& path) {
  const bool png = path.size() > 4 && path.compare(path.size() - 4, 4, ".png") == 0;
  const std::vector<uint8_t> bytes = png ? data::encode_png(im) : data::encode_jpeg(im, 90);
  write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
}

void write_image(const cv::Mat& rgb, const std::string& path) {
  write_image(data::Image{rgb.cols, rgb.rows, std::vector<uint8_t>(rgb.data, rgb.data + rgb.total() * 3)}, path);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// A chart of y over x in `cell` with a title and the y range written on it.
void line_chart(cv::Mat& canvas, const cv::Rect& cell, const std::string& title, const std::vector<double>& x,
                const std::vector<double>& y) {
  cv::rectangle(canvas, cell, kGrid, 1);
  cv::putText(canvas, title, {cell.x + 6, cell.y + 16}, cv::FONT_HERSHEY_SIMPLEX, 0.42, kInk, 1, cv::LINE_AA);
  std::vector<cv::Point> pts;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : y)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo) || x.empty()) return;
  const double top = hi;  // the label; a flat line gets a tiny range to draw in
  if (hi - lo < 1e-12) hi = lo + 1e-12;
  const double x0 = x.front(), x1 = std::max(x.back(), x0 + 1e-9);
  const cv::Rect plot(cell.x + 40, cell.y + 24, cell.width - 50, cell.height - 36);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    pts.emplace_back(plot.x + int((x[i] - x0) / (x1 - x0) * plot.width), plot.y + plot.height - int((y[i] - lo) / (hi - lo) * plot.height));
  }
  cv::putText(canvas, number(top), {cell.x + 2, plot.y + 8}, cv::FONT_HERSHEY_SIMPLEX, 0.32, kInk, 1, cv::LINE_AA);
  cv::putText(canvas, number(lo), {cell.x + 2, plot.y + plot.height}, cv::FONT_HERSHEY_SIMPLEX, 0.32, kInk, 1, cv::LINE_AA);
  cv::polylines(canvas, pts, false, kLine, 2, cv::LINE_AA);
  for (const auto& p : pts) cv::circle(canvas, p, 2, kLine, cv::FILLED, cv::LINE_AA);
}

}  // namespace

void plot_results(const std::vector<std::string>& header, const std::vector<std::vector<double>>& rows, const std::string& path) {
  const int charts = std::max<int>(int(header.size()) - 1, 1), cols = 5, rows_n = (charts + cols - 1) / cols;
  const int w = 300, h = 220;
  cv::Mat canvas(rows_n * h, cols * w, CV_8UC3, cv::Scalar(255, 255, 255));
  std::vector<double> x;
  for (const auto& r : rows) x.push_back(r.empty() ? 0 : r[0]);
  for (int c = 1; c < int(header.size()); ++c) {
    std::vector<double> y;
    for (const auto& r : rows) y.push_back(size_t(c) < r.size() ? r[size_t(c)] : NAN);
    line_chart(canvas, cv::Rect(((c - 1) % cols) * w + 4, ((c - 1) / cols) * h + 4, w - 8, h - 8), header[size_t(c)], x, y);
  }
  write_image(canvas, path);
}

void plot_batch(const data::HostBatch& batch, const std::vector<std::string>& names, const std::string& path) {
  const int64_t n = std::min<int64_t>(batch.size(), 16);
  if (n == 0) return;
  const int64_t s = batch.images.size(2), grid = int64_t(std::ceil(std::sqrt(double(n))));
  const at::Tensor images = batch.images.slice(0, 0, n).cpu().permute({0, 2, 3, 1}).contiguous();  // [n, S, S, 3]
  const at::Tensor boxes = batch.boxes.cpu(), classes = batch.classes.cpu(), counts = batch.counts.cpu();
  data::Image mosaic{int(grid * s), int(((n + grid - 1) / grid) * s), {}};
  mosaic.pixels.assign(size_t(mosaic.width) * size_t(mosaic.height) * 3, 114);
  std::vector<std::array<float, 6>> rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ox = (i % grid) * s, oy = (i / grid) * s;
    const uint8_t* src = images[i].data_ptr<uint8_t>();
    for (int64_t y = 0; y < s; ++y)
      std::copy(src + y * s * 3, src + (y + 1) * s * 3, mosaic.pixels.data() + ((oy + y) * mosaic.width + ox) * 3);
    const at::Tensor bi = boxes[i].contiguous();
    const float* b = bi.data_ptr<float>();
    const int64_t* cls = classes[i].contiguous().data_ptr<int64_t>();
    for (int64_t k = 0; k < counts[i].item<int64_t>(); ++k)
      rows.push_back(std::array<float, 6>{b[4 * k] + float(ox), b[4 * k + 1] + float(oy), b[4 * k + 2] + float(ox),
                                          b[4 * k + 3] + float(oy), -1.0f, float(cls[k])});
  }
  eval::draw_detections(mosaic, rows, names);
  write_image(mosaic, path);
}

void plot_labels(const data::Split& split, const std::string& path) {
  const int w = 900, h = 420;
  cv::Mat canvas(h, w, CV_8UC3, cv::Scalar(255, 255, 255));
  std::vector<int64_t> counts(std::max<size_t>(split.names.size(), 1), 0);
  std::vector<cv::Point2d> sizes;  // box width, height relative to the image
  for (const auto& s : split.samples)
    for (const auto& b : s.boxes) {
      if (b.cls >= 0 && size_t(b.cls) < counts.size()) ++counts[size_t(b.cls)];
      sizes.emplace_back((b.x2 - b.x1) / std::max(s.width, 1), (b.y2 - b.y1) / std::max(s.height, 1));
    }
  // Class counts as bars.
  const cv::Rect bars(50, 40, 380, 330);
  cv::putText(canvas, "instances per class", {50, 24}, cv::FONT_HERSHEY_SIMPLEX, 0.5, kInk, 1, cv::LINE_AA);
  const int64_t most = std::max<int64_t>(*std::max_element(counts.begin(), counts.end()), 1);
  const int bw = std::max(1, bars.width / int(counts.size()));
  for (size_t c = 0; c < counts.size(); ++c) {
    const int bh = int(double(counts[c]) / double(most) * bars.height);
    cv::rectangle(canvas, cv::Rect(bars.x + int(c) * bw + 1, bars.y + bars.height - bh, std::max(bw - 2, 1), bh), kLine, cv::FILLED);
    if (counts.size() <= 20)
      cv::putText(canvas, c < split.names.size() ? split.names[c] : std::to_string(c), {bars.x + int(c) * bw + 2, bars.y + bars.height + 14},
                  cv::FONT_HERSHEY_SIMPLEX, 0.32, kInk, 1, cv::LINE_AA);
  }
  cv::putText(canvas, std::to_string(most), {4, bars.y + 8}, cv::FONT_HERSHEY_SIMPLEX, 0.35, kInk, 1, cv::LINE_AA);
  cv::rectangle(canvas, bars, kGrid, 1);
  // Box sizes as a scatter (width vs height, fractions of the image).
  const cv::Rect sc(500, 40, 330, 330);
  cv::putText(canvas, "box width (x) vs height (y), fraction of image", {480, 24}, cv::FONT_HERSHEY_SIMPLEX, 0.45, kInk, 1, cv::LINE_AA);
  cv::rectangle(canvas, sc, kGrid, 1);
  for (const auto& p : sizes)
    cv::circle(canvas, {sc.x + int(std::clamp(p.x, 0.0, 1.0) * sc.width), sc.y + sc.height - int(std::clamp(p.y, 0.0, 1.0) * sc.height)}, 2,
               kLine, cv::FILLED, cv::LINE_AA);
  write_image(canvas, path);
}

}  // namespace headroom::train
