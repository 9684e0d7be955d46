#include "image/decode.h"
#include "support/memory_limit.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>

#include <jpeglib.h>
#include <jerror.h>
#include <openjpeg.h>
#include <png.h>
#include <tiffio.h>
#include <webp/decode.h>

namespace kiln::image {

const char* format_name(Format f) {
  switch (f) {
    case Format::kBmp: return "BMP";
    case Format::kJpeg: return "JPEG";
    case Format::kJpeg2000: return "JPEG 2000";
    case Format::kPng: return "PNG";
    case Format::kPnm: return "PNM";
    case Format::kTiff: return "TIFF";
    case Format::kWebp: return "WebP";
    case Format::kUnknown: break;
  }
  return "unknown";
}

Format sniff(const uint8_t* d, size_t n) {
  auto starts = [&](const char* sig, size_t len, size_t at = 0) { return n >= at + len && std::memcmp(d + at, sig, len) == 0; };
  if (starts("\x89PNG\r\n\x1a\n", 8)) return Format::kPng;
  if (starts("\xff\xd8\xff", 3)) return Format::kJpeg;
  if (starts("\x00\x00\x00\x0cjP  \r\n\x87\n", 12) || starts("\xff\x4f\xff\x51", 4)) return Format::kJpeg2000;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return Format::kWebp;
  if (starts("II*\x00", 4) || starts("MM\x00*", 4)) return Format::kTiff;
  if (starts("BM", 2)) return Format::kBmp;
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && std::isspace(d[2])) return Format::kPnm;
  return Format::kUnknown;
}

namespace {

StatusBuilder bad(Format f) {
  StatusBuilder b(StatusCode::kInvalidArgument);
  b << "malformed " << format_name(f) << " image: ";
  return b;
}

// Checks a decoder's dimensions and allocates the pixels.
Status shape(Image& img, Format f, int64_t h, int64_t w, int64_t c) {
  if (h <= 0 || w <= 0 || h > (int64_t{1} << 31) || w > (int64_t{1} << 31)) return bad(f) << "size " << w << " x " << h;
  KILN_ASSIGN_OR_RETURN(img.pixels, Tensor::allocate(DType::kUInt8, {h, w, c}, std::string("the ") + format_name(f) + " image's pixels"));
  img.height = h;
  img.width = w;
  img.channels = c;
  return Status::ok();
}

uint8_t* pixels(Image& img) { return img.pixels.data_as<uint8_t>(); }

// ---- BMP: uncompressed 1/4/8-bit paletted, 24-bit and 32-bit (BGR(X)), bottom-up or top-down.
Result<Image> decode_bmp(const uint8_t* d, size_t n) {
  const Format f = Format::kBmp;
  auto u16 = [&](size_t at) { return static_cast<uint32_t>(d[at] | d[at + 1] << 8); };
  auto u32 = [&](size_t at) { return static_cast<uint32_t>(d[at] | d[at + 1] << 8 | d[at + 2] << 16) | static_cast<uint32_t>(d[at + 3]) << 24; };
  if (n < 26) return bad(f) << "truncated header (" << n << " bytes)";
  uint32_t data_at = u32(10), dib = u32(14);
  int64_t w, h, bits, compression = 0, palette_at = 14 + dib, palette_entry = 4, colors = 0;
  if (dib == 12) {  // BITMAPCOREHEADER
    w = u16(18);
    h = static_cast<int16_t>(u16(20));
    bits = u16(24);
    palette_entry = 3;
  } else if (dib >= 40 && n >= 54) {
    w = static_cast<int32_t>(u32(18));
    h = static_cast<int32_t>(u32(22));
    bits = u16(28);
    compression = u32(30);
    colors = u32(46);
  } else {
    return bad(f) << "header of " << dib << " bytes";
  }
  if (compression != 0 && !(compression == 3 && bits == 32))
    return unsupported() << "BMP compression " << compression << " (only uncompressed bitmaps are decoded)";
  if (bits != 1 && bits != 4 && bits != 8 && bits != 24 && bits != 32) return unsupported() << "BMP of " << bits << " bits per pixel";
  if (compression == 3) {  // 32 bits with channel masks: only the plain B, G, R, X order
    if (n < 66 || u32(54) != 0x00ff0000u || u32(58) != 0x0000ff00u || u32(62) != 0x000000ffu)
      return unsupported() << "BMP with channel masks other than B, G, R";
  }
  bool top_down = h < 0;
  if (top_down) h = -h;
  if (w <= 0 || h <= 0 || w > (int64_t{1} << 31)) return bad(f) << "size " << w << " x " << h;
  int64_t stride = (w * bits + 31) / 32 * 4;
  if (data_at > n || static_cast<int64_t>(n - data_at) / stride < h) return bad(f) << "truncated pixel data";
  Image img;
  KILN_RETURN_IF_ERROR(shape(img, f, h, w, 3));
  std::vector<uint8_t> palette;
  if (bits <= 8) {
    if (colors == 0 || colors > (int64_t{1} << bits)) colors = int64_t{1} << bits;
    if (palette_at + colors * palette_entry > static_cast<int64_t>(n)) return bad(f) << "truncated palette";
    palette.assign(d + palette_at, d + palette_at + colors * palette_entry);
  }
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* row = d + data_at + (top_down ? y : h - 1 - y) * stride;
    uint8_t* out = pixels(img) + y * w * 3;
    for (int64_t x = 0; x < w; ++x, out += 3) {
      if (bits >= 24) {
        const uint8_t* p = row + x * (bits / 8);
        out[0] = p[2], out[1] = p[1], out[2] = p[0];
        continue;
      }
      int64_t bit = x * bits;
      int64_t index = (row[bit / 8] >> (8 - bits - bit % 8)) & ((1 << bits) - 1);
      if (index >= colors) return bad(f) << "palette index " << index << " of " << colors << " colors";
      const uint8_t* p = palette.data() + index * palette_entry;
      out[0] = p[2], out[1] = p[1], out[2] = p[0];
    }
  }
  return img;
}

