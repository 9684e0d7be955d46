// The default schedules (register-tiled reductions, materialized padding,
// overlapping tail tiles) against the naive reference schedule, through the
// whole pipeline, on convolution and matmul shapes with awkward sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "driver/compile.h"
#include "ops/registry.h"
#include "strategy/strategy.h"
#include "runtime/vm.h"
#include "tir/schedule.h"

namespace kiln::driver {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

Attribute ints_attr(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::kInts;
  a.ints = std::move(v);
  return a;
}

Attribute int_attr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}

struct ConvCase {
  int64_t n, cin, cout, h, w, kh, kw, stride, group, dilation;
  std::vector<int64_t> pads;  // begin h, begin w, end h, end w
  bool bias;
};

std::unique_ptr<Graph> conv_graph(const ConvCase& c, const Tensor& w, const Tensor& b) {
  auto g = std::make_unique<Graph>();
  g->source = "conv";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{c.n, c.cin, c.h, c.w}});
  std::vector<Value*> ins = {x, g->add_constant("w", w)};
  if (c.bias) ins.push_back(g->add_constant("b", b));
  Node* conv = g->add_node("Conv", ins, {"y"});
  conv->set_attr("kernel_shape", ints_attr({c.kh, c.kw}));
  conv->set_attr("strides", ints_attr({c.stride, c.stride}));
  conv->set_attr("dilations", ints_attr({c.dilation, c.dilation}));
  conv->set_attr("pads", ints_attr(c.pads));
  conv->set_attr("group", int_attr(c.group));
  g->set_outputs({conv->output(0)});
  return g;
}

std::unique_ptr<Graph> matmul_graph(std::vector<int64_t> a_shape, const Tensor& b) {
  auto g = std::make_unique<Graph>();
  g->source = "matmul";
  g->opsets[""] = 17;
  Shape s(a_shape.begin(), a_shape.end());
  Value* a = g->add_input("a", TensorType{DType::kFloat32, s});
  Node* mm = g->add_node("MatMul", {a, g->add_constant("b", b)}, {"y"});
  g->set_outputs({mm->output(0)});
  return g;
}

Tensor run(std::unique_ptr<Graph> g, bool naive, int threads, const Tensor& x) {
  CompileOptions opts;
  opts.naive = naive;
  opts.threads = threads;
  auto compiled = compile_graph(std::move(g), opts);
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  if (!compiled.is_ok()) return Tensor();
  runtime::VM vm(compiled->program, threads);
  auto out = vm.run({x});
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  if (!out.is_ok()) return Tensor();
  return (*out)[0];
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    float g = got.data_as<float>()[i], w = want.data_as<float>()[i];
    ASSERT_NEAR(g, w, 1e-4 + 1e-4 * std::fabs(w)) << what << ", element " << i;
  }
}

