// Convolutions: Conv (1-D/2-D/3-D, groups, dilations, strides, pads,
// auto_pad, optional bias) and ConvTranspose (any spatial rank, groups,
// output_padding, output_shape).
//
// Both lower to one reduction stage over (input channel of the group, kernel
// positions). Padding is handled inside the body: an input index outside the
// tensor contributes 0 (a select on the bounds), and the load index itself is
// clamped into the tensor so that no out-of-bounds load happens even when the
// select evaluates both sides.
//
// Conv also accepts the internal string attribute "kiln_weight_layout", set by
// the operator strategy's candidates (src/strategy/conv.cc) on 2-D
// convolutions with one group: "IHWO" (conv.ihwo) stores the weight as
// [I, KH, KW, O], output channels contiguous; "P<nr>" (conv.panels) stores it
// as panels of nr output channels [ceil(O / nr), I, KH, KW, nr], zero past O
// (whose value is then the int attribute kiln_out_channels). It is indexed
// accordingly. Any other value of the attribute, or the attribute on another
// kind of Conv, is an error. The int attribute kiln_subsample = 1 (set by the
// strategy on strided convolutions with a kernel of size 1; on a larger kernel
// an error) copies the input at the strided positions into a dense stage
// first, which the reduction then reads contiguously. The int attribute
// kiln_phase_split = 1 (2-D, strided along the width, dilation 1 there; set
// by conv.wvec) copies the zero-padded input with its columns split by phase,
// [N, C, H, SW, ceil(W / SW)] (column SW*j + q at [.., q, j]), so that tap kw
// of consecutive output columns reads consecutive elements of phase kw mod SW.
// The int attribute kiln_channels_last = 1 (2-D, one group; set by
// conv.panels' knob cl) copies the zero-padded input channels-last, [N, H, W,
// C], so that the reduction's consecutive input channels are consecutive
// elements (one cache line serves 16 of a tile's broadcasts, where NCHW puts
// each in another plane).
//
// "W<m>P<mr>" (conv.winograd; a 2-D 3x3 kernel, stride and dilation 1, one
// group) stores the Winograd-transformed weight U = G w GT (tir/winograd.h)
// as [m + 2, m + 2, ceil(O / mr), I, mr], and the convolution lowers to
// F(m x m, 3 x 3) in five stages: a zero-padded copy of the input with its
// columns split by phase m ([N, C, TH*m + 2, m, TW + 1], TH x TW tiles of m x
// m outputs); the input transform V = BT d B ([N, a, a, C, TH, TW], a = m +
// 2); a^2 products M = U V over the input channels ([N, a, a, O, TH, TW]); the
// output transform AT M A ([N, O, TH, m, m, TW]); and the output, its tiles
// read back into rows (plus the bias). Each transform is written out term by
// term with its constant coefficients, so unrolling the position axes leaves
// only the non-zero terms.
//
// "G<g>P<mr>" (conv.im2col; 2-D, any group count, group == g) stores the
// weight as panels of mr output channels within each group, [G, ceil(Og /
// mr), Cg, KH, KW, mr] (Og = O / G, each group's last panel zero-padded; O is
// then kiln_out_channels), and the convolution lowers to one GEMM per image
// and group, [Og, Cg KH KW] x [Cg KH KW, OH OW]. With the int attribute
// kiln_im2col = 1 its right operand is materialized first (im2col: a stage
// [N, G, Cg, KH, KW, OH, OW] of every tap's input at every output position,
// zero outside the input), so that the products read contiguous rows across
// the whole plane; with 0 they read the zero-padded input (or the input
// itself, unpadded) through the same index map (implicit GEMM). With one
// group the products are the output; with several they are a stage [N, G,
// Og, OH, OW] that the output reads back (plus the bias).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onednn/conv.h"
#include "ops/common.h"
#include "tir/winograd.h"

namespace kiln::ops {

Result<std::vector<int64_t>> spatial_attr(const Node& n, const std::string& name, size_t rank, int64_t def) {
  std::vector<int64_t> v = n.attr_ints(name, std::vector<int64_t>(rank, def));
  if (v.size() != rank) {
    return node_invalid(n) << "attribute '" << name << "' has " << v.size() << " values, expected " << rank;
  }
  for (int64_t x : v) {
    if (x <= 0) return node_invalid(n) << "attribute '" << name << "' must be positive";
  }
  return v;
}

// Output extents and padding of Conv: explicit pads or auto_pad.
Status check_window_span(const Node& n, size_t d, const Expr& span, const Expr& reach, const SymbolBounds& bounds) {
  auto s = simplify(span, bounds).as_const();
  auto r = simplify(reach, bounds).as_const();
  if (!s || !r) return Status::ok();
  if (*s > std::max<int64_t>(kMaxWindowOverInput, kMaxWindowOverInput / 4 * std::max<int64_t>(*r, 1)))
    return node_invalid(n) << "the window spans " << *s << " positions on spatial dim " << d << " over an input of "
                           << *r << "; a window more than " << kMaxWindowOverInput / 4 << " times (and "
                           << kMaxWindowOverInput << " positions) longer than its input is refused";
  return Status::ok();
}

Expr clamp_index(const Expr& i, const Expr& extent) { return max(min(i, extent - 1), Expr(0)); }

Result<ConvGeometry> conv_geometry(const Node& n, const Shape& x, const std::vector<Expr>& kernel,
                                   const SymbolBounds& bounds) {
  size_t rank = kernel.size();
  ConvGeometry g;
  g.kernel = kernel;
  g.in.assign(x.begin() + 2, x.end());
  KILN_ASSIGN_OR_RETURN(g.stride, spatial_attr(n, "strides", rank, 1));
  KILN_ASSIGN_OR_RETURN(g.dilation, spatial_attr(n, "dilations", rank, 1));
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * rank, 0));
  if (pads.size() != 2 * rank) return node_invalid(n) << "attribute 'pads' needs " << 2 * rank << " values";
  for (size_t d = 0; d < rank; ++d) {
    Expr span = Expr(g.dilation[d]) * (kernel[d] - 1) + 1;  // receptive field
    KILN_RETURN_IF_ERROR(check_window_span(n, d, span, g.in[d], bounds));
    Expr s = Expr(g.stride[d]);
    if (auto_pad == "NOTSET") {
      g.pad_begin.push_back(Expr(pads[d]));
      g.out.push_back(simplify(floordiv(g.in[d] + pads[d] + pads[d + rank] - span, s) + 1, bounds));
      if (pads[d] != 0 || pads[d + rank] != 0) g.may_pad = true;
    } else if (auto_pad == "VALID") {
      g.pad_begin.push_back(Expr(0));
      g.out.push_back(simplify(floordiv(g.in[d] - span, s) + 1, bounds));
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      Expr out = simplify(floordiv(g.in[d] + (g.stride[d] - 1), s), bounds);
      Expr total = simplify(max(Expr(0), (out - 1) * s + span - g.in[d]), bounds);
      Expr half = floordiv(total, 2);
      g.pad_begin.push_back(simplify(auto_pad == "SAME_UPPER" ? half : total - half, bounds));
      g.out.push_back(out);
      g.may_pad = true;
    } else {
      return node_invalid(n) << "unknown auto_pad '" << auto_pad << "'";
    }
  }
  return g;
}

