#include "headroom/data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <opencv2/core.hpp>

#include "headroom/core/text.h"

#include <cstring>
#include <memory>

namespace headroom::data {
namespace {

bool starts_with(const uint8_t* d, size_t n, const char* magic, size_t m) {
  return n >= m && std::memcmp(d, magic, m) == 0;
}

// Names what a non-JPEG/PNG file looks like, so the message can say what to do.
std::string describe_foreign(const uint8_t* d, size_t n) {
  if (starts_with(d, n, "GIF8", 4)) return "a GIF image, which is not supported; convert it to JPEG or PNG";
  if (starts_with(d, n, "BM", 2)) return "a BMP image, which is not supported; convert it to JPEG or PNG";
  if (starts_with(d, n, "RIFF", 4) && n >= 12 && std::memcmp(d + 8, "WEBP", 4) == 0)
    return "a WebP image, which is not supported; convert it to JPEG or PNG";
  if (starts_with(d, n, "II*\0", 4) || starts_with(d, n, "MM\0*", 4))
    return "a TIFF image, which is not supported; convert it to JPEG or PNG";
  size_t printable = 0;
  const size_t look = std::min<size_t>(n, 64);
  for (size_t i = 0; i < look; ++i) printable += (d[i] >= 0x20 && d[i] < 0x7f) || d[i] == '\n' || d[i] == '\r' || d[i] == '\t';
  if (printable == look) {
    std::string head(reinterpret_cast<const char*>(d), std::min<size_t>(look, 24));
    for (char& c : head)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    return "not an image: it holds text (\"" + head + "...\")";
  }
  return "not a JPEG or PNG image (unrecognised first bytes)";
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

// The orientation tag (0x0112) of an APP1 Exif segment's first IFD; 1 when absent.
int exif_orientation(const uint8_t* seg, size_t len) {
  if (len < 14 || std::memcmp(seg, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = seg + 6;
  const size_t tn = len - 6;
  const bool le = t[0] == 'I' && t[1] == 'I';
  if (!le && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](size_t o) -> uint32_t { return le ? t[o] | (t[o + 1] << 8) : (t[o] << 8) | t[o + 1]; };
  auto u32 = [&](size_t o) -> uint32_t { return le ? u16(o) | (u16(o + 2) << 16) : (u16(o) << 16) | u16(o + 2); };
  const size_t ifd = u32(4);
  if (ifd + 2 > tn) return 1;
  const uint32_t entries = u16(ifd);
  for (uint32_t e = 0; e < entries; ++e) {
    const size_t o = ifd + 2 + 12 * size_t(e);
    if (o + 12 > tn) return 1;
    if (u16(o) == 0x0112) {
      const uint32_t v = u16(o + 8);
      return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
    }
  }
  return 1;
}

// Orientations 5..8 turn the image by 90 degrees: width and height swap.
bool swaps_axes(int orientation) { return orientation >= 5; }

// Applies the EXIF orientation so the pixels are upright.
Image orient(Image img, int orientation) {
  if (orientation <= 1) return img;
  cv::Mat src(img.height, img.width, CV_8UC3, img.pixels.data());
  cv::Mat dst;
  switch (orientation) {
    case 2: cv::flip(src, dst, 1); break;
    case 3: cv::rotate(src, dst, cv::ROTATE_180); break;
    case 4: cv::flip(src, dst, 0); break;
    case 5: cv::transpose(src, dst); break;
    case 6: cv::rotate(src, dst, cv::ROTATE_90_CLOCKWISE); break;
    case 7: cv::transpose(src, dst); cv::flip(dst, dst, -1); break;
    case 8: cv::rotate(src, dst, cv::ROTATE_90_COUNTERCLOCKWISE); break;
    default: return img;
  }
  Image out;
  out.width = dst.cols;
  out.height = dst.rows;
  out.pixels.assign(dst.data, dst.data + dst.total() * 3);
  return out;
}

ImageHeader jpeg_header(const uint8_t* d, size_t n) {
  int orientation = 1;
  size_t i = 2;
  while (i + 4 <= n) {
    if (d[i] != 0xFF) {  // junk before a marker: libjpeg skips it with a warning, and so do PIL and OpenCV
      ++i;
      continue;
    }
    uint8_t marker = d[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      i += 2;
      continue;
    }
    const size_t len = (size_t(d[i + 2]) << 8) | d[i + 3];
    if (len < 2) throw ImageError("corrupt JPEG header (segment length " + std::to_string(len) + ")");
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (i + 9 > n) break;
      ImageHeader h{ImageFormat::jpeg, (int(d[i + 7]) << 8) | d[i + 8], (int(d[i + 5]) << 8) | d[i + 6],
                    orientation};
      if (h.width <= 0 || h.height <= 0) throw ImageError("JPEG header gives a zero image size");
      if (swaps_axes(orientation)) std::swap(h.width, h.height);
      return h;
    }
    if (marker == 0xE1 && i + 2 + len <= n) orientation = exif_orientation(d + i + 4, len - 2);
    if (marker == 0xDA || marker == 0xD9) throw ImageError("corrupt JPEG: no frame header before the image data");
    i += 2 + len;
  }
  throw ImageError("truncated JPEG: the file ends inside its header");
}

ImageHeader png_header(const uint8_t* d, size_t n) {
  if (n < 33) throw ImageError("truncated PNG: the file ends inside its header");
  if (std::memcmp(d + 12, "IHDR", 4) != 0) throw ImageError("corrupt PNG: the first chunk is not IHDR");
  ImageHeader h{ImageFormat::png, static_cast<int>(be32(d + 16)), static_cast<int>(be32(d + 20))};
  if (h.width <= 0 || h.height <= 0) throw ImageError("PNG header gives a zero or huge image size");
  return h;
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};

// One decompressor per thread: loader threads decode concurrently. A decompressor that failed
// (a truncated or corrupt file) is replaced: libjpeg-turbo leaves it mid-decode, and the next
// image on that thread would fail with "Invalid argument".
std::unique_ptr<void, TjDeleter>& thread_handle() {
  thread_local std::unique_ptr<void, TjDeleter> handle;
  return handle;
}
tjhandle thread_decompressor() {
  auto& handle = thread_handle();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle) throw Error("libjpeg-turbo: cannot create a decompressor");
  return handle.get();
}

// min_w/min_h are in stored (pre-orientation) axes.
Image decode_jpeg(const uint8_t* d, size_t n, int min_w, int min_h) {
  tjhandle tj = thread_decompressor();
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  // A warning ("extraneous bytes before marker") leaves a readable header: decoding goes on.
  if (tjDecompressHeader3(tj, d, static_cast<unsigned long>(n), &w, &h, &subsamp, &colorspace) != 0 &&
      (tjGetErrorCode(tj) != TJERR_WARNING || w <= 0 || h <= 0)) {
    const std::string msg = tjGetErrorStr2(tj);
    thread_handle().reset();
    throw ImageError("corrupt JPEG: " + msg);
  }
  // Scaled decoding: the smallest DCT scale that still covers the requested size.
  int sw = w, sh = h;
  if (min_w > 0 && min_h > 0) {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int k = 0; k < count; ++k) {
      const tjscalingfactor f = factors[k];
      if (f.num > f.denom) continue;
      const int cw = TJSCALED(w, f), ch = TJSCALED(h, f);
      if (cw >= min_w && ch >= min_h && int64_t(cw) * ch < int64_t(sw) * sh) sw = cw, sh = ch;
    }
  }
  Image img;
  img.width = sw;
  img.height = sh;
  // CMYK/YCCK JPEGs (print workflows) decode as CMYK and are converted below.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::vector<uint8_t> cmyk_pixels(cmyk ? size_t(sw) * sh * 4 : 0);
  img.pixels.resize(size_t(sw) * sh * 3);
  uint8_t* dst = cmyk ? cmyk_pixels.data() : img.pixels.data();
  if (tjDecompress2(tj, d, static_cast<unsigned long>(n), dst, sw, 0, sh, cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0) {
    const std::string msg = tjGetErrorStr2(tj);
    const bool warning = tjGetErrorCode(tj) == TJERR_WARNING;  // read before the handle is freed
    thread_handle().reset();
    // Warnings such as "extraneous bytes" leave a good image; missing or undecodable data
    // leaves part of it grey.
    const std::string lower = to_lower(msg);
    if (!warning || lower.find("premature end") != std::string::npos ||
        lower.find("huffman") != std::string::npos)
      throw ImageError("corrupt JPEG: " + msg);
  }
  // Adobe-style (inverted) CMYK, which nearly every CMYK JPEG is: R = C * K / 255, etc.
  for (size_t i = 0; i < cmyk_pixels.size() / 4; ++i) {
    const unsigned k = cmyk_pixels[4 * i + 3];
    for (int c = 0; c < 3; ++c) img.pixels[3 * i + c] = static_cast<uint8_t>(cmyk_pixels[4 * i + c] * k / 255);
  }
  return img;
}

Image decode_png(const uint8_t* d, size_t n) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, d, n))
    throw ImageError(std::string("corrupt PNG: ") + png.message);
  png.format = PNG_FORMAT_RGB;
  Image img;
  img.width = static_cast<int>(png.width);
  img.height = static_cast<int>(png.height);
  img.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
    const std::string msg = png.message;
    png_image_free(&png);
    throw ImageError("corrupt PNG: " + msg);
  }
  return img;
}

}  // namespace

