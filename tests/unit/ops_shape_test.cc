// Shape ops and indexing ops: symbolic shape inference (including the
// Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains exporters emit),
// numerics of the lowered compute definitions against direct references,
// and the runtime kernels (TopK, NonZero, ScatterND, ScatterElements, Range).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <limits>
#include <string>
#include <vector>

#include "ops_test_harness.h"

namespace kiln::ops::testing {
namespace {

// i64 tensors are filled exactly (through doubles, INT64_MAX would not survive).
Tensor i64s(std::vector<int64_t> shape, std::vector<int64_t> v) {
  Tensor t(DType::kInt64, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  for (int64_t i = 0; i < t.numel() && i < static_cast<int64_t>(v.size()); ++i) t.data_as<int64_t>()[i] = v[i];
  return t;
}
Tensor i64vec(std::vector<int64_t> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return i64s({n}, std::move(v));
}

// Test data exactly representable in f32, so that copies compare exactly.
std::vector<double> framp(int64_t n, double lo, double hi, int seed) {
  std::vector<double> v = ramp(n, lo, hi, seed);
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

std::string sym_string(const Value* v) {
  if (!v->sym_value()) return "none";
  std::string s = "[";
  for (size_t i = 0; i < v->sym_value()->size(); ++i) s += (i ? ", " : "") + (*v->sym_value())[i].to_string();
  return s + "]";
}

std::string shape_of(const Value* v) { return v->type().has_shape() ? shape_to_string(*v->type().shape) : "?"; }

// Runs the runtime kernel of node n.
std::vector<Tensor> run_kernel(const Node& n, const std::vector<Tensor>& inputs) {
  const OpDef* def = find_op("", n.op_type());
  if (def == nullptr || !def->kernel) {
    ADD_FAILURE() << "no kernel for " << n.op_type();
    return {};
  }
  auto k = def->kernel(n);
  if (!k.is_ok()) {
    ADD_FAILURE() << k.status().to_string();
    return {};
  }
  std::vector<Tensor> out;
  Status st = (*k)(inputs, out);
  if (!st.is_ok()) {
    ADD_FAILURE() << st.to_string();
    return {};
  }
  return out;
}

// ---- Symbolic inference ---------------------------------------------------------------------------

class ShapeChain : public ::testing::Test {
 protected:
  void SetUp() override {
    g.opsets[""] = 17;
    g.bounds["a"] = Interval{1, std::nullopt};
    g.bounds["b"] = Interval{1, std::nullopt};
  }
  Graph g;
};

TEST_F(ShapeChain, ReshapeToMinusOneGivesProduct) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), var("b")}));
  Node* r = g.add_node("Reshape", {x, g.add_constant("s", i64vec({-1}))}, {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(r->output(0)), "[a*b]");
}

TEST_F(ShapeChain, PyTorchStyleReshapeBackGivesSymbols) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), var("b")}));
  Node* flat = g.add_node("Reshape", {x, g.add_constant("s", i64vec({-1}))}, {"flat"});
  Node* shape = g.add_node("Shape", {x}, {"shp"});
  Node* g0 = g.add_node("Gather", {shape->output(0), g.add_constant("i0", i64s({}, {0}))}, {"d0"});
  Node* g1 = g.add_node("Gather", {shape->output(0), g.add_constant("i1", i64s({}, {-1}))}, {"d1"});
  Value* axes = g.add_constant("ax", i64vec({0}));
  Node* u0 = g.add_node("Unsqueeze", {g0->output(0), axes}, {"u0"});
  Node* u1 = g.add_node("Unsqueeze", {g1->output(0), axes}, {"u1"});
  Node* cat = g.add_node("Concat", {u0->output(0), u1->output(0)}, {"cat"});
  cat->set_attr("axis", Attribute::of_int(0));
  Node* back = g.add_node("Reshape", {flat->output(0), cat->output(0)}, {"y"});
  // Reshape to [a, -1] as well: the -1 cancels to b.
  Node* cat2 = g.add_node("Concat", {u0->output(0), g.add_constant("m1", i64vec({-1}))}, {"cat2"});
  cat2->set_attr("axis", Attribute::of_int(0));
  Node* back2 = g.add_node("Reshape", {flat->output(0), cat2->output(0)}, {"y2"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(shape->output(0)), "[2]");
  EXPECT_EQ(sym_string(shape->output(0)), "[a, b]");
  EXPECT_EQ(sym_string(g1->output(0)), "[b]");
  EXPECT_EQ(sym_string(cat->output(0)), "[a, b]");
  EXPECT_EQ(shape_of(back->output(0)), "[a, b]");
  EXPECT_EQ(shape_of(back2->output(0)), "[a, b]");
}

TEST_F(ShapeChain, ConcatOfSymbolicLengths) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("m")}));
  Value* y = g.add_input("y", tt(DType::kFloat32, {var("n")}));
  Node* c = g.add_node("Concat", {x, y}, {"z"});
  c->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(c->output(0)), "[m + n]");
}

TEST_F(ShapeChain, SliceSymbolic) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), 10, var("b")}));
  int64_t big = std::numeric_limits<int64_t>::max();
  Node* s = g.add_node("Slice",
                       {x, g.add_constant("st", i64vec({1, -3, 0})), g.add_constant("en", i64vec({big, 1000, -1})),
                        g.add_constant("ax", i64vec({0, 1, 2}))},
                       {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(s->output(0)), "[a - 1, 3, b - 1]");
}

TEST_F(ShapeChain, SliceOfShapeKeepsSymValue) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), 3, var("b"), 5}));
  Node* shape = g.add_node("Shape", {x}, {"shp"});
  Node* s = g.add_node("Slice",
                       {shape->output(0), g.add_constant("st", i64vec({-1})), g.add_constant("en", i64vec({0})),
                        g.add_constant("ax", i64vec({0})), g.add_constant("sp", i64vec({-2}))},
                       {"y"});
  Node* part = g.add_node("Shape", {x}, {"shp2"});
  part->set_attr("start", Attribute::of_int(1));
  part->set_attr("end", Attribute::of_int(-1));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(sym_string(s->output(0)), "[5, 3]");
  EXPECT_EQ(sym_string(part->output(0)), "[3, b]");
}

TEST_F(ShapeChain, SqueezeUnsqueezeFlattenTransposeSplit) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), 1, var("b"), 6}));
  Node* sq = g.add_node("Squeeze", {x, g.add_constant("ax", i64vec({1}))}, {"sq"});
  Node* us = g.add_node("Unsqueeze", {sq->output(0), g.add_constant("ax2", i64vec({-1, 0}))}, {"us"});
  Node* fl = g.add_node("Flatten", {x}, {"fl"});
  fl->set_attr("axis", Attribute::of_int(2));
  Node* tr = g.add_node("Transpose", {x}, {"tr"});
  tr->set_attr("perm", Attribute::of_ints({2, 0, 3, 1}));
  Node* sp = g.add_node("Split", {x}, {"s0", "s1", "s2", "s3"});
  sp->set_attr("axis", Attribute::of_int(2));
  sp->set_attr("num_outputs", Attribute::of_int(4));
  Node* sp2 = g.add_node("Split", {x, g.add_constant("sizes", i64vec({2, 4}))}, {"t0", "t1"});
  sp2->set_attr("axis", Attribute::of_int(-1));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(sq->output(0)), "[a, b, 6]");
  EXPECT_EQ(shape_of(us->output(0)), "[1, a, b, 6, 1]");
  EXPECT_EQ(shape_of(fl->output(0)), "[a, 6*b]");
  EXPECT_EQ(shape_of(tr->output(0)), "[b, a, 6, 1]");
  Expr chunk = simplify(floordiv(var("b") + 3, Expr(4)), g.bounds);
  EXPECT_EQ(shape_of(sp->output(0)), "[a, 1, " + chunk.to_string() + ", 6]");
  EXPECT_TRUE(prove_equal((*sp->output(3)->type().shape)[2], var("b") - chunk * 3, g.bounds));
  EXPECT_EQ(shape_of(sp2->output(1)), "[a, 1, b, 4]");
}