namespace {


// An index into an input dim of extent `extent`, clamped into range.

// True when s[from, to) is one or more decimal digits.
bool digits(const std::string& s, size_t from, size_t to = std::string::npos) {
  to = std::min(to, s.size());
  return from < to && std::all_of(s.begin() + static_cast<long>(from), s.begin() + static_cast<long>(to),
                                  [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Output channels of weights stored in `panels` panels of nr: panels * nr,
// or kiln_out_channels where the last panel is zero-padded past O.
Result<Expr> panel_out_channels(const Node& n, const Expr& panels, int64_t nr) {
  if (!n.has_attr("kiln_out_channels")) return panels * Expr(nr);
  int64_t c = n.attr_int("kiln_out_channels", 0);
  auto count = panels.as_const();
  if (!count || c <= (*count - 1) * nr || c > *count * nr)
    return node_invalid(n) << "kiln_out_channels " << c << " does not fit the weight's " << (count ? *count : 0)
                           << " panels of " << nr;
  return Expr(c);
}

// The weight's dims in ONNX order [O, I, k...], whatever its stored layout.
// `packed` says how it is stored: 0 as ONNX has it, -1 as [I, KH, KW, O]
// ("IHWO"), nr > 0 as panels of nr output channels [O / nr, I, KH, KW, nr] ("P<nr>").
// With wino_m set, "W<m>P<mr>": Winograd weights [m+2, m+2, ceil(O / mr), I, mr]
// (packed = mr).
// With im2col_groups set, "G<g>P<mr>": grouped panels [G, ceil(Og / mr), Cg,
// KH, KW, mr] (packed = mr, *im2col_groups = G), Og = O / G output channels
// per group, each group's last panel zero-padded past Og.
Result<std::vector<Expr>> conv_weight_dims(const Node& n, const std::vector<Expr>& w, int64_t& packed,
                                           int64_t* wino_m = nullptr, int64_t* im2col_groups = nullptr) {
  packed = 0;
  if (wino_m) *wino_m = 0;
  if (im2col_groups) *im2col_groups = 0;
  if (!n.has_attr("kiln_weight_layout")) return w;
  std::string layout = n.attr_string("kiln_weight_layout", "");
  if (size_t p = layout.find('P');
      layout.size() < 15 && layout[0] == 'G' && p != std::string::npos && p <= 7 && digits(layout, 1, p) &&
      digits(layout, p + 1)) {
    int64_t groups = std::stoll(layout.substr(1, p - 1)), mr = std::stoll(layout.substr(p + 1));
    auto dim = [&](size_t i) { return w.size() == 6 ? w[i].as_const() : std::nullopt; };
    auto g0 = dim(0), panels = dim(1), last = dim(5);
    int64_t per_group = 0, out_channels = 0;
    if (groups <= 0 || mr <= 0 || w.size() != 6 || n.attr_int("group", 1) != groups || g0 != groups || !panels ||
        *panels <= 0 || last != mr || __builtin_mul_overflow(*panels, mr, &per_group) ||
        __builtin_mul_overflow(groups, per_group, &out_channels)) {
      return node_invalid(n) << "kiln_weight_layout " << layout
                             << " needs a 2-D convolution of group G and weights [G, Og/mr, I/G, KH, KW, mr]";
    }
    packed = mr;
    if (im2col_groups) *im2col_groups = groups;
    if (n.has_attr("kiln_out_channels")) {
      int64_t o = n.attr_int("kiln_out_channels", 0);
      if (o <= 0 || o % groups != 0 || o / groups <= (*panels - 1) * mr || o / groups > per_group)
        return node_invalid(n) << "kiln_out_channels " << o << " does not fit " << groups << " groups of " << *panels
                               << " panels of " << mr;
      per_group = o / groups;
    }
    return std::vector<Expr>{Expr(groups * per_group), w[2], w[3], w[4]};  // at most out_channels
  }
  if (size_t p = layout.find('P');
      layout.size() < 10 && layout[0] == 'W' && p != std::string::npos && digits(layout, 1, p) && digits(layout, p + 1)) {
    int64_t m = std::stoll(layout.substr(1, p - 1)), mr = std::stoll(layout.substr(p + 1));
    const tir::WinogradMatrices* t = tir::winograd_matrices(m);
    auto a0 = w.size() == 5 ? w[0].as_const() : std::nullopt, a1 = w.size() == 5 ? w[1].as_const() : std::nullopt;
    if (t == nullptr || mr <= 0 || w.size() != 5 || n.attr_int("group", 1) != 1 || a0 != t->alpha || a1 != t->alpha ||
        w[4].as_const() != mr) {
      return node_invalid(n) << "kiln_weight_layout " << layout
                             << " needs m = 2 or 4, one group and weights [m+2, m+2, O/mr, I, mr]";
    }
    packed = mr;
    if (wino_m) *wino_m = m;
    KILN_ASSIGN_OR_RETURN(Expr out_channels, panel_out_channels(n, w[2], mr));
    return std::vector<Expr>{out_channels, w[3], Expr(3), Expr(3)};
  }
  if (layout == "IHWO") {
    if (w.size() != 4 || n.attr_int("group", 1) != 1) {
      return node_invalid(n) << "kiln_weight_layout IHWO needs a 2-D convolution with one group";
    }
    packed = -1;
    return std::vector<Expr>{w[3], w[0], w[1], w[2]};
  }
  if (layout.size() < 8 && layout[0] == 'P' && digits(layout, 1)) {
    int64_t nr = std::stoll(layout.substr(1));
    if (nr <= 0 || w.size() != 5 || n.attr_int("group", 1) != 1 || w[4].as_const() != nr) {
      return node_invalid(n) << "kiln_weight_layout " << layout
                             << " needs a 2-D convolution with one group and weights [O/nr, I, KH, KW, nr]";
    }
    packed = nr;
    KILN_ASSIGN_OR_RETURN(Expr out_channels, panel_out_channels(n, w[0], nr));
    return std::vector<Expr>{out_channels, w[1], w[2], w[3]};
  }
  return node_invalid(n) << "unknown kiln_weight_layout '" << layout << "'";
}

Status infer_conv(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape stored_w, input_shape(n, 1));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  int64_t group = n.attr_int("group", 1);
  if (group <= 0) return node_invalid(n) << "group must be positive";
  int64_t packed = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<Expr> w, conv_weight_dims(n, stored_w, packed, nullptr));
  if (w.size() != x.size()) {
    return node_invalid(n) << "weight rank " << w.size() << " != input rank " << x.size();
  }
  std::vector<Expr> kernel(w.begin() + 2, w.end());
  std::vector<int64_t> ks = n.attr_ints("kernel_shape");
  if (!ks.empty()) {
    if (ks.size() != kernel.size()) return node_invalid(n) << "kernel_shape has the wrong rank";
    for (size_t d = 0; d < ks.size(); ++d) {
      // The lowerings read the weight's window: a kernel_shape that says
      // otherwise would size the output for another window.
      if (auto k = simplify(kernel[d], ctx.bounds).as_const(); k && *k != ks[d])
        return node_invalid(n) << "kernel_shape " << shape_to_string(ks) << " does not match the weight's window (dim "
                               << d << " is " << *k << ")";
      kernel[d] = Expr(ks[d]);
    }
  }
  KILN_RETURN_IF_ERROR(require_param_shape(n, 2, {w[0]}, "bias", ctx.bounds));
  // Channels: C == group * W[1] (checked when both are constants).
  auto c = simplify(x[1], ctx.bounds).as_const();
  auto wc = simplify(w[1], ctx.bounds).as_const();
  if (c && wc && *c != group * *wc) {
    return node_invalid(n) << "input has " << *c << " channels, weight expects " << group * *wc << " (group "
                           << group << ")";
  }
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, x, kernel, ctx.bounds));
  Shape out = {x[0], w[0]};
  out.insert(out.end(), g.out.begin(), g.out.end());
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

// Sum over j < width of right[rr, j] * (sum over i < width of left[lr, i] *
// term(i, j)) (rows of two row-major matrices `width` wide), the zero
// coefficients left out. Separable: the inner sums do not depend on rr, so
// where the transform's positions are unrolled into one body each inner sum
// is one expression that LLVM computes once for all rr (2 width^2 terms per
// row of outputs instead of width^3, and each input loaded once).
Expr transform_sum(const std::vector<double>& left, int64_t lr, const std::vector<double>& right, int64_t rr,
                   int64_t width, DType dtype, const std::function<Expr(int64_t, int64_t)>& term) {
  auto weighted_sum = [&](const std::vector<double>& coef, int64_t row, const std::function<Expr(int64_t)>& item) {
    Expr sum;
    for (int64_t k = 0; k < width; ++k) {
      double c = coef[static_cast<size_t>(row * width + k)];
      if (c == 0) continue;
      Expr t = item(k);
      if (sum.defined() && (c == 1 || c == -1)) {
        sum = c == 1 ? sum + t : sum - t;
      } else {
        if (c != 1) t = const_of(dtype, c) * t;
        sum = sum.defined() ? sum + t : t;
      }
    }
    return sum.defined() ? sum : const_of(dtype, 0);
  };
  return weighted_sum(right, rr, [&](int64_t j) { return weighted_sum(left, lr, [&](int64_t i) { return term(i, j); }); });
}

// select(p == 0, value(0), select(p == 1, value(1), ... value(count - 1))).
Expr select_by(const Expr& p, int64_t count, const std::function<Expr(int64_t)>& value) {
  Expr e = value(count - 1);
  for (int64_t k = count - 2; k >= 0; --k) e = select(eq(p, Expr(k)), value(k), e);
  return e;
}

// F(m x m, 3 x 3) (kiln_weight_layout "W<m>P<mr>"; see the file comment).
Result<std::vector<tir::ComputeDef>> lower_winograd(const Node& n, LowerContext& ctx, const ConvGeometry& g,
                                                    const std::vector<Expr>& wd, int64_t m, int64_t mr) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  const tir::WinogradMatrices& t = *tir::winograd_matrices(m);
  const int64_t a = t.alpha;
  if (g.kernel.size() != 2 || g.kernel[0].as_const() != 3 || g.kernel[1].as_const() != 3 || g.stride[0] != 1 ||
      g.stride[1] != 1 || g.dilation[0] != 1 || g.dilation[1] != 1 || n.attr_int("group", 1) != 1)
    return node_invalid(n) << "Winograd weights (kiln_weight_layout W" << m << "P" << mr
                           << ") need a 2-D 3x3 kernel with stride 1, dilation 1 and one group";
  for (const char* copy : {"kiln_subsample", "kiln_phase_split", "kiln_channels_last", "kiln_im2col"})
    if (n.attr_int(copy, 0) != 0)
      return node_invalid(n) << copy << " does not apply to Winograd weights (kiln_weight_layout W" << m << "P" << mr
                             << "), which read their own phase-split copy";
  const DType dt = y.dtype;
  Expr th_n = simplify(floordiv(g.out[0] + (m - 1), Expr(m)));
  Expr tw_n = simplify(floordiv(g.out[1] + (m - 1), Expr(m)));
  const Expr& channels = wd[1];
  std::vector<tir::ComputeDef> stages;
  // The zero-padded input, columns split by phase: column m*j + q at [.., q, j].
  {
    std::vector<std::string> ax = fresh_axes(ctx, 5, "p");
    std::vector<Expr> v = axis_vars(ax);
    Expr ph = v[2] - g.pad_begin[0], pw = v[4] * m + v[3] - g.pad_begin[1];
    Expr valid = logical_and(logical_and(le(Expr(0), ph), lt(ph, g.in[0])), logical_and(le(Expr(0), pw), lt(pw, g.in[1])));
    Expr src = ctx.load_input(0, {v[0], v[1], clamp_index(ph, g.in[0]), clamp_index(pw, g.in[1])});
    stages.push_back(make_stage(y.name + ".pad", dt, ax, {x.shape[0], x.shape[1], simplify(th_n * m + 2), Expr(m), simplify(tw_n + 1)},
                                select(valid, src, const_of(dt, 0))));
  }
  const tir::ComputeDef pad = stages.back();
  // V[n, ξ, ν, c, th, tw] = (BT d B)[ξ, ν], d the input tile at (th, tw).
  {
    std::vector<std::string> ax = fresh_axes(ctx, 6, "v");
    std::vector<Expr> v = axis_vars(ax);
    auto d = [&](int64_t i, int64_t j) {
      return stage_load(pad, {v[0], v[3], v[4] * m + i, Expr(j % m), v[5] + j / m});
    };
    Expr body = select_by(v[1], a, [&](int64_t xi) {
      return select_by(v[2], a, [&](int64_t nu) { return transform_sum(t.bt, xi, t.bt, nu, a, dt, d); });
    });
    stages.push_back(make_stage(y.name + ".wi", dt, ax, {x.shape[0], Expr(a), Expr(a), channels, th_n, tw_n}, body));
  }
  const tir::ComputeDef vin = stages.back();
  // M[n, ξ, ν, o, th, tw] = sum over c of U[ξ, ν, o / mr, c, o % mr] V[n, ξ, ν, c, th, tw].
  {
    std::vector<std::string> ax = fresh_axes(ctx, 6, "i");
    std::vector<Expr> v = axis_vars(ax);
    std::vector<std::string> rax = fresh_axes(ctx, 1, "k");
    Expr c = axis_vars(rax)[0];
    Expr body = ctx.load_input(1, {v[1], v[2], floordiv(v[3], Expr(mr)), c, mod(v[3], Expr(mr))}) *
                stage_load(vin, {v[0], v[1], v[2], c, v[4], v[5]});
    stages.push_back(make_reduce_stage(y.name + ".wm", dt, ax, {x.shape[0], Expr(a), Expr(a), wd[0], th_n, tw_n}, rax,
                                       {channels}, tir::Combiner::kSum, const_of(dt, 0), body));
  }
  const tir::ComputeDef prod = stages.back();
  // Z[n, o, th, r, s, tw] = (AT M A)[r, s].
  {
    std::vector<std::string> ax = fresh_axes(ctx, 6, "z");
    std::vector<Expr> v = axis_vars(ax);
    auto mv = [&](int64_t xi, int64_t nu) { return stage_load(prod, {v[0], Expr(xi), Expr(nu), v[1], v[2], v[5]}); };
    Expr body = select_by(v[3], m, [&](int64_t r) {
      return select_by(v[4], m, [&](int64_t s) { return transform_sum(t.at, r, t.at, s, a, dt, mv); });
    });
    stages.push_back(make_stage(y.name + ".wo", dt, ax, {x.shape[0], wd[0], th_n, Expr(m), Expr(m), tw_n}, body));
  }
  const tir::ComputeDef tiles = stages.back();
  std::vector<std::string> ax = fresh_axes(ctx, 4, "i");
  std::vector<Expr> v = axis_vars(ax);
  Expr body = stage_load(tiles, {v[0], v[1], floordiv(v[2], Expr(m)), mod(v[2], Expr(m)), mod(v[3], Expr(m)),
                                 floordiv(v[3], Expr(m))});
  if (has_input(n, 2)) body = body + ctx.load_input(2, {v[1]});
  stages.push_back(make_stage(y.name, dt, ax, y.shape, body));
  return stages;
}

