// ImageDecoder (opset 20): the bytes of an encoded image (u8, 1-D) decoded
// into u8 pixels [H, W, 3] (pixel_format RGB, the default, or BGR) or
// [H, W, 1] (Grayscale); H and W are known only once the data is read (fresh
// symbols). The formats and their codecs are image/decode.h's. An image
// stored in gray becomes RGB by repeating its channel; a color image becomes
// gray by the ITU-R 601-2 luma weights in the fixed point Pillow uses (the
// ONNX reference decodes with Pillow): (19595 R + 38470 G + 7471 B + 2^15) >> 16.
// Undecodable data is an error naming the node and the format.

#include "image/decode.h"
#include "ops/common.h"

namespace kiln::ops {
namespace {

Result<int64_t> decoded_channels(const Node& n) {
  std::string fmt = n.attr_string("pixel_format", "RGB");
  if (fmt == "RGB" || fmt == "BGR") return 3;
  if (fmt == "Grayscale") return 1;
  return node_invalid(n) << "pixel_format '" << fmt << "' (RGB, BGR or Grayscale)";
}

Status infer_image_decoder(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t c, decoded_channels(n));
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.dtype != DType::kUInt8) return node_invalid(n) << "encoded_stream must be uint8, got " << t.to_string();
  if (t.shape && t.shape->size() != 1) return node_invalid(n) << "encoded_stream must be 1-D, got " << t.to_string();
  set_output(n, 0, DType::kUInt8, {ctx.fresh_symbol(), ctx.fresh_symbol(), Expr(c)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> image_decoder_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(int64_t c, decoded_channels(n));
  const bool bgr = n.attr_string("pixel_format", "RGB") == "BGR";
  return RuntimeKernel([c, bgr](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.dtype() != DType::kUInt8 || x.shape().size() != 1)
      return invalid_argument() << "encoded_stream " << x.describe() << " is not a 1-D uint8 tensor";
    KILN_ASSIGN_OR_RETURN(image::Image img,
                          image::decode(x.data_as<uint8_t>(), static_cast<size_t>(x.numel())));
    out.resize(1);
    if (img.channels == c && !bgr) {
      out[0] = std::move(img.pixels);
      return Status::ok();
    }
    const int64_t pixels = img.height * img.width;
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kUInt8, {img.height, img.width, c}, "the decoded image"));
    const uint8_t* src = img.pixels.data_as<uint8_t>();
    uint8_t* dst = out[0].data_as<uint8_t>();
    for (int64_t i = 0; i < pixels; ++i) {
      if (img.channels == 1) {  // gray -> RGB / BGR
        dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[i];
      } else if (c == 1) {  // RGB -> gray
        const uint8_t* p = src + 3 * i;
        dst[i] = static_cast<uint8_t>((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 0x8000u) >> 16);
      } else {  // RGB -> BGR
        dst[3 * i] = src[3 * i + 2];
        dst[3 * i + 1] = src[3 * i + 1];
        dst[3 * i + 2] = src[3 * i];
      }
    }
    return Status::ok();
  });
}

}  // namespace

void register_image_ops() { register_op(kernel_op("ImageDecoder", infer_image_decoder, image_decoder_kernel)); }

}  // namespace kiln::ops