// Squeeze without axes drops every dim of size 1. A symbolic dim that may be
// 1 at run time would make the output's rank data-dependent: unsupported (it
// used to be kept, giving [1, 5] where ONNX gives [5] when a = 1). With a
// bound that excludes 1 the dim stays.
TEST_F(ShapeChain, SqueezeWithoutAxesNeedsDimsKnownNotToBeOne) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), 1, 5}));
  g.add_node("Squeeze", {x}, {"sq"});
  Status st = infer(g);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.to_string().find("dim 0 (a) may be 1 at run time"), std::string::npos) << st.to_string();
  Graph h;
  h.bounds["a"] = Interval{2, std::nullopt};
  Value* y = h.add_input("y", tt(DType::kFloat32, {var("a"), 1, 5}));
  Node* sq = h.add_node("Squeeze", {y}, {"sq"});
  ASSERT_TRUE(infer(h).is_ok());
  EXPECT_EQ(shape_of(sq->output(0)), "[a, 5]");
}

TEST_F(ShapeChain, RangeExpandConstantOfShapeFromShapeValues) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), var("b")}));
  Node* shape = g.add_node("Shape", {x}, {"shp"});
  Node* gb = g.add_node("Gather", {shape->output(0), g.add_constant("i1", i64s({}, {1}))}, {"d1"});
  Node* range = g.add_node("Range", {g.add_constant("zero", i64s({}, {0})), gb->output(0), g.add_constant("one", i64s({}, {1}))}, {"r"});
  Node* ex = g.add_node("Expand", {g.add_input("v", tt(DType::kFloat32, {1, 1})), shape->output(0)}, {"e"});
  Node* cs = g.add_node("ConstantOfShape", {shape->output(0)}, {"c"});
  Node* tile = g.add_node("Tile", {x, g.add_constant("rep", i64vec({2, 3}))}, {"t"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(range->output(0)), "[b]");
  EXPECT_EQ(shape_of(ex->output(0)), "[a, b]");
  EXPECT_EQ(shape_of(cs->output(0)), "[a, b]");
  EXPECT_EQ(shape_of(tile->output(0)), "[2*a, 3*b]");
}

TEST_F(ShapeChain, UnknownShapeInputGivesFreshSymbolsOfKnownRank) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("a"), var("b")}));
  Value* s = g.add_input("s", tt(DType::kInt64, {3}));
  Node* r = g.add_node("Reshape", {x, s}, {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_TRUE(r->output(0)->type().has_shape());
  EXPECT_EQ(r->output(0)->type().rank(), 3);
}

TEST_F(ShapeChain, ReshapeElementCountMismatchIsAnError) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 3}));
  g.add_node("Reshape", {x, g.add_constant("s", i64vec({4, 2}))}, {"y"}, "", "bad_reshape");
  Status st = infer(g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("bad_reshape"), std::string::npos) << st.message();
}

TEST_F(ShapeChain, NonZeroAndTopKGetSymbolicDims) {
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 4}));
  Node* nz = g.add_node("NonZero", {x}, {"nz"});
  Node* tk = g.add_node("TopK", {x, g.add_constant("k", i64vec({2}))}, {"v", "i"});
  Value* kin = g.add_input("kin", tt(DType::kInt64, {1}));
  Node* tk2 = g.add_node("TopK", {x, kin}, {"v2", "i2"});
  tk2->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(infer(g).is_ok());
  const Shape& nzs = *nz->output(0)->type().shape;
  EXPECT_EQ(nzs[0].to_string(), "2");
  EXPECT_TRUE(nzs[1].is_var());
  EXPECT_EQ(shape_of(tk->output(0)), "[3, 2]");
  EXPECT_EQ(shape_of(tk->output(1)), "[3, 2]");
  EXPECT_TRUE((*tk2->output(0)->type().shape)[0].is_var());
}

// ---- Numerics of compiled shape ops ----------------------------------------------------------------

TEST(ShapeNumerics, Transpose) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 3, 4}));
  Node* t = g.add_node("Transpose", {x}, {"y"});
  t->set_attr("perm", Attribute::of_ints({2, 0, 1}));
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<double> xv = framp(24, -1, 1, 1);
  auto out = run_node(g, *t, {make_tensor(DType::kFloat32, {2, 3, 4}, xv)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) ref.push_back(xv[(i * 3 + j) * 4 + k]);
  expect_close(out[0], ref, 0, "transpose");
}

// numpy-style reference of one sliced dim.
std::vector<int64_t> slice_positions(int64_t d, int64_t s, int64_t e, int64_t step) {
  if (s < 0) s += d;
  if (e < 0) e += d;
  std::vector<int64_t> pos;
  if (step > 0) {
    s = std::clamp<int64_t>(s, 0, d);
    e = std::clamp<int64_t>(e, 0, d);
    for (int64_t i = s; i < e; i += step) pos.push_back(i);
  } else {
    s = std::clamp<int64_t>(s, 0, d - 1);
    e = std::clamp<int64_t>(e, -1, d - 1);
    for (int64_t i = s; i > e; i += step) pos.push_back(i);
  }
  return pos;
}

void run_slice(std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> steps) {
  SCOPED_TRACE(::testing::Message() << "slice starts " << shape_to_string(starts) << " ends " << shape_to_string(ends)
                                    << " steps " << shape_to_string(steps));
  std::vector<int64_t> xs = {5, 7};
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {5, 7}));
  Tensor st = i64vec(starts), en = i64vec(ends), ax = i64vec({0, 1}), sp = i64vec(steps);
  Node* s = g.add_node("Slice",
                       {x, g.add_constant("st", st), g.add_constant("en", en), g.add_constant("ax", ax),
                        g.add_constant("sp", sp)},
                       {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<int64_t> p0 = slice_positions(5, starts[0], ends[0], steps[0]);
  std::vector<int64_t> p1 = slice_positions(7, starts[1], ends[1], steps[1]);
  ASSERT_EQ(s->output(0)->type().static_shape(),
            (std::vector<int64_t>{static_cast<int64_t>(p0.size()), static_cast<int64_t>(p1.size())}));
  std::vector<double> xv = framp(35, -1, 1, 2);
  auto out = run_node(g, *s, {make_tensor(DType::kFloat32, xs, xv), st, en, ax, sp});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t i : p0)
    for (int64_t j : p1) ref.push_back(xv[i * 7 + j]);
  expect_close(out[0], ref, 0, "slice");
}

TEST(ShapeNumerics, SlicePositiveSteps) { run_slice({1, -5}, {4, 100}, {2, 1}); }
TEST(ShapeNumerics, SliceNegativeSteps) {
  int64_t lo = std::numeric_limits<int64_t>::min();
  run_slice({-1, 5}, {lo, 0}, {-2, -3});
}
TEST(ShapeNumerics, SliceNegativeStepsFromPastEnd) {
  int64_t hi = std::numeric_limits<int64_t>::max();
  run_slice({hi, 100}, {-6, -8}, {-1, -2});
}
TEST(ShapeNumerics, SliceEmpty) { run_slice({3, 0}, {3, 7}, {1, 1}); }

TEST(ShapeNumerics, SliceSymbolicBoundAtRunTime) {
  Graph g;
  g.bounds["n"] = Interval{1, std::nullopt};
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("n"), 3}));
  Tensor st = i64vec({-2}), en = i64vec({0}), ax = i64vec({0}), sp = i64vec({-1});
  Node* s = g.add_node("Slice",
                       {x, g.add_constant("st", st), g.add_constant("en", en), g.add_constant("ax", ax),
                        g.add_constant("sp", sp)},
                       {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  int64_t n = 6;
  std::vector<double> xv = framp(n * 3, -1, 1, 3);
  auto out = run_node(g, *s, {make_tensor(DType::kFloat32, {n, 3}, xv), st, en, ax, sp}, {{"n", n}});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t i : slice_positions(n, -2, 0, -1))
    for (int64_t j = 0; j < 3; ++j) ref.push_back(xv[i * 3 + j]);
  expect_close(out[0], ref, 0, "symbolic slice");
}

