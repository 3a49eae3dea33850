#include <gtest/gtest.h>

#include "headroom/data/letterbox.h"

using namespace headroom::data;

TEST(Letterbox, KeepsAspectAndCentres) {
  const Letterbox g = letterbox_geometry(200, 100, 64);
  EXPECT_EQ(g.resized_w, 64);
  EXPECT_EQ(g.resized_h, 32);
  EXPECT_EQ(g.pad_x, 0);
  EXPECT_EQ(g.pad_y, 16);
  const Letterbox t = letterbox_geometry(30, 90, 96);  // enlarges too
  EXPECT_EQ(t.resized_w, 32);
  EXPECT_EQ(t.resized_h, 96);
  EXPECT_EQ(t.pad_x, 32);
}

TEST(Letterbox, MapsBoxesIntoTheCanvas) {
  const Letterbox g = letterbox_geometry(200, 100, 64);
  Box b;
  b.x1 = 0.25f, b.y1 = 0.5f, b.x2 = 0.5f, b.y2 = 1.0f;
  const auto c = box_to_canvas(b, g);
  EXPECT_FLOAT_EQ(c[0], 16.f);
  EXPECT_FLOAT_EQ(c[1], 32.f);
  EXPECT_FLOAT_EQ(c[2], 32.f);
  EXPECT_FLOAT_EQ(c[3], 48.f);
}

TEST(Letterbox, WritesRgbPlanesAndPadding) {
  Image img;
  img.width = 8, img.height = 4;
  img.pixels.resize(8 * 4 * 3);
  for (size_t i = 0; i < img.pixels.size(); i += 3) img.pixels[i] = 10, img.pixels[i + 1] = 20, img.pixels[i + 2] = 30;
  const Letterbox g = letterbox_geometry(8, 4, 16);  // 16x8 image, 4 rows of padding above and below
  std::vector<uint8_t> chw(3 * 16 * 16);
  letterbox_to_chw(img, g, chw.data());
  const auto at = [&](int c, int y, int x) { return chw[size_t(c) * 256 + y * 16 + x]; };
  EXPECT_EQ(at(0, 0, 0), kPadValue);
  EXPECT_EQ(at(2, 15, 15), kPadValue);
  EXPECT_EQ(at(0, 8, 8), 10);
  EXPECT_EQ(at(1, 4, 0), 20);
  EXPECT_EQ(at(2, 11, 15), 30);
  EXPECT_EQ(at(2, 12, 15), kPadValue);
}
