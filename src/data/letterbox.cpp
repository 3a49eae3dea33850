#include "headroom/data/letterbox.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <opencv2/imgproc.hpp>

#include "headroom/core/files.h"
#include "headroom/core/text.h"

namespace headroom::data {

Letterbox letterbox_geometry(int width, int height, int canvas) {
  Letterbox g;
  g.orig_w = width, g.orig_h = height, g.canvas = canvas;
  const double r = std::min(double(canvas) / width, double(canvas) / height);
  g.resized_w = std::clamp(static_cast<int>(std::lround(width * r)), 1, canvas);
  g.resized_h = std::clamp(static_cast<int>(std::lround(height * r)), 1, canvas);
  g.pad_x = (canvas - g.resized_w) / 2;
  g.pad_y = (canvas - g.resized_h) / 2;
  return g;
}

namespace {
const std::pair<const char*, Preprocess> kPreprocess[] = {{"fast", Preprocess::fast}, {"source", Preprocess::source}};
}  // namespace

Preprocess preprocess_from(const std::string& word) { return enum_from_word(word, kPreprocess); }
const char* to_string(Preprocess p) { return enum_word(p, kPreprocess); }

void letterbox_to_chw(const Image& image, const Letterbox& g, uint8_t* chw, Preprocess p) {
  const size_t plane = size_t(g.canvas) * g.canvas;
  std::memset(chw, kPadValue, 3 * plane);
  cv::Mat src(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.pixels.data()));
  cv::Mat resized;
  if (image.width == g.resized_w && image.height == g.resized_h) {
    resized = src;
  } else {
    // fast: INTER_AREA when shrinking (no aliasing from a DCT-scaled decode), bilinear when enlarging.
    const bool shrink = image.width > g.resized_w || image.height > g.resized_h;
    const bool area = p == Preprocess::fast && shrink;
    cv::resize(src, resized, cv::Size(g.resized_w, g.resized_h), 0, 0, area ? cv::INTER_AREA : cv::INTER_LINEAR);
  }
  // Split straight into the canvas planes: each output Mat is a window of its plane.
  std::vector<cv::Mat> planes;
  for (int c = 0; c < 3; ++c)
    planes.emplace_back(g.resized_h, g.resized_w, CV_8UC1,
                        chw + c * plane + size_t(g.pad_y) * g.canvas + g.pad_x, size_t(g.canvas));
  cv::split(resized, planes);
}

std::array<float, 4> box_to_canvas(const Box& b, const Letterbox& g) {
  return {b.x1 * g.resized_w + g.pad_x, b.y1 * g.resized_h + g.pad_y,
          b.x2 * g.resized_w + g.pad_x, b.y2 * g.resized_h + g.pad_y};
}

ItemBoxes boxes_in_canvas(const Sample& s, const Letterbox& g) {
  ItemBoxes out;
  for (const Box& b : s.boxes) {
    out.xyxy.push_back(box_to_canvas(b, g));
    out.classes.push_back(b.cls);
    out.crowd.push_back(b.crowd);
  }
  return out;
}

namespace {
std::atomic<int64_t> g_decoded{0};
}  // namespace

int64_t canvases_decoded() { return g_decoded.load(); }

void decode_into_canvas(const Sample& s, const Letterbox& g, int64_t max_pixels, uint8_t* chw, Preprocess p) {
  ++g_decoded;
  std::string bytes;
  try {
    bytes = read_image_bytes(s);
  } catch (const InputError& e) {  // the scan read it: it was removed, changed or made unreadable since
    throw UnreadableImage((s.record >= 0 ? first_line(e.what()) : s.image + ": cannot be read any more") +
                     " (removed, changed or made unreadable after the data set was scanned)");
  }
  try {
    const bool full = p == Preprocess::source;
    const Image img = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), max_pixels,
                                   full ? 0 : g.resized_w, full ? 0 : g.resized_h);
    letterbox_to_chw(img, g, chw, p);
  } catch (const ImageError& e) {
    throw ImageError(s.image + ": " + e.what());
  }
}

}  // namespace headroom::data
