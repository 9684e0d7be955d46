// Blocked-channel activations (domain "kiln"): a 4-D activation [N, C, H, W]
// stored as [N, ceil(C / b), H, W, b] ("NCHW<b>c"): channel c at block c / b,
// lane c % b, so b consecutive channels of one position are one vector. The
// pass `block-layout` (passes/block_layout.cc) makes convolution chains use it,
// with the conversions below only at the chains' edges.
//
// The channels past C of the last block hold values no reader uses (a
// convolution writes zeros there; an elementwise op on the chain may change
// them but keeps them finite): the blocked convolution's weights for them are
// zero, and FromBlocked drops them.
//
//   kiln:ToBlocked(x)   attr block      [N, C, H, W] -> [N, ceil(C/b), H, W, b], zeros past C
//   kiln:FromBlocked(x) attr block, channels   [N, Cb, H, W, b] -> [N, channels, H, W]
//   Both with channels_last = 1: the NCHW side is [N, H, W, C] instead
//   (convnext's Transposes to and from channels-last around LayerNorm and its
//   MLP become these: one contiguous copy of b channels per position).
//   kiln:ConvBlocked(x, w[, bias]) attrs block, channels (output channels O),
//       in_blocked (0/1), strides, pads, dilations, auto_pad, group (1 or, with
//       in_blocked, depthwise: C = O): the ONNX Conv with weights laid out
//         group 1, in_blocked 1: [ceil(O/b), ceil(C/b), KH, KW, b (input lane), b (output lane)]
//         group 1, in_blocked 0: [ceil(O/b), C, KH, KW, b]   (x read as NCHW)
//         depthwise:             [ceil(C/b), KH, KW, b]
//       zero past O and C; bias [ceil(O/b), b]. Output [N, ceil(O/b), OH, OW, b].
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {

Result<int64_t> block_of(const Node& n) {
  int64_t b = n.attr_int("block", 0);
  if (b < 1 || b > 64) return node_invalid(n) << "attribute 'block' must be in [1, 64], got " << b;
  return b;
}

Expr ceil_blocks(const Expr& c, int64_t b) { return floordiv(c + (b - 1), Expr(b)); }

Result<bool> channels_last_of(const Node& n) {
  int64_t cl = n.attr_int("channels_last", 0);
  if (cl != 0 && cl != 1) return node_invalid(n) << "attribute 'channels_last' must be 0 or 1, got " << cl;
  return cl == 1;
}

Status infer_to_blocked(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t b, block_of(n));
  KILN_ASSIGN_OR_RETURN(bool cl, channels_last_of(n));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  Shape out = {x[0], ceil_blocks(cl ? x.back() : x[1], b)};
  out.insert(out.end(), x.begin() + (cl ? 1 : 2), cl ? x.end() - 1 : x.end());
  out.push_back(Expr(b));
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_to_blocked(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(int64_t b, block_of(n));
  KILN_ASSIGN_OR_RETURN(bool cl, channels_last_of(n));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> v = axis_vars(axes);
  Expr c = v[1] * b + v.back();
  const Expr& channels = cl ? x.shape.back() : x.shape[1];
  std::vector<Expr> src = {v[0]};
  if (!cl) src.push_back(min(c, channels - 1));
  src.insert(src.end(), v.begin() + 2, v.end() - 1);
  if (cl) src.push_back(min(c, channels - 1));
  Expr body = select(lt(c, channels), ctx.load_input(0, src), const_of(y.dtype, 0));
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, body)};
}