TEST(ShapeNumerics, ConcatThreeInputsMiddleAxis) {
  Graph g;
  Value* a = g.add_input("a", tt(DType::kFloat32, {2, 1, 3}));
  Value* b = g.add_input("b", tt(DType::kFloat32, {2, 4, 3}));
  Value* c = g.add_input("c", tt(DType::kFloat32, {2, 2, 3}));
  Node* n = g.add_node("Concat", {a, b, c}, {"y"});
  n->set_attr("axis", Attribute::of_int(-2));
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(n->output(0)->type().static_shape(), (std::vector<int64_t>{2, 7, 3}));
  std::vector<double> av = framp(6, 0, 1, 4), bv = framp(24, 1, 2, 5), cv = framp(12, 2, 3, 6);
  auto out = run_node(g, *n,
                      {make_tensor(DType::kFloat32, {2, 1, 3}, av), make_tensor(DType::kFloat32, {2, 4, 3}, bv),
                       make_tensor(DType::kFloat32, {2, 2, 3}, cv)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t e = 0; e < 3; ++e) ref.push_back(av[i * 3 + e]);
    for (int64_t e = 0; e < 12; ++e) ref.push_back(bv[i * 12 + e]);
    for (int64_t e = 0; e < 6; ++e) ref.push_back(cv[i * 6 + e]);
  }
  expect_close(out[0], ref, 0, "concat");
}

TEST(ShapeNumerics, SplitUneven) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 7}));
  Node* n = g.add_node("Split", {x}, {"a", "b", "c"});
  n->set_attr("axis", Attribute::of_int(1));
  n->set_attr("num_outputs", Attribute::of_int(3));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(n->output(2)), "[2, 1]");
  std::vector<double> xv = framp(14, -1, 1, 7);
  auto out = run_node(g, *n, {make_tensor(DType::kFloat32, {2, 7}, xv)});
  ASSERT_EQ(out.size(), 3u);
  expect_close(out[0], {xv[0], xv[1], xv[2], xv[7], xv[8], xv[9]}, 0, "split 0");
  expect_close(out[1], {xv[3], xv[4], xv[5], xv[10], xv[11], xv[12]}, 0, "split 1");
  expect_close(out[2], {xv[6], xv[13]}, 0, "split 2");
}

// Reference padding of one index; nullopt for the constant fill.
std::optional<int64_t> pad_source(int64_t i, int64_t pb, int64_t d, const std::string& mode) {
  int64_t p = i - pb;
  if (p >= 0 && p < d) return p;
  if (mode == "constant") return std::nullopt;
  if (mode == "edge") return std::clamp<int64_t>(p, 0, d - 1);
  if (mode == "wrap") return ((p % d) + d) % d;
  if (p < 0) return -p;  // reflect
  return 2 * (d - 1) - p;
}

void run_pad(const std::string& mode, std::vector<int64_t> pads) {
  SCOPED_TRACE("pad " + mode + " " + shape_to_string(pads));
  std::vector<int64_t> xs = {3, 4};
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 4}));
  Tensor pt = i64vec(pads);
  Tensor cv = make_tensor(DType::kFloat32, {}, {2.5});
  Node* n = g.add_node("Pad", {x, g.add_constant("p", pt), g.add_input("cv", tt(DType::kFloat32, {}))}, {"y"});
  n->set_attr("mode", Attribute::of_string(mode));
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<int64_t> ys = {3 + pads[0] + pads[2], 4 + pads[1] + pads[3]};
  ASSERT_EQ(n->output(0)->type().static_shape(), ys);
  std::vector<double> xv = framp(12, -1, 1, 8);
  auto out = run_node(g, *n, {make_tensor(DType::kFloat32, xs, xv), pt, cv});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t i = 0; i < ys[0]; ++i)
    for (int64_t j = 0; j < ys[1]; ++j) {
      auto si = pad_source(i, pads[0], 3, mode), sj = pad_source(j, pads[1], 4, mode);
      ref.push_back(si && sj ? xv[*si * 4 + *sj] : 2.5);
    }
  expect_close(out[0], ref, 0, "pad");
}

TEST(ShapeNumerics, PadConstant) { run_pad("constant", {1, 2, 2, 0}); }
TEST(ShapeNumerics, PadConstantWithCrop) { run_pad("constant", {-1, 2, 1, -2}); }
TEST(ShapeNumerics, PadReflect) { run_pad("reflect", {2, 3, 1, 2}); }
TEST(ShapeNumerics, PadEdge) { run_pad("edge", {2, 1, 3, 4}); }
TEST(ShapeNumerics, PadWrap) { run_pad("wrap", {2, 1, 1, 1}); }

TEST(ShapeNumerics, ExpandTileShapeSize) {
  Graph g;
  g.bounds["n"] = Interval{1, std::nullopt};
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 1}));
  Tensor target = i64vec({2, 3, 4});
  Node* ex = g.add_node("Expand", {x, g.add_constant("s", target)}, {"e"});
  Tensor reps = i64vec({2, 3});
  Node* tile = g.add_node("Tile", {x, g.add_constant("r", reps)}, {"t"});
  Value* z = g.add_input("z", tt(DType::kFloat32, {var("n"), 5, 2}));
  Node* shape = g.add_node("Shape", {z}, {"shp"});
  Node* size = g.add_node("Size", {z}, {"sz"});
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<double> xv = {1, 2, 3};
  Tensor xt = make_tensor(DType::kFloat32, {3, 1}, xv);
  auto e = run_node(g, *ex, {xt, target});
  ASSERT_EQ(e.size(), 1u);
  std::vector<double> ref;
  for (int64_t i = 0; i < 24; ++i) ref.push_back(xv[(i / 4) % 3]);
  expect_close(e[0], ref, 0, "expand");
  auto t = run_node(g, *tile, {xt, reps});
  ASSERT_EQ(t.size(), 1u);
  ref.clear();
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 3; ++j) ref.push_back(xv[i % 3]);
  expect_close(t[0], ref, 0, "tile");
  Tensor zt(DType::kFloat32, {7, 5, 2});
  auto s = run_node(g, *shape, {zt}, {{"n", 7}});
  ASSERT_EQ(s.size(), 1u);
  expect_close(s[0], {7, 5, 2}, 0, "shape");
  auto sz = run_node(g, *size, {zt}, {{"n", 7}});
  ASSERT_EQ(sz.size(), 1u);
  expect_close(sz[0], {70}, 0, "size");
}

TEST(ShapeNumerics, ReshapeCopyRangeConstantOfShape) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 6}));
  Tensor s = i64vec({3, -1});
  Node* r = g.add_node("Reshape", {x, g.add_constant("s", s)}, {"y"});
  Tensor a = make_tensor(DType::kFloat32, {}, {1.5}), l = make_tensor(DType::kFloat32, {}, {-2}),
         d = make_tensor(DType::kFloat32, {}, {-0.75});
  Node* range = g.add_node("Range", {g.add_constant("a", a), g.add_constant("l", l), g.add_constant("d", d)}, {"r"});
  Tensor cs = i64vec({2, 3});
  Node* cos = g.add_node("ConstantOfShape", {g.add_constant("cs", cs)}, {"c"});
  Tensor val = make_tensor(DType::kInt32, {1}, {7});
  Attribute va;
  va.kind = Attribute::Kind::kTensor;
  va.t = val;
  cos->set_attr("value", va);
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(r->output(0)), "[3, 4]");
  EXPECT_EQ(shape_of(range->output(0)), "[5]");
  std::vector<double> xv = framp(12, -1, 1, 9);
  auto out = run_node(g, *r, {make_tensor(DType::kFloat32, {2, 6}, xv), s});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0], xv, 0, "reshape copy");
  auto rr = run_node(g, *range, {a, l, d});
  ASSERT_EQ(rr.size(), 1u);
  expect_close(rr[0], {1.5, 0.75, 0, -0.75, -1.5}, 1e-7, "range");
  auto c = run_node(g, *cos, {cs});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].dtype(), DType::kInt32);
  expect_close(c[0], {7, 7, 7, 7, 7, 7}, 0, "constant of shape");
  // The runtime kernel of Range agrees.
  const OpDef* def = find_op("", "Range");
  ASSERT_TRUE(def != nullptr && def->kernel);
  auto k = def->kernel(*range);
  ASSERT_TRUE(k.is_ok());
  std::vector<Tensor> kout;
  ASSERT_TRUE((*k)({i64s({}, {10}), i64s({}, {3}), i64s({}, {-3})}, kout).is_ok());
  ASSERT_EQ(kout.size(), 1u);
  expect_close(kout[0], {10, 7, 4}, 0, "range kernel");
}