// ---- PNM: P1-P6, maxval up to 65535 (scaled to 8 bits).
Result<Image> decode_pnm(const uint8_t* d, size_t n) {
  const Format f = Format::kPnm;
  const int kind = d[1] - '0';
  size_t at = 2;
  auto skip_space = [&] {
    while (at < n) {
      if (d[at] == '#') {
        while (at < n && d[at] != '\n') ++at;
      } else if (std::isspace(d[at])) {
        ++at;
      } else {
        break;
      }
    }
  };
  auto number = [&](int64_t limit) -> Result<int64_t> {
    skip_space();
    if (at >= n || !std::isdigit(d[at])) return bad(f) << "expected a number at byte " << at;
    int64_t v = 0;
    while (at < n && std::isdigit(d[at])) {
      v = v * 10 + (d[at++] - '0');
      if (v > limit) return bad(f) << "number above " << limit << " at byte " << at;
    }
    return v;
  };
  KILN_ASSIGN_OR_RETURN(int64_t w, number(int64_t{1} << 30));
  KILN_ASSIGN_OR_RETURN(int64_t h, number(int64_t{1} << 30));
  int64_t maxval = 1;
  if (kind != 1 && kind != 4) {
    KILN_ASSIGN_OR_RETURN(maxval, number(65535));
    if (maxval == 0) return bad(f) << "maxval 0";
  }
  const bool color = kind == 3 || kind == 6, ascii = kind <= 3;
  if (!ascii) {
    if (at >= n || !std::isspace(d[at])) return bad(f) << "no whitespace after the header";
    ++at;
  }
  // Enough data for the samples the header claims (ASCII: a byte at least
  // each), checked before the pixels are allocated.
  const int64_t channels = color ? 3 : 1;
  const int64_t room = static_cast<int64_t>(n - std::min(at, n));
  const int64_t per_row = kind == 4 ? (w + 7) / 8 : w * channels * (ascii || maxval < 256 ? 1 : 2);
  if (w <= 0 || h <= 0 || room / per_row < h) return bad(f) << "truncated pixel data (" << w << " x " << h << ")";
  Image img;
  KILN_RETURN_IF_ERROR(shape(img, f, h, w, channels));
  uint8_t* px = pixels(img);
  const int64_t samples = h * w * channels;
  auto scale = [&](int64_t v) { return static_cast<uint8_t>(maxval == 255 ? v : (v * 255 + maxval / 2) / maxval); };
  if (kind == 4) {  // packed bits, rows padded to a byte, 1 = black
    int64_t stride = (w + 7) / 8;
    if (static_cast<int64_t>(n - at) / stride < h) return bad(f) << "truncated pixel data";
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        px[y * w + x] = (d[at + y * stride + x / 8] >> (7 - x % 8)) & 1 ? 0 : 255;
    return img;
  }
  for (int64_t i = 0; i < samples; ++i) {
    int64_t v;
    if (kind == 1) {  // one digit per pixel, whitespace optional
      skip_space();
      if (at >= n || (d[at] != '0' && d[at] != '1')) return bad(f) << "expected 0 or 1 at byte " << at;
      px[i] = d[at++] == '1' ? 0 : 255;
      continue;
    }
    if (ascii) {
      KILN_ASSIGN_OR_RETURN(v, number(maxval));
    } else if (maxval < 256) {
      if (at >= n) return bad(f) << "truncated pixel data";
      v = d[at++];
    } else {
      if (at + 1 >= n) return bad(f) << "truncated pixel data";
      v = d[at] << 8 | d[at + 1];
      at += 2;
    }
    if (v > maxval) return bad(f) << "sample " << v << " above maxval " << maxval;
    px[i] = scale(v);
  }
  return img;
}

