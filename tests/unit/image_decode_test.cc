// image/decode.h: every format decodes what its own encoder (or a hand-built
// file) holds; about a hundred prefixes of each encoded file, its last byte
// cut included, are errors; random corruptions decode or fail but never crash
// (the sanitized CI run checks the decoders' memory accesses). JPEG 2000 is
// checked against the ONNX backend cases (test_image_decoder_*) and, cut
// short, in tests/error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <png.h>
#include <tiffio.h>
#include <webp/encode.h>

#include "image/decode.h"
#include "support/memory_limit.h"

namespace kiln::image {
namespace {

using Bytes = std::vector<uint8_t>;

// A w x h RGB test pattern (distinct values per pixel and channel).
Bytes pattern(int w, int h, int c = 3) {
  Bytes p(static_cast<size_t>(w * h * c));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>((i * 37 + i / 7) & 0xff);
  return p;
}

Bytes png_bytes(const Bytes& px, int w, int h, png_uint_32 format) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = format;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr));
  Bytes out(size);
  EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr));
  out.resize(size);
  return out;
}

Bytes jpeg_bytes(const Bytes& px, int w, int h, int c) {
  jpeg_compress_struct info{};
  jpeg_error_mgr err{};
  info.err = jpeg_std_error(&err);
  jpeg_create_compress(&info);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &mem, &size);
  info.image_width = static_cast<JDIMENSION>(w);
  info.image_height = static_cast<JDIMENSION>(h);
  info.input_components = c;
  info.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 100, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data()) + static_cast<size_t>(info.next_scanline) * w * c;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  Bytes out(mem, mem + size);
  std::free(mem);
  return out;
}

Bytes tiff_bytes(const Bytes& px, int w, int h) {
  std::string path = testing::TempDir() + "kiln_image_test.tif";
  TIFF* t = TIFFOpen(path.c_str(), "w");
  EXPECT_NE(t, nullptr);
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, w);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, h);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(t, TIFFTAG_COMPRESSION, COMPRESSION_LZW);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 4);
  for (int y = 0; y < h; ++y) TIFFWriteScanline(t, const_cast<uint8_t*>(px.data()) + y * w * 3, static_cast<uint32_t>(y), 0);
  TIFFClose(t);
  Bytes out;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    int ch;
    while ((ch = std::fgetc(f)) != EOF) out.push_back(static_cast<uint8_t>(ch));
    std::fclose(f);
  }
  std::remove(path.c_str());
  return out;
}

void put16(Bytes& b, uint32_t v) { b.push_back(v & 0xff), b.push_back((v >> 8) & 0xff); }
void put32(Bytes& b, uint32_t v) { put16(b, v & 0xffff), put16(b, v >> 16); }

// An uncompressed BMP of `bits` (1, 8: gray palettes; 24, 32: BGR(X)),
// bottom-up unless top_down.
Bytes bmp_bytes(const Bytes& rgb, int w, int h, int bits, bool top_down) {
  const int colors = bits <= 8 ? 1 << bits : 0;
  const int stride = (w * bits + 31) / 32 * 4;
  const uint32_t data_at = 14 + 40 + 4 * colors;
  Bytes b = {'B', 'M'};
  put32(b, data_at + stride * h), put32(b, 0), put32(b, data_at);
  put32(b, 40), put32(b, static_cast<uint32_t>(w)), put32(b, static_cast<uint32_t>(top_down ? -h : h));
  put16(b, 1), put16(b, static_cast<uint32_t>(bits)), put32(b, 0), put32(b, stride * h);
  put32(b, 2835), put32(b, 2835), put32(b, colors), put32(b, 0);
  for (int i = 0; i < colors; ++i) {  // gray ramp
    uint8_t v = static_cast<uint8_t>(i * 255 / (colors - 1));
    b.insert(b.end(), {v, v, v, 0});
  }
  for (int r = 0; r < h; ++r) {
    const int y = top_down ? r : h - 1 - r;
    Bytes row(static_cast<size_t>(stride), 0);
    for (int x = 0; x < w; ++x) {
      const uint8_t* p = rgb.data() + (y * w + x) * 3;
      if (bits >= 24) {
        uint8_t* q = row.data() + x * (bits / 8);
        q[0] = p[2], q[1] = p[1], q[2] = p[0];
      } else {  // palette index from the red channel
        int index = p[0] * (colors - 1) / 255;
        row[(x * bits) / 8] |= static_cast<uint8_t>(index << (8 - bits - (x * bits) % 8));
      }
    }
    b.insert(b.end(), row.begin(), row.end());
  }
  return b;
}

Result<Image> decode_bytes(const Bytes& b) { return decode(b.data(), b.size()); }

void expect_pixels(const Bytes& encoded, const Bytes& want, int w, int h, int c, int tolerance, const std::string& what) {
  auto img = decode_bytes(encoded);
  ASSERT_TRUE(img.is_ok()) << what << ": " << img.status().to_string();
  ASSERT_EQ(img->height, h) << what;
  ASSERT_EQ(img->width, w) << what;
  ASSERT_EQ(img->channels, c) << what;
  const uint8_t* got = img->pixels.data_as<uint8_t>();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_LE(std::abs(int{got[i]} - int{want[i]}), tolerance) << what << " sample " << i;
}