// ---- Indexing ---------------------------------------------------------------------------------------

TEST(IndexingNumerics, GatherNegativeIndicesAxis1) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 5, 3}));
  Value* idx = g.add_input("idx", tt(DType::kInt64, {2, 2}));
  Node* n = g.add_node("Gather", {x, idx}, {"y"});
  n->set_attr("axis", Attribute::of_int(1));
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(n->output(0)->type().static_shape(), (std::vector<int64_t>{2, 2, 2, 3}));
  std::vector<double> xv = framp(30, -1, 1, 10);
  std::vector<int64_t> iv = {-1, 0, 3, -5};
  auto out = run_node(g, *n, {make_tensor(DType::kFloat32, {2, 5, 3}, xv), i64s({2, 2}, iv)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t i : iv) {
      if (i < 0) i += 5;
      for (int64_t c = 0; c < 3; ++c) ref.push_back(xv[(a * 5 + i) * 3 + c]);
    }
  expect_close(out[0], ref, 0, "gather");
}

TEST(IndexingNumerics, GatherElementsAndGatherND) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 4}));
  Value* ie = g.add_input("ie", tt(DType::kInt32, {2, 4}));
  Node* ge = g.add_node("GatherElements", {x, ie}, {"ge"});
  ge->set_attr("axis", Attribute::of_int(0));
  Value* ind = g.add_input("ind", tt(DType::kInt64, {2, 2}));
  Node* gnd = g.add_node("GatherND", {x, ind}, {"gnd"});
  Value* ind1 = g.add_input("ind1", tt(DType::kInt64, {3, 1}));
  Node* gnd1 = g.add_node("GatherND", {x, ind1}, {"gnd1"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(gnd->output(0)), "[2]");
  EXPECT_EQ(shape_of(gnd1->output(0)), "[3, 4]");
  std::vector<double> xv = framp(12, -1, 1, 11);
  Tensor xt = make_tensor(DType::kFloat32, {3, 4}, xv);
  std::vector<double> iev = {0, -1, 2, 1, 2, 0, -3, 1};
  auto o1 = run_node(g, *ge, {xt, make_tensor(DType::kInt32, {2, 4}, iev)});
  ASSERT_EQ(o1.size(), 1u);
  std::vector<double> ref;
  for (int64_t e = 0; e < 8; ++e) {
    int64_t r = static_cast<int64_t>(iev[e]);
    if (r < 0) r += 3;
    ref.push_back(xv[r * 4 + e % 4]);
  }
  expect_close(o1[0], ref, 0, "gather_elements");
  auto o2 = run_node(g, *gnd, {xt, i64s({2, 2}, {2, 3, -1, 0})});
  ASSERT_EQ(o2.size(), 1u);
  expect_close(o2[0], {xv[11], xv[8]}, 0, "gather_nd");
  auto o3 = run_node(g, *gnd1, {xt, i64s({3, 1}, {1, 0, -1})});
  ASSERT_EQ(o3.size(), 1u);
  ref.clear();
  for (int64_t r : {1, 0, 2})
    for (int64_t c = 0; c < 4; ++c) ref.push_back(xv[r * 4 + c]);
  expect_close(o3[0], ref, 0, "gather_nd slices");
}

TEST(IndexingNumerics, TriluCumSumOneHot) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 3, 4}));
  Tensor k = i64s({}, {-1});
  Node* lower = g.add_node("Trilu", {x, g.add_constant("k", k)}, {"lo"});
  lower->set_attr("upper", Attribute::of_int(0));
  Node* upper = g.add_node("Trilu", {x}, {"up"});
  Tensor ax = i64s({}, {1});
  Node* cs = g.add_node("CumSum", {x, g.add_constant("ax", ax)}, {"cs"});
  cs->set_attr("exclusive", Attribute::of_int(1));
  cs->set_attr("reverse", Attribute::of_int(1));
  Value* ind = g.add_input("ind", tt(DType::kInt64, {3}));
  Tensor depth = i64s({}, {4});
  Value* vals = g.add_input("vals", tt(DType::kFloat32, {2}));
  Node* oh = g.add_node("OneHot", {ind, g.add_constant("depth", depth), vals}, {"oh"});
  oh->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(oh->output(0)), "[4, 3]");
  std::vector<double> xv = framp(24, -1, 1, 12);
  Tensor xt = make_tensor(DType::kFloat32, {2, 3, 4}, xv);
  auto lo = run_node(g, *lower, {xt, k});
  auto up = run_node(g, *upper, {xt});
  auto c = run_node(g, *cs, {xt, ax});
  ASSERT_EQ(lo.size(), 1u);
  ASSERT_EQ(up.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  std::vector<double> rlo, rup, rcs;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        double v = xv[(b * 3 + i) * 4 + j];
        rlo.push_back(j - i <= -1 ? v : 0);
        rup.push_back(j - i >= 0 ? v : 0);
        double s = 0;
        for (int64_t r = i + 1; r < 3; ++r) s += xv[(b * 3 + r) * 4 + j];
        rcs.push_back(s);
      }
  expect_close(lo[0], rlo, 0, "trilu lower");
  expect_close(up[0], rup, 0, "trilu upper");
  expect_close(c[0], rcs, 1e-6, "cumsum");
  auto o = run_node(g, *oh, {i64s({3}, {1, -1, 7}), depth, make_tensor(DType::kFloat32, {2}, {-1, 5})});
  ASSERT_EQ(o.size(), 1u);
  // Column j is one-hot of index j (-1 wraps to 3; 7 is out of range: all off).
  expect_close(o[0], {-1, -1, -1, 5, -1, -1, -1, -1, -1, -1, 5, -1}, 0, "one_hot");
}

TEST(IndexingNumerics, ResizeNearestAndLinear) {
  std::vector<double> xv = framp(1 * 1 * 3 * 4, 0, 10, 13);
  struct Case {
    std::string mode, coord, nearest;
  };
  for (const Case& c : {Case{"nearest", "asymmetric", "floor"}, Case{"nearest", "half_pixel", "round_prefer_floor"},
                        Case{"linear", "half_pixel", ""}, Case{"linear", "align_corners", ""},
                        Case{"linear", "pytorch_half_pixel", ""}}) {
    SCOPED_TRACE(c.mode + " " + c.coord + " " + c.nearest);
    Graph g;
    Value* x = g.add_input("x", tt(DType::kFloat32, {1, 1, 3, 4}));
    Tensor scales = make_tensor(DType::kFloat32, {4}, {1, 1, 2, 1.5});
    Node* n = g.add_node("Resize", {x, nullptr, g.add_constant("scales", scales)}, {"y"});
    n->set_attr("mode", Attribute::of_string(c.mode));
    n->set_attr("coordinate_transformation_mode", Attribute::of_string(c.coord));
    if (!c.nearest.empty()) n->set_attr("nearest_mode", Attribute::of_string(c.nearest));
    ASSERT_TRUE(infer(g).is_ok());
    ASSERT_EQ(n->output(0)->type().static_shape(), (std::vector<int64_t>{1, 1, 6, 6}));
    auto out = run_node(g, *n, {make_tensor(DType::kFloat32, {1, 1, 3, 4}, xv), Tensor(), scales});
    ASSERT_EQ(out.size(), 1u);
    auto src = [&](int64_t o, int64_t in, int64_t outn, double scale) {
      double x;
      if (c.coord == "asymmetric") {
        x = o / scale;
      } else if (c.coord == "align_corners") {
        x = outn > 1 ? o * (in - 1.0) / (outn - 1.0) : 0;
      } else if (c.coord == "pytorch_half_pixel") {
        x = outn > 1 ? (o + 0.5) / scale - 0.5 : 0;
      } else {
        x = (o + 0.5) / scale - 0.5;
      }
      return x;
    };
    std::vector<double> ref;
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 6; ++j) {
        double yi = src(i, 3, 6, 2), xj = src(j, 4, 6, 1.5);
        if (c.mode == "nearest") {
          auto pick = [&](double v, int64_t in) {
            double r = c.nearest == "floor" ? std::floor(v) : std::ceil(v - 0.5);
            return std::clamp<int64_t>(static_cast<int64_t>(r), 0, in - 1);
          };
          ref.push_back(xv[pick(yi, 3) * 4 + pick(xj, 4)]);
        } else {
          yi = std::clamp(yi, 0.0, 2.0);
          xj = std::clamp(xj, 0.0, 3.0);
          int64_t y0 = static_cast<int64_t>(std::floor(yi)), x0 = static_cast<int64_t>(std::floor(xj));
          int64_t y1 = std::min<int64_t>(y0 + 1, 2), x1 = std::min<int64_t>(x0 + 1, 3);
          double wy = yi - y0, wx = xj - x0;
          ref.push_back((1 - wy) * ((1 - wx) * xv[y0 * 4 + x0] + wx * xv[y0 * 4 + x1]) +
                        wy * ((1 - wx) * xv[y1 * 4 + x0] + wx * xv[y1 * 4 + x1]));
        }
      }
    expect_close(out[0], ref, 1e-5, "resize");
    auto k = run_kernel(*n, {make_tensor(DType::kFloat32, {1, 1, 3, 4}, xv), Tensor(), scales});
    ASSERT_EQ(k.size(), 1u);
    expect_close(k[0], ref, 1e-5, "resize kernel");
  }
}