// im2col + GEMM (kiln_weight_layout "G<g>P<mr>"; see the file comment).
Result<std::vector<tir::ComputeDef>> lower_im2col(const Node& n, LowerContext& ctx, const ConvGeometry& g,
                                                  const std::vector<Expr>& wd, int64_t groups, int64_t mr) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  if (g.kernel.size() != 2)
    return node_invalid(n) << "grouped panels (kiln_weight_layout G" << groups << "P" << mr
                           << ") need a 2-D convolution";
  for (const char* copy : {"kiln_subsample", "kiln_phase_split", "kiln_channels_last"})
    if (n.attr_int(copy, 0) != 0)
      return node_invalid(n) << copy << " does not apply to grouped panels (kiln_weight_layout G" << groups << "P"
                             << mr << ")";
  const bool materialize = n.attr_int("kiln_im2col", 0) != 0;
  const DType dt = y.dtype;
  const Expr per_group = simplify(floordiv(wd[0], Expr(groups)));
  const Expr& channels = wd[1];  // input channels per group
  std::vector<tir::ComputeDef> stages;
  // The input value of group gi, channel c, tap (kh, kw) at output (oh, ow).
  std::function<Expr(const Expr&, const Expr&, const Expr&, const Expr&, const Expr&, const Expr&, const Expr&)> in;
  if (materialize) {
    // col[n, g, c, kh, kw, oh, ow]: every tap's input for every output
    // position, zero outside the input; the products read it as a matrix
    // [Cg KH KW, OH OW] per group, rows contiguous.
    std::vector<std::string> ax = fresh_axes(ctx, 7, "c");
    std::vector<Expr> v = axis_vars(ax);
    Expr valid;
    std::vector<Expr> src = {v[0], v[1] * channels + v[2]};
    for (size_t d = 0; d < 2; ++d) {
      Expr pos = v[5 + d] * g.stride[d] + v[3 + d] * g.dilation[d] - g.pad_begin[d];
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      src.push_back(clamp_index(pos, g.in[d]));
    }
    stages.push_back(make_stage(y.name + ".col", dt, ax,
                                {x.shape[0], Expr(groups), channels, g.kernel[0], g.kernel[1], g.out[0], g.out[1]},
                                select(valid, ctx.load_input(0, src), const_of(dt, 0))));
    const tir::ComputeDef col = stages.back();
    in = [col](const Expr& b, const Expr& gi, const Expr& c, const Expr& kh, const Expr& kw, const Expr& oh,
               const Expr& ow) { return stage_load(col, {b, gi, c, kh, kw, oh, ow}); };
  } else if (g.may_pad) {
    // Implicit: a zero-padded copy of the input, read through the im2col index map.
    std::vector<std::string> ax = fresh_axes(ctx, 4, "p");
    std::vector<Expr> v = axis_vars(ax);
    std::vector<Expr> shape = {x.shape[0], x.shape[1]}, src = {v[0], v[1]};
    Expr valid;
    for (size_t d = 0; d < 2; ++d) {
      shape.push_back(simplify((g.out[d] - 1) * g.stride[d] + (g.kernel[d] - 1) * g.dilation[d] + 1));
      Expr pos = v[2 + d] - g.pad_begin[d];
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      src.push_back(clamp_index(pos, g.in[d]));
    }
    stages.push_back(make_stage(y.name + ".pad", dt, ax, shape, select(valid, ctx.load_input(0, src), const_of(dt, 0))));
    const tir::ComputeDef pad = stages.back();
    in = [pad, g, channels](const Expr& b, const Expr& gi, const Expr& c, const Expr& kh, const Expr& kw,
                            const Expr& oh, const Expr& ow) {
      return stage_load(pad, {b, gi * channels + c, oh * g.stride[0] + kh * g.dilation[0],
                              ow * g.stride[1] + kw * g.dilation[1]});
    };
  } else {
    in = [&ctx, g, channels](const Expr& b, const Expr& gi, const Expr& c, const Expr& kh, const Expr& kw,
                             const Expr& oh, const Expr& ow) {
      return ctx.load_input(0, {b, gi * channels + c, oh * g.stride[0] + kh * g.dilation[0],
                                ow * g.stride[1] + kw * g.dilation[1]});
    };
  }
  std::vector<std::string> rax = fresh_axes(ctx, 3, "k");
  std::vector<Expr> r = axis_vars(rax);
  std::vector<Expr> rext = {channels, g.kernel[0], g.kernel[1]};
  auto weight = [&](const Expr& gi, const Expr& o) {
    return ctx.load_input(1, {gi, floordiv(o, Expr(mr)), r[0], r[1], r[2], mod(o, Expr(mr))});
  };
  if (groups == 1) {
    // One GEMM per image, written straight to the output: [O, Cg KH KW] x [Cg KH KW, OH OW].
    std::vector<std::string> ax = fresh_axes(ctx, 4, "i");
    std::vector<Expr> v = axis_vars(ax);
    Expr body = in(v[0], Expr(0), r[0], r[1], r[2], v[2], v[3]) * weight(Expr(0), v[1]);
    Expr finalize;
    if (has_input(n, 2)) finalize = var("acc", dt) + ctx.load_input(2, {v[1]});
    stages.push_back(make_reduce_stage(y.name, dt, ax, y.shape, rax, rext, tir::Combiner::kSum, const_of(dt, 0), body,
                                       finalize));
    return stages;
  }
  // One GEMM per image and group: products [N, G, Og, OH, OW], then the
  // output (the same elements in the same order, plus the bias).
  {
    std::vector<std::string> ax = fresh_axes(ctx, 5, "i");
    std::vector<Expr> v = axis_vars(ax);
    Expr body = in(v[0], v[1], r[0], r[1], r[2], v[3], v[4]) * weight(v[1], v[2]);
    stages.push_back(make_reduce_stage(y.name + ".gm", dt, ax, {x.shape[0], Expr(groups), per_group, g.out[0], g.out[1]},
                                       rax, rext, tir::Combiner::kSum, const_of(dt, 0), body));
  }
  const tir::ComputeDef prod = stages.back();
  std::vector<std::string> ax = fresh_axes(ctx, 4, "i");
  std::vector<Expr> v = axis_vars(ax);
  Expr body = stage_load(prod, {v[0], floordiv(v[1], per_group), mod(v[1], per_group), v[2], v[3]});
  if (has_input(n, 2)) body = body + ctx.load_input(2, {v[1]});
  stages.push_back(make_stage(y.name, dt, ax, y.shape, body));
  return stages;
}

