// Letterbox: scale an image to fit a square canvas keeping its aspect, centre it, pad the
// rest (Ultralytics' grey 114). The geometry maps boxes into the canvas and predictions back.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "headroom/data/dataset.h"
#include "headroom/data/image.h"

namespace headroom::data {

constexpr uint8_t kPadValue = 114;

// How an image becomes its canvas. fast: a JPEG decoded at the smallest libjpeg-turbo scale still
// at least the canvas size, area interpolation when shrinking (the training path: a 4000-px photo
// decodes at 1/4). source: decoded at full scale and resized bilinearly, as the frameworks the
// weights come from prepare inputs at inference (Ultralytics' predictor and validator, YOLOv5's
// detect.py: cv2.imread and cv2.INTER_LINEAR; the TF OD API's resizer: a bilinear resize).
enum class Preprocess { fast, source };
Preprocess preprocess_from(const std::string& word);  // "fast" | "source"
const char* to_string(Preprocess p);

struct Letterbox {
  int orig_w = 0, orig_h = 0;        // upright original image
  int resized_w = 0, resized_h = 0;  // the image's size inside the canvas
  int pad_x = 0, pad_y = 0;          // left and top padding
  int canvas = 0;
};

Letterbox letterbox_geometry(int width, int height, int canvas);

// Bytes of one letterboxed image: uint8 [3, canvas, canvas] (what the loader and the cache hold).
inline int64_t canvas_bytes(int64_t canvas) { return 3 * canvas * canvas; }

// Resizes `image` (any size: a scaled JPEG decode is fine) to the geometry's resized size and
// writes it into `chw` = uint8 [3, canvas, canvas] (RGB planes), padding with kPadValue.
void letterbox_to_chw(const Image& image, const Letterbox& g, uint8_t* chw, Preprocess p = Preprocess::fast);

// Normalised original-image box -> canvas pixels, xyxy.
std::array<float, 4> box_to_canvas(const Box& b, const Letterbox& g);

// One image's boxes in canvas pixels, as the batch carries them.
struct ItemBoxes {
  std::vector<std::array<float, 4>> xyxy;
  std::vector<int64_t> classes;
  std::vector<bool> crowd;
};
ItemBoxes boxes_in_canvas(const Sample& s, const Letterbox& g);

// Reads, decodes (fast: JPEG at the smallest sufficient DCT scale) and letterboxes one sample into
// `chw` = [3, canvas, canvas]. Throws ImageError naming the file.
void decode_into_canvas(const Sample& s, const Letterbox& g, int64_t max_pixels, uint8_t* chw, Preprocess p = Preprocess::fast);
// How many images decode_into_canvas has decoded in this process (loaders and caches together).
int64_t canvases_decoded();

}  // namespace headroom::data