// ---- Runtime kernels -------------------------------------------------------------------------------

TEST(IndexingKernels, TopKLargestAndSmallestWithTies) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 4}));
  Node* big = g.add_node("TopK", {x, g.add_constant("k", i64vec({3}))}, {"v", "i"});
  Node* small = g.add_node("TopK", {x, g.add_constant("k2", i64vec({2}))}, {"v2", "i2"});
  small->set_attr("largest", Attribute::of_int(0));
  small->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(infer(g).is_ok());
  Tensor xt = make_tensor(DType::kFloat32, {2, 4}, {1, 3, 3, 2, 0, -1, 5, 5});
  auto o = run_kernel(*big, {xt, i64vec({3})});
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].shape(), (std::vector<int64_t>{2, 3}));
  expect_close(o[0], {3, 3, 2, 5, 5, 0}, 0, "topk values");
  expect_close(o[1], {1, 2, 3, 2, 3, 0}, 0, "topk indices");
  auto s = run_kernel(*small, {xt, i64vec({2})});
  ASSERT_EQ(s.size(), 2u);
  expect_close(s[0], {0, -1, 3, 2, 1, 3, 5, 5}, 0, "topk smallest values");
  expect_close(s[1], {1, 1, 0, 0, 0, 0, 1, 1}, 0, "topk smallest indices");
}

TEST(IndexingKernels, NonZero) {
  Graph g;
  Node* n = g.add_node("NonZero", {g.add_input("x", tt(DType::kInt32, {2, 3}))}, {"y"});
  auto o = run_kernel(*n, {make_tensor(DType::kInt32, {2, 3}, {0, 4, 0, -1, 0, 2})});
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].shape(), (std::vector<int64_t>{2, 3}));
  expect_close(o[0], {0, 1, 1, 1, 0, 2}, 0, "nonzero");
}

TEST(IndexingKernels, ScatterNDAndScatterElements) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 2}));
  Node* nd = g.add_node("ScatterND", {x, g.add_input("i", tt(DType::kInt64, {2, 1})), g.add_input("u", tt(DType::kFloat32, {2, 2}))}, {"y"});
  Node* el = g.add_node("ScatterElements",
                        {x, g.add_input("i2", tt(DType::kInt64, {1, 2})), g.add_input("u2", tt(DType::kFloat32, {1, 2}))},
                        {"z"});
  el->set_attr("axis", Attribute::of_int(0));
  el->set_attr("reduction", Attribute::of_string("add"));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_of(nd->output(0)), "[3, 2]");
  Tensor xt = make_tensor(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6});
  auto o = run_kernel(*nd, {xt, i64s({2, 1}, {-1, 0}), make_tensor(DType::kFloat32, {2, 2}, {10, 20, 30, 40})});
  ASSERT_EQ(o.size(), 1u);
  expect_close(o[0], {30, 40, 3, 4, 10, 20}, 0, "scatter_nd");
  auto e = run_kernel(*el, {xt, i64s({1, 2}, {2, -3}), make_tensor(DType::kFloat32, {1, 2}, {100, 200})});
  ASSERT_EQ(e.size(), 1u);
  expect_close(e[0], {1, 202, 3, 4, 105, 6}, 0, "scatter_elements add");
  // The input is not modified.
  expect_close(xt, {1, 2, 3, 4, 5, 6}, 0, "input untouched");
  // Plain scatter over a rank-3 odometer, axis 1 (the offsets walk every dim).
  Graph g3;
  Value* x3 = g3.add_input("x", tt(DType::kFloat32, {2, 3, 2}));
  Node* el3 = g3.add_node("ScatterElements", {x3, g3.add_input("i", tt(DType::kInt64, {2, 1, 2})),
                                               g3.add_input("u", tt(DType::kFloat32, {2, 1, 2}))}, {"z"});
  el3->set_attr("axis", Attribute::of_int(1));
  ASSERT_TRUE(infer(g3).is_ok());
  std::vector<double> base(12, 0);
  auto e3 = run_kernel(*el3, {make_tensor(DType::kFloat32, {2, 3, 2}, base), i64s({2, 1, 2}, {2, 0, 1, -1}),
                              make_tensor(DType::kFloat32, {2, 1, 2}, {1, 2, 3, 4})});
  ASSERT_EQ(e3.size(), 1u);
  expect_close(e3[0], {0, 2, 0, 0, 1, 0, 0, 0, 3, 0, 0, 4}, 0, "scatter_elements rank 3");
  // Indices longer than the data on a non-axis dim would write past the
  // output; updates of another dtype would be read past their end: errors.
  auto longer = try_kernel(*el, {xt, i64s({1, 3}, {0, 0, 0}), make_tensor(DType::kFloat32, {1, 3}, {1, 2, 3})});
  ASSERT_FALSE(longer.is_ok());
  EXPECT_NE(longer.status().message().find("exceed data"), std::string::npos) << longer.status().to_string();
  auto other = try_kernel(*el, {xt, i64s({1, 2}, {0, 0}), make_tensor(DType::kFloat64, {1, 2}, {1, 2})});
  ASSERT_FALSE(other.is_ok());
  EXPECT_NE(other.status().message().find("dtype"), std::string::npos) << other.status().to_string();
}


// Plain ScatterElements copies a row whose indices along the last dim are
// all equal in one piece (a detector's RoI features) and walks any other row
// element by element: against a direct reference, on an axis before the
// last, with indices shorter than the data on the last dim, mixed rows,
// negative and repeated indices (the later write wins, as in row-major order).
TEST(IndexingKernels, ScatterElementsRowsMatchReference) {
  const std::vector<int64_t> ds = {5, 3, 2, 4}, is = {4, 3, 2, 3};
  for (int64_t axis : {0, 1, 2}) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    Graph g;
    const Shape dshape(ds.begin(), ds.end()), ishape(is.begin(), is.end());
    Value* x = g.add_input("x", tt(DType::kFloat32, dshape));
    Node* n = g.add_node("ScatterElements", {x, g.add_input("i", tt(DType::kInt64, ishape)),
                                             g.add_input("u", tt(DType::kFloat32, ishape))}, {"y"});
    n->set_attr("axis", Attribute::of_int(axis));
    ASSERT_TRUE(infer(g).is_ok());
    const int64_t count = 4 * 3 * 2 * 3;
    std::vector<int64_t> idx(count);
    uint32_t state = 7 + static_cast<uint32_t>(axis);
    auto next = [&] { return state = state * 1664525u + 1013904223u; };
    for (int64_t r = 0; r < count / 3; ++r) {
      bool same = r % 3 != 1;  // two rows of three are constant
      int64_t v = static_cast<int64_t>(next() % ds[axis]) - (r % 4 == 0 ? ds[axis] : 0);
      for (int64_t j = 0; j < 3; ++j) idx[r * 3 + j] = same ? v : static_cast<int64_t>(next() % ds[axis]);
    }
    std::vector<double> data = framp(5 * 3 * 2 * 4, -2, 2, 3), upd = framp(count, 10, 20, 4);
    std::vector<double> want = data;
    std::vector<int64_t> pos(4, 0);
    for (int64_t e = 0; e < count; ++e) {
      int64_t r = e;
      for (int k = 3; k >= 0; --k) {
        pos[k] = r % is[k];
        r /= is[k];
      }
      int64_t i = idx[e] < 0 ? idx[e] + ds[axis] : idx[e];
      std::vector<int64_t> d = pos;
      d[axis] = i;
      want[((d[0] * ds[1] + d[1]) * ds[2] + d[2]) * ds[3] + d[3]] = upd[e];
    }
    auto out = run_kernel(*n, {make_tensor(DType::kFloat32, ds, data), i64s(is, idx), make_tensor(DType::kFloat32, is, upd)});
    ASSERT_EQ(out.size(), 1u);
    expect_close(out[0], want, 0, "scatter_elements rows");
  }
}

