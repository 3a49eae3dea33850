#include <gtest/gtest.h>

#include <algorithm>
#include <turbojpeg.h>

#include "headroom/data/image.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;

namespace {

// A w x h RGB image: left half red, right half blue.
Image two_tone(int w, int h) {
  Image img;
  img.width = w, img.height = h;
  img.pixels.resize(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &img.pixels[(size_t(y) * w + x) * 3];
      p[0] = x < w / 2 ? 255 : 0, p[1] = 0, p[2] = x < w / 2 ? 0 : 255;
    }
  return img;
}

const uint8_t* px(const Image& img, int x, int y) { return &img.pixels[(size_t(y) * img.width + x) * 3]; }

std::string message_of(const std::vector<uint8_t>& bytes, int64_t max_pixels = 1 << 30) {
  try {
    decode_image(bytes.data(), bytes.size(), max_pixels);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Image, JpegAndPngHeadersWithoutDecoding) {
  const auto jpeg = encode_jpeg(two_tone(64, 48), 90);
  ImageHeader h = read_image_header(jpeg.data(), jpeg.size());
  EXPECT_EQ(h.format, ImageFormat::jpeg);
  EXPECT_EQ(h.width, 64);
  EXPECT_EQ(h.height, 48);
  EXPECT_TRUE(image_is_complete(jpeg.data(), jpeg.size(), ImageFormat::jpeg));
  const auto png = encode_png(two_tone(30, 20));
  h = read_image_header(png.data(), png.size());
  EXPECT_EQ(h.format, ImageFormat::png);
  EXPECT_EQ(h.width, 30);
  EXPECT_EQ(h.height, 20);
  EXPECT_TRUE(image_is_complete(png.data(), png.size(), ImageFormat::png));
}

TEST(Image, DecodesRgbInTheRightOrder) {
  for (const auto& bytes : {encode_jpeg(two_tone(64, 32), 95), encode_png(two_tone(64, 32))}) {
    const Image img = decode_image(bytes.data(), bytes.size(), 1 << 30);
    ASSERT_EQ(img.width, 64);
    ASSERT_EQ(img.height, 32);
    EXPECT_GT(px(img, 8, 16)[0], 200);  // red on the left
    EXPECT_LT(px(img, 8, 16)[2], 60);
    EXPECT_GT(px(img, 56, 16)[2], 200);  // blue on the right
    EXPECT_LT(px(img, 56, 16)[0], 60);
  }
}

TEST(Image, ScaledJpegDecodingStaysAtLeastTheRequestedSize) {
  const auto jpeg = encode_jpeg(two_tone(800, 600), 90);
  Image img = decode_image(jpeg.data(), jpeg.size(), 1 << 30, 100, 75);
  EXPECT_EQ(img.width, 100);  // 1/8
  EXPECT_EQ(img.height, 75);
  img = decode_image(jpeg.data(), jpeg.size(), 1 << 30, 101, 76);
  EXPECT_EQ(img.width, 200);  // 1/4: the next scale that covers 101x76
  EXPECT_EQ(img.height, 150);
  img = decode_image(jpeg.data(), jpeg.size(), 1 << 30, 800, 600);
  EXPECT_EQ(img.width, 800);
}

TEST(Image, ExifOrientationTurnsTheImageUpright) {
  const auto jpeg = test::with_orientation(encode_jpeg(two_tone(64, 32), 95), 6);  // rotate 90 clockwise
  const ImageHeader h = read_image_header(jpeg.data(), jpeg.size());
  EXPECT_EQ(h.orientation, 6);
  EXPECT_EQ(h.width, 32);  // as displayed
  EXPECT_EQ(h.height, 64);
  const Image img = decode_image(jpeg.data(), jpeg.size(), 1 << 30);
  ASSERT_EQ(img.width, 32);
  ASSERT_EQ(img.height, 64);
  EXPECT_GT(px(img, 16, 8)[0], 200);   // the left (red) half is now on top
  EXPECT_GT(px(img, 16, 56)[2], 200);  // the right (blue) half at the bottom
  // Scaled decoding asks for the upright size too.
  const Image small = decode_image(jpeg.data(), jpeg.size(), 1 << 30, 8, 16);
  EXPECT_EQ(small.width, 8);
  EXPECT_EQ(small.height, 16);
}

TEST(Image, CmykJpegsDecodeToRgb) {
  std::vector<uint8_t> cmyk(32 * 16 * 4);
  for (size_t i = 0; i < cmyk.size(); i += 4) cmyk[i] = 255, cmyk[i + 1] = 0, cmyk[i + 2] = 0, cmyk[i + 3] = 255;
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, cmyk.data(), 32, 0, 16, TJPF_CMYK, &buf, &size, TJSAMP_444, 95, 0), 0);
  const std::vector<uint8_t> jpeg(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  const Image img = decode_image(jpeg.data(), jpeg.size(), 1 << 30);
  ASSERT_EQ(img.width, 32);
  EXPECT_GT(px(img, 16, 8)[0], 240);
  EXPECT_LT(px(img, 16, 8)[1], 15);
  EXPECT_LT(px(img, 16, 8)[2], 15);
}

TEST(Image, EmptyTextAndForeignFilesAreNamed) {
  EXPECT_NE(message_of({}).find("empty file"), std::string::npos);
  const std::string text = "<html><body>404 Not Found</body></html>";
  EXPECT_NE(message_of(std::vector<uint8_t>(text.begin(), text.end())).find("not an image: it holds text"), std::string::npos);
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  EXPECT_NE(message_of(std::vector<uint8_t>(gif.begin(), gif.end())).find("GIF"), std::string::npos);
  const std::string bmp = "BM\x36\x00\x00\x00";
  EXPECT_NE(message_of(std::vector<uint8_t>(bmp.begin(), bmp.end())).find("convert it to JPEG or PNG"), std::string::npos);
  const std::vector<uint8_t> junk = {0x00, 0x13, 0x37, 0xAA, 0xFE};
  EXPECT_NE(message_of(junk).find("not a JPEG or PNG"), std::string::npos);
}

TEST(Image, TruncatedFilesAreDetected) {
  auto jpeg = encode_jpeg(two_tone(128, 128), 90);
  jpeg.resize(jpeg.size() / 2);
  EXPECT_FALSE(image_is_complete(jpeg.data(), jpeg.size(), ImageFormat::jpeg));
  EXPECT_NE(message_of(jpeg).find("corrupt JPEG"), std::string::npos);
  auto png = encode_png(two_tone(128, 128));
  png.resize(png.size() - 30);
  EXPECT_FALSE(image_is_complete(png.data(), png.size(), ImageFormat::png));
  EXPECT_NE(message_of(png).find("corrupt PNG"), std::string::npos);
  auto header_only = encode_jpeg(two_tone(16, 16), 90);
  header_only.resize(40);
  EXPECT_NE(message_of(header_only).find("truncated JPEG"), std::string::npos);
  // The thread's decoder survives a corrupt file: the next JPEG on it decodes.
  const auto good = encode_jpeg(two_tone(40, 30), 90);
  EXPECT_EQ(message_of(good), "");
}

// Junk bytes before a marker ("N extraneous bytes before marker"), common in real data sets:
// libjpeg-turbo warns, the image is whole, and it decodes as the clean file does.
TEST(Image, AJpegWithExtraneousBytesDecodesAsTheCleanOne) {
  const auto clean = encode_jpeg(two_tone(64, 48), 90);
  auto junk = clean;
  const uint8_t dqt[] = {0xFF, 0xDB};
  const auto at = std::search(junk.begin() + 2, junk.end(), std::begin(dqt), std::end(dqt));
  ASSERT_NE(at, junk.end());
  junk.insert(at, {0x12, 0x34, 0x56});
  for (int i = 0; i < 3; ++i) {  // the thread's decoder is made again after each warning
    const Image a = decode_image(junk.data(), junk.size(), 1 << 30), b = decode_image(clean.data(), clean.size(), 1 << 30);
    EXPECT_EQ(a.width, 64);
    EXPECT_EQ(a.pixels, b.pixels);
  }
}

TEST(Image, DecompressionBombsAreRefusedBeforeDecoding) {
  // A PNG whose IHDR claims 100000 x 100000 (10^10 pixels) but carries no data.
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                              0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0, 8, 2, 0, 0, 0, 0, 0, 0, 0};
  const std::string msg = message_of(png, 89478485);
  EXPECT_NE(msg.find("refused before decoding"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100000x100000"), std::string::npos) << msg;
  // The same for a JPEG whose frame header was edited to 60000 x 60000.
  auto jpeg = encode_jpeg(two_tone(16, 16), 90);
  for (size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = 0xEA, jpeg[i + 6] = 0x60, jpeg[i + 7] = 0xEA, jpeg[i + 8] = 0x60;
      break;
    }
  EXPECT_NE(message_of(jpeg, 89478485).find("refused before decoding"), std::string::npos);
}
