// Image files: header probing (format, size) without decoding, completeness checks,
// decoding to RGB (libjpeg-turbo with scaled decoding, libpng), and encoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/core/errors.h"

namespace headroom::data {

// A file that is not a usable image. The message does not name the file: callers add it.
class ImageError : public InputError {
 public:
  using InputError::InputError;
};

// An image the scan read that cannot be read now (removed, changed or made unreadable since, a
// network file system's hiccup): not a fact about the image to remember, as a decode failure is.
class UnreadableImage : public ImageError {
 public:
  using ImageError::ImageError;
};

enum class ImageFormat { jpeg, png };

struct ImageHeader {
  ImageFormat format = ImageFormat::jpeg;
  int width = 0;        // as displayed: after the EXIF orientation is applied
  int height = 0;
  int orientation = 1;  // EXIF orientation (1 = as stored .. 8), JPEG only
};

// RGB, row-major, 3 bytes a pixel.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// Reads only the header. Throws ImageError for empty files, non-images (saying what the bytes
// look like), unsupported formats and malformed headers.
ImageHeader read_image_header(const uint8_t* data, size_t size);

// False when the file ends before its end marker (JPEG EOI, PNG IEND): a truncated download.
bool image_is_complete(const uint8_t* data, size_t size, ImageFormat format);

// Decodes to RGB, turned upright by the EXIF orientation (as OpenCV's imread and therefore
// Ultralytics do, so labels drawn on the upright view stay right). A header claiming more than `max_pixels` is refused before any decoding.
// With min_width/min_height > 0, JPEGs are decoded at the smallest libjpeg-turbo scale
// (1/8 .. 1) still at least that large: a 4000-px photo for a 640 canvas decodes at 1/4 size.
Image decode_image(const uint8_t* data, size_t size, int64_t max_pixels, int min_width = 0,
                   int min_height = 0);

std::vector<uint8_t> encode_jpeg(const Image& image, int quality);
std::vector<uint8_t> encode_png(const Image& image);

const char* to_string(ImageFormat f);

}  // namespace headroom::data
