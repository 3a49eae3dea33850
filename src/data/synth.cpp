#include "headroom/data/synth.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <opencv2/imgproc.hpp>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"
#include "headroom/core/random.h"
#include "headroom/core/threads.h"
#include "headroom/data/image.h"

namespace headroom::data {

namespace fs = std::filesystem;

const std::vector<std::string>& synth_shape_names() {
  static const std::vector<std::string> names = {"circle", "square", "triangle", "cross", "ring", "star"};
  return names;
}

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int kShift = 4;  // sub-pixel bits for OpenCV drawing

struct SynthObject {
  int cls;
  double x1, y1, x2, y2;  // pixel-corner coordinates: pixel i spans [i, i+1)
  double area;
};

struct SynthImage {
  Image image;
  std::vector<SynthObject> objects;
};

cv::Scalar random_colour(Rng& rng) {
  return cv::Scalar(rng.integer(0, 255), rng.integer(0, 255), rng.integer(0, 255));
}

double colour_distance(const cv::Scalar& a, const cv::Scalar& b) {
  return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) + (a[2] - b[2]) * (a[2] - b[2]));
}

// Textured backgrounds: gradient, stripes, checkerboard or smooth blotches, plus noise.
cv::Scalar draw_background(cv::Mat& m, Rng& rng) {
  const cv::Scalar a = random_colour(rng), b = random_colour(rng);
  const int kind = static_cast<int>(rng.integer(0, 3));
  const double angle = rng.uniform(0, kPi), ca = std::cos(angle), sa = std::sin(angle);
  const double period = rng.uniform(8, 40);
  if (kind == 3) {
    cv::Mat small(6, 6, CV_8UC3);
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 6; ++x) {
        const double t = rng.uniform();
        for (int c = 0; c < 3; ++c) small.at<cv::Vec3b>(y, x)[c] = cv::saturate_cast<uint8_t>(a[c] * t + b[c] * (1 - t));
      }
    cv::resize(small, m, m.size(), 0, 0, cv::INTER_CUBIC);
  } else {
    const double diag = std::hypot(m.cols, m.rows);
    for (int y = 0; y < m.rows; ++y)
      for (int x = 0; x < m.cols; ++x) {
        const double u = x * ca + y * sa;
        double t;
        if (kind == 0) t = u / diag;
        else if (kind == 1) t = std::fmod(u / period, 2.0) < 1.0 ? 0.0 : 1.0;
        else t = (static_cast<int>(std::floor(x / period)) + static_cast<int>(std::floor(y / period))) % 2;
        auto& px = m.at<cv::Vec3b>(y, x);
        for (int c = 0; c < 3; ++c) px[c] = cv::saturate_cast<uint8_t>(a[c] * (1 - t) + b[c] * t);
      }
  }
  uint8_t* p = m.data;
  const size_t n = m.total() * 3;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rng.next();
    for (size_t j = i; j < std::min(n, i + 8); ++j, r >>= 8)
      p[j] = cv::saturate_cast<uint8_t>(int(p[j]) + int(r & 31) - 16);
  }
  return (a + b) * 0.5;
}

std::vector<cv::Point2d> shape_outline(int cls, double r, double theta) {
  std::vector<cv::Point2d> local;
  switch (cls) {
    case 1:  // square: corners on radius r
      for (int k = 0; k < 4; ++k) local.emplace_back(r * std::cos(kPi / 4 + k * kPi / 2), r * std::sin(kPi / 4 + k * kPi / 2));
      break;
    case 2:  // triangle
      for (int k = 0; k < 3; ++k) local.emplace_back(r * std::cos(-kPi / 2 + k * 2 * kPi / 3), r * std::sin(-kPi / 2 + k * 2 * kPi / 3));
      break;
    case 3: {  // cross (plus sign), arms 0.3 r wide
      const double w = 0.3 * r;
      local = {{-w, -r}, {w, -r}, {w, -w}, {r, -w}, {r, w}, {w, w}, {w, r}, {-w, r}, {-w, w}, {-r, w}, {-r, -w}, {-w, -w}};
      break;
    }
    case 5:  // five-pointed star
      for (int k = 0; k < 10; ++k) {
        const double rr = k % 2 ? 0.45 * r : r, a = -kPi / 2 + k * kPi / 5;
        local.emplace_back(rr * std::cos(a), rr * std::sin(a));
      }
      break;
    default: break;  // circle and ring are not polygons
  }
  std::vector<cv::Point2d> out;
  for (const auto& p : local)
    out.emplace_back(p.x * std::cos(theta) - p.y * std::sin(theta), p.x * std::sin(theta) + p.y * std::cos(theta));
  return out;
}

