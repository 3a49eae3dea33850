// Drawing boxes with class names and scores on images (predict's output, plots).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "headroom/data/image.h"

namespace headroom::eval {

// rows: (x1, y1, x2, y2, score, class) in the image's pixels; score < 0 draws no score.
void draw_detections(data::Image& image, const std::vector<std::array<float, 6>>& rows, const std::vector<std::string>& names);

}  // namespace headroom::eval