TEST(DefaultSchedules, ConvMatchesNaive) {
  const std::vector<ConvCase> cases = {
      {1, 3, 17, 33, 33, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true},
      {2, 4, 8, 17, 9, 3, 3, 2, 1, 1, {1, 1, 1, 1}, false},
      {1, 8, 8, 13, 31, 3, 3, 1, 8, 1, {1, 1, 1, 1}, true},   // depthwise
      {1, 6, 9, 20, 17, 3, 3, 1, 3, 2, {2, 2, 2, 2}, true},   // groups, dilation
      {1, 5, 7, 1, 1, 1, 1, 1, 1, 1, {0, 0, 0, 0}, true},     // 1x1 on 1x1
      {1, 16, 33, 7, 7, 1, 1, 1, 1, 1, {0, 0, 0, 0}, false},  // pointwise, small plane
      {1, 3, 16, 19, 40, 5, 5, 2, 1, 1, {2, 2, 2, 2}, true},  // stride 2, pad 2
      {1, 4, 5, 18, 35, 3, 2, 1, 1, 1, {0, 1, 2, 0}, true},   // asymmetric pads
      {1, 32, 32, 15, 15, 3, 3, 2, 32, 1, {1, 1, 1, 1}, true},  // depthwise, stride 2
      {1, 7, 3, 9, 64, 3, 3, 1, 1, 1, {0, 0, 0, 0}, false},   // no padding, divisible width
      // Packed weights [I, KH, KW, O], vectorized along output channels:
      {1, 16, 17, 7, 7, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true},    // 7x7, one 16-lane tail channel
      {1, 8, 33, 7, 7, 3, 3, 1, 1, 1, {1, 1, 1, 1}, false},    // 7x7, 33 channels
      {2, 5, 20, 5, 6, 3, 3, 1, 1, 2, {2, 2, 2, 2}, true},     // dilation 2, batch 2, 6 wide
      {1, 12, 32, 14, 14, 3, 3, 2, 1, 1, {1, 1, 1, 1}, true},  // stride 2 to 7x7
      {1, 9, 17, 14, 15, 1, 1, 2, 1, 1, {0, 0, 0, 0}, true},   // 1x1 stride 2 to 7x8
      {1, 6, 40, 28, 28, 3, 3, 2, 1, 1, {1, 0, 1, 2}, true},   // stride 2, asymmetric pads, 14x14
      {1, 3, 18, 25, 25, 3, 3, 2, 1, 1, {1, 1, 1, 1}, true},   // stride 2, 13 rows (overlapping row tiles)
      {1, 4, 5, 6, 6, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true},      // packed, fewer channels than lanes
      {1, 24, 48, 2, 3, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true},    // tiny plane
      {1, 16, 24, 14, 14, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true},  // 14x14 stride 1: not packed
  };
  uint32_t seed = 10;
  for (const ConvCase& c : cases) {
    std::string what = "conv cin " + std::to_string(c.cin) + " cout " + std::to_string(c.cout) + " " +
                       std::to_string(c.h) + "x" + std::to_string(c.w) + " stride " + std::to_string(c.stride) +
                       " group " + std::to_string(c.group) + " dilation " + std::to_string(c.dilation);
    Tensor w = random_tensor({c.cout, c.cin / c.group, c.kh, c.kw}, seed++);
    Tensor b = random_tensor({c.cout}, seed++);
    Tensor x = random_tensor({c.n, c.cin, c.h, c.w}, seed++);
    Tensor want = run(conv_graph(c, w, b), true, 1, x);
    for (int threads : {1, 2}) {
      Tensor got = run(conv_graph(c, w, b), false, threads, x);
      expect_close(got, want, what + " threads " + std::to_string(threads));
    }
  }
}

TEST(DefaultSchedules, MatMulMatchesNaive) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{1, 1}, {1, 1}},      {{3, 17}, {17, 33}},   {{17, 33}, {33, 3}},     {{33, 64}, {64, 100}},
      {{128, 96}, {96, 50}}, {{9, 5}, {5, 16}},     {{2, 5, 17}, {17, 33}},  {{1, 40}, {40, 47}},
      {{8, 3}, {3, 8}},      {{20, 20}, {20, 31}},
  };
  uint32_t seed = 100;
  for (const auto& [as, bs] : cases) {
    std::string what = "matmul a " + std::to_string(as.front()) + "x" + std::to_string(as.back()) + " b " +
                       std::to_string(bs.front()) + "x" + std::to_string(bs.back());
    Tensor b = random_tensor(bs, seed++);
    Tensor a = random_tensor(as, seed++);
    Tensor want = run(matmul_graph(as, b), true, 1, a);
    for (int threads : {1, 2}) {
      Tensor got = run(matmul_graph(as, b), false, threads, a);
      expect_close(got, want, what + " threads " + std::to_string(threads));
    }
  }
}

// The default schedule of a matmul is register tiled: an 8 x 16 accumulator
// tile with overlapping tail tiles, the rows unrolled and the columns vectorized.
// A symbolic batch is usually 1 at run time: the parallel loop is one with a
// known count of at least 2 when there is one (GPT-2 ran on one core at
// batch 1 before), for reductions and for elementwise stages.
TEST(DefaultSchedules, ParallelPrefersKnownLargeLoopOverSymbolicBatch) {
  Expr b = var("b");
  tir::KernelDef mm;
  mm.name = "mm";
  mm.params = {{"A", DType::kFloat32, {b, Expr(20), Expr(9)}},
               {"B", DType::kFloat32, {Expr(9), Expr(64)}},
               {"C", DType::kFloat32, {b, Expr(20), Expr(64)}}};
  mm.num_inputs = 2;
  tir::ComputeDef c;
  c.name = "C";
  c.axes = {"n", "i", "j"};
  c.shape = {b, Expr(20), Expr(64)};
  c.reduce_axes = {"k"};
  c.reduce_extents = {Expr(9)};
  c.combiner = tir::Combiner::kSum;
  c.body = load("A", 0, DType::kFloat32, {var("n"), var("i"), var("k")}) *
           load("B", 1, DType::kFloat32, {var("k"), var("j")});
  mm.stages.push_back(c);
  std::string s = tir::default_schedule(mm).to_string();
  EXPECT_NE(s.find("parallel(C, j.o)"), std::string::npos) << s;

  tir::KernelDef ew;
  ew.name = "ew";
  ew.params = {{"X", DType::kFloat32, {b, Expr(7), Expr(32)}}, {"Y", DType::kFloat32, {b, Expr(7), Expr(32)}}};
  ew.num_inputs = 1;
  tir::ComputeDef e;
  e.name = "Y";
  e.axes = {"n", "i", "j"};
  e.shape = {b, Expr(7), Expr(32)};
  e.body = load("X", 0, DType::kFloat32, {var("n"), var("i"), var("j")}) * float_imm(2.0);
  ew.stages.push_back(e);
  std::string t = tir::default_schedule(ew).to_string();
  EXPECT_NE(t.find("parallel(Y, i)"), std::string::npos) << t;
}