Status infer_from_blocked(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t b, block_of(n));
  KILN_ASSIGN_OR_RETURN(bool cl, channels_last_of(n));
  int64_t c = n.attr_int("channels", 0);
  if (c > (int64_t{1} << 40)) return node_invalid(n) << "channels " << c << " out of range";
  if (x.size() < 4) return node_invalid(n) << "input rank " << x.size() << " < 4";
  if (x.back().as_const() != b) return node_invalid(n) << "input's last dim is not the block " << b;
  // The blocks must be known: the kernel reads block c / b of every channel c.
  auto blocks = simplify(x[1], ctx.bounds).as_const();
  if (!blocks) return node_invalid(n) << "the input's number of blocks " << print_expr(x[1]) << " is not a constant";
  if (c < 1 || c > *blocks * b || c <= (*blocks - 1) * b)
    return node_invalid(n) << "channels " << c << " do not fit the input's " << *blocks << " blocks of " << b;
  Shape out = {x[0]};
  if (!cl) out.push_back(Expr(c));
  out.insert(out.end(), x.begin() + 2, x.end() - 1);
  if (cl) out.push_back(Expr(c));
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_from_blocked(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(int64_t b, block_of(n));
  KILN_ASSIGN_OR_RETURN(bool cl, channels_last_of(n));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> v = axis_vars(axes);
  const Expr& c = cl ? v.back() : v[1];
  std::vector<Expr> src = {v[0], floordiv(c, Expr(b))};
  src.insert(src.end(), v.begin() + (cl ? 1 : 2), cl ? v.end() - 1 : v.end());
  src.push_back(mod(c, Expr(b)));
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, src))};
}

// ---- ConvBlocked ---------------------------------------------------------------------------

struct BlockedConv {
  int64_t block = 0, channels = 0, in_channels = 0;
  bool in_blocked = false, depthwise = false;
  std::vector<Expr> kernel;  // KH, KW
  Shape x_nchw;              // the input as [N, C, H, W] (C padded to blocks when blocked)
};

Result<BlockedConv> blocked_conv(const Node& n, const Shape& x, const Shape& w, const SymbolBounds& bounds) {
  BlockedConv c;
  KILN_ASSIGN_OR_RETURN(c.block, block_of(n));
  const int64_t b = c.block;
  c.channels = n.attr_int("channels", 0);
  c.in_blocked = n.attr_int("in_blocked", 1) != 0;
  int64_t group = n.attr_int("group", 1);
  c.depthwise = group != 1;
  if (c.channels < 1 || c.channels > (int64_t{1} << 40))
    return node_invalid(n) << "attribute 'channels' must be in [1, 2^40], got " << c.channels;
  if (c.in_blocked ? x.size() != 5 || x[4].as_const() != b : x.size() != 4)
    return node_invalid(n) << "input must be " << (c.in_blocked ? "[N, C/b, H, W, b]" : "[N, C, H, W]")
                           << " with b = " << b << ", got rank " << x.size();
  const int64_t ob = (c.channels + b - 1) / b;
  auto wdim = [&](size_t i) { return i < w.size() ? simplify(w[i], bounds).as_const() : std::nullopt; };
  if (c.depthwise) {
    if (!c.in_blocked || group != c.channels || w.size() != 4 || wdim(0) != ob || wdim(3) != b)
      return node_invalid(n) << "a depthwise ConvBlocked needs a blocked input, group = channels and weights "
                                "[ceil(C/b), KH, KW, b]";
    c.kernel = {w[1], w[2]};
  } else if (c.in_blocked) {
    if (w.size() != 6 || wdim(0) != ob || wdim(4) != b || wdim(5) != b)
      return node_invalid(n) << "weights must be [ceil(O/b), ceil(C/b), KH, KW, b, b]";
    c.kernel = {w[2], w[3]};
  } else {
    if (w.size() != 5 || wdim(0) != ob || wdim(4) != b)
      return node_invalid(n) << "weights must be [ceil(O/b), C, KH, KW, b] for an NCHW input";
    c.kernel = {w[2], w[3]};
  }
  if (c.in_blocked) {
    c.x_nchw = {x[0], x[1] * b, x[2], x[3]};
    if (c.depthwise) {
      if (simplify(x[1], bounds).as_const() != ob)
        return node_invalid(n) << "input blocks do not match " << c.channels << " channels";
    } else if (!prove_equal(simplify(x[1], bounds), simplify(w[1], bounds), bounds)) {
      return node_invalid(n) << "input blocks do not match the weights' input blocks";
    }
  } else {
    c.x_nchw = x;
    if (!prove_equal(simplify(x[1], bounds), simplify(w[1], bounds), bounds))
      return node_invalid(n) << "input channels do not match the weights'";
  }
  return c;
}