// About a hundred prefixes of `b` (the last byte cut among them) are errors;
// corruptions of `b` decode or fail, without crashing.
void expect_robust(const Bytes& b, const std::string& what) {
  std::vector<size_t> cuts = {b.size() - 1};
  for (size_t n = 0; n < b.size(); n += std::max<size_t>(1, b.size() / 97)) cuts.push_back(n);
  for (size_t n : cuts) {
    Bytes prefix(b.begin(), b.begin() + static_cast<long>(n));
    EXPECT_FALSE(decode_bytes(prefix).is_ok()) << what << " cut to " << n << " of " << b.size() << " bytes";
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    Bytes c = b;
    for (int k = 0; k < 4; ++k) c[rng() % c.size()] = static_cast<uint8_t>(rng());
    (void)decode_bytes(c);
  }
}

TEST(ImageDecode, FormatsRoundTrip) {
  const int w = 13, h = 7;
  Bytes rgb = pattern(w, h), gray = pattern(w, h, 1);
  expect_pixels(png_bytes(rgb, w, h, PNG_FORMAT_RGB), rgb, w, h, 3, 0, "PNG RGB");
  expect_pixels(png_bytes(gray, w, h, PNG_FORMAT_GRAY), gray, w, h, 1, 0, "PNG gray");
  Bytes rgba = pattern(w, h, 4);
  Bytes rgb_of_rgba;
  for (size_t i = 0; i < rgba.size(); i += 4) rgb_of_rgba.insert(rgb_of_rgba.end(), {rgba[i], rgba[i + 1], rgba[i + 2]});
  expect_pixels(png_bytes(rgba, w, h, PNG_FORMAT_RGBA), rgb_of_rgba, w, h, 3, 0, "PNG RGBA (alpha dropped)");
  uint8_t* webp = nullptr;
  size_t webp_size = WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &webp);
  ASSERT_GT(webp_size, 0u);
  Bytes webp_bytes(webp, webp + webp_size);
  WebPFree(webp);
  expect_pixels(webp_bytes, rgb, w, h, 3, 0, "WebP lossless");
  expect_pixels(tiff_bytes(rgb, w, h), rgb, w, h, 3, 0, "TIFF LZW");
  // JPEG at quality 100: within a few levels of the source.
  Bytes flat(static_cast<size_t>(w * h * 3), 0);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<uint8_t>(40 + 60 * (i % 3));
  expect_pixels(jpeg_bytes(flat, w, h, 3), flat, w, h, 3, 3, "JPEG RGB");
  Bytes flat_gray(static_cast<size_t>(w * h), 90);
  expect_pixels(jpeg_bytes(flat_gray, w, h, 1), flat_gray, w, h, 1, 1, "JPEG gray");
  expect_pixels(bmp_bytes(rgb, w, h, 24, false), rgb, w, h, 3, 0, "BMP 24 bottom-up");
  expect_pixels(bmp_bytes(rgb, w, h, 32, true), rgb, w, h, 3, 0, "BMP 32 top-down");
  Bytes ramp(rgb.size());
  for (size_t i = 0; i < rgb.size(); i += 3) ramp[i] = ramp[i + 1] = ramp[i + 2] = rgb[i - i % 3];
  expect_pixels(bmp_bytes(rgb, w, h, 8, false), ramp, w, h, 3, 0, "BMP 8 paletted");
  Bytes bits(rgb.size());
  for (size_t i = 0; i < rgb.size(); i += 3) bits[i] = bits[i + 1] = bits[i + 2] = rgb[i] == 255 ? 255 : 0;
  expect_pixels(bmp_bytes(rgb, w, h, 1, false), bits, w, h, 3, 0, "BMP 1 bit");
}

// A TIFF whose second strip lies past the end of the data: an error, not an
// image with that strip left black.
TEST(ImageDecode, TiffStripThatDoesNotReadFails) {
  const int w = 13, h = 7;  // two strips of 4 rows
  Bytes b = tiff_bytes(pattern(w, h), w, h);
  ASSERT_TRUE(decode_bytes(b).is_ok());
  ASSERT_TRUE(b[0] == 'I' && b[1] == 'I');
  auto u16 = [&](size_t at) { return static_cast<uint32_t>(b[at] | b[at + 1] << 8); };
  auto u32 = [&](size_t at) { return u16(at) | u16(at + 2) << 16; };
  uint32_t ifd = u32(4);
  ASSERT_LT(ifd + 2, b.size());
  bool patched = false;
  for (uint32_t e = 0; e < u16(ifd); ++e) {
    size_t entry = ifd + 2 + 12 * e;
    if (u16(entry) != 273 || u32(entry + 4) != 2) continue;  // StripOffsets, 2 values
    // Two SHORTs or LONGs: inline (SHORT) or at an offset (LONG).
    size_t second = u16(entry + 2) == 3 ? entry + 10 : u32(entry + 8) + 4;
    if (u16(entry + 2) == 3) {
      b[second] = 0xff, b[second + 1] = 0xff;
    } else {
      b[second] = b[second + 1] = b[second + 2] = 0xff, b[second + 3] = 0x7f;
    }
    patched = true;
  }
  ASSERT_TRUE(patched);
  auto img = decode_bytes(b);
  ASSERT_FALSE(img.is_ok());
  EXPECT_NE(img.status().to_string().find("TIFF"), std::string::npos) << img.status().to_string();
}