TEST(DefaultSchedules, MatMulIsRegisterTiled) {
  tir::KernelDef k;
  k.name = "mm";
  k.params = {{"A", DType::kFloat32, {Expr(20), Expr(9)}},
              {"B", DType::kFloat32, {Expr(9), Expr(40)}},
              {"C", DType::kFloat32, {Expr(20), Expr(40)}}};
  k.num_inputs = 2;
  tir::ComputeDef c;
  c.name = "C";
  c.axes = {"i", "j"};
  c.shape = {Expr(20), Expr(40)};
  c.reduce_axes = {"k"};
  c.reduce_extents = {Expr(9)};
  c.combiner = tir::Combiner::kSum;
  c.body = load("A", 0, DType::kFloat32, {var("i"), var("k")}) *
           load("B", 1, DType::kFloat32, {var("k"), var("j")});
  k.stages.push_back(c);
  std::string s = tir::default_schedule(k).to_string();
  EXPECT_NE(s.find("split_overlap(C, i, 8)"), std::string::npos) << s;
  EXPECT_NE(s.find("split_overlap(C, j, 16)"), std::string::npos) << s;
  // Column panels outermost (one K x 16 panel of B stays cached for every row tile).
  EXPECT_NE(s.find("reorder(C, j.o, i.o, i.i, j.i)"), std::string::npos) << s;
  EXPECT_NE(s.find("cache_write(C, i.o)"), std::string::npos) << s;
  EXPECT_NE(s.find("unroll(C, i.i)"), std::string::npos) << s;
  EXPECT_NE(s.find("vectorize(C, j.i)"), std::string::npos) << s;
  auto reparsed = tir::parse_schedule(s);
  ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string();
  EXPECT_TRUE(tir::lower(k, *reparsed).is_ok());
}

// A reduction with no operand the row tile reuses (a 3x3 stride-2 max pool:
// every load moves with the rows) keeps its tiles row-major, so the input
// streams through once; a matmul (above) walks column panels outermost.
TEST(DefaultSchedules, PoolingTilesStayRowMajor) {
  tir::KernelDef k;
  k.name = "pool";
  k.params = {{"X", DType::kFloat32, {Expr(8), Expr(41), Expr(41)}}, {"Y", DType::kFloat32, {Expr(8), Expr(20), Expr(20)}}};
  k.num_inputs = 1;
  tir::ComputeDef c;
  c.name = "Y";
  c.axes = {"c", "i", "j"};
  c.shape = {Expr(8), Expr(20), Expr(20)};
  c.reduce_axes = {"u", "v"};
  c.reduce_extents = {Expr(3), Expr(3)};
  c.combiner = tir::Combiner::kMax;
  c.body = load("X", 0, DType::kFloat32, {var("c"), var("i") * Expr(2) + var("u"), var("j") * Expr(2) + var("v")});
  k.stages.push_back(c);
  std::string s = tir::default_schedule(k).to_string();
  EXPECT_NE(s.find("reorder(Y, c, i.o, j.o, i.i, j.i)"), std::string::npos) << s;
  EXPECT_NE(s.find("cache_write(Y, j.o)"), std::string::npos) << s;
  auto reparsed = tir::parse_schedule(s);
  ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string();
  EXPECT_TRUE(tir::lower(k, *reparsed).is_ok());
}

