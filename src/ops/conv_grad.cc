// Kiln-internal ops (domain "kiln") that convolution and pooling gradients
// and computed weights lower to. All but the last are compiled:
//
//   kiln:PackPanels(w) attr nr: [O, R...] -> [ceil(O / nr), R..., nr], zero
//       past O. The layout "P<nr>" conv.panels and conv.wvec read
//       (strategy/conv.cc), made each run for a weight that is not a
//       constant (a training step's parameters). With attr transpose = 1, a
//       2-D [K, N] -> [ceil(N / nr), K, nr], zero past N: a computed B's
//       panels of columns (strategy/gemm.cc, matmul.dynamic).
//   kiln:Im2Col(x) attrs kernel_shape, strides, pads, dilations:
//       [N, C, S...] -> [C, K..., N, O...]: every tap's input at every output
//       position, zero in the padding (rows: the taps of a channel; columns:
//       the output positions of every image). A weight's gradient is then one
//       product of its rows with the output gradient.
//   kiln:Col2Im(col) attrs image_shape, kernel_shape, strides, pads,
//       dilations: [C, K..., N, O...] -> [N, C, S...], each input position
//       the sum of the columns whose tap read it (the adjoint of Im2Col): an
//       input gradient from the product of the transposed weight with the
//       output gradient.
//   kiln:ConvWeightGrad(a, b) attrs kernel_shape, strides, pads, dilations,
//       window: a Conv's weight gradient (one group) as a product summed over
//       the images and output positions, taps outermost, each operand read
//       along its contiguous dim (no columns materialized):
//         window 0: a = dY [N, M, O...], b = x channels-last [N, S..., C]
//           -> [K..., M, C]: y[k, m, c] = sum over n, o of
//              a[n, m, o] b[n, o*stride + k*dilation - pad, c];
//         window 1: a = x [N, C, S...], b = dY channels-last [N, O..., M]
//           -> [K..., C, M]: y[k, c, m] = sum over n, o of
//              a[n, c, o*stride + k*dilation - pad] b[n, o, m];
//         depthwise 1 (window 0): a = dY channels-last [N, O..., C], b = x
//           channels-last [N, S..., C] -> [K..., C]: y[k, c] = sum over n, o
//           of a[n, o, c] b[n, o*stride + k*dilation - pad, c] (a depthwise
//           Conv's, one input and one output channel per group);
//       x is 0 in the padding. The last output dim is the one a schedule
//       vectorizes; the reduction runs over every image's output rows as one
//       axis, then the other output dims, so that it can be blocked by rows
//       across images (strategy/conv_grad.cc).
//   kiln:WinogradWeights(wp, G) attr m: conv.winograd's transformed weight
//       U = G w GT from the packed panels, made each run for a weight that is
//       not a constant.
//   kiln:MaxPoolGrad(dy, indices): a MaxPool's input gradient (below; a
//       host kernel).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {

constexpr int64_t kMaxPanel = 256;

Result<int64_t> panel_width(const Node& n) {
  int64_t nr = n.attr_int("nr", 0);
  if (nr < 1 || nr > kMaxPanel) return node_invalid(n) << "attribute 'nr' must be in [1, " << kMaxPanel << "], got " << nr;
  return nr;
}

Result<bool> pack_transposed(const Node& n, size_t rank) {
  int64_t t = n.attr_int("transpose", 0);
  if (t != 0 && t != 1) return node_invalid(n) << "attribute 'transpose' must be 0 or 1, got " << t;
  if (t == 1 && rank != 2) return node_invalid(n) << "transpose = 1 packs a 2-D input, got rank " << rank;
  return t == 1;
}