Result<std::vector<tir::ComputeDef>> lower_conv(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& w = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  size_t rank = x.shape.size() - 2;
  int64_t packed = 0, wino_m = 0, im2col_groups = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<Expr> wd, conv_weight_dims(n, w.shape, packed, &wino_m, &im2col_groups));
  std::vector<Expr> kernel(wd.begin() + 2, wd.end());
  Shape xs(x.shape.begin(), x.shape.end());
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, xs, kernel, {}));
  int64_t group = n.attr_int("group", 1);
  if (wino_m > 0) return lower_winograd(n, ctx, g, wd, wino_m, packed);
  if (im2col_groups > 0) return lower_im2col(n, ctx, g, wd, im2col_groups, packed);
  if (n.attr_int("kiln_im2col", 0) != 0)
    return node_invalid(n) << "kiln_im2col needs grouped panels (kiln_weight_layout G<g>P<mr>)";

  std::vector<std::string> axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank + 1, "k");
  std::vector<Expr> rv = axis_vars(raxes);
  std::vector<Expr> rext = {wd[1]};
  rext.insert(rext.end(), kernel.begin(), kernel.end());

  // Input channel: the group of output channel m, then the channel within it.
  Expr ci = rv[0];
  if (group != 1) ci = floordiv(iv[1], floordiv(wd[0], group)) * wd[1] + rv[0];
  std::vector<Expr> x_idx = {iv[0], ci};
  std::vector<Expr> w_idx = {iv[1], rv[0]};
  std::vector<tir::ComputeDef> stages;
  // kiln_subsample (a 1x1 kernel): the strided input is copied into a dense
  // [N, C, out...] stage first, so that the reduction reads it contiguously.
  bool subsample = n.attr_int("kiln_subsample", 0) != 0;
  if (subsample && !std::all_of(kernel.begin(), kernel.end(), [](const Expr& k) { return k.as_const() == 1; }))
    return node_invalid(n) << "kiln_subsample needs a kernel of size 1";
  bool phase_split = n.attr_int("kiln_phase_split", 0) != 0;
  if (phase_split && (subsample || rank != 2 || g.stride[1] < 2 || g.dilation[1] != 1))
    return node_invalid(n) << "kiln_phase_split needs a 2-D kernel strided along the width, dilation 1 there";
  bool channels_last = n.attr_int("kiln_channels_last", 0) != 0;
  if (channels_last && (subsample || phase_split || rank != 2 || group != 1))
    return node_invalid(n) << "kiln_channels_last needs a 2-D convolution with one group, without "
                              "kiln_subsample or kiln_phase_split";
  bool copy = g.may_pad || subsample || phase_split || channels_last;
  for (size_t d = 0; d < rank; ++d) {
    Expr pos = iv[d + 2] * g.stride[d] + rv[d + 1] * g.dilation[d];
    if (phase_split && d == 1) {
      int64_t sw = g.stride[1];
      x_idx.push_back(mod(rv[d + 1], Expr(sw)));
      x_idx.push_back(iv[d + 2] + floordiv(rv[d + 1], Expr(sw)));
    } else {
      x_idx.push_back(subsample ? iv[d + 2] : copy ? pos : pos - g.pad_begin[d]);
    }
    w_idx.push_back(rv[d + 1]);
  }
  if (packed < 0) w_idx = {rv[0], rv[1], rv[2], iv[1]};  // [I, KH, KW, O]
  if (packed > 0)                                         // [O / nr, I, KH, KW, nr]
    w_idx = {floordiv(iv[1], Expr(packed)), rv[0], rv[1], rv[2], mod(iv[1], Expr(packed))};
  Expr x_value;
  if (copy) {
    // A zero-padded copy of the input, just large enough for every window:
    // the reduction then reads it without bound checks (contiguous windows);
    // subsampled, one element per output position.
    // Phase-split, the last axis is two: [.., SW, ceil(span / SW)].
    std::vector<std::string> paxes = fresh_axes(ctx, rank + 2 + (phase_split ? 1 : 0), "p");
    std::vector<Expr> pv = axis_vars(paxes);
    std::vector<Expr> pshape = {x.shape[0], x.shape[1]};
    std::vector<Expr> src = {pv[0], pv[1]};
    Expr valid;
    for (size_t d = 0; d < rank; ++d) {
      Expr span = simplify((g.out[d] - 1) * g.stride[d] + (kernel[d] - 1) * g.dilation[d] + 1);
      Expr pos = (subsample ? pv[d + 2] * g.stride[d] : pv[d + 2]) - g.pad_begin[d];
      if (phase_split && d == 1) {
        int64_t sw = g.stride[1];
        pshape.push_back(Expr(sw));
        pshape.push_back(simplify(floordiv(span + (sw - 1), Expr(sw))));
        pos = pv[d + 3] * sw + pv[d + 2] - g.pad_begin[d];
      } else {
        pshape.push_back(subsample ? g.out[d] : span);
      }
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      src.push_back(clamp_index(pos, g.in[d]));
    }
    if (channels_last) {
      // [N, H, W, C]: the channels of one input position are contiguous.
      std::rotate(pshape.begin() + 1, pshape.begin() + 2, pshape.end());
      std::rotate(paxes.begin() + 1, paxes.begin() + 2, paxes.end());
      std::rotate(x_idx.begin() + 1, x_idx.begin() + 2, x_idx.end());
      // A multiple of 16 channels gets 16 more (zeros, never read): the
      // positions a tile reads along a row are then not a power of two of
      // bytes apart (512 channels at stride 2 are 4 KB: every broadcast of a
      // tile in one set of the L1 cache, 5x slower).
      if (auto c = x.shape[1].as_const(); c && *c % 16 == 0) {
        pshape.back() = Expr(*c + 16);
        valid = logical_and(valid, lt(pv[1], x.shape[1]));
        src[1] = min(pv[1], x.shape[1] - 1);
      }
    }
    stages.push_back(make_stage(y.name + ".pad", y.dtype, paxes, pshape,
                                select(valid, ctx.load_input(0, src), const_of(y.dtype, 0))));
    x_value = stage_load(stages.back(), x_idx);
  } else {
    x_value = ctx.load_input(0, x_idx);
  }
  Expr body = x_value * ctx.load_input(1, w_idx);
  Expr finalize;
  if (has_input(n, 2)) finalize = var("acc", y.dtype) + ctx.load_input(2, {iv[1]});
  stages.push_back(make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, rext, tir::Combiner::kSum,
                                     const_of(y.dtype, 0), body, finalize));
  return stages;
}