double polygon_area(const std::vector<cv::Point2d>& p) {
  double a = 0;
  for (size_t i = 0; i < p.size(); ++i) a += p[i].x * p[(i + 1) % p.size()].y - p[(i + 1) % p.size()].x * p[i].y;
  return std::fabs(a) / 2;
}

// Pixel-corner coordinates to OpenCV's fixed-point pixel-centre coordinates.
cv::Point fixed_point(double x, double y) {
  return cv::Point(static_cast<int>(std::lround((x - 0.5) * (1 << kShift))),
                   static_cast<int>(std::lround((y - 0.5) * (1 << kShift))));
}

double iou(const SynthObject& a, const SynthObject& b) {
  const double iw = std::max(0.0, std::min(a.x2, b.x2) - std::max(a.x1, b.x1));
  const double ih = std::max(0.0, std::min(a.y2, b.y2) - std::max(a.y1, b.y1));
  const double inter = iw * ih;
  return inter / ((a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter);
}

SynthImage render(const SynthOptions& o, int64_t index) {
  Rng rng(mix_seed(static_cast<uint64_t>(o.seed)) ^ mix_seed(static_cast<uint64_t>(index) + 1));
  const int shorter = static_cast<int>(std::lround(o.size * rng.uniform(0.6, 1.0)));
  const bool landscape = rng.chance(0.5);
  const int W = landscape ? o.size : shorter, H = landscape ? shorter : o.size;
  cv::Mat m(H, W, CV_8UC3);
  const cv::Scalar bg = draw_background(m, rng);

  SynthImage out;
  const int count = rng.chance(0.05) ? 0 : static_cast<int>(rng.integer(1, o.max_objects));
  for (int k = 0; k < count; ++k) {
    const int cls = static_cast<int>(rng.integer(0, o.classes - 1));
    const double r = std::min(W, H) * rng.uniform(o.min_object, o.max_object) / 2;  // half the extent
    const double theta = rng.uniform(0, 2 * kPi);
    cv::Scalar colour = random_colour(rng);
    for (int tries = 0; tries < 8 && colour_distance(colour, bg) < 120; ++tries) colour = random_colour(rng);
    const std::vector<cv::Point2d> outline = shape_outline(cls, r, theta);
    double ex0 = -r, ey0 = -r, ex1 = r, ey1 = r;  // extent around the centre
    if (!outline.empty()) {
      ex0 = ey0 = 1e9, ex1 = ey1 = -1e9;
      for (const auto& p : outline) ex0 = std::min(ex0, p.x), ex1 = std::max(ex1, p.x), ey0 = std::min(ey0, p.y), ey1 = std::max(ey1, p.y);
    }
    // Place it wholly inside the image, overlapping earlier objects little (IoU <= 0.2).
    for (int tries = 0; tries < 30; ++tries) {
      const double cx = rng.uniform(1 - ex0, W - 1 - ex1), cy = rng.uniform(1 - ey0, H - 1 - ey1);
      SynthObject obj{cls, cx + ex0, cy + ey0, cx + ex1, cy + ey1, 0};
      bool free = true;
      for (const auto& other : out.objects) free = free && iou(obj, other) <= 0.2;
      if (!free) continue;
      if (outline.empty()) {
        const cv::Point c = fixed_point(cx, cy);
        const int rf = static_cast<int>(std::lround(r * (1 << kShift)));
        if (cls == 0) {
          cv::circle(m, c, rf, colour, cv::FILLED, cv::LINE_AA, kShift);
          obj.area = kPi * r * r;
        } else {  // ring: the band between 0.55 r and r
          const double mid = 0.775 * r, band = 0.45 * r;
          cv::circle(m, c, static_cast<int>(std::lround(mid * (1 << kShift))), colour,
                     static_cast<int>(std::lround(band)), cv::LINE_AA, kShift);
          obj.area = kPi * r * r * (1 - 0.55 * 0.55);
        }
      } else {
        std::vector<cv::Point> poly;
        for (const auto& p : outline) poly.push_back(fixed_point(cx + p.x, cy + p.y));
        cv::fillPoly(m, std::vector<std::vector<cv::Point>>{poly}, colour, cv::LINE_AA, kShift);
        obj.area = polygon_area(outline);
      }
      out.objects.push_back(obj);
      break;
    }
  }
  out.image.width = W;
  out.image.height = H;
  out.image.pixels.assign(m.data, m.data + m.total() * 3);
  return out;
}

Json options_json(const SynthOptions& o) {
  return Json::object({{"images", o.images}, {"size", o.size}, {"seed", o.seed}, {"classes", o.classes},
                       {"val_fraction", o.val_fraction}, {"max_objects", o.max_objects}, {"quality", o.quality},
                       {"min_object", o.min_object}, {"max_object", o.max_object}});
}

void write_binary(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(path.string() + ": write failed");
}

void check_options(const SynthOptions& o) {
  auto bad = [](const std::string& m) { throw InputError("data synth: " + m); };
  if (o.out.empty()) bad("--out is required");
  if (o.images < 1 || o.images > 10000000) bad("--images must be 1 .. 10000000");
  if (o.size < 32 || o.size > 8192) bad("--size must be 32 .. 8192 pixels");
  if (o.classes < 1 || o.classes > static_cast<int>(synth_shape_names().size())) bad("--classes must be 1 .. 6");
  if (o.max_objects < 1 || o.max_objects > 1000) bad("--max-objects must be 1 .. 1000");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) bad("--val-fraction must be in [0, 1)");  // NaN too
  if (o.quality < 1 || o.quality > 100) bad("--quality must be 1 .. 100");
  if (!(o.min_object > 0 && o.min_object <= o.max_object && o.max_object <= 0.9))
    bad("--min-object and --max-object must satisfy 0 < min <= max <= 0.9 (fractions of the short side)");
}

