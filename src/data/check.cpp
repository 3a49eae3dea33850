#include "headroom/data/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace headroom::data {

namespace {

struct Buckets {
  std::vector<double> upper;  // bucket i holds values < upper[i]; the last is open
  std::vector<std::string> labels;
};

Histogram histogram(const Buckets& b, const std::vector<double>& values) {
  Histogram h{b.labels, std::vector<int64_t>(b.labels.size(), 0)};
  for (double v : values) {
    size_t i = 0;
    while (i < b.upper.size() && v >= b.upper[i]) ++i;
    ++h.counts[i];
  }
  return h;
}

const Buckets kImageSides{{256, 512, 1024, 2048, 4096}, {"<256", "256-511", "512-1023", "1024-2047", "2048-4095", ">=4096"}};
// 32 and 96 are COCO's small / medium / large limits (on sqrt of the area).
const Buckets kBoxSides{{8, 16, 32, 64, 96, 256}, {"<8", "8-15", "16-31", "32-63", "64-95", "96-255", ">=256"}};
const Buckets kBoxCounts{{1, 2, 6, 21, 101, 1001}, {"0", "1", "2-5", "6-20", "21-100", "101-1000", ">1000"}};

SplitReport report_split(Split split) {
  SplitReport r;
  const size_t nc = split.names.size();
  r.boxes_per_class.assign(nc, 0);
  r.images_per_class.assign(nc, 0);
  std::vector<double> sides, box_sides, counts;
  for (const Sample& s : split.samples) {
    sides.push_back(std::max(s.width, s.height));
    counts.push_back(static_cast<double>(s.boxes.size()));
    r.max_boxes_per_image = std::max<int64_t>(r.max_boxes_per_image, static_cast<int64_t>(s.boxes.size()));
    std::vector<bool> seen(nc, false);
    for (const Box& b : s.boxes) {
      ++r.boxes_per_class[size_t(b.cls)];
      seen[size_t(b.cls)] = true;
      r.crowd_boxes += b.crowd;
      box_sides.push_back(std::sqrt((b.x2 - b.x1) * s.width * (b.y2 - b.y1) * s.height));
    }
    for (size_t c = 0; c < nc; ++c) r.images_per_class[c] += seen[c];
  }
  r.image_sizes = histogram(kImageSides, sides);
  r.box_sizes = histogram(kBoxSides, box_sides);
  r.boxes_per_image = histogram(kBoxCounts, counts);
  r.split = std::move(split);
  return r;
}

std::string histogram_line(const Histogram& h) {
  std::string out;
  for (size_t i = 0; i < h.labels.size(); ++i) out += "  " + h.labels[i] + ": " + std::to_string(h.counts[i]);
  return out;
}

Json histogram_json(const Histogram& h) {
  Json j = Json::object();
  for (size_t i = 0; i < h.labels.size(); ++i) j[h.labels[i]] = h.counts[i];
  return j;
}

}  // namespace

bool CheckReport::has_skips() const {
  for (const auto& s : splits)
    for (const auto& p : s.split.problems)
      if (p.image_skipped) return true;
  return false;
}

CheckReport check_data(const std::string& data_yaml, const std::vector<std::string>& splits, const ScanOptions& o) {
  const DataSpec spec = read_data_yaml(data_yaml);
  CheckReport report;
  report.data_yaml = data_yaml;
  for (const auto& [name, source] : spec.splits) {
    if (!splits.empty() && std::find(splits.begin(), splits.end(), name) == splits.end()) continue;
    report.splits.push_back(report_split(scan_split(spec, name, o)));
  }
  return report;
}

std::string format_check_report(const CheckReport& r) {
  std::string out = "data: " + r.data_yaml + "\n";
  char buf[256];
  for (const SplitReport& s : r.splits) {
    const Split& sp = s.split;
    int64_t boxes = 0;
    for (int64_t b : s.boxes_per_class) boxes += b;
    std::snprintf(buf, sizeof buf,
                  "\n[%s] %lld images listed, %lld usable, %lld skipped, %lld background; %lld boxes (%lld crowd), "
                  "at most %lld in one image\n",
                  sp.name.c_str(), (long long)sp.listed_images, (long long)sp.samples.size(),
                  (long long)sp.skipped_images(), (long long)sp.background_images(), (long long)boxes,
                  (long long)s.crowd_boxes, (long long)s.max_boxes_per_image);
    out += buf;
    std::snprintf(buf, sizeof buf, "  %-5s %-24s %10s %10s\n", "class", "name", "boxes", "images");
    out += buf;
    for (size_t c = 0; c < sp.names.size(); ++c) {
      std::snprintf(buf, sizeof buf, "  %-5zu %-24s %10lld %10lld\n", c, sp.names[c].c_str(),
                    (long long)s.boxes_per_class[c], (long long)s.images_per_class[c]);
      out += buf;
    }
    out += "  image long side (px):" + histogram_line(s.image_sizes) + "\n";
    out += "  box size sqrt(area) (px):" + histogram_line(s.box_sizes) + "\n";
    out += "  boxes per image:" + histogram_line(s.boxes_per_image) + "\n";
    std::map<std::string, int64_t> by_kind;
    for (const auto& p : sp.problems) ++by_kind[to_string(p.kind)];
    if (sp.problems.empty()) {
      out += "  problems: none\n";
    } else {
      out += "  problems:";
      for (const auto& [k, n] : by_kind) out += " " + k + " " + std::to_string(n) + ";";
      out += "\n";
      for (const auto& p : sp.problems)
        out += "    " + p.where + ": " + to_string(p.kind) + ": " + p.message + "\n";
    }
  }
  return out;
}

Json check_report_json(const CheckReport& r) {
  Json j = Json::object();
  j["data"] = r.data_yaml;
  Json splits = Json::array();
  for (const SplitReport& s : r.splits) {
    const Split& sp = s.split;
    Json js = Json::object();
    js["split"] = sp.name;
    js["listed_images"] = sp.listed_images;
    js["usable_images"] = static_cast<int64_t>(sp.samples.size());
    js["skipped_images"] = sp.skipped_images();
    js["background_images"] = sp.background_images();
    js["crowd_boxes"] = s.crowd_boxes;
    js["max_boxes_per_image"] = s.max_boxes_per_image;
    Json classes = Json::array();
    for (size_t c = 0; c < sp.names.size(); ++c) {
      Json jc = Json::object();
      jc["id"] = static_cast<int64_t>(c);
      jc["name"] = sp.names[c];
      jc["boxes"] = s.boxes_per_class[c];
      jc["images"] = s.images_per_class[c];
      classes.push_back(std::move(jc));
    }
    js["classes"] = std::move(classes);
    js["image_long_side"] = histogram_json(s.image_sizes);
    js["box_size"] = histogram_json(s.box_sizes);
    js["boxes_per_image"] = histogram_json(s.boxes_per_image);
    Json problems = Json::array();
    for (const auto& p : sp.problems) {
      Json jp = Json::object();
      jp["kind"] = to_string(p.kind);
      jp["where"] = p.where;
      jp["message"] = p.message;
      jp["image_skipped"] = p.image_skipped;
      problems.push_back(std::move(jp));
    }
    js["problems"] = std::move(problems);
    splits.push_back(std::move(js));
  }
  j["splits"] = std::move(splits);
  j["ok"] = !r.has_skips();
  return j;
}

}  // namespace headroom::data