// ---- ConvTranspose --------------------------------------------------------------

struct ConvTransposeGeometry {
  std::vector<Expr> in, kernel, out, pad_begin;
  std::vector<int64_t> stride, dilation;
};

Result<ConvTransposeGeometry> conv_transpose_geometry(const Node& n, const Shape& x, const std::vector<Expr>& kernel,
                                                      const SymbolBounds& bounds) {
  size_t rank = kernel.size();
  ConvTransposeGeometry g;
  g.kernel = kernel;
  g.in.assign(x.begin() + 2, x.end());
  KILN_ASSIGN_OR_RETURN(g.stride, spatial_attr(n, "strides", rank, 1));
  KILN_ASSIGN_OR_RETURN(g.dilation, spatial_attr(n, "dilations", rank, 1));
  std::vector<int64_t> out_pad = n.attr_ints("output_padding", std::vector<int64_t>(rank, 0));
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * rank, 0));
  std::vector<int64_t> out_shape = n.attr_ints("output_shape");
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (out_pad.size() != rank) return node_invalid(n) << "output_padding needs " << rank << " values";
  if (pads.size() != 2 * rank) return node_invalid(n) << "pads needs " << 2 * rank << " values";
  if (!out_shape.empty() && out_shape.size() != rank) {
    // output_shape may include N and C; keep the spatial tail.
    if (out_shape.size() != rank + 2) return node_invalid(n) << "output_shape needs " << rank << " values";
    out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  }
  for (size_t d = 0; d < rank; ++d) {
    Expr span = Expr(g.dilation[d]) * (kernel[d] - 1) + 1;
    KILN_RETURN_IF_ERROR(check_window_span(n, d, span, Expr(g.stride[d]) * (g.in[d] - 1) + 1, bounds));
    Expr full = Expr(g.stride[d]) * (g.in[d] - 1) + out_pad[d] + span;  // output size without padding
    Expr target;
    if (!out_shape.empty()) {
      target = Expr(out_shape[d]);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      target = g.in[d] * g.stride[d];
    }
    if (target.defined()) {
      Expr total = simplify(full - target, bounds);
      Expr half = floordiv(total, 2);
      // The spec: SAME_UPPER puts the smaller half first, anything else the larger half.
      g.pad_begin.push_back(simplify(auto_pad == "SAME_UPPER" ? half : total - half, bounds));
      g.out.push_back(simplify(target, bounds));
    } else if (auto_pad == "NOTSET" || auto_pad == "VALID") {
      int64_t pb = auto_pad == "VALID" ? 0 : pads[d];
      int64_t pe = auto_pad == "VALID" ? 0 : pads[d + rank];
      g.pad_begin.push_back(Expr(pb));
      g.out.push_back(simplify(full - pb - pe, bounds));
    } else {
      return node_invalid(n) << "unknown auto_pad '" << auto_pad << "'";
    }
  }
  return g;
}