Status infer_pack_panels(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType wt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t nr, panel_width(n));
  if (w.empty()) return node_invalid(n) << "weight must have rank >= 1";
  KILN_ASSIGN_OR_RETURN(bool transposed, pack_transposed(n, w.size()));
  if (transposed) std::swap(w[0], w[1]);
  Shape out = {simplify(floordiv(w[0] + (nr - 1), Expr(nr)), ctx.bounds)};
  out.insert(out.end(), w.begin() + 1, w.end());
  out.push_back(Expr(nr));
  set_output(n, 0, wt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_pack_panels(const Node& n, LowerContext& ctx) {
  const tir::Buffer& w = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(int64_t nr, panel_width(n));
  KILN_ASSIGN_OR_RETURN(bool transposed, pack_transposed(n, w.shape.size()));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> v = axis_vars(axes);
  Expr o = v[0] * Expr(nr) + v.back();
  const Expr& extent = transposed ? w.shape[1] : w.shape[0];
  std::vector<Expr> src = {clamp_index(o, extent)};
  src.insert(src.end(), v.begin() + 1, v.end() - 1);
  if (transposed) std::swap(src[0], src[1]);
  Expr body = select(lt(o, extent), ctx.load_input(0, src), const_of(y.dtype, 0));
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, body)};
}

// kiln:WinogradWeights(wp, g) attr m: a 3x3 weight packed in panels of mr
// output channels [P, I, 3, 3, mr] (kiln:PackPanels: zero past O, the lanes
// contiguous) and F(m x m, 3 x 3)'s kernel transform G [m + 2, 3]
// (tir/winograd.h) -> U = G w GT per channel pair in conv.winograd's layout
// [m + 2, m + 2, P, I, mr]: the transform of a weight that is not a
// constant, each run.
Result<int64_t> winograd_attr(const Node& n, const char* name, int64_t lo, int64_t hi) {
  int64_t v = n.attr_int(name, 0);
  if (v < lo || v > hi) return node_invalid(n) << "attribute '" << name << "' must be in [" << lo << ", " << hi << "], got " << v;
  return v;
}

Status infer_winograd_weights(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType wt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape gs, input_shape(n, 1));
  KILN_ASSIGN_OR_RETURN(int64_t m, winograd_attr(n, "m", 2, 4));
  if (wt.dtype != DType::kFloat32) return node_invalid(n) << "weight must be f32";
  if (w.size() != 5 || !prove_equal(w[2], Expr(3), ctx.bounds) || !prove_equal(w[3], Expr(3), ctx.bounds))
    return node_invalid(n) << "weight must be packed panels [P, I, 3, 3, mr], got " << shape_to_string(w);
  if (gs.size() != 2 || !prove_equal(gs[0], Expr(m + 2), ctx.bounds) || !prove_equal(gs[1], Expr(3), ctx.bounds))
    return node_invalid(n) << "G must be [" << m + 2 << ", 3], got " << shape_to_string(gs);
  set_output(n, 0, wt.dtype, {Expr(m + 2), Expr(m + 2), w[0], w[1], w[4]}, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_winograd_weights(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, 5);
  std::vector<Expr> v = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, 2, "k");
  std::vector<Expr> r = axis_vars(raxes);
  Expr gg = ctx.load_input(1, {v[0], r[0]}) * ctx.load_input(1, {v[1], r[1]});
  Expr body = gg * ctx.load_input(0, {v[2], v[3], r[0], r[1], v[4]});
  return std::vector<tir::ComputeDef>{make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, {Expr(3), Expr(3)},
                                                        tir::Combiner::kSum, const_of(y.dtype, 0), body)};
}

// The window of an Im2Col or Col2Im: kernel_shape (required), strides, pads,
// dilations over `rank` spatial dims, through conv_geometry.
Result<ConvGeometry> window(const Node& n, const Shape& image, size_t rank, const SymbolBounds& bounds) {
  std::vector<int64_t> k = n.attr_ints("kernel_shape", {});
  if (k.size() != rank) return node_invalid(n) << "kernel_shape must have " << rank << " values, got " << k.size();
  std::vector<Expr> kernel;
  for (int64_t v : k) {
    if (v < 1) return node_invalid(n) << "kernel_shape values must be positive";
    kernel.push_back(Expr(v));
  }
  return conv_geometry(n, image, kernel, bounds);
}

Status infer_im2col(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  const size_t rank = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, window(n, x, rank, ctx.bounds));
  Shape out = {x[1]};
  out.insert(out.end(), g.kernel.begin(), g.kernel.end());
  out.push_back(x[0]);
  out.insert(out.end(), g.out.begin(), g.out.end());
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

