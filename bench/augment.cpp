// bench_augment: images per second of the augmentation pipelines of configs/centernet_hg104.yaml
// (the TF OD API user's seven operations, 512 px) and of Ultralytics' YOLOv8 defaults (mosaic,
// affine, HSV, flip; 640 px), at batch 16 and 64: the batched tensor pipeline on the device
// against the same operations done per image with OpenCV on the CPU threads (the way CPU-side
// loaders work), in the same run. One JSON line per measurement.
//   bench_augment [--device auto] [--iterations 3] [--batches 16,64]
#include <CLI/CLI.hpp>
#include <ATen/ATen.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

#include "headroom/augment/augment.h"
#include "headroom/core/device.h"
#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/random.h"
#include "headroom/core/threads.h"

using namespace headroom;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

AugmentConfig yolov8_pipeline() {  // Ultralytics' defaults
  AugmentConfig o;
  o.hsv_h = 0.015, o.hsv_s = 0.7, o.hsv_v = 0.4, o.translate = 0.1, o.scale = 0.5, o.fliplr = 0.5, o.mosaic = 1.0;
  return o;
}

AugmentConfig hg104_pipeline() {  // configs/centernet_hg104.yaml
  AugmentConfig o;
  o.random_horizontal_flip.enabled = true;
  o.random_crop_image.enabled = true;
  o.random_adjust_hue.enabled = true;
  o.random_adjust_contrast.enabled = true;
  o.random_adjust_saturation.enabled = true;
  o.random_adjust_brightness.enabled = true;
  o.random_absolute_pad_image.enabled = true;
  o.random_absolute_pad_image.max_height_padding = 200;
  o.random_absolute_pad_image.max_width_padding = 200;
  return o;
}

struct Images {
  std::vector<cv::Mat> rgb;                              // S x S uint8 RGB
  std::vector<std::vector<std::array<float, 4>>> boxes;  // xyxy pixels
};

// Smooth random pictures with a few boxes each, as host images and as a batch.
Images make_images(int64_t n, int64_t s, Rng& rng) {
  Images im;
  for (int64_t i = 0; i < n; ++i) {
    cv::Mat small(16, 16, CV_8UC3), big;
    cv::randu(small, 0, 255);
    cv::resize(small, big, cv::Size(int(s), int(s)), 0, 0, cv::INTER_LINEAR);
    im.rgb.push_back(big);
    std::vector<std::array<float, 4>> b;
    for (int k = 0; k < 8; ++k) {
      const float w = float(rng.uniform(0.05, 0.4) * s), h = float(rng.uniform(0.05, 0.4) * s);
      const float x = float(rng.uniform(0, s - w)), y = float(rng.uniform(0, s - h));
      b.push_back({x, y, x + w, y + h});
    }
    im.boxes.push_back(b);
  }
  return im;
}

std::vector<std::array<float, 4>> transform_boxes(const std::vector<std::array<float, 4>>& in, const cv::Matx23d& m, float size) {
  std::vector<std::array<float, 4>> out;
  for (const auto& b : in) {
    float x0 = 1e9f, y0 = 1e9f, x1 = -1e9f, y1 = -1e9f;
    for (const auto& [x, y] : {std::pair{b[0], b[1]}, std::pair{b[2], b[1]}, std::pair{b[0], b[3]}, std::pair{b[2], b[3]}}) {
      const float u = float(m(0, 0) * x + m(0, 1) * y + m(0, 2)), v = float(m(1, 0) * x + m(1, 1) * y + m(1, 2));
      x0 = std::min(x0, u), y0 = std::min(y0, v), x1 = std::max(x1, u), y1 = std::max(y1, v);
    }
    x0 = std::clamp(x0, 0.f, size), x1 = std::clamp(x1, 0.f, size), y0 = std::clamp(y0, 0.f, size), y1 = std::clamp(y1, 0.f, size);
    if (x1 - x0 > 2 && y1 - y0 > 2) out.push_back({x0, y0, x1, y1});
  }
  return out;
}