Status infer_conv_transpose(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 1));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  if (w.size() != x.size()) return node_invalid(n) << "weight rank " << w.size() << " != input rank " << x.size();
  int64_t group = n.attr_int("group", 1);
  if (group <= 0) return node_invalid(n) << "group must be positive";
  std::vector<Expr> kernel(w.begin() + 2, w.end());
  if (!prove_equal(x[1], w[0], ctx.bounds))
    return node_invalid(n) << "input has " << print_expr(x[1]) << " channels, weight has " << print_expr(w[0]);
  KILN_RETURN_IF_ERROR(require_param_shape(n, 2, {simplify(w[1] * group, ctx.bounds)}, "bias", ctx.bounds));
  KILN_ASSIGN_OR_RETURN(ConvTransposeGeometry g, conv_transpose_geometry(n, x, kernel, ctx.bounds));
  Shape out = {x[0], w[1] * group};
  out.insert(out.end(), g.out.begin(), g.out.end());
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

// y[n, m, o] = sum over input channels c of m's group and kernel positions r of
//   x[n, c, (o + pad - r*dil) / stride] * w[c, m within group, r]
// where the division must be exact and land inside the input.
Result<std::vector<tir::ComputeDef>> lower_conv_transpose(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& w = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  size_t rank = x.shape.size() - 2;
  std::vector<Expr> kernel(w.shape.begin() + 2, w.shape.end());
  Shape xs(x.shape.begin(), x.shape.end());
  KILN_ASSIGN_OR_RETURN(ConvTransposeGeometry g, conv_transpose_geometry(n, xs, kernel, {}));
  int64_t group = n.attr_int("group", 1);
  Expr c_per_group = group == 1 ? x.shape[1] : floordiv(x.shape[1], group);
  Expr m_per_group = w.shape[1];

  std::vector<std::string> axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank + 1, "k");
  std::vector<Expr> rv = axis_vars(raxes);
  std::vector<Expr> rext = {c_per_group};
  rext.insert(rext.end(), kernel.begin(), kernel.end());

  Expr ci = rv[0];
  Expr mi = iv[1];
  if (group != 1) {
    ci = floordiv(iv[1], m_per_group) * c_per_group + rv[0];
    mi = mod(iv[1], m_per_group);
  }
  std::vector<Expr> x_idx = {iv[0], ci};
  std::vector<Expr> w_idx = {ci, mi};
  Expr valid;
  for (size_t d = 0; d < rank; ++d) {
    Expr num = iv[d + 2] + g.pad_begin[d] - rv[d + 1] * g.dilation[d];
    Expr pos = g.stride[d] == 1 ? num : floordiv(num, Expr(g.stride[d]));
    Expr ok = logical_and(le(Expr(0), num), lt(pos, g.in[d]));
    if (g.stride[d] != 1) ok = logical_and(ok, eq(mod(num, Expr(g.stride[d])), Expr(0)));
    valid = valid.defined() ? logical_and(valid, ok) : ok;
    x_idx.push_back(clamp_index(pos, g.in[d]));
    w_idx.push_back(rv[d + 1]);
  }
  Expr body = select(valid, ctx.load_input(0, x_idx) * ctx.load_input(1, w_idx), const_of(y.dtype, 0));
  Expr finalize;
  if (has_input(n, 2)) finalize = var("acc", y.dtype) + ctx.load_input(2, {iv[1]});
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, rext, tir::Combiner::kSum,
                                     const_of(y.dtype, 0), body, finalize));
  return stages;
}