TEST(ImageDecode, PnmVariants) {
  auto text = [](const std::string& s) { return Bytes(s.begin(), s.end()); };
  expect_pixels(text("P3\n# comment\n2 1\n255\n1 2 3  4 5 6\n"), {1, 2, 3, 4, 5, 6}, 2, 1, 3, 0, "P3");
  expect_pixels(text("P2 2 2 15 0 15 5 10"), {0, 255, 85, 170}, 2, 2, 1, 0, "P2, maxval 15 scaled");
  expect_pixels(text("P1\n3 1\n1 0 1\n"), {0, 255, 0}, 3, 1, 1, 0, "P1: 1 is black");
  Bytes p6 = text("P6\n2 1\n255\n");
  p6.insert(p6.end(), {9, 8, 7, 6, 5, 4});
  expect_pixels(p6, {9, 8, 7, 6, 5, 4}, 2, 1, 3, 0, "P6");
  Bytes p5 = text("P5 2 1 65535 ");
  p5.insert(p5.end(), {0xff, 0xff, 0x80, 0x00});
  expect_pixels(p5, {255, 128}, 2, 1, 1, 0, "P5 16-bit");
  Bytes p4 = text("P4\n10 1\n");
  p4.insert(p4.end(), {0xa0, 0x40});
  expect_pixels(p4, {0, 255, 0, 255, 255, 255, 255, 255, 255, 0}, 10, 1, 1, 0, "P4");
  // A sample above maxval, a truncated body, a header claiming more than the data.
  EXPECT_FALSE(decode_bytes(text("P2 1 1 7 9")).is_ok());
  EXPECT_FALSE(decode_bytes(text("P6 2 2 255 abc")).is_ok());
  auto huge = decode_bytes(text("P5 1000000000 1000000000 255 x"));
  ASSERT_FALSE(huge.is_ok());
  EXPECT_NE(huge.status().to_string().find("truncated"), std::string::npos) << huge.status().to_string();
}

TEST(ImageDecode, MalformedDataIsAnError) {
  const int w = 9, h = 6;
  Bytes rgb = pattern(w, h);
  uint8_t* webp = nullptr;
  size_t webp_size = WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &webp);
  Bytes webp_bytes(webp, webp + webp_size);
  WebPFree(webp);
  std::vector<std::pair<std::string, Bytes>> files = {
      {"PNG", png_bytes(rgb, w, h, PNG_FORMAT_RGB)}, {"JPEG", jpeg_bytes(rgb, w, h, 3)},
      {"WebP", webp_bytes},                          {"TIFF", tiff_bytes(rgb, w, h)},
      {"BMP", bmp_bytes(rgb, w, h, 24, false)},      {"BMP8", bmp_bytes(rgb, w, h, 8, true)},
  };
  auto text = [](const std::string& t) { return Bytes(t.begin(), t.end()); };
  Bytes p6 = text("P6\n# made here\n9 6\n255\n");
  p6.insert(p6.end(), rgb.begin(), rgb.end());
  files.push_back({"PNM", p6});
  for (const auto& [name, bytes] : files) {
    ASSERT_GT(bytes.size(), 16u) << name;
    expect_robust(bytes, name);
    // Cut in half: an error that names the format.
    Bytes half(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2));
    auto img = decode_bytes(half);
    ASSERT_FALSE(img.is_ok()) << name;
    EXPECT_NE(img.status().to_string().find(name.substr(0, 3)), std::string::npos) << img.status().to_string();
  }
  auto unknown = decode_bytes(Bytes{'G', 'I', 'F', '8', '9', 'a', 0, 0});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().to_string().find("not recognized"), std::string::npos);
  EXPECT_FALSE(decode_bytes(Bytes{}).is_ok());
  // A PNG header claiming 60000 x 60000 pixels (its CRC mended): refused
  // under the memory limit before its pixels are allocated.
  Bytes big = png_bytes(rgb, w, h, PNG_FORMAT_RGB);
  const uint8_t dims[8] = {0, 0, 0xea, 0x60, 0, 0, 0xea, 0x60};
  std::memcpy(big.data() + 16, dims, 8);  // IHDR width and height
  uint32_t crc = 0xffffffffu;             // over the chunk type and data, bytes 12 to 28
  for (size_t i = 12; i < 29; ++i) {
    crc ^= big[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  crc ^= 0xffffffffu;
  for (int k = 0; k < 4; ++k) big[29 + k] = static_cast<uint8_t>(crc >> (24 - 8 * k));
  int64_t saved = set_current_memory_limit(int64_t{64} << 20);
  auto refused = decode_bytes(big);
  set_current_memory_limit(saved);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().to_string().find("limit"), std::string::npos) << refused.status().to_string();
}

}  // namespace
}  // namespace kiln::image