// The operator strategy's priority rule chooses conv.ihwo for narrow and wide
// strided convolutions with deep enough reductions (after shape inference)
// and packs the weight transposed to [I, KH, KW, O]; wide stride-1, narrow
// strided, shallow and grouped ones get conv.direct and keep their weights.
TEST(SelectKernels, ConvIhwoForNarrowAndStridedConvs) {
  struct Want {
    ConvCase c;
    bool packed;
  };
  const std::vector<Want> cases = {
      {{1, 8, 5, 7, 7, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true}, true},      // 7 wide, 72 products
      {{1, 12, 5, 32, 32, 3, 2, 2, 1, 1, {1, 1, 1, 1}, false}, true},  // strided, 17 wide
      {{1, 12, 5, 16, 16, 3, 2, 2, 1, 1, {1, 1, 1, 1}, false}, false}, // strided, 9 wide
      {{1, 3, 5, 7, 7, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true}, false},     // 27 products: shallow
      {{1, 3, 5, 16, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, true}, false},   // wide, stride 1
      {{1, 4, 6, 7, 7, 3, 3, 1, 2, 1, {1, 1, 1, 1}, true}, false},     // groups
  };
  uint32_t seed = 300;
  for (const Want& want : cases) {
    const ConvCase& c = want.c;
    Tensor w = random_tensor({c.cout, c.cin / c.group, c.kh, c.kw}, seed++);
    std::unique_ptr<Graph> g = conv_graph(c, w, random_tensor({c.cout}, seed++));
    ops::InferContext ictx;
    ictx.graph = g.get();
    ASSERT_TRUE(ops::infer_shapes(*g, ictx).is_ok());
    auto rewrites = strategy::select_kernels(*g, strategy::SelectOptions{});
    ASSERT_TRUE(rewrites.is_ok()) << rewrites.status().to_string();
    EXPECT_EQ(*rewrites, 1) << c.h << "x" << c.w;
    Node* conv = nullptr;
    for (Node* n : g->nodes())
      if (n->op_type() == "Conv") conv = n;
    ASSERT_NE(conv, nullptr);
    EXPECT_EQ(conv->has_attr("kiln_weight_layout"), want.packed);
    EXPECT_EQ(conv->attr_string(strategy::kImplAttr, ""), want.packed ? "conv.ihwo" : "conv.direct");
    const Tensor& p = conv->input(1)->constant();
    if (!want.packed) {
      EXPECT_EQ(p.shape(), w.shape());
      continue;
    }
    ASSERT_EQ(p.shape(), (std::vector<int64_t>{c.cin, c.kh, c.kw, c.cout}));
    for (int64_t o = 0; o < c.cout; ++o)
      for (int64_t i = 0; i < c.cin; ++i)
        for (int64_t h = 0; h < c.kh; ++h)
          for (int64_t x = 0; x < c.kw; ++x) {
            float a = w.data_as<float>()[((o * c.cin + i) * c.kh + h) * c.kw + x];
            float b = p.data_as<float>()[((i * c.kh + h) * c.kw + x) * c.cout + o];
            ASSERT_EQ(a, b) << o << " " << i << " " << h << " " << x;
          }
  }
}

// A convolution with packed weights on a 7-wide plane is vectorized along its
// output channels (contiguous weight loads) with the output rows unrolled as
// the register tile's rows.
TEST(DefaultSchedules, PackedConvVectorizesChannels) {
  tir::KernelDef k;
  k.name = "conv";
  k.params = {{"X", DType::kFloat32, {Expr(1), Expr(8), Expr(9), Expr(9)}},
              {"W", DType::kFloat32, {Expr(8), Expr(3), Expr(3), Expr(40)}},
              {"Y", DType::kFloat32, {Expr(1), Expr(40), Expr(7), Expr(7)}}};
  k.num_inputs = 2;
  tir::ComputeDef c;
  c.name = "Y";
  c.axes = {"n", "m", "h", "w"};
  c.shape = {Expr(1), Expr(40), Expr(7), Expr(7)};
  c.reduce_axes = {"c", "r", "s"};
  c.reduce_extents = {Expr(8), Expr(3), Expr(3)};
  c.combiner = tir::Combiner::kSum;
  c.body = load("X", 0, DType::kFloat32, {var("n"), var("c"), var("h") + var("r"), var("w") + var("s")}) *
           load("W", 1, DType::kFloat32, {var("c"), var("r"), var("s"), var("m")});
  k.stages.push_back(c);
  std::string s = tir::default_schedule(k).to_string();
  EXPECT_NE(s.find("split_overlap(Y, m, 16)"), std::string::npos) << s;
  EXPECT_NE(s.find("reorder(Y, n, m.o, w, h, m.i)"), std::string::npos) << s;
  EXPECT_NE(s.find("cache_write(Y, w)"), std::string::npos) << s;
  EXPECT_NE(s.find("unroll(Y, h)"), std::string::npos) << s;
  EXPECT_NE(s.find("vectorize(Y, m.i)"), std::string::npos) << s;
  EXPECT_NE(s.find("parallel(Y, m.o)"), std::string::npos) << s;
  auto reparsed = tir::parse_schedule(s);
  ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string();
  EXPECT_TRUE(tir::lower(k, *reparsed).is_ok());
}

}  // namespace
}  // namespace kiln::driver