// Conv (explicit or VALID padding, static shapes but the batch). With M
// output and C input channels, taps K, output positions O and images N (with
// G groups, each product below runs per group, batched over the groups):
//   dB = dY summed over all but the channel axis;
//   dW = with one group, kiln:ConvWeightGrad: per tap, dY times the input
//        at that tap summed over images and positions, the wider channel
//        dim's tensor made channels-last; depthwise, the same per channel
//        with both channels-last; with other groups, [Mg, N O] x [N O,
//        Cg K] per group: the input's columns (kiln:Im2Col, [C K, N O])
//        times dY transposed to [N O, Mg] over chunks of the batch (each
//        added to the last), transposed back;
//   dX = at stride 1, where the padding allows, the Conv of dY with W's
//        channels swapped and taps reversed (the convolution strategy's
//        kernels, the weight packed per run); else the transposed weight
//        [C K, M] times dY as [M, N O], summed back onto the input positions
//        (kiln:Col2Im).
Status grad_conv(GradBuilder& b) {
  const Node& n = b.node();
  Value* x = n.input(0);
  Value* w = n.input(1);
  Value* y = n.output(0);
  Value* dy = b.output_grad(0);
  // Static but for the batch dim (-1 in the reshapes below).
  auto dims = [](const Value* v) -> std::optional<std::vector<int64_t>> {
    if (!v->type().has_shape() || v->type().rank() < 3) return std::nullopt;
    std::vector<int64_t> out = {-1};
    const Shape& s = *v->type().shape;
    for (size_t d = 1; d < s.size(); ++d) {
      auto c = s[d].as_const();
      if (!c) return std::nullopt;
      out.push_back(*c);
    }
    return out;
  };
  auto xd = dims(x), yd = dims(y);
  if (!xd || !yd || !w->type().is_static())
    return node_unsupported(n) << "the gradient of a Conv with symbolic shapes other than the batch (not yet)";
  const int64_t groups = n.attr_int("group", 1);
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID")
    return node_unsupported(n) << "the gradient of a Conv with auto_pad " << auto_pad << " (not yet)";
  const std::vector<int64_t> xs = *xd, ws = w->type().static_shape(), ys = *yd;
  const size_t sp = xs.size() - 2;
  std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  std::vector<int64_t> dilations = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  std::vector<int64_t> pads = auto_pad == "VALID" ? std::vector<int64_t>(2 * sp, 0)
                                                  : n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
  std::vector<int64_t> axes = {0};
  for (size_t d = 0; d < sp; ++d) axes.push_back(static_cast<int64_t>(d + 2));
  if (n.num_inputs() > 2 && n.input(2) != nullptr && b.wants(2)) {
    KILN_ASSIGN_OR_RETURN(Value* db, b.reduce_sum(dy, axes, false));
    KILN_RETURN_IF_ERROR(b.set_input_grad(2, db));
  }
  auto ints_attr = [](std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); };
  // Per group g: output channels g Mg .. (g + 1) Mg - 1 read input channels
  // g Cg .. (g + 1) Cg - 1 (W is [M, Cg, K...]); every product below runs
  // per group, as a MatMul batched over the groups.
  const int64_t m = ws[0], c = ws[1], mg = m / groups;
  int64_t taps = 1;
  const int64_t positions = -1;  // N O
  std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  for (size_t d = 0; d < sp; ++d) taps *= ws[d + 2];
  std::map<std::string, Attribute> window = {{"kernel_shape", ints_attr(kernel)},
                                             {"strides", ints_attr(strides)},
                                             {"dilations", ints_attr(dilations)},
                                             {"pads", ints_attr(pads)}};
  // dY as [M, N O] (channels first) and as [N O, M].
  std::vector<int64_t> channels_first = {1, 0}, channels_last = {0};
  for (size_t d = 0; d < sp; ++d) {
    channels_first.push_back(static_cast<int64_t>(d + 2));
    channels_last.push_back(static_cast<int64_t>(d + 2));
  }
  channels_last.push_back(1);
  // Depthwise: one input and one output channel per group.
  const bool depthwise = groups > 1 && c == 1 && mg == 1;
  if (b.wants(1) && (groups == 1 || depthwise)) {
    // The taps' products summed over images and positions in one kernel
    // (kiln:ConvWeightGrad), reading x and dY where they are. One group:
    // the wider of the two channel dims is the vector dim, its tensor made
    // channels-last (one copy), the other read as stored, [K..., M, C] (or
    // [K..., C, M]); depthwise: both channels-last, [K..., C]. Then
    // transposed to W's layout.
    const bool window_on_a = !depthwise && m > c;
    std::map<std::string, Attribute> attrs = window;
    if (depthwise) {
      attrs.emplace("depthwise", Attribute::of_int(1));
    } else {
      attrs.emplace("window", Attribute::of_int(window_on_a ? 1 : 0));
    }
    Value* a = window_on_a ? x : dy;
    if (depthwise) {
      KILN_ASSIGN_OR_RETURN(a, b.add1("Transpose", {dy}, {{"perm", ints_attr(channels_last)}}));
    }
    KILN_ASSIGN_OR_RETURN(Value* lanes, b.add1("Transpose", {window_on_a ? dy : x}, {{"perm", ints_attr(channels_last)}}));
    KILN_ASSIGN_OR_RETURN(std::vector<Value*> taps_first, b.add("ConvWeightGrad", {a, lanes}, attrs, 1, "kiln"));
    const int64_t spi = static_cast<int64_t>(sp);
    // W's channel dims (M, C, or C alone), then the taps.
    std::vector<int64_t> perm = depthwise ? std::vector<int64_t>{spi}
                                : window_on_a ? std::vector<int64_t>{spi + 1, spi}
                                              : std::vector<int64_t>{spi, spi + 1};
    for (int64_t d = 0; d < spi; ++d) perm.push_back(d);
    KILN_ASSIGN_OR_RETURN(Value* dw, b.add1("Transpose", {taps_first[0]}, {{"perm", ints_attr(perm)}}));
    if (depthwise) {
      KILN_ASSIGN_OR_RETURN(dw, b.add1("Reshape", {dw, b.ints(ws)}));
    }
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, dw));
  } else if (b.wants(1)) {
    // Groups: with a static batch, in chunks of images so that the columns
    // take no more memory than dY or dW: the backward's largest temporaries
    // stay the size of activations, each chunk's product added to the
    // last's.
    const std::optional<int64_t> batch = x->type().shape->at(0).as_const();
    int64_t positions_per_image = 1;
    for (size_t d = 2; d < ys.size(); ++d) positions_per_image *= ys[d];
    const int64_t cols_elems = batch ? c * taps * positions_per_image * *batch : 0;
    const int64_t bound = batch ? std::max(m * positions_per_image * *batch, m * c * taps) : 1;
    const int64_t chunks = batch && *batch > 1 ? std::min(*batch, (cols_elems + bound - 1) / bound) : 1;
    const int64_t per = batch ? (*batch + chunks - 1) / chunks : 0;
    Value* dwt = nullptr;
    for (int64_t n0 = 0; n0 == 0 || (batch && n0 < *batch); n0 += per) {
      Value* xc = x;
      Value* dyc = dy;
      if (chunks > 1) {
        const int64_t n1 = std::min(*batch, n0 + per);
        KILN_ASSIGN_OR_RETURN(xc, b.add1("Slice", {x, b.ints({n0}), b.ints({n1}), b.ints({0})}));
        KILN_ASSIGN_OR_RETURN(dyc, b.add1("Slice", {dy, b.ints({n0}), b.ints({n1}), b.ints({0})}));
      }
      KILN_ASSIGN_OR_RETURN(std::vector<Value*> cols, b.add("Im2Col", {xc}, window, 1, "kiln"));
      // Columns [G, Cg K, N O] times dY as [G, N O, Mg], per group; the
      // chunks' products added.
      KILN_ASSIGN_OR_RETURN(Value* cols3, b.add1("Reshape", {cols[0], b.ints({groups, c * taps, positions})}));
      KILN_ASSIGN_OR_RETURN(Value* dyg, b.add1("Reshape", {dyc, b.ints({0, groups, mg, -1})}));
      KILN_ASSIGN_OR_RETURN(Value* dygt, b.add1("Transpose", {dyg}, {{"perm", ints_attr({1, 0, 3, 2})}}));
      KILN_ASSIGN_OR_RETURN(Value* dyg3, b.add1("Reshape", {dygt, b.ints({groups, positions, mg})}));
      KILN_ASSIGN_OR_RETURN(Value* part, b.add1("MatMul", {cols3, dyg3}));
      if (dwt == nullptr) {
        dwt = part;
      } else {
        KILN_ASSIGN_OR_RETURN(dwt, b.add1("Add", {dwt, part}));
      }
      if (chunks == 1) break;
    }
    KILN_ASSIGN_OR_RETURN(Value* dw2, b.add1("Transpose", {dwt}, {{"perm", ints_attr({0, 2, 1})}}));
    KILN_ASSIGN_OR_RETURN(Value* dw, b.add1("Reshape", {dw2, b.ints(ws)}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, dw));
  }
  if (b.wants(0)) {
    // As a stride-1 Conv: output extent X = Y + pb' + pe' - dil (K - 1) with
    // pb' = dil (K - 1) - pb; both pads must be non-negative.
    // A strided depthwise Conv's dY is first spread out with zeros between
    // its elements (stride - 1 after each, Y' = (Y - 1) stride + 1 per dim;
    // trailing ones up to Y stride where the end pad takes them): then the
    // same stride-1 Conv, computing every input position with all its taps,
    // of which about one in stride^d is not zero, but on the depthwise
    // kernels rather than a product per group and kiln:Col2Im.
    const bool spread = depthwise && std::any_of(strides.begin(), strides.end(), [](int64_t v) { return v > 1; });
    bool as_conv = b.opset() >= 10;
    std::vector<int64_t> conv_pads(2 * sp);
    for (size_t d = 0; d < sp; ++d) {
      const int64_t span = dilations[d] * (ws[d + 2] - 1);
      const int64_t extent = spread ? (ys[d + 2] - 1) * strides[d] + 1 : ys[d + 2];
      conv_pads[d] = span - pads[d];
      conv_pads[d + sp] = xs[d + 2] - extent - conv_pads[d] + span;
      as_conv = as_conv && (spread || strides[d] == 1) && conv_pads[d] >= 0 && conv_pads[d + sp] >= 0;
    }
    // The spread's trailing stride - 1 zeros kept where every end pad can
    // take them (no Slice).
    bool trailing = spread;
    for (size_t d = 0; d < sp && trailing; ++d) trailing = conv_pads[d + sp] >= strides[d] - 1;
    if (trailing)
      for (size_t d = 0; d < sp; ++d) conv_pads[d + sp] -= strides[d] - 1;
    Value* dx = nullptr;
    if (as_conv && spread) {
      // [N, M, Y...] -> [N, M, Y1, 1, Y2, 1, ...], zeros after each unit
      // dim, -> [N, M, Y1 s1, Y2 s2, ...], less the trailing zeros unless
      // the end pads took them.
      std::vector<int64_t> units = {0, m}, spread_pads(2 * (2 + 2 * sp), 0), merged = {0, m}, ends;
      for (size_t d = 0; d < sp; ++d) {
        units.push_back(ys[d + 2]);
        units.push_back(1);
        spread_pads[2 + 2 * sp + 3 + 2 * d] = strides[d] - 1;
        merged.push_back(ys[d + 2] * strides[d]);
        ends.push_back((ys[d + 2] - 1) * strides[d] + 1);
      }
      KILN_ASSIGN_OR_RETURN(Value* unit, b.add1("Reshape", {dy, b.ints(units)}));
      KILN_ASSIGN_OR_RETURN(Value* padded, b.add1("Pad", {unit, b.ints(spread_pads)}));
      KILN_ASSIGN_OR_RETURN(dy, b.add1("Reshape", {padded, b.ints(merged)}));
      if (!trailing) {
        std::vector<int64_t> starts(sp, 0), axes;
        for (size_t d = 0; d < sp; ++d) axes.push_back(static_cast<int64_t>(d + 2));
        KILN_ASSIGN_OR_RETURN(dy, b.add1("Slice", {dy, b.ints(starts), b.ints(ends), b.ints(axes)}));
      }
    }
    if (as_conv) {
      std::vector<int64_t> starts(sp, -1), ends(sp, std::numeric_limits<int64_t>::min()), steps(sp, -1), flip_axes;
      for (size_t d = 0; d < sp; ++d) flip_axes.push_back(static_cast<int64_t>(d + 2));
      KILN_ASSIGN_OR_RETURN(Value* flipped,
                            b.add1("Slice", {w, b.ints(starts), b.ints(ends), b.ints(flip_axes), b.ints(steps)}));
      Value* wt = nullptr;
      std::map<std::string, Attribute> attrs = {{"dilations", ints_attr(dilations)}, {"pads", ints_attr(conv_pads)}};
      if (groups == 1) {
        KILN_ASSIGN_OR_RETURN(wt, b.add1("Transpose", {flipped}, {{"perm", ints_attr(channels_first)}}));
      } else {
        // Per group, Mg and Cg swapped: [G, Mg, Cg, K...] -> [G, Cg, Mg, K...] as [C, Mg, K...].
        std::vector<int64_t> split = {groups, mg, c}, swap = {0, 2, 1}, merged = {groups * c, mg};
        for (size_t d = 0; d < sp; ++d) {
          split.push_back(kernel[d]);
          swap.push_back(static_cast<int64_t>(d + 3));
          merged.push_back(kernel[d]);
        }
        KILN_ASSIGN_OR_RETURN(Value* wg, b.add1("Reshape", {flipped, b.ints(split)}));
        KILN_ASSIGN_OR_RETURN(Value* wgt, b.add1("Transpose", {wg}, {{"perm", ints_attr(swap)}}));
        KILN_ASSIGN_OR_RETURN(wt, b.add1("Reshape", {wgt, b.ints(merged)}));
        attrs["group"] = Attribute::of_int(groups);
      }
      KILN_ASSIGN_OR_RETURN(dx, b.add1("Conv", {dy, wt}, attrs));
    } else {
      // Per group: W's block transposed [Cg K, Mg] times dY's [Mg, N O].
      // (One group: 2-D products.)
      auto per_group = [&](std::vector<int64_t> dims) {
        if (groups > 1) dims.insert(dims.begin(), groups);
        return dims;
      };
      const std::vector<int64_t> swap = groups > 1 ? std::vector<int64_t>{0, 2, 1} : std::vector<int64_t>{1, 0};
      KILN_ASSIGN_OR_RETURN(Value* w2, b.add1("Reshape", {w, b.ints(per_group({mg, c * taps}))}));
      KILN_ASSIGN_OR_RETURN(Value* wt2, b.add1("Transpose", {w2}, {{"perm", ints_attr(swap)}}));
      KILN_ASSIGN_OR_RETURN(Value* dyc, b.add1("Transpose", {dy}, {{"perm", ints_attr(channels_first)}}));
      KILN_ASSIGN_OR_RETURN(Value* dyc2, b.add1("Reshape", {dyc, b.ints(per_group({mg, positions}))}));
      KILN_ASSIGN_OR_RETURN(Value* dcols, b.add1("MatMul", {wt2, dyc2}));
      std::vector<int64_t> cols_shape = {groups * c};
      cols_shape.insert(cols_shape.end(), kernel.begin(), kernel.end());
      cols_shape.push_back(-1);  // N
      cols_shape.insert(cols_shape.end(), ys.begin() + 2, ys.end());
      KILN_ASSIGN_OR_RETURN(Value* dcols_nd, b.add1("Reshape", {dcols, b.ints(cols_shape)}));
      std::map<std::string, Attribute> back = window;
      back.emplace("image_shape", ints_attr(std::vector<int64_t>(xs.begin() + 2, xs.end())));
      KILN_ASSIGN_OR_RETURN(std::vector<Value*> out, b.add("Col2Im", {dcols_nd}, back, 1, "kiln"));
      dx = out[0];
    }
    KILN_RETURN_IF_ERROR(b.set_input_grad(0, dx));
  }
  return Status::ok();
}

}  // namespace

void register_conv_ops() {
  OpDef conv;
  conv.name = "Conv";
  conv.infer = infer_conv;
  conv.lower = lower_conv;
  // A Conv marked kiln_onednn (the candidate conv.onednn) runs on oneDNN.
  conv.kernel = onednn::conv_kernel;
  conv.runs_kernel = onednn::runs_conv;
  conv.kernel_fills_outputs = true;
  conv.gradient = grad_conv;
  register_op(std::move(conv));

  OpDef convt;
  convt.name = "ConvTranspose";
  convt.infer = infer_conv_transpose;
  convt.lower = lower_conv_transpose;
  register_op(std::move(convt));
}

}  // namespace kiln::ops