// Bicubic: the compiled lowering (constant scales) against the runtime kernel
// (the same scales given at run time), and both against a direct reference on
// a 1-D resize.
TEST(IndexingNumerics, ResizeCubicCompiledMatchesKernelAndReference) {
  std::vector<double> xv = framp(1 * 1 * 4 * 5, -3, 3, 21);
  for (bool exclude : {false, true}) {
    for (const char* coord : {"half_pixel", "asymmetric", "align_corners"}) {
      SCOPED_TRACE(std::string(coord) + (exclude ? " exclude_outside" : ""));
      Graph g;
      Value* x = g.add_input("x", tt(DType::kFloat32, {1, 1, 4, 5}));
      Tensor scales = make_tensor(DType::kFloat32, {4}, {1, 1, 1, 1.6});
      Node* n = g.add_node("Resize", {x, nullptr, g.add_constant("scales", scales)}, {"y"});
      n->set_attr("mode", Attribute::of_string("cubic"));
      n->set_attr("coordinate_transformation_mode", Attribute::of_string(coord));
      n->set_attr("cubic_coeff_a", Attribute::of_float(-0.5));
      n->set_attr("exclude_outside", Attribute::of_int(exclude ? 1 : 0));
      ASSERT_TRUE(infer(g).is_ok());
      ASSERT_EQ(n->output(0)->type().static_shape(), (std::vector<int64_t>{1, 1, 4, 8}));
      Tensor xt = make_tensor(DType::kFloat32, {1, 1, 4, 5}, xv);
      auto compiled = run_node(g, *n, {xt, Tensor(), scales});
      ASSERT_EQ(compiled.size(), 1u);
      auto kernel = find_op("", "Resize")->kernel(*n);
      ASSERT_TRUE(kernel.is_ok());
      std::vector<Tensor> ran;
      ASSERT_TRUE((*kernel)({xt, Tensor(), scales}, ran).is_ok());
      ASSERT_EQ(ran[0].shape(), (std::vector<int64_t>{1, 1, 4, 8}));
      // Reference: each row resized along the last axis (5 -> 8, scale 1.6).
      std::vector<double> ref;
      double a = -0.5;
      auto kernel_w = [a](double d) {
        d = std::fabs(d);
        if (d < 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
        if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
        return 0.0;
      };
      for (int r = 0; r < 4; ++r)
        for (int o = 0; o < 8; ++o) {
          double c = std::string(coord) == "asymmetric" ? o / 1.6
                     : std::string(coord) == "align_corners" ? o * 4.0 / (1.6 * 5 - 1)
                                                             : (o + 0.5) / 1.6 - 0.5;
          double f = std::floor(c), acc = 0, total = 0;
          for (int j = -1; j <= 2; ++j) {
            int64_t pos = static_cast<int64_t>(f) + j;
            double w = kernel_w(c - (f + j));
            if (exclude && (pos < 0 || pos >= 5)) w = 0;
            total += w;
            acc += w * xv[r * 5 + std::clamp<int64_t>(pos, 0, 4)];
          }
          ref.push_back(exclude ? acc / total : acc);
        }
      expect_close(compiled[0], ref, 1e-5, "compiled cubic");
      expect_close(ran[0], ref, 1e-5, "kernel cubic");
    }
  }
}

// tf_crop_and_resize (runtime kernel, roi read at run time): along axis 1 of
// [2, 5] with roi [0.25, 1.5] and 3 outputs the source points are 1 + 2.5 o =
// 1, 3.5, 6; the last is past the input (4) and takes extrapolation_value.
TEST(IndexingNumerics, ResizeTfCropAndResizeExtrapolates) {
  Graph g;
  g.opsets[""] = 19;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 5}));
  Value* roi = g.add_input("roi", tt(DType::kFloat32, {2}));
  Value* sizes = g.add_input("sizes", tt(DType::kInt64, {1}));
  Node* n = g.add_node("Resize", {x, roi, nullptr, sizes}, {"y"});
  n->set_attr("mode", Attribute::of_string("linear"));
  n->set_attr("coordinate_transformation_mode", Attribute::of_string("tf_crop_and_resize"));
  n->set_attr("extrapolation_value", Attribute::of_float(-1.0));
  n->set_attr("axes", Attribute::of_ints({1}));
  ASSERT_TRUE(testing::infer(g).is_ok());
  auto kernel = find_op("", "Resize")->kernel(*n);
  ASSERT_TRUE(kernel.is_ok()) << kernel.status().to_string();
  std::vector<Tensor> ran;
  Tensor xt = make_tensor(DType::kFloat32, {2, 5}, {0, 1, 2, 3, 4, 10, 20, 30, 40, 50});
  Status st = (*kernel)({xt, make_tensor(DType::kFloat32, {2}, {0.25, 1.5}), Tensor(),
                         make_tensor(DType::kInt64, {1}, {3})}, ran);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  expect_close(ran[0], {1, 3.5, -1, 20, 45, -1}, 1e-6, "tf_crop_and_resize");
  ran.clear();
  st = (*kernel)({xt, make_tensor(DType::kFloat32, {4}, {0, 0, 1, 1}), Tensor(), make_tensor(DType::kInt64, {1}, {3})},
                 ran);
  EXPECT_FALSE(st.is_ok());  // roi must hold 2 values for one axis
}

// Antialiased downsampling (runtime kernel): per resized axis, the n input
// pixels nearest the source point (ties to the lower index, the input
// edge-replicated), weighted by the triangle or Keys filter stretched by
// 1 / scale and normalized, as the ONNX reference computes it; exclude_outside
// drops the pixels off the input. Separable: rows, then columns.
std::vector<double> antialias_1d(const std::vector<double>& row, double scale, int64_t out, bool cubic,
                                 bool exclude) {
  const int64_t len = static_cast<int64_t>(row.size());
  std::vector<double> res;
  for (int64_t o = 0; o < out; ++o) {
    double x = (static_cast<double>(o) + 0.5) / scale - 0.5;  // half_pixel
    double ratio = x == std::floor(x) ? 1.0 : x - std::floor(x);
    double s = std::min(scale, 1.0), a = -0.75;
    int64_t start = static_cast<int64_t>(std::floor((cubic ? -2.0 : -1.0) / s)) + 1, n = 2 - 2 * start;
    std::vector<double> coef;
    for (int64_t i = start; i < start + n; ++i) {
      double u = std::fabs(s * (static_cast<double>(i) - ratio));
      coef.push_back(cubic ? (u <= 1 ? (a + 2) * u * u * u - (a + 3) * u * u + 1
                                     : u < 2 ? a * u * u * u - 5 * a * u * u + 8 * a * u - 4 * a : 0.0)
                           : std::max(0.0, 1 - u));
    }
    // The n nearest indices of the edge-padded row (pad ceil(n / 2)).
    int64_t pad = (n + 1) / 2;
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < len + 2 * pad; ++i) idx.push_back(i);
    double xp = x + static_cast<double>(pad);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t p, int64_t q) {
      return std::fabs(xp - static_cast<double>(p)) < std::fabs(xp - static_cast<double>(q));
    });
    idx.resize(static_cast<size_t>(n));
    std::sort(idx.begin(), idx.end());
    double total = 0, acc = 0;
    for (int64_t j = 0; j < n; ++j) {
      int64_t pos = idx[static_cast<size_t>(j)] - pad;
      if (exclude && (pos < 0 || pos >= len)) coef[static_cast<size_t>(j)] = 0;
      total += coef[static_cast<size_t>(j)];
    }
    for (int64_t j = 0; j < n; ++j) {
      int64_t pos = std::clamp<int64_t>(idx[static_cast<size_t>(j)] - pad, 0, len - 1);
      acc += coef[static_cast<size_t>(j)] / total * row[static_cast<size_t>(pos)];
    }
    res.push_back(acc);
  }
  return res;
}