// Ultralytics' per-image path: mosaic canvas, warpAffine, HSV by lookup tables, flip.
void yolov8_one(const Images& im, int64_t i, Rng& rng, cv::Mat& out) {
  const int s = im.rgb[0].rows;
  cv::Mat canvas(2 * s, 2 * s, CV_8UC3, cv::Scalar(114, 114, 114));
  const int xc = int(rng.uniform(0.5 * s, 1.5 * s)), yc = int(rng.uniform(0.5 * s, 1.5 * s));
  std::vector<std::array<float, 4>> boxes;
  for (int t = 0; t < 4; ++t) {
    const size_t k = size_t((i + t * 7) % int64_t(im.rgb.size()));
    const cv::Mat& src = im.rgb[k];
    const int x0 = t % 2 ? xc : xc - s, y0 = t / 2 ? yc : yc - s;
    const cv::Rect dst = cv::Rect(x0, y0, s, s) & cv::Rect(0, 0, 2 * s, 2 * s);
    src(cv::Rect(dst.x - x0, dst.y - y0, dst.width, dst.height)).copyTo(canvas(dst));
    for (const auto& b : im.boxes[k]) boxes.push_back({b[0] + x0, b[1] + y0, b[2] + x0, b[3] + y0});
  }
  const double a = 0, sc = rng.uniform(0.5, 1.5), tx = rng.uniform(0.4, 0.6) * s, ty = rng.uniform(0.4, 0.6) * s;
  cv::Matx23d m = cv::getRotationMatrix2D(cv::Point2f(0, 0), a, sc);
  m(0, 2) = -s * m(0, 0) - s * m(0, 1) + tx;
  m(1, 2) = -s * m(1, 0) - s * m(1, 1) + ty;
  cv::warpAffine(canvas, out, m, cv::Size(s, s), cv::INTER_LINEAR, cv::BORDER_CONSTANT, cv::Scalar(114, 114, 114));
  const auto kept = transform_boxes(boxes, m, float(s));
  cv::Mat hsv;
  cv::cvtColor(out, hsv, cv::COLOR_RGB2HSV);
  const double r0 = rng.uniform(-1, 1) * 0.015, r1 = rng.uniform(-1, 1) * 0.7 + 1, r2 = rng.uniform(-1, 1) * 0.4 + 1;
  cv::Mat lut(1, 256, CV_8UC3);
  for (int x = 0; x < 256; ++x)
    lut.at<cv::Vec3b>(x) = cv::Vec3b(uint8_t(int(std::fmod(x + r0 * 180 + 180, 180))), cv::saturate_cast<uint8_t>(x * r1),
                                     cv::saturate_cast<uint8_t>(x * r2));
  cv::LUT(hsv, lut, hsv);
  cv::cvtColor(hsv, out, cv::COLOR_HSV2RGB);
  if (rng.chance(0.5)) cv::flip(out, out, 1);
  (void)kept;  // computed for its cost, as a loader would; the bench keeps only the images
}

// The TF OD API user's path, in their order: flip, crop, hue, contrast, saturation,
// brightness, pad (then the resizer to the canvas).
void hg104_one(const Images& im, int64_t i, Rng& rng, cv::Mat& out) {
  const int s = im.rgb[0].rows;
  cv::Mat img = im.rgb[size_t(i)];  // shared between threads: flip into a copy
  if (rng.chance(0.5)) cv::flip(im.rgb[size_t(i)], img, 1);
  cv::Rect crop(0, 0, s, s);
  for (int attempt = 0; attempt < 100; ++attempt) {  // sample_distorted_bounding_box
    const double area = rng.uniform(0.1, 1.0) * s * s, aspect = rng.uniform(0.75, 1.33);
    const int h = int(std::sqrt(area / aspect)), w = int(h * aspect);
    if (w > s || h > s || w < 1 || h < 1) continue;
    const cv::Rect c(int(rng.uniform(0, s - w)), int(rng.uniform(0, s - h)), w, h);
    bool holds = false;
    for (const auto& b : im.boxes[size_t(i)]) holds = holds || (b[0] >= c.x && b[1] >= c.y && b[2] <= c.x + w && b[3] <= c.y + h);
    if (holds) {
      crop = c;
      break;
    }
  }
  cv::Mat f;
  img(crop).convertTo(f, CV_32FC3, 1.0 / 255);
  cv::Mat hsv;
  cv::cvtColor(f, hsv, cv::COLOR_RGB2HSV);
  std::vector<cv::Mat> ch;
  cv::split(hsv, ch);
  ch[0] += rng.uniform(-0.02, 0.02) * 360;  // hue wraps in HSV2RGB
  cv::merge(ch, hsv);
  cv::cvtColor(hsv, f, cv::COLOR_HSV2RGB);
  const cv::Scalar mean = cv::mean(f);
  const double c = rng.uniform(0.8, 1.25);
  f = (f - mean) * c + mean;
  cv::max(cv::min(f, 1.0), 0.0, f);
  cv::cvtColor(f, hsv, cv::COLOR_RGB2HSV);
  cv::split(hsv, ch);
  ch[1] *= rng.uniform(0.8, 1.25);
  cv::min(ch[1], 1.0, ch[1]);
  cv::merge(ch, hsv);
  cv::cvtColor(hsv, f, cv::COLOR_HSV2RGB);
  f += cv::Scalar::all(rng.uniform(-0.2, 0.2));
  cv::max(cv::min(f, 1.0), 0.0, f);
  const int ph = int(rng.uniform(0, 200)), pw = int(rng.uniform(0, 200)), oy = int(rng.uniform(0, ph)), ox = int(rng.uniform(0, pw));
  cv::Mat padded;
  cv::copyMakeBorder(f, padded, oy, ph - oy, ox, pw - ox, cv::BORDER_CONSTANT, cv::mean(f));
  const double k = double(s) / std::max(padded.rows, padded.cols);
  cv::Mat resized;
  cv::resize(padded, resized, cv::Size(std::max(1, int(padded.cols * k)), std::max(1, int(padded.rows * k))), 0, 0, cv::INTER_LINEAR);
  out = cv::Mat(s, s, CV_32FC3, cv::Scalar::all(114.0 / 255));
  resized.copyTo(out(cv::Rect(0, 0, resized.cols, resized.rows)));
}