const char* kMarker = ".headroom-synth";
const char* kOwned[] = {"images", "labels", "annotations", "data.yaml", "data_coco.yaml", "synth.json"};

// Checks an existing --out folder. Returns true (and fills the summary) when it already holds a complete set made
// with the same options; otherwise clears what an earlier synth wrote so the new set starts clean.
bool reuse_or_clear_existing(const SynthOptions& o, const fs::path& out, const std::string& wanted, SynthSummary& summary) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return false;
  if (!fs::is_directory(out)) throw InputError(o.out + ": exists and is not a folder; choose another --out");
  const bool ours = fs::exists(out / kMarker);
  if (!ours && !fs::is_empty(out))
    throw InputError(o.out + ": the folder is not empty and is not a Headroom synthetic data set; "
                     "refusing to write into it (choose an empty or new --out)");
  if (ours && fs::exists(out / "synth.json")) {
    const Json done = read_json_file((out / "synth.json").string());
    const auto count = [&](const char* key) {
      const Json* v = done.find(key);
      return v && v->is_number() ? static_cast<int64_t>(v->as_number()) : int64_t{-1};
    };
    const auto files_in = [&](const char* split) {  // an image deleted since: the set is made again
      int64_t n = 0;
      std::error_code e;
      for (auto it = fs::directory_iterator(out / "images" / split, e); !e && it != fs::directory_iterator(); it.increment(e)) ++n;
      return n;
    };
    const Json* opts = done.find("options");
    if (opts && opts->dump() == wanted && count("boxes") >= 0 && count("train_images") == files_in("train") &&
        count("val_images") == files_in("val")) {
      summary.reused = true;
      summary.train_images = count("train_images");
      summary.val_images = count("val_images");
      summary.boxes = count("boxes");
      return true;
    }
  }
  for (const char* owned : kOwned) fs::remove_all(out / owned);
  for (const auto& e : fs::directory_iterator(out))  // cache shards of the old set
    if (e.path().extension() == ".hrcache") fs::remove(e.path());
  return false;
}