// ---- JPEG (libjpeg-turbo): errors longjmp back here; nothing is printed.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

Result<Image> decode_jpeg(const uint8_t* d, size_t n) {
  // Everything the error path touches, and every object live across a call
  // that may longjmp, lives on the heap, made before setjmp: no local is
  // written after it and no destructor is skipped.
  auto img = std::make_unique<Image>();
  auto status = std::make_unique<Status>(Status::ok());
  auto err = std::make_unique<JpegError>();
  auto info = std::make_unique<jpeg_decompress_struct>();
  info->err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = [](j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
  };
  err->mgr.output_message = [](j_common_ptr) {};
  // libjpeg pads data that ends early with gray and warns: an error here (as
  // Pillow, the ONNX reference's decoder, reports a truncated file).
  err->mgr.emit_message = [](j_common_ptr c, int level) {
    if (level < 0 && (c->err->msg_code == JWRN_JPEG_EOF || c->err->msg_code == JWRN_HIT_MARKER))
      c->err->error_exit(c);
  };
  err->message[0] = 0;
  if (setjmp(err->jump) != 0) {
    jpeg_destroy_decompress(info.get());
    return bad(Format::kJpeg) << err->message;
  }
  jpeg_create_decompress(info.get());
  // libjpeg's own buffers (a progressive image's coefficients) under the run's limit.
  info->mem->max_memory_to_use = static_cast<long>(std::min<int64_t>(current_memory_limit(), LONG_MAX));
  jpeg_mem_src(info.get(), d, static_cast<unsigned long>(n));
  jpeg_read_header(info.get(), TRUE);
  if (info->jpeg_color_space == JCS_CMYK || info->jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(info.get());
    return unsupported() << "CMYK JPEG image";
  }
  info->out_color_space = info->num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_calc_output_dimensions(info.get());
  *status = shape(*img, Format::kJpeg, info->output_height, info->output_width, info->out_color_components);
  if (!status->is_ok()) {
    jpeg_destroy_decompress(info.get());
    return std::move(*status);
  }
  jpeg_start_decompress(info.get());
  while (info->output_scanline < info->output_height) {
    JSAMPROW row = pixels(*img) + static_cast<size_t>(info->output_scanline) * img->width * img->channels;
    jpeg_read_scanlines(info.get(), &row, 1);
  }
  jpeg_finish_decompress(info.get());
  jpeg_destroy_decompress(info.get());
  return std::move(*img);
}

// ---- PNG (libpng): 8 bits per sample (16 reduced, palettes and low bit
// depths expanded), alpha stripped, no gamma applied.
struct PngReader {
  const uint8_t* data;
  size_t size, at;
  char message[256];
};