Status infer_conv_blocked(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 1));
  KILN_ASSIGN_OR_RETURN(BlockedConv c, blocked_conv(n, x, w, ctx.bounds));
  const int64_t ob = (c.channels + c.block - 1) / c.block;
  KILN_RETURN_IF_ERROR(require_param_shape(n, 2, {Expr(ob), Expr(c.block)}, "bias", ctx.bounds));
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, c.x_nchw, c.kernel, ctx.bounds));
  set_output(n, 0, xt.dtype, {x[0], Expr(ob), g.out[0], g.out[1], Expr(c.block)}, ctx);
  return Status::ok();
}

// y[n, ob, oh, ow, o] = sum over the window of x * w (+ bias[ob, o]); padded
// positions read as zero (select on a clamped load: the lowering's interior
// tiles drop the select).
Result<std::vector<tir::ComputeDef>> lower_conv_blocked(const Node& n, LowerContext& ctx) {
  const tir::Buffer& xb = ctx.inputs[0];
  const tir::Buffer& wb = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  Shape xs(xb.shape.begin(), xb.shape.end()), ws(wb.shape.begin(), wb.shape.end());
  KILN_ASSIGN_OR_RETURN(BlockedConv c, blocked_conv(n, xs, ws, ctx.bounds));
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, c.x_nchw, c.kernel, ctx.bounds));
  std::vector<std::string> axes = fresh_axes(ctx, 5, "i");
  std::vector<Expr> v = axis_vars(axes);  // n, ob, oh, ow, o
  // Reduce axes: depthwise (kh, kw); blocked (ib, kh, kw, ii); NCHW (c, kh, kw).
  size_t nred = c.depthwise ? 2 : c.in_blocked ? 4 : 3;
  std::vector<std::string> raxes = fresh_axes(ctx, nred, "k");
  std::vector<Expr> r = axis_vars(raxes);
  std::vector<Expr> rext;
  Expr kh, kw;
  if (c.depthwise) {
    rext = {c.kernel[0], c.kernel[1]};
    kh = r[0];
    kw = r[1];
  } else if (c.in_blocked) {
    rext = {xs[1], c.kernel[0], c.kernel[1], Expr(c.block)};
    kh = r[1];
    kw = r[2];
  } else {
    rext = {xs[1], c.kernel[0], c.kernel[1]};
    kh = r[1];
    kw = r[2];
  }
  Expr h = v[2] * g.stride[0] + kh * g.dilation[0] - g.pad_begin[0];
  Expr w = v[3] * g.stride[1] + kw * g.dilation[1] - g.pad_begin[1];
  Expr hi = h, wi = w, valid;
  if (g.may_pad) {
    valid = logical_and(logical_and(le(Expr(0), h), lt(h, g.in[0])), logical_and(le(Expr(0), w), lt(w, g.in[1])));
    hi = max(min(h, g.in[0] - 1), Expr(0));
    wi = max(min(w, g.in[1] - 1), Expr(0));
  }
  std::vector<Expr> x_idx, w_idx;
  if (c.depthwise) {
    x_idx = {v[0], v[1], hi, wi, v[4]};
    w_idx = {v[1], kh, kw, v[4]};
  } else if (c.in_blocked) {
    x_idx = {v[0], r[0], hi, wi, r[3]};
    w_idx = {v[1], r[0], kh, kw, r[3], v[4]};
  } else {
    x_idx = {v[0], r[0], hi, wi};
    w_idx = {v[1], r[0], kh, kw, v[4]};
  }
  Expr xv = ctx.load_input(0, x_idx);
  if (valid.defined()) xv = select(valid, xv, const_of(y.dtype, 0));
  Expr body = xv * ctx.load_input(1, w_idx);
  Expr finalize;
  if (has_input(n, 2)) finalize = var("acc", y.dtype) + ctx.load_input(2, {v[1], v[4]});
  return std::vector<tir::ComputeDef>{make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, rext,
                                                        tir::Combiner::kSum, const_of(y.dtype, 0), body, finalize)};
}

}  // namespace

void register_layout_ops() {
  OpDef to = make_def("ToBlocked", infer_to_blocked, lower_to_blocked);
  to.domain = "kiln";
  register_op(std::move(to));
  OpDef from = make_def("FromBlocked", infer_from_blocked, lower_from_blocked);
  from.domain = "kiln";
  register_op(std::move(from));
  OpDef conv = make_def("ConvBlocked", infer_conv_blocked, lower_conv_blocked);
  conv.domain = "kiln";
  register_op(std::move(conv));
}

}  // namespace kiln::ops
