#include <algorithm>
#include <cmath>
#include <sstream>

#include "headroom/core/text.h"
#include "headroom/data/labels.h"

namespace headroom::data {

std::string yolo_label_path(const std::string& image_path) {
  std::string p = image_path;
  const size_t dot = p.rfind('.');
  const size_t slash = p.rfind('/');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) p.erase(dot);
  p += ".txt";
  const std::string from = "/images/", to = "/labels/";
  size_t at = p.rfind(from);
  if (at != std::string::npos) return p.replace(at, from.size(), to);
  if (p.rfind("images/", 0) == 0) return p.replace(0, from.size() - 1, to.substr(1));
  return p;
}

namespace {

std::string fmt_num(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

}  // namespace

LabelFile parse_yolo_labels(const std::string& text, const std::string& path, int num_classes) {
  LabelFile out;
  auto bad = [&](int line, const std::string& msg) {
    out.problems.push_back({ProblemKind::bad_label, path + ":" + std::to_string(line), msg, true});
    out.corrupt = true;
  };
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const auto fields = split_whitespace(raw);
    if (fields.empty()) continue;
    const size_t n = fields.size();
    if (n != 5 && (n < 7 || n % 2 == 0)) {
      bad(line, std::to_string(n) + " fields; expected 5 (class cx cy w h) or a polygon "
                "(class x1 y1 x2 y2 x3 y3 ...)");
      continue;
    }
    std::vector<double> v(n);
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      const auto d = parse_double(fields[i]);
      if (!d) {
        bad(line, "'" + std::string(fields[i]) + "' is not a number");
        ok = false;
      } else if (!std::isfinite(*d)) {
        bad(line, "'" + std::string(fields[i]) + "' is not a finite number");
        ok = false;
      } else {
        v[i] = *d;
      }
    }
    if (!ok) continue;
    if (v[0] != std::floor(v[0]) || v[0] < 0 || v[0] >= num_classes) {
      bad(line, "class id " + fmt_num(v[0]) + " is not valid: this data set has " +
                    std::to_string(num_classes) + " classes, ids 0.." + std::to_string(num_classes - 1) +
                    " (check `names` in the data YAML)");
      continue;
    }
    for (size_t i = 1; i < n && ok; ++i) {
      if (v[i] < -kCoordTolerance || v[i] > 1 + kCoordTolerance) {
        bad(line, "coordinate " + fmt_num(v[i]) + " is outside [0, 1]: YOLO labels are normalised "
                  "by the image size (pixel coordinates? divide x by the width, y by the height)");
        ok = false;
      }
    }
    if (!ok) continue;
    Box b;
    b.cls = static_cast<int>(v[0]);
    if (n == 5) {
      b.x1 = static_cast<float>(v[1] - v[3] / 2), b.x2 = static_cast<float>(v[1] + v[3] / 2);
      b.y1 = static_cast<float>(v[2] - v[4] / 2), b.y2 = static_cast<float>(v[2] + v[4] / 2);
    } else {
      b.x1 = b.y1 = 2, b.x2 = b.y2 = -1;
      for (size_t i = 1; i + 1 < n; i += 2) {
        b.x1 = std::min(b.x1, float(v[i])), b.x2 = std::max(b.x2, float(v[i]));
        b.y1 = std::min(b.y1, float(v[i + 1])), b.y2 = std::max(b.y2, float(v[i + 1]));
      }
    }
    b.x1 = std::clamp(b.x1, 0.f, 1.f), b.x2 = std::clamp(b.x2, 0.f, 1.f);
    b.y1 = std::clamp(b.y1, 0.f, 1.f), b.y2 = std::clamp(b.y2, 0.f, 1.f);
    const std::string where = path + ":" + std::to_string(line);
    if (b.x2 <= b.x1 || b.y2 <= b.y1) {
      out.problems.push_back({ProblemKind::zero_area_box, where, "zero-area box dropped", false});
    } else if (std::find(out.boxes.begin(), out.boxes.end(), b) != out.boxes.end()) {
      out.problems.push_back({ProblemKind::duplicate_box, where, "duplicate box dropped", false});
    } else {
      out.boxes.push_back(b);
    }
  }
  return out;
}

}  // namespace headroom::data