// One YOLO label line per object: class, then centre and size normalised to the image.
std::string yolo_label_lines(const SynthImage& img) {
  std::string lines;
  const double W = img.image.width, H = img.image.height;
  for (const auto& ob : img.objects) {
    char line[96];
    std::snprintf(line, sizeof line, "%d %.6f %.6f %.6f %.6f\n", ob.cls, (ob.x1 + ob.x2) / 2 / W,
                  (ob.y1 + ob.y2) / 2 / H, (ob.x2 - ob.x1) / W, (ob.y2 - ob.y1) / H);
    lines += line;
  }
  return lines;
}

// Renders every image and writes its JPEG and label file; returns the boxes with the pixels dropped, for the COCO files.
std::vector<SynthImage> render_and_write_images(const SynthOptions& o, const fs::path& out, int n_train) {
  std::vector<SynthImage> rendered_meta(static_cast<size_t>(o.images));
  parallel_for(o.images, o.threads, [&](int64_t i) {
    SynthImage img = render(o, i);
    const bool val = i >= n_train;
    const std::string split = val ? "val" : "train";
    char name[32];
    std::snprintf(name, sizeof name, "im%06lld", static_cast<long long>(i));
    write_binary(out / "images" / split / (std::string(name) + ".jpg"), encode_jpeg(img.image, o.quality));
    if (!img.objects.empty())  // background images get no label file, as in Ultralytics sets
      std::ofstream(out / "labels" / split / (std::string(name) + ".txt")) << yolo_label_lines(img);
    img.image.pixels.clear();
    img.image.pixels.shrink_to_fit();
    rendered_meta[size_t(i)] = std::move(img);
  });
  return rendered_meta;
}

Json coco_image_json(const SynthImage& img, int64_t i) {
  char name[32];
  std::snprintf(name, sizeof name, "im%06lld.jpg", static_cast<long long>(i));
  Json im = Json::object();
  im["id"] = i + 1;
  im["file_name"] = std::string(name);
  im["width"] = img.image.width;
  im["height"] = img.image.height;
  return im;
}

Json coco_annotation_json(const SynthObject& ob, int64_t ann_id, int64_t i) {
  Json a = Json::object();
  a["id"] = ann_id;
  a["image_id"] = i + 1;
  a["category_id"] = ob.cls + 1;
  Json bbox = Json::array();
  for (double v : {ob.x1, ob.y1, ob.x2 - ob.x1, ob.y2 - ob.y1}) bbox.push_back(std::round(v * 100) / 100);
  a["bbox"] = std::move(bbox);
  a["area"] = std::round(ob.area * 100) / 100;
  a["iscrowd"] = 0;
  return a;
}

Json coco_categories_json(int classes) {
  const auto& names = synth_shape_names();
  Json cats = Json::array();
  for (int c = 0; c < classes; ++c) {
    Json cat = Json::object();
    cat["id"] = c + 1;
    cat["name"] = names[size_t(c)];
    cat["supercategory"] = "shape";
    cats.push_back(std::move(cat));
  }
  return cats;
}