const char* to_string(ImageFormat f) { return f == ImageFormat::jpeg ? "JPEG" : "PNG"; }

ImageHeader read_image_header(const uint8_t* d, size_t n) {
  if (n == 0) throw ImageError("empty file (0 bytes)");
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return jpeg_header(d, n);
  if (starts_with(d, n, "\x89PNG\r\n\x1a\n", 8)) return png_header(d, n);
  throw ImageError(describe_foreign(d, n));
}

bool image_is_complete(const uint8_t* d, size_t n, ImageFormat format) {
  if (format == ImageFormat::jpeg) {
    // Some writers pad after EOI with zeros or newlines; skip those.
    while (n > 2 && (d[n - 1] == 0 || d[n - 1] == '\n' || d[n - 1] == '\r')) --n;
    return n >= 4 && d[n - 2] == 0xFF && d[n - 1] == 0xD9;
  }
  static const uint8_t iend[8] = {'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  return n >= 20 && std::memcmp(d + n - 8, iend, 8) == 0;
}

Image decode_image(const uint8_t* d, size_t n, int64_t max_pixels, int min_w, int min_h) {
  const ImageHeader h = read_image_header(d, n);
  const int64_t pixels = int64_t(h.width) * h.height;
  if (pixels > max_pixels)
    throw ImageError("refused before decoding: the header claims " + std::to_string(h.width) + "x" +
                     std::to_string(h.height) + " = " + std::to_string(pixels) +
                     " pixels, over data.max_pixels = " + std::to_string(max_pixels) +
                     " (a decompression bomb, or raise data.max_pixels)");
  if (h.format == ImageFormat::png) return decode_png(d, n);
  if (swaps_axes(h.orientation)) std::swap(min_w, min_h);
  return orient(decode_jpeg(d, n, min_w, min_h), h.orientation);
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  std::unique_ptr<void, TjDeleter> tj(tjInitCompress());
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj.get(), image.pixels.data(), image.width, 0, image.height, TJPF_RGB, &buf, &size,
                  TJSAMP_420, quality, 0) != 0)
    throw Error(std::string("JPEG encoding failed: ") + tjGetErrorStr2(tj.get()));
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
}

std::vector<uint8_t> encode_png(const Image& image) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr))
    throw Error(std::string("PNG encoding failed: ") + png.message);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, image.pixels.data(), 0, nullptr))
    throw Error(std::string("PNG encoding failed: ") + png.message);
  out.resize(size);
  return out;
}

}  // namespace headroom::data