Result<Image> decode_png(const uint8_t* d, size_t n) {
  auto img = std::make_unique<Image>();
  auto rd = std::make_unique<PngReader>(PngReader{d, n, 0, {0}});
  png_structp png = png_create_read_struct(
      PNG_LIBPNG_VER_STRING, rd.get(),
      [](png_structp p, png_const_charp msg) {
        auto* r = static_cast<PngReader*>(png_get_error_ptr(p));
        std::snprintf(r->message, sizeof r->message, "%s", msg);
        png_longjmp(p, 1);
      },
      [](png_structp, png_const_charp) {});
  if (!png) return resource_exhausted() << "PNG decoder: out of memory";
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return resource_exhausted() << "PNG decoder: out of memory";
  }
  auto rows = std::make_unique<std::vector<png_bytep>>();
  auto status = std::make_unique<Status>(Status::ok());  // heap, made before setjmp (see decode_jpeg)
  if (setjmp(png_jmpbuf(png)) != 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    return bad(Format::kPng) << rd->message;
  }
  png_set_read_fn(png, rd.get(), [](png_structp p, png_bytep out, size_t len) {
    auto* r = static_cast<PngReader*>(png_get_io_ptr(p));
    if (len > r->size - r->at) png_error(p, "truncated data");
    std::memcpy(out, r->data + r->at, len);
    r->at += len;
  });
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, type = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &type, nullptr, nullptr, nullptr);
  if (depth == 16) png_set_strip_16(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  if (channels != 1 && channels != 3) {
    png_destroy_read_struct(&png, &info, nullptr);
    return unsupported() << "PNG with " << channels << " channels after expansion";
  }
  *status = shape(*img, Format::kPng, h, w, channels);
  if (!status->is_ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return std::move(*status);
  }
  rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y) (*rows)[y] = pixels(*img) + static_cast<size_t>(y) * w * channels;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return std::move(*img);
}

// ---- WebP (libwebp).
Result<Image> decode_webp(const uint8_t* d, size_t n) {
  int w = 0, h = 0;
  if (!WebPGetInfo(d, n, &w, &h)) return bad(Format::kWebp) << "unreadable header";
  Image img;
  KILN_RETURN_IF_ERROR(shape(img, Format::kWebp, h, w, 3));
  if (!WebPDecodeRGBInto(d, n, pixels(img), static_cast<size_t>(img.pixels.numel()), w * 3))
    return bad(Format::kWebp) << "the bitstream does not decode";
  return img;
}

// ---- TIFF (libtiff, through its RGBA interface), read from memory.
struct TiffMemory {
  const uint8_t* data;
  toff_t size, at;
};

