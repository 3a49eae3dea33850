#include "headroom/eval/draw.h"

#include <algorithm>
#include <cstdio>
#include <opencv2/imgproc.hpp>

namespace headroom::eval {

namespace {
// Ultralytics' palette, as RGB.
const uint32_t kPalette[] = {0xFF3838, 0xFF9D97, 0xFF701F, 0xFFB21D, 0xCFD231, 0x48F90A, 0x92CC17, 0x3DDB86, 0x1A9334, 0x00D4BB,
                             0x2C99A8, 0x00C2FF, 0x344593, 0x6473FF, 0x0018EC, 0x8438FF, 0x520085, 0xCB38FF, 0xFF95C8, 0xFF37C7};
}  // namespace

void draw_detections(data::Image& image, const std::vector<std::array<float, 6>>& rows, const std::vector<std::string>& names) {
  cv::Mat m(image.height, image.width, CV_8UC3, image.pixels.data());  // RGB
  const int thickness = std::max(1, int(std::lround(0.002 * (image.width + image.height) / 2)));
  const double font = std::max(0.35, thickness / 3.0);
  for (const auto& r : rows) {
    const int cls = int(r[5]);
    const uint32_t c = kPalette[size_t(std::max(cls, 0)) % (sizeof kPalette / sizeof kPalette[0])];
    const cv::Scalar colour((c >> 16) & 0xFF, (c >> 8) & 0xFF, c & 0xFF);
    const cv::Point p1(static_cast<int>(r[0]), static_cast<int>(r[1])), p2(static_cast<int>(r[2]), static_cast<int>(r[3]));
    cv::rectangle(m, p1, p2, colour, thickness, cv::LINE_AA);
    char label[128];
    const std::string name = cls >= 0 && size_t(cls) < names.size() ? names[size_t(cls)] : std::to_string(cls);
    if (r[4] >= 0)
      std::snprintf(label, sizeof label, "%s %.2f", name.c_str(), r[4]);
    else
      std::snprintf(label, sizeof label, "%s", name.c_str());
    int baseline = 0;
    const cv::Size ts = cv::getTextSize(label, cv::FONT_HERSHEY_SIMPLEX, font, std::max(thickness - 1, 1), &baseline);
    const bool above = p1.y - ts.height - 3 >= 0;
    const cv::Point t1(p1.x, above ? p1.y - ts.height - 3 : p1.y), t2(p1.x + ts.width, above ? p1.y : p1.y + ts.height + 3);
    cv::rectangle(m, t1, t2, colour, cv::FILLED, cv::LINE_AA);
    cv::putText(m, label, cv::Point(p1.x, above ? p1.y - 2 : p1.y + ts.height + 1), cv::FONT_HERSHEY_SIMPLEX, font,
                cv::Scalar(255, 255, 255), std::max(thickness - 1, 1), cv::LINE_AA);
  }
}

}  // namespace headroom::eval