// y[c, k..., n, o...] = x[n, c, o*stride + k*dilation - pad] (0 outside x).
Result<std::vector<tir::ComputeDef>> lower_im2col(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  const size_t rank = x.shape.size() - 2;
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, window(n, Shape(x.shape.begin(), x.shape.end()), rank, {}));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> v = axis_vars(axes);
  std::vector<Expr> idx = {v[rank + 1], v[0]};
  Expr valid;
  for (size_t d = 0; d < rank; ++d) {
    Expr pos = v[rank + 2 + d] * Expr(g.stride[d]) + v[1 + d] * Expr(g.dilation[d]) - g.pad_begin[d];
    Expr ok = logical_and(le(Expr(0), pos), lt(pos, g.in[d]));
    valid = valid.defined() ? logical_and(valid, ok) : ok;
    idx.push_back(clamp_index(pos, g.in[d]));
  }
  Expr body = select(valid, ctx.load_input(0, idx), const_of(y.dtype, 0));
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, body)};
}

// The window of a kiln:ConvWeightGrad over its inputs: the image [N, C, S...]
// (x's shape, channels first) and dY's [N, M, O...], checked to match.
struct WeightGradShapes {
  bool window_on_a = false;  // window 1: a is x, read through the window
  bool depthwise = false;    // both channels-last, one channel per group
  Shape image, dy;           // channels first
  ConvGeometry g;
};

Result<WeightGradShapes> weight_grad_shapes(const Node& n, const Shape& a, const Shape& b, const SymbolBounds& bounds) {
  const int64_t w = n.attr_int("window", 0), dw = n.attr_int("depthwise", 0);
  if (w != 0 && w != 1) return node_invalid(n) << "attribute 'window' must be 0 or 1, got " << w;
  if (dw != 0 && dw != 1) return node_invalid(n) << "attribute 'depthwise' must be 0 or 1, got " << dw;
  if (dw == 1 && w != 0) return node_invalid(n) << "a depthwise weight gradient has its window on b (window 0)";
  if (a.size() < 3 || b.size() != a.size())
    return node_invalid(n) << "inputs must have one rank of at least 3, got " << shape_to_string(a) << " and "
                           << shape_to_string(b);
  WeightGradShapes s;
  s.window_on_a = w == 1;
  s.depthwise = dw == 1;
  const size_t rank = a.size() - 2;
  // Channels-last [N, P..., V] as channels-first [N, V, P...].
  auto channels_first = [](const Shape& t) {
    Shape cf = {t[0], t.back()};
    cf.insert(cf.end(), t.begin() + 1, t.end() - 1);
    return cf;
  };
  const Shape b_cf = channels_first(b);
  s.image = s.window_on_a ? a : b_cf;
  s.dy = s.window_on_a ? b_cf : s.depthwise ? channels_first(a) : a;
  KILN_ASSIGN_OR_RETURN(s.g, window(n, s.image, rank, bounds));
  if (!prove_equal(s.image[0], s.dy[0], bounds))
    return node_invalid(n) << "x and dY have different batches: " << shape_to_string(a) << " and " << shape_to_string(b);
  if (s.depthwise && !prove_equal(s.image[1], s.dy[1], bounds))
    return node_invalid(n) << "a depthwise weight gradient's x and dY have different channels: " << shape_to_string(a)
                           << " and " << shape_to_string(b);
  for (size_t d = 0; d < rank; ++d) {
    if (auto o = s.g.out[d].as_const(); o && *o < 1)
      return node_invalid(n) << "the window leaves no output positions over x " << shape_to_string(s.image);
    if (!prove_equal(s.dy[d + 2], s.g.out[d], bounds))
      return node_invalid(n) << "dY " << shape_to_string(s.dy) << " does not match the window over x "
                             << shape_to_string(s.image);
  }
  return s;
}