Result<Image> decode_tiff(const uint8_t* d, size_t n) {
  TiffMemory mem{d, static_cast<toff_t>(n), 0};
  // Messages go to this handle's handlers (nothing printed, no process-wide state).
  TIFFOpenOptions* opts = TIFFOpenOptionsAlloc();
  if (!opts) return resource_exhausted() << "TIFF decoder: out of memory";
  auto quiet = [](TIFF*, void*, const char*, const char*, va_list) { return 1; };
  TIFFOpenOptionsSetErrorHandlerExtR(opts, quiet, nullptr);
  TIFFOpenOptionsSetWarningHandlerExtR(opts, quiet, nullptr);
  TIFF* tif = TIFFClientOpenExt(
      "memory", "rm", reinterpret_cast<thandle_t>(&mem),
      [](thandle_t h, tdata_t buf, tmsize_t len) -> tmsize_t {
        auto* m = reinterpret_cast<TiffMemory*>(h);
        tmsize_t k = std::min<tmsize_t>(len, static_cast<tmsize_t>(m->size - std::min(m->at, m->size)));
        if (k > 0) std::memcpy(buf, m->data + m->at, static_cast<size_t>(k));
        m->at += static_cast<toff_t>(std::max<tmsize_t>(k, 0));
        return k;
      },
      [](thandle_t, tdata_t, tmsize_t) -> tmsize_t { return -1; },
      [](thandle_t h, toff_t off, int whence) -> toff_t {
        auto* m = reinterpret_cast<TiffMemory*>(h);
        toff_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->at : m->size;
        m->at = base + off;
        return m->at;
      },
      [](thandle_t) { return 0; },
      [](thandle_t h) -> toff_t { return reinterpret_cast<TiffMemory*>(h)->size; },
      [](thandle_t, tdata_t*, toff_t*) { return 0; }, [](thandle_t, tdata_t, toff_t) {}, opts);
  TIFFOpenOptionsFree(opts);
  if (!tif) return bad(Format::kTiff) << "unreadable header";
  uint32_t w = 0, h = 0;
  uint16_t photometric = PHOTOMETRIC_RGB;
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h);
  TIFFGetFieldDefaulted(tif, TIFFTAG_PHOTOMETRIC, &photometric);
  // Gray only for gray photometrics (a palette image has one sample per pixel too).
  const int64_t channels = photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE ? 1 : 3;
  char why[1024] = {0};
  Image img;
  Status status = shape(img, Format::kTiff, h, w, channels);
  // libtiff's RGBA raster: 4 bytes a pixel, under the same limit as the pixels.
  if (status.is_ok())
    status = check_allocation(DType::kUInt32, {img.height, img.width}, current_memory_limit(), "the TIFF image's raster");
  if (status.is_ok() && !TIFFRGBAImageOK(tif, why)) status = unsupported() << "TIFF image: " << why;
  std::vector<uint32_t> raster;
  if (status.is_ok()) {
    raster.resize(static_cast<size_t>(w) * h);
    // stop_on_error = 1: a strip or tile that does not decode fails the image.
    if (!TIFFReadRGBAImageOriented(tif, w, h, raster.data(), ORIENTATION_TOPLEFT, 1))
      status = bad(Format::kTiff) << "the pixel data does not decode";
  }
  TIFFClose(tif);
  KILN_RETURN_IF_ERROR(status);
  uint8_t* px = pixels(img);
  for (size_t i = 0; i < raster.size(); ++i) {
    uint32_t p = raster[i];
    if (img.channels == 1) {
      px[i] = static_cast<uint8_t>(TIFFGetR(p));
    } else {
      px[3 * i] = static_cast<uint8_t>(TIFFGetR(p));
      px[3 * i + 1] = static_cast<uint8_t>(TIFFGetG(p));
      px[3 * i + 2] = static_cast<uint8_t>(TIFFGetB(p));
    }
  }
  return img;
}

// ---- JPEG 2000 (OpenJPEG): JP2 boxes or a raw codestream, from memory.
struct J2kMemory {
  const uint8_t* data;
  OPJ_UINT64 size, at;
  std::string error;
};