double opencv_rate(const Images& im, int64_t batch, int iterations, int threads, bool yolo) {
  cv::setNumThreads(1);  // parallel over images, as loader workers are
  const double t0 = now();
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        Rng rng(mix_seed(uint64_t(it * 1000 + w)));
        cv::Mat out;
        for (int64_t i = w; i < batch; i += threads) yolo ? yolov8_one(im, i, rng, out) : hg104_one(im, i, rng, out);
      });
    for (auto& t : pool) t.join();
  }
  return double(batch * iterations) / (now() - t0);
}

double tensor_rate(const AugmentConfig& o, const Images& im, int64_t batch, int iterations, c10::Device device) {
  const int64_t s = im.rgb[0].rows;
  std::vector<at::Tensor> imgs;
  for (int64_t i = 0; i < batch; ++i) imgs.push_back(at::from_blob(im.rgb[size_t(i)].data, {s, s, 3}, at::kByte).permute({2, 0, 1}));
  augment::Batch b;
  b.images = at::stack(imgs).to(device);
  std::vector<float> flat;
  for (int64_t i = 0; i < batch; ++i)
    for (const auto& x : im.boxes[size_t(i)]) flat.insert(flat.end(), x.begin(), x.end());
  const int64_t n = int64_t(im.boxes[0].size());
  b.boxes = at::tensor(flat).view({batch, n, 4}).to(device);
  b.classes = at::zeros({batch, n}, at::kLong).to(device);
  b.crowd = at::zeros({batch, n}, at::kBool).to(device);
  augment::DrawInputs d;
  d.images = b.images;
  d.boxes = b.boxes;
  d.classes = b.classes;
  d.sample_ids = at::arange(batch, at::kLong).to(device);
  d.content = at::tensor({0.0f, 0.0f, float(s), float(s)}).repeat({batch, 1}).to(device);
  d.out_size = s;
  double t0 = 0;
  for (int it = -1; it < iterations; ++it) {  // one warm-up
    if (it == 0) t0 = now();
    d.key = augment::epoch_key(0, it + 1);
    const augment::Batch out = augment::apply(augment::draw_params(o, d), o, b, 4 * n);
    out.images.sum().item<float>();  // waits for the device
  }
  return double(batch * iterations) / (now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warn");
  CLI::App app{"bench_augment: batched on-device augmentation vs per-image OpenCV"};
  std::string device = "auto";
  int iterations = 3;
  std::vector<int64_t> batches{16, 64};
  app.add_option("--device", device, "auto | cpu | cuda");
  app.add_option("--iterations", iterations, "Timed batches per measurement (after one warm-up)");
  app.add_option("--batches", batches, "Batch sizes")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    const DeviceChoice dev = resolve_device(device, query_cuda());
    const int threads = available_cores();
    set_intra_op_threads(AutoInt{false, threads});
    Rng rng(1);
    for (const bool yolo : {false, true}) {
      const int64_t s = yolo ? 640 : 512;
      const Images im = make_images(*std::max_element(batches.begin(), batches.end()), s, rng);
      for (const int64_t batch : batches) {
        Json j = Json::object();
        j["bench"] = "augment";
        j["pipeline"] = yolo ? "yolov8 (mosaic, affine, hsv, fliplr)" : "centernet_hg104 (TF: flip, crop, hue, contrast, saturation, brightness, pad)";
        j["imgsz"] = s;
        j["batch"] = batch;
        j["device"] = dev.device.str();
        j["threads"] = threads;
        const double ours = tensor_rate(yolo ? yolov8_pipeline() : hg104_pipeline(), im, batch, iterations, dev.device);
        const double cv_rate = opencv_rate(im, batch, iterations, threads, yolo);
        j["batched_images_per_s"] = ours;
        j["opencv_per_image_images_per_s"] = cv_rate;
        j["ratio"] = ours / cv_rate;
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_augment: %s\n", e.what());
    return 1;
  }
  return 0;
}