TEST(IndexingNumerics, ResizeAntialiasMatchesTheReferenceFilters) {
  const int64_t h = 9, w = 13;
  std::vector<double> xv;
  for (int64_t i = 0; i < h * w; ++i) xv.push_back(std::sin(0.7 * static_cast<double>(i)) * 3 + 0.1 * static_cast<double>(i % 5));
  for (const char* mode : {"linear", "cubic"})
    for (int exclude : {0, 1})
      for (auto [sh, sw] : {std::pair<double, double>{0.6, 0.3}, {0.5, 0.75}, {1.0, 0.25}}) {
        SCOPED_TRACE(std::string(mode) + " exclude " + std::to_string(exclude) + " scales " + std::to_string(sh) + "," +
                     std::to_string(sw));
        Graph g;
        g.opsets[""] = 18;
        Value* x = g.add_input("x", tt(DType::kFloat32, {1, 1, h, w}));
        Tensor scales = make_tensor(DType::kFloat32, {4}, {1, 1, sh, sw});
        Node* n = g.add_node("Resize", {x, nullptr, g.add_constant("scales", scales)}, {"y"});
        n->set_attr("mode", Attribute::of_string(mode));
        n->set_attr("antialias", Attribute::of_int(1));
        n->set_attr("exclude_outside", Attribute::of_int(exclude));
        ASSERT_TRUE(infer(g).is_ok());
        auto k = run_kernel(*n, {make_tensor(DType::kFloat32, {1, 1, h, w}, xv), Tensor(), scales});
        ASSERT_EQ(k.size(), 1u);
        int64_t oh = static_cast<int64_t>(std::floor(static_cast<double>(h) * sh));
        int64_t ow = static_cast<int64_t>(std::floor(static_cast<double>(w) * sw));
        ASSERT_EQ(k[0].shape(), (std::vector<int64_t>{1, 1, oh, ow}));
        bool cubic = std::string(mode) == "cubic";
        std::vector<std::vector<double>> cols(static_cast<size_t>(w));  // each column resized along H
        for (int64_t c = 0; c < w; ++c) {
          std::vector<double> col;
          for (int64_t r = 0; r < h; ++r) col.push_back(xv[static_cast<size_t>(r * w + c)]);
          cols[static_cast<size_t>(c)] = sh == 1.0 ? col : antialias_1d(col, sh, oh, cubic, exclude != 0);
        }
        std::vector<double> want;
        for (int64_t r = 0; r < oh; ++r) {
          std::vector<double> row;
          for (int64_t c = 0; c < w; ++c) row.push_back(cols[static_cast<size_t>(c)][static_cast<size_t>(r)]);
          for (double v : antialias_1d(row, sw, ow, cubic, exclude != 0)) want.push_back(v);
        }
        expect_close(k[0], want, 1e-5, "antialias");
      }
}

// The runtime kernel's plane loop (f32, only the last two dims resized)
// gives what its general loop gives (f64, the same values): every mode.
TEST(IndexingNumerics, ResizePlanesMatchTheGeneralLoop) {
  const int64_t h = 7, w = 11;
  std::vector<double> xv;
  for (int64_t i = 0; i < 2 * 3 * h * w; ++i) xv.push_back(static_cast<float>(std::cos(0.37 * static_cast<double>(i)) * 5));
  // The last case shrinks the channel dim 3 -> 2 with nearest/asymmetric taps
  // that map 0 -> 0 and 1 -> 1: not a plane copy (the plane loop must not take it).
  for (const char* mode : {"nearest", "linear", "cubic"})
    for (auto [sc, sh, sw] : {std::tuple<double, double, double>{1.0, 2.0, 0.5}, {1.0, 0.7, 1.6}, {2.0 / 3, 1.0, 1.0}}) {
      SCOPED_TRACE(std::string(mode) + " " + std::to_string(sc) + "," + std::to_string(sh) + "," + std::to_string(sw));
      std::vector<Tensor> outs;
      for (DType dt : {DType::kFloat32, DType::kFloat64}) {
        Graph g;
        g.opsets[""] = 18;
        Value* x = g.add_input("x", tt(dt, {2, 3, h, w}));
        Tensor scales = make_tensor(DType::kFloat32, {4}, {1, sc, sh, sw});
        Node* n = g.add_node("Resize", {x, nullptr, g.add_constant("scales", scales)}, {"y"});
        n->set_attr("mode", Attribute::of_string(mode));
        n->set_attr("coordinate_transformation_mode", Attribute::of_string("asymmetric"));
        ASSERT_TRUE(infer(g).is_ok());
        auto k = run_kernel(*n, {make_tensor(dt, {2, 3, h, w}, xv), Tensor(), scales});
        ASSERT_EQ(k.size(), 1u);
        outs.push_back(k[0]);
      }
      ASSERT_EQ(outs[0].shape(), outs[1].shape());
      for (int64_t i = 0; i < outs[0].numel(); ++i)
        ASSERT_EQ(outs[0].data_as<float>()[i], static_cast<float>(outs[1].data_as<double>()[i])) << "element " << i;
      if (sc != 1.0 && std::string(mode) == "nearest") {
        // Output channel 1 is input channel 1 (asymmetric: 1 / (2/3) = 1.5 -> 1).
        const int64_t oh = outs[0].shape()[2], ow = outs[0].shape()[3];
        ASSERT_EQ(outs[0].shape()[1], 2);
        EXPECT_EQ(outs[0].data_as<float>()[oh * ow], static_cast<float>(xv[static_cast<size_t>(h * w)]));
      }
    }
}

TEST(IndexingNumerics, ResizeAlignCornersUsesFractionalOutputWidth) {
  // ONNX test_resize_downsample_scales_linear_align_corners: width 4 * 0.6 = 2.4
  // (not the integer 2) sets the sampling step.
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 1, 2, 4}));
  Tensor scales = make_tensor(DType::kFloat32, {4}, {1, 1, 0.6, 0.6});
  Node* n = g.add_node("Resize", {x, nullptr, g.add_constant("scales", scales)}, {"y"});
  n->set_attr("mode", Attribute::of_string("linear"));
  n->set_attr("coordinate_transformation_mode", Attribute::of_string("align_corners"));
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(n->output(0)->type().static_shape(), (std::vector<int64_t>{1, 1, 1, 2}));
  Tensor xt = make_tensor(DType::kFloat32, {1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto out = run_node(g, *n, {xt, Tensor(), scales});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0], {1, 3.142857}, 1e-6, "lowered");
  auto k = run_kernel(*n, {xt, Tensor(), scales});
  ASSERT_EQ(k.size(), 1u);
  expect_close(k[0], {1, 3.142857}, 1e-6, "kernel");
}

// The runtime kernels of ops that also lower (used when shape-like inputs are
// only known at run time) agree with the lowerings.
void expect_kernel_matches_lowering(const Graph& g, const Node& n, const std::vector<Tensor>& inputs) {
  SCOPED_TRACE(n.op_type());
  auto lowered = run_node(g, n, inputs);
  auto kernel = run_kernel(n, inputs);
  ASSERT_EQ(lowered.size(), n.num_outputs());
  ASSERT_EQ(kernel.size(), n.num_outputs());
  for (size_t i = 0; i < lowered.size(); ++i) {
    EXPECT_EQ(kernel[i].shape(), lowered[i].shape()) << "output " << i;
    EXPECT_EQ(kernel[i].dtype(), lowered[i].dtype()) << "output " << i;
    if (kernel[i].shape() == lowered[i].shape()) expect_close(kernel[i], to_vector(lowered[i]), 1e-6, "kernel");
  }
}