Result<Image> decode_jpeg2000(const uint8_t* d, size_t n) {
  const Format f = Format::kJpeg2000;
  J2kMemory mem{d, n, 0, {}};
  opj_stream_t* stream = opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE);
  if (!stream) return resource_exhausted() << "JPEG 2000 decoder: out of memory";
  opj_stream_set_user_data(stream, &mem, nullptr);
  opj_stream_set_user_data_length(stream, n);
  opj_stream_set_read_function(stream, [](void* buf, OPJ_SIZE_T len, void* user) -> OPJ_SIZE_T {
    auto* m = static_cast<J2kMemory*>(user);
    if (m->at >= m->size) return static_cast<OPJ_SIZE_T>(-1);
    OPJ_SIZE_T k = static_cast<OPJ_SIZE_T>(std::min<OPJ_UINT64>(len, m->size - m->at));
    std::memcpy(buf, m->data + m->at, k);
    m->at += k;
    return k;
  });
  opj_stream_set_skip_function(stream, [](OPJ_OFF_T off, void* user) -> OPJ_OFF_T {
    auto* m = static_cast<J2kMemory*>(user);
    OPJ_OFF_T room = off >= 0 ? static_cast<OPJ_OFF_T>(m->size - m->at) : -static_cast<OPJ_OFF_T>(m->at);
    OPJ_OFF_T k = off >= 0 ? std::min(off, room) : std::max(off, room);
    m->at = static_cast<OPJ_UINT64>(static_cast<OPJ_OFF_T>(m->at) + k);
    return k;
  });
  opj_stream_set_seek_function(stream, [](OPJ_OFF_T off, void* user) -> OPJ_BOOL {
    auto* m = static_cast<J2kMemory*>(user);
    if (off < 0 || static_cast<OPJ_UINT64>(off) > m->size) return OPJ_FALSE;
    m->at = static_cast<OPJ_UINT64>(off);
    return OPJ_TRUE;
  });
  const bool jp2 = n >= 4 && d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == 0x0c;
  opj_codec_t* codec = opj_create_decompress(jp2 ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K);
  opj_set_error_handler(codec, [](const char* msg, void* user) {
    auto* m = static_cast<J2kMemory*>(user);
    if (m->error.empty()) m->error = msg;
    while (!m->error.empty() && (m->error.back() == '\n' || m->error.back() == ' ')) m->error.pop_back();
  }, &mem);
  opj_set_warning_handler(codec, [](const char*, void*) {}, nullptr);
  opj_set_info_handler(codec, [](const char*, void*) {}, nullptr);
  opj_dparameters_t params;
  opj_set_default_decoder_parameters(&params);
  opj_image_t* raw = nullptr;
  Status status = Status::ok();
  if (!opj_setup_decoder(codec, &params) || !opj_read_header(stream, codec, &raw) ||
      !opj_decode(codec, stream, raw) || !opj_end_decompress(codec, stream))
    status = bad(f) << (mem.error.empty() ? std::string("the codestream does not decode") : mem.error);
  std::unique_ptr<opj_image_t, void (*)(opj_image_t*)> image(raw, opj_image_destroy);
  opj_destroy_codec(codec);
  opj_stream_destroy(stream);
  KILN_RETURN_IF_ERROR(status);
  if (!image || image->numcomps < 1) return bad(f) << "no components";
  const OPJ_UINT32 comps = image->numcomps >= 3 ? 3 : 1;
  if (image->color_space == OPJ_CLRSPC_SYCC || image->color_space == OPJ_CLRSPC_EYCC ||
      image->color_space == OPJ_CLRSPC_CMYK)
    return unsupported() << "JPEG 2000 image in color space " << static_cast<int>(image->color_space);
  const opj_image_comp_t& c0 = image->comps[0];
  for (OPJ_UINT32 c = 0; c < comps; ++c) {
    const opj_image_comp_t& cc = image->comps[c];
    if (cc.w != c0.w || cc.h != c0.h || cc.dx != 1 || cc.dy != 1 || !cc.data)
      return unsupported() << "JPEG 2000 image with subsampled components";
    if (cc.prec < 1 || cc.prec > 16) return bad(f) << "component precision " << cc.prec;
  }
  Image img;
  KILN_RETURN_IF_ERROR(shape(img, f, c0.h, c0.w, comps));
  const size_t count = static_cast<size_t>(c0.w) * c0.h;
  for (OPJ_UINT32 c = 0; c < comps; ++c) {
    const opj_image_comp_t& cc = image->comps[c];
    const int64_t offset = cc.sgnd ? int64_t{1} << (cc.prec - 1) : 0, top = (int64_t{1} << cc.prec) - 1;
    for (size_t i = 0; i < count; ++i) {
      int64_t v = std::clamp<int64_t>(int64_t{cc.data[i]} + offset, 0, top);
      if (cc.prec > 8) v >>= cc.prec - 8;
      else if (cc.prec < 8) v = (v * 255 + top / 2) / top;
      pixels(img)[i * comps + c] = static_cast<uint8_t>(v);
    }
  }
  return img;
}

}  // namespace

Result<Image> decode(const uint8_t* data, size_t size) {
  switch (sniff(data, size)) {
    case Format::kBmp: return decode_bmp(data, size);
    case Format::kPnm: return decode_pnm(data, size);
    case Format::kJpeg: return decode_jpeg(data, size);
    case Format::kPng: return decode_png(data, size);
    case Format::kWebp: return decode_webp(data, size);
    case Format::kTiff: return decode_tiff(data, size);
    case Format::kJpeg2000: return decode_jpeg2000(data, size);
    case Format::kUnknown: break;
  }
  return unsupported() << "image format not recognized from its first bytes (BMP, JPEG, JPEG 2000, PNG, PNM, TIFF "
                          "and WebP are decoded)";
}

}  // namespace kiln::image