Status infer_conv_weight_grad(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType at, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType bt, input_type(n, 1));
  KILN_ASSIGN_OR_RETURN(Shape a, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape b, input_shape(n, 1));
  if (at.dtype != bt.dtype || (at.dtype != DType::kFloat32 && at.dtype != DType::kFloat64))
    return node_invalid(n) << "inputs must be both f32 or both f64, got " << dtype_name(at.dtype) << " and "
                           << dtype_name(bt.dtype);
  KILN_ASSIGN_OR_RETURN(WeightGradShapes s, weight_grad_shapes(n, a, b, ctx.bounds));
  Shape out = s.g.kernel;
  if (!s.depthwise) out.push_back(a[1]);
  out.push_back(b.back());
  set_output(n, 0, at.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_conv_weight_grad(const Node& n, LowerContext& ctx) {
  const tir::Buffer& a = ctx.inputs[0];
  const tir::Buffer& b = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(WeightGradShapes s, weight_grad_shapes(n, Shape(a.shape.begin(), a.shape.end()),
                                                               Shape(b.shape.begin(), b.shape.end()), {}));
  const size_t rank = a.shape.size() - 2;
  std::vector<std::string> axes = fresh_axes(ctx, rank + (s.depthwise ? 1 : 2));
  std::vector<Expr> v = axis_vars(axes);  // k..., row (not depthwise), vector
  // Reduce axes: the output rows of every image as one axis (image n, row
  // o1 = r0 / O1, r0 % O1), then the other output dims: a schedule can block
  // the reduction by rows across images.
  std::vector<std::string> raxes = fresh_axes(ctx, rank, "r");
  std::vector<Expr> r = axis_vars(raxes);
  const Expr& rows_per_image = s.g.out[0];
  std::vector<Expr> out_pos = {mod(r[0], rows_per_image)};
  out_pos.insert(out_pos.end(), r.begin() + 1, r.end());
  const Expr image = floordiv(r[0], rows_per_image);
  Expr valid;
  std::vector<Expr> image_idx;
  for (size_t d = 0; d < rank; ++d) {
    Expr pos = out_pos[d] * Expr(s.g.stride[d]) + v[d] * Expr(s.g.dilation[d]) - s.g.pad_begin[d];
    if (s.g.may_pad) {
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, s.g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      pos = clamp_index(pos, s.g.in[d]);
    }
    image_idx.push_back(pos);
  }
  const Expr& lane = v.back();
  // a: [N, rows, P...] read at (n, row, p), or depthwise [N, P..., lanes] at
  // (n, p, lane); b: [N, P..., lanes] at (n, p, lane).
  std::vector<Expr> a_idx = {image}, b_idx = {image};
  if (!s.depthwise) a_idx.push_back(v[rank]);
  const std::vector<Expr>& a_pos = s.window_on_a ? image_idx : out_pos;
  const std::vector<Expr>& b_pos = s.window_on_a ? out_pos : image_idx;
  a_idx.insert(a_idx.end(), a_pos.begin(), a_pos.end());
  if (s.depthwise) a_idx.push_back(lane);
  b_idx.insert(b_idx.end(), b_pos.begin(), b_pos.end());
  b_idx.push_back(lane);
  Expr x_load = s.window_on_a ? ctx.load_input(0, a_idx) : ctx.load_input(1, b_idx);
  Expr dy_load = s.window_on_a ? ctx.load_input(1, b_idx) : ctx.load_input(0, a_idx);
  if (valid.defined()) x_load = select(valid, x_load, const_of(y.dtype, 0));
  Expr body = s.window_on_a ? x_load * dy_load : dy_load * x_load;
  std::vector<Expr> rext = {simplify(s.image[0] * rows_per_image, {})};
  rext.insert(rext.end(), s.g.out.begin() + 1, s.g.out.end());
  return std::vector<tir::ComputeDef>{make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, rext,
                                                        tir::Combiner::kSum, const_of(y.dtype, 0), body)};
}

struct Col2ImShapes {
  size_t rank = 0;
  Shape image;  // [N, C, S...]
  ConvGeometry g;
};