TEST(ShapeKernels, AgreeWithLowerings) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 4}));
  Tensor xt = make_tensor(DType::kFloat32, {3, 4}, framp(12, -1, 1, 20));
  int64_t lo = std::numeric_limits<int64_t>::min();
  Tensor st = i64vec({-1, 3}), en = i64vec({lo, 0}), ax = i64vec({0, 1}), sp = i64vec({-2, -1});
  Node* slice = g.add_node("Slice", {x, g.add_constant("st", st), g.add_constant("en", en), g.add_constant("ax", ax),
                                     g.add_constant("sp", sp)}, {"slice"});
  Tensor pads = i64vec({2, 1, 1, 3});
  std::vector<Node*> pad_nodes;
  for (std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    Node* p = g.add_node("Pad", {x, g.add_constant("pads_" + mode, pads)}, {"pad_" + mode});
    p->set_attr("mode", Attribute::of_string(mode));
    pad_nodes.push_back(p);
  }
  Tensor sizes = i64vec({1, 3});
  Node* split = g.add_node("Split", {x, g.add_constant("sizes", sizes)}, {"s0", "s1"});
  split->set_attr("axis", Attribute::of_int(1));
  Tensor target = i64vec({2, 3, 1});
  Node* expand = g.add_node("Expand", {x, g.add_constant("target", target)}, {"ex"});
  Tensor reps = i64vec({2, 1});
  Node* tile = g.add_node("Tile", {x, g.add_constant("reps", reps)}, {"tile"});
  Tensor cs_shape = i64vec({2, 2});
  Node* cos = g.add_node("ConstantOfShape", {g.add_constant("cs", cs_shape)}, {"cos"});
  Tensor axis = i64s({}, {-1});
  Node* cumsum = g.add_node("CumSum", {x, g.add_constant("axis", axis)}, {"cumsum"});
  cumsum->set_attr("reverse", Attribute::of_int(1));
  Value* ind = g.add_input("ind", tt(DType::kInt64, {2, 2}));
  Tensor depth = i64s({}, {3});
  Value* vals = g.add_input("vals", tt(DType::kFloat32, {2}));
  Node* oh = g.add_node("OneHot", {ind, g.add_constant("depth", depth), vals}, {"oh"});
  oh->set_attr("axis", Attribute::of_int(1));
  ASSERT_TRUE(infer(g).is_ok());
  expect_kernel_matches_lowering(g, *slice, {xt, st, en, ax, sp});
  for (Node* p : pad_nodes) expect_kernel_matches_lowering(g, *p, {xt, pads});
  expect_kernel_matches_lowering(g, *split, {xt, sizes});
  expect_kernel_matches_lowering(g, *expand, {xt, target});
  expect_kernel_matches_lowering(g, *tile, {xt, reps});
  expect_kernel_matches_lowering(g, *cos, {cs_shape});
  expect_kernel_matches_lowering(g, *cumsum, {xt, axis});
  expect_kernel_matches_lowering(g, *oh, {i64s({2, 2}, {0, -1, 5, 2}), depth, make_tensor(DType::kFloat32, {2}, {0, 1})});
}

// The Pad kernel copies runs of each output row: rank 3, pads and crops on
// every axis, all four modes, against the lowering.
TEST(ShapeKernels, PadRunsAgreeWithLoweringInThreeDims) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {3, 4, 6}));
  Tensor xt = make_tensor(DType::kFloat32, {3, 4, 6}, framp(72, -1, 1, 40));
  std::vector<std::pair<Node*, Tensor>> cases;
  for (std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    for (std::vector<int64_t> pv : {std::vector<int64_t>{1, 2, 3, 2, 0, 4}, std::vector<int64_t>{-1, 1, -2, 0, 2, 1}}) {
      Tensor pads = i64vec(pv);
      std::string name = mode + std::to_string(cases.size());
      Node* p = g.add_node("Pad", {x, g.add_constant("pads_" + name, pads)}, {"pad_" + name});
      p->set_attr("mode", Attribute::of_string(mode));
      cases.emplace_back(p, pads);
    }
  }
  ASSERT_TRUE(infer(g).is_ok());
  for (auto& [p, pads] : cases) expect_kernel_matches_lowering(g, *p, {xt, pads});
}

// Bounds known only at run time in sign (Faster R-CNN's anchor counts) and
// split sizes that cannot be proven to tile a data-dependent axis (a traced
// split [1]) leave the output dims data-dependent: the runtime kernels take
// the values and check them, where inference used to refuse the model.
TEST(ShapeKernels, UnprovableBoundsAndSplitsRunTheirKernels) {
  Graph g;
  g.opsets[""] = 13;
  g.bounds["n"] = Interval{1, std::nullopt};
  g.bounds["m"] = Interval{0, std::nullopt};
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("n")}));
  Value* shape = g.add_node("Shape", {x}, {"shape"})->output(0);
  Value* five = g.add_constant("five", make_tensor(DType::kInt64, {1}, {5}));
  Value* end = g.add_node("Sub", {shape, five}, {"end"})->output(0);
  Value* zero = g.add_constant("zero", make_tensor(DType::kInt64, {1}, {0}));
  Node* slice = g.add_node("Slice", {x, zero, end}, {"y"});
  Value* z = g.add_input("z", tt(DType::kFloat32, {var("m"), 2}));
  Node* split = g.add_node("Split", {z, g.add_constant("one", make_tensor(DType::kInt64, {1}, {1}))}, {"part"});
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(slice->output(0)->type().rank(), 1);
  EXPECT_TRUE((*slice->output(0)->type().shape)[0].is_var());  // data-dependent: n - 5 may be negative
  EXPECT_TRUE((*split->output(0)->type().shape)[0].is_var());
  auto y = run_kernel(*slice, {make_tensor(DType::kFloat32, {8}, framp(8, 0, 1, 3)), make_tensor(DType::kInt64, {1}, {0}),
                               make_tensor(DType::kInt64, {1}, {3})});
  EXPECT_EQ(y.at(0).shape(), (std::vector<int64_t>{3}));
  auto part = run_kernel(*split, {make_tensor(DType::kFloat32, {1, 2}, {4, 5}), make_tensor(DType::kInt64, {1}, {1})});
  EXPECT_EQ(part.at(0).shape(), (std::vector<int64_t>{1, 2}));
  auto bad = try_kernel(*split, {make_tensor(DType::kFloat32, {2, 2}, {4, 5, 6, 7}), make_tensor(DType::kInt64, {1}, {1})});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("split sizes do not match"), std::string::npos) << bad.status().to_string();
}

TEST(ShapeKernels, RuntimeShapeInputsGiveDataDependentDims) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {4, 5}));
  Value* starts = g.add_input("starts", tt(DType::kInt64, {1}));
  Value* ends = g.add_input("ends", tt(DType::kInt64, {1}));
  Node* slice = g.add_node("Slice", {x, starts, ends}, {"y"});
  Value* axes = g.add_input("axes", tt(DType::kInt64, {1}));
  Node* us = g.add_node("Unsqueeze", {x, axes}, {"u"});
  Node* sq = g.add_node("Squeeze", {us->output(0), axes}, {"s"});
  Value* shape = g.add_input("shape", tt(DType::kInt64, {3}));
  Node* rs = g.add_node("Reshape", {x, shape}, {"r"});
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(slice->output(0)->type().rank(), 2);
  EXPECT_TRUE((*slice->output(0)->type().shape)[0].is_var());
  EXPECT_EQ(us->output(0)->type().rank(), 3);
  EXPECT_EQ(sq->output(0)->type().rank(), 2);
  EXPECT_EQ(rs->output(0)->type().rank(), 3);
  Tensor xt = make_tensor(DType::kFloat32, {4, 5}, framp(20, -1, 1, 21));
  auto y = run_kernel(*slice, {xt, i64vec({1}), i64vec({-1})});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{2, 5}));
  std::vector<double> xv = to_vector(xt);
  expect_close(y[0], std::vector<double>(xv.begin() + 5, xv.begin() + 15), 0, "runtime slice");
  auto u = run_kernel(*us, {xt, i64vec({-1})});
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].shape(), (std::vector<int64_t>{4, 5, 1}));
  auto r = run_kernel(*rs, {xt, i64vec({2, 0, -1})});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].shape(), (std::vector<int64_t>{2, 5, 2}));
  expect_close(r[0], xv, 0, "runtime reshape");
}
}  // namespace
}  // namespace kiln::ops::testing