// The COCO file for images [first, last); adds the annotations it writes to `boxes`.
Json coco_split_json(const SynthOptions& o, const std::vector<SynthImage>& rendered_meta, int64_t first, int64_t last,
                     int64_t& boxes) {
  Json coco = Json::object();
  Json info = Json::object();
  info["description"] = "Headroom synthetic shapes (trainer data synth)";
  coco["info"] = info;
  Json images = Json::array(), anns = Json::array();
  int64_t ann_id = 1;
  for (int64_t i = first; i < last; ++i) {
    const SynthImage& img = rendered_meta[size_t(i)];
    images.push_back(coco_image_json(img, i));
    for (const auto& ob : img.objects) {
      anns.push_back(coco_annotation_json(ob, ann_id++, i));
      ++boxes;
    }
  }
  coco["images"] = std::move(images);
  coco["annotations"] = std::move(anns);
  coco["categories"] = coco_categories_json(o.classes);
  return coco;
}

void write_coco_annotations(const SynthOptions& o, const fs::path& out, const std::vector<SynthImage>& rendered_meta,
                            int n_train, int n_val, SynthSummary& summary) {
  for (int s = 0; s < (n_val ? 2 : 1); ++s) {
    const std::string split = s ? "val" : "train";
    const Json coco = coco_split_json(o, rendered_meta, s ? n_train : 0, s ? o.images : n_train, summary.boxes);
    fs::create_directories(out / "annotations");
    write_file_atomic((out / "annotations" / ("instances_" + split + ".json")).string(), coco.dump());
  }
}

// data.yaml (YOLO labels) and data_coco.yaml (COCO annotations) over the same images.
void write_data_yamls(const SynthOptions& o, const SynthSummary& summary, int n_val) {
  const auto& names = synth_shape_names();
  std::string header = "# Headroom synthetic data set (trainer data synth --images " + std::to_string(o.images) +
                       " --size " + std::to_string(o.size) + " --seed " + std::to_string(o.seed) + ")\npath: .\n";
  std::string yolo = header + "train: images/train\n" + (n_val ? "val: images/val\n" : "") + "names:\n";
  for (int c = 0; c < o.classes; ++c) yolo += "  " + std::to_string(c) + ": " + names[size_t(c)] + "\n";
  write_file_atomic(summary.data_yaml, yolo);
  std::string coco_yaml = header + "train: {coco: annotations/instances_train.json, images: images/train}\n";
  if (n_val) coco_yaml += "val: {coco: annotations/instances_val.json, images: images/val}\n";
  write_file_atomic(summary.coco_yaml, coco_yaml);
}

}  // namespace

SynthSummary synthesize(const SynthOptions& o) {
  check_options(o);
  const fs::path out(o.out);
  const std::string wanted = options_json(o).dump();
  SynthSummary summary;
  summary.data_yaml = (out / "data.yaml").string();
  summary.coco_yaml = (out / "data_coco.yaml").string();

  if (reuse_or_clear_existing(o, out, wanted, summary)) return summary;
  fs::create_directories(out);
  write_file_atomic((out / kMarker).string(), "written by trainer data synth\n");

  const int n_val = o.val_fraction > 0 && o.images >= 2
                        ? std::max(1, static_cast<int>(std::lround(o.images * o.val_fraction)))
                        : 0;
  const int n_train = o.images - n_val;
  for (const char* split : {"train", "val"}) {
    if (std::string(split) == "val" && n_val == 0) continue;
    fs::create_directories(out / "images" / split);
    fs::create_directories(out / "labels" / split);
  }

  const std::vector<SynthImage> rendered_meta = render_and_write_images(o, out, n_train);
  write_coco_annotations(o, out, rendered_meta, n_train, n_val, summary);
  write_data_yamls(o, summary, n_val);

  summary.train_images = n_train;
  summary.val_images = n_val;
  Json done = Json::object();
  done["options"] = options_json(o);
  done["train_images"] = summary.train_images;
  done["val_images"] = summary.val_images;
  done["boxes"] = summary.boxes;
  write_file_atomic((out / "synth.json").string(), done.dump(2));  // last: marks the set complete
  return summary;
}

}  // namespace headroom::data
