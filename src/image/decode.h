// Decoding of encoded images (the bytes of a file) into 8-bit pixels, for the
// ImageDecoder op (ops/image_decoder.cc). The format is recognized from the
// data's first bytes: BMP and PNM (parsed here), JPEG (libjpeg-turbo), PNG
// (libpng), TIFF (libtiff), WebP (libwebp), JPEG 2000 (OpenJPEG). Pixels come
// out row-major, height x width x channels, as 3 channels (RGB) or 1 (gray)
// as the image stores them; alpha is dropped. Malformed or truncated data,
// and features a decoder here does not handle (CMYK JPEG, RLE bitmaps,
// subsampled JPEG 2000 components) are errors naming the format, never a
// crash; nothing is printed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "support/status.h"
#include "support/tensor.h"

namespace kiln::image {

enum class Format { kUnknown, kBmp, kJpeg, kJpeg2000, kPng, kPnm, kTiff, kWebp };

const char* format_name(Format f);

// The format announced by the data's signature; kUnknown if none matches.
Format sniff(const uint8_t* data, size_t size);

struct Image {
  int64_t height = 0, width = 0, channels = 0;  // channels: 3 (R, G, B) or 1 (gray)
  Tensor pixels;                                // u8 [height, width, channels]
};

// Decodes `size` bytes. The pixels are allocated under the thread's memory
// limit (support/memory_limit.h): an image whose header claims more is an
// error; bitmaps and PNM are checked for enough data before allocating.
Result<Image> decode(const uint8_t* data, size_t size);

}  // namespace kiln::image