Result<Col2ImShapes> col2im_shapes(const Node& n, const Shape& col, const SymbolBounds& bounds) {
  std::vector<int64_t> image = n.attr_ints("image_shape", {});
  if (image.empty() || col.size() != 2 * image.size() + 2)
    return node_invalid(n) << "image_shape must have one value per spatial dim of the columns [C, K..., N, O...]";
  Col2ImShapes s;
  s.rank = image.size();
  s.image = {col[s.rank + 1], col[0]};
  for (int64_t d : image) {
    if (d < 1) return node_invalid(n) << "image_shape values must be positive";
    s.image.push_back(Expr(d));
  }
  KILN_ASSIGN_OR_RETURN(s.g, window(n, s.image, s.rank, bounds));
  for (size_t d = 0; d < s.rank; ++d) {
    if (!prove_equal(col[1 + d], s.g.kernel[d], bounds) || !prove_equal(col[s.rank + 2 + d], s.g.out[d], bounds))
      return node_invalid(n) << "columns " << shape_to_string(col) << " do not match the window over image_shape";
  }
  return s;
}

Status infer_col2im(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType ct, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape col, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Col2ImShapes s, col2im_shapes(n, col, ctx.bounds));
  set_output(n, 0, ct.dtype, s.image, ctx);
  return Status::ok();
}

// The window positions that reach input position `at` (one per spatial dim)
// through taps `taps`: (at + pad - tap * dilation) / stride where that is
// exact and inside the outputs. `valid` says so; `pos` are clamped indices.
struct TapSources {
  Expr valid;
  std::vector<Expr> pos;
};

TapSources tap_sources(const ConvGeometry& g, const std::vector<Expr>& at, const std::vector<Expr>& taps) {
  TapSources t;
  for (size_t d = 0; d < at.size(); ++d) {
    Expr num = at[d] + g.pad_begin[d] - taps[d] * Expr(g.dilation[d]);
    Expr pos = g.stride[d] == 1 ? num : floordiv(num, Expr(g.stride[d]));
    Expr ok = logical_and(le(Expr(0), num), lt(pos, g.out[d]));
    if (g.stride[d] != 1) ok = logical_and(ok, eq(mod(num, Expr(g.stride[d])), Expr(0)));
    t.valid = t.valid.defined() ? logical_and(t.valid, ok) : ok;
    t.pos.push_back(clamp_index(pos, g.out[d]));
  }
  return t;
}

// y[n, c, h...] = sum over taps k of col[c, k, n, (h + pad - k*dilation) / stride]
// where that division is exact and lands inside the output positions.
Result<std::vector<tir::ComputeDef>> lower_col2im(const Node& n, LowerContext& ctx) {
  const tir::Buffer& col = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(Col2ImShapes s, col2im_shapes(n, Shape(col.shape.begin(), col.shape.end()), {}));
  const size_t rank = s.rank;
  std::vector<std::string> axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> v = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank, "k");
  std::vector<Expr> r = axis_vars(raxes);
  std::vector<Expr> idx = {v[1]};
  idx.insert(idx.end(), r.begin(), r.end());
  idx.push_back(v[0]);
  TapSources t = tap_sources(s.g, std::vector<Expr>(v.begin() + 2, v.end()), r);
  idx.insert(idx.end(), t.pos.begin(), t.pos.end());
  Expr body = select(t.valid, ctx.load_input(0, idx), const_of(y.dtype, 0));
  return std::vector<tir::ComputeDef>{make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, s.g.kernel,
                                                        tir::Combiner::kSum, const_of(y.dtype, 0), body)};
}

// kiln:MaxPoolGrad(dy, indices) attrs image_shape, kernel_shape, strides,
// pads, dilations: dy and a MaxPool's Indices [N, C, O...] (flat row-major
// over the whole input) -> [N, C, S...], each input position the sum of dy
// over the windows whose maximum it was: the taps that reach it, as Col2Im.
Result<Col2ImShapes> max_pool_grad_shapes(const Node& n, const Shape& dy, const Shape& idx, const SymbolBounds& bounds) {
  std::vector<int64_t> image = n.attr_ints("image_shape", {});
  if (image.empty() || dy.size() != image.size() + 2 || idx.size() != dy.size())
    return node_invalid(n) << "dy and indices must be [N, C, O...] with one O per image_shape value";
  Col2ImShapes s;
  s.rank = image.size();
  s.image = {dy[0], dy[1]};
  for (int64_t d : image) {
    if (d < 1) return node_invalid(n) << "image_shape values must be positive";
    s.image.push_back(Expr(d));
  }
  KILN_ASSIGN_OR_RETURN(s.g, window(n, s.image, s.rank, bounds));
  for (size_t d = 0; d < dy.size(); ++d) {
    const Expr& want = d < 2 ? s.image[d] : s.g.out[d - 2];
    if (!prove_equal(dy[d], want, bounds) || !prove_equal(idx[d], want, bounds))
      return node_invalid(n) << "dy " << shape_to_string(dy) << " and indices " << shape_to_string(idx)
                             << " do not match the window over image_shape";
  }
  return s;
}

Status infer_max_pool_grad(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType dt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape dy, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType it, input_type(n, 1));
  KILN_ASSIGN_OR_RETURN(Shape idx, input_shape(n, 1));
  if (it.dtype != DType::kInt64) return node_invalid(n) << "indices must be i64, not " << dtype_name(it.dtype);
  KILN_ASSIGN_OR_RETURN(Col2ImShapes s, max_pool_grad_shapes(n, dy, idx, ctx.bounds));
  set_output(n, 0, dt.dtype, s.image, ctx);
  return Status::ok();
}

// Scatter form, one pass over dy: y[indices[e]] += dy[e], e in order (so
// every run sums in the same order). A host kernel: the gather form, a
// reduction per input position over every tap that might reach it, tested
// each tap's index against the position (9 taps for each of 4 times as many
// positions on a 3x3 stride-2 pool).
template <typename T>
Status scatter_add(const Tensor& dy, const Tensor& idx, Tensor& y, const std::string& node) {
  T* out = y.data_as<T>();
  std::fill(out, out + y.numel(), T(0));
  const T* g = dy.data_as<T>();
  const int64_t* at = idx.data_as<int64_t>();
  const int64_t n = y.numel();
  for (int64_t e = 0; e < dy.numel(); ++e) {
    if (at[e] < 0 || at[e] >= n)
      return invalid_argument() << "kiln:MaxPoolGrad '" << node << "': index " << at[e] << " outside the input's " << n
                                << " elements";
    out[at[e]] += g[e];
  }
  return Status::ok();
}

Result<RuntimeKernel> max_pool_grad_kernel(const Node& n) {
  const std::string name = n.name();
  const std::vector<int64_t> image = n.attr_ints("image_shape", {});
  return RuntimeKernel([name, image](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    std::vector<int64_t> shape = {in[0].shape()[0], in[0].shape()[1]};
    shape.insert(shape.end(), image.begin(), image.end());
    if (!out[0].defined() || out[0].shape() != shape) {
      KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(in[0].dtype(), shape, "kiln:MaxPoolGrad '" + name + "'"));
    }
    Tensor& y = out[0];
    if (in[0].dtype() == DType::kFloat32) return scatter_add<float>(in[0], in[1], y, name);
    if (in[0].dtype() == DType::kFloat64) return scatter_add<double>(in[0], in[1], y, name);
    return unsupported() << "kiln:MaxPoolGrad '" << name << "': dtype " << dtype_name(in[0].dtype())
                         << " (f32 or f64)";
  });
}

}  // namespace

void register_conv_grad_ops() {
  OpDef pack = make_def("PackPanels", infer_pack_panels, lower_pack_panels);
  OpDef im2col = make_def("Im2Col", infer_im2col, lower_im2col);
  OpDef col2im = make_def("Col2Im", infer_col2im, lower_col2im);
  OpDef winograd = make_def("WinogradWeights", infer_winograd_weights, lower_winograd_weights);
  OpDef weight_grad = make_def("ConvWeightGrad", infer_conv_weight_grad, lower_conv_weight_grad);
  OpDef max_pool_grad = kernel_op("MaxPoolGrad", infer_max_pool_grad, max_pool_grad_kernel);
  max_pool_grad.kernel_fills_outputs = true;
  for (OpDef* def : {&pack, &im2col, &col2im, &winograd, &weight_grad, &max_pool_grad}) {
    def->domain = "kiln";
    register_op(std::move(*def));
  }
}

}  // namespace kiln::ops
