// Graph IR: printer/parser round trip, verifier, topological sort, editing.
#include <gtest/gtest.h>

#include <cstring>

#include "graph/graph.h"

namespace kiln {
namespace {

TensorType ty(DType dt, Shape s) {
  TensorType t;
  t.dtype = dt;
  t.shape = std::move(s);
  return t;
}

std::string roundtrip_check(const Graph& g, const PrintOptions& opts = {}) {
  std::string text = print_graph(g, opts);
  auto parsed = parse_graph(text);
  EXPECT_TRUE(parsed.is_ok()) << parsed.status().to_string() << "\n" << text;
  if (!parsed.is_ok()) return text;
  EXPECT_TRUE(parsed.value()->verify().is_ok()) << parsed.value()->verify().to_string();
  EXPECT_EQ(print_graph(*parsed.value(), opts), text);
  return text;
}

// A graph exercising every kind of attribute, constant and name.
std::unique_ptr<Graph> rich_graph() {
  auto g = std::make_unique<Graph>();
  g->name = "main";
  g->source = "dir/model \"x\".onnx";
  g->opsets[""] = 17;
  g->opsets["com.microsoft"] = 1;
  g->bounds["n"] = Interval{1, std::nullopt};
  g->bounds["h"] = Interval{0, 4096};
  g->bounds["w"] = Interval{std::nullopt, 8};
  Expr n = var("n"), h = var("h");
  Value* x = g->add_input("input.1", ty(DType::kFloat32, {n, 3, h, h}));
  Value* y = g->add_input("has space", ty(DType::kInt64, {n + 1, floordiv(h - 1, 2) + 1, min(n, h)}));
  Value* z = g->add_input("unknown", TensorType{DType::kFloat32, std::nullopt});

  Tensor w(DType::kFloat32, {3, 2});
  float wv[] = {1.0f, -2.5f, 0.1f, 3e-20f, 1e30f, 0.0f};
  std::memcpy(w.data(), wv, sizeof(wv));
  Value* wc = g->add_constant("/conv/weight", w);
  Tensor big(DType::kFloat32, {64, 3, 7, 7});
  for (int64_t i = 0; i < big.numel(); ++i) big.set_f64(i, static_cast<double>(i % 13) * 0.5);
  g->add_constant("big", big);
  Tensor shape(DType::kInt64, {2});
  shape.data_as<int64_t>()[0] = -1;
  shape.data_as<int64_t>()[1] = INT64_MAX;
  Value* sc = g->add_constant("shape", shape);
  Tensor b(DType::kBool, {3});
  b.data_as<uint8_t>()[1] = 1;
  g->add_constant("mask", b);
  Tensor s(DType::kString, {2});
  s.data_as<std::string>()[0] = "a \"quoted\"\n\x01 string";
  s.data_as<std::string>()[1] = "";
  g->add_constant("strs", s);
  Tensor h16(DType::kFloat16, {2});
  h16.data_as<uint16_t>()[0] = 0x3c00;
  h16.data_as<uint16_t>()[1] = 0xfbff;
  g->add_constant("half", h16);
  Tensor u64(DType::kUInt64, {1});
  u64.data_as<uint64_t>()[0] = UINT64_MAX;
  g->add_constant("u64", u64);
  Tensor d(DType::kFloat64, {});
  d.data_as<double>()[0] = 0.1;
  g->add_constant("dbl", d);
  g->add_constant("empty", Tensor(DType::kInt32, {0, 4}));

  Node* conv = g->add_node("Conv", {x, wc, nullptr}, {"/conv/Conv_output_0"}, "", "conv1");
  Attribute pads;
  pads.kind = Attribute::Kind::kInts;
  pads.ints = {1, 1, -1, 0};
  conv->set_attr("pads", pads);
  conv->set_attr("group", Attribute::of_int(-3));
  conv->set_attr("alpha", Attribute::of_float(0.5));
  conv->set_attr("beta", Attribute::of_float(0.1));                       // not an f32: prints as 0.1d
  conv->set_attr("gamma", Attribute::of_float(static_cast<float>(0.1)));  // an f32
  conv->set_attr("delta", Attribute::of_float(2.0));
  conv->set_attr("eps", Attribute::of_float(-std::numeric_limits<double>::infinity()));
  Attribute str;
  str.kind = Attribute::Kind::kString;
  str.s = "NOTSET\t\"q\"\\";
  conv->set_attr("auto pad", str);
  Attribute floats;
  floats.kind = Attribute::Kind::kFloats;
  floats.floats = {1.0, 0.25, 1e-7};
  conv->set_attr("scales", floats);
  Attribute strings;
  strings.kind = Attribute::Kind::kStrings;
  strings.strings = {"a", "b,c"};
  conv->set_attr("names", strings);
  Attribute empty_ints;
  empty_ints.kind = Attribute::Kind::kInts;
  conv->set_attr("empty", empty_ints);
  Attribute empty_floats;
  empty_floats.kind = Attribute::Kind::kFloats;
  conv->set_attr("empty_f", empty_floats);
  Attribute tensor;
  tensor.kind = Attribute::Kind::kTensor;
  tensor.t = w;
  conv->set_attr("value", tensor);
  Attribute tensors;
  tensors.kind = Attribute::Kind::kTensors;
  tensors.tensors = {shape, big};
  conv->set_attr("values", tensors);
  conv->output(0)->set_type(ty(DType::kFloat32, {n, 2, h, h}));

  Node* shp = g->add_node("Shape", {conv->output(0)}, {"s"});
  shp->output(0)->set_type(ty(DType::kInt64, {4}));
  shp->output(0)->set_sym_value(std::vector<Expr>{n, 2, h, h});

  // If with two branches reading outer values through captures.
  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  Value* cap = then_g->add_capture("/conv/Conv_output_0", conv->output(0)->type());
  Node* relu = then_g->add_node("Relu", {cap}, {"t_out"});
  relu->output(0)->set_type(cap->type());
  then_g->set_outputs({relu->output(0)});
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  Value* cap2 = else_g->add_capture("shape", sc->type());
  else_g->set_outputs({cap2});
  Tensor cond(DType::kBool, {});
  Value* cv = g->add_constant("cond", cond);
  Node* iff = g->add_node("If", {cv}, {"if_out"});
  Attribute tg;
  tg.kind = Attribute::Kind::kGraph;
  tg.g = then_g;
  iff->set_attr("then_branch", tg);
  Attribute eg;
  eg.kind = Attribute::Kind::kGraph;
  eg.g = else_g;
  iff->set_attr("else_branch", eg);
  Attribute gs;
  gs.kind = Attribute::Kind::kGraphs;
  gs.graphs = {else_g};
  iff->set_attr("more", gs);

  Node* custom = g->add_node("Split2", {y, z, nullptr}, {"p", "q"}, "com.example");
  Node* none = g->add_node("Print", {}, {});
  (void)none;
  g->set_outputs({conv->output(0), shp->output(0), iff->output(0), custom->output(1), x});
  return g;
}

TEST(GraphPrinter, RoundTripIsExact) {
  auto g = rich_graph();
  ASSERT_TRUE(g->verify().is_ok()) << g->verify().to_string();
  std::string text = roundtrip_check(*g);
  // Spot checks on the format.
  EXPECT_NE(text.find("graph main(%input.1: f32[n, 3, h, h], %\"has space\": i64["), std::string::npos) << text;
  EXPECT_NE(text.find("%unknown: f32[?]"), std::string::npos) << text;
  EXPECT_NE(text.find("bound n [1, inf]"), std::string::npos) << text;
  EXPECT_NE(text.find("bound w [-inf, 8]"), std::string::npos) << text;
  EXPECT_NE(text.find("beta = 0.1d"), std::string::npos) << text;
  EXPECT_NE(text.find("gamma = 0.1,"), std::string::npos) << text;
  EXPECT_NE(text.find("delta = 2.0,"), std::string::npos) << text;
  EXPECT_NE(text.find("empty = ints[]"), std::string::npos) << text;
  EXPECT_NE(text.find("const<f32[64,3,7,7] fnv:"), std::string::npos) << text;
  EXPECT_NE(text.find("const<f32[3,2] [1, -2.5, 0.1, 3e-20, 1e+30, 0]>"), std::string::npos) << text;
  EXPECT_NE(text.find("const<f16[2] hex:003cfffb>"), std::string::npos) << text;
  EXPECT_NE(text.find("sym [n, 2, h, h]"), std::string::npos) << text;
  EXPECT_NE(text.find("capture %/conv/Conv_output_0: f32[n, 2, h, h]"), std::string::npos) << text;
  EXPECT_NE(text.find("com.example::Split2(%\"has space\", %unknown, _)"), std::string::npos) << text;
  EXPECT_NE(text.find("() = Print()"), std::string::npos) << text;
  EXPECT_NE(text.find("name \"conv1\""), std::string::npos) << text;
}

TEST(GraphPrinter, PrintingIsDeterministic) {
  auto a = rich_graph();
  auto b = rich_graph();
  EXPECT_EQ(print_graph(*a), print_graph(*b));
}

TEST(GraphPrinter, ConstantsAndAttributeValuesSurvive) {
  auto g = rich_graph();
  PrintOptions full;
  full.max_constant_elements = -1;
  std::string text = roundtrip_check(*g, full);
  EXPECT_EQ(text.find("fnv:"), std::string::npos);
  auto p = parse_graph(text);
  ASSERT_TRUE(p.is_ok());
  Graph& pg = *p.value();
  const Tensor& big = pg.find_value("big")->constant();
  ASSERT_EQ(big.numel(), 64 * 3 * 7 * 7);
  for (int64_t i = 0; i < big.numel(); ++i) ASSERT_EQ(big.get_f64(i), static_cast<double>(i % 13) * 0.5);
  EXPECT_EQ(pg.find_value("strs")->constant().data_as<std::string>()[0], "a \"quoted\"\n\x01 string");
  EXPECT_EQ(pg.find_value("u64")->constant().data_as<uint64_t>()[0], UINT64_MAX);
  EXPECT_EQ(pg.find_value("shape")->constant().data_as<int64_t>()[1], INT64_MAX);
  EXPECT_EQ(pg.find_value("dbl")->constant().data_as<double>()[0], 0.1);
  Node* conv = pg.find_value("/conv/Conv_output_0")->producer();
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->attr_float("beta", 0), 0.1);
  EXPECT_EQ(conv->attr_float("gamma", 0), static_cast<double>(0.1f));
  EXPECT_EQ(conv->attr_int("group", 0), -3);
  EXPECT_EQ(conv->attr_string("auto pad", ""), "NOTSET\t\"q\"\\");
  EXPECT_EQ(conv->attr_ints("pads"), (std::vector<int64_t>{1, 1, -1, 0}));
  EXPECT_EQ(conv->attr("empty_f")->kind, Attribute::Kind::kFloats);
  EXPECT_EQ(conv->input(2), nullptr);
  EXPECT_EQ(pg.bounds.at("h").hi, 4096);
  EXPECT_FALSE(pg.bounds.at("w").lo.has_value());
}

TEST(GraphPrinter, ElidedConstantsBecomeZeroPlaceholders) {
  auto g = rich_graph();
  std::string text = print_graph(*g);
  auto p = parse_graph(text);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  const Tensor& big = p.value()->find_value("big")->constant();
  EXPECT_EQ(big.describe(), "f32[64,3,7,7]");
  EXPECT_EQ(big.get_f64(1), 0.0);  // the data was not in the text
  // big is elided twice: as a constant and inside the "values" attribute.
  EXPECT_EQ(p.value()->elided_tensors.size(), 2u);
  EXPECT_EQ(print_graph(*p.value()), text);
}

TEST(GraphPrinter, ParseErrorsNameTheLine) {
  auto r = parse_graph("graph g(%x: f32[2]) -> (%y) {\n  %y: f32[2] = Relu(%nope)\n}\n");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("%nope"), std::string::npos) << r.status().message();

  r = parse_graph("graph g(%x: q32[2]) -> (%x) {\n}\n");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("unknown dtype"), std::string::npos) << r.status().message();

  r = parse_graph("graph g(%x: f32[2]) -> (%x) {\n  %c: f32[2] = const<f32[2] [1]>\n}\n");
  ASSERT_FALSE(r.is_ok());

  r = parse_graph("graph g(%x: f32[2], %x: f32[2]) -> (%x) {\n}\n");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("duplicate"), std::string::npos) << r.status().message();

  r = parse_graph("graph g(%x: f32[2]) -> (%missing) {\n}\n");
  ASSERT_FALSE(r.is_ok());
}

// Sequence and optional types print with their element type and parse back
// (an element type could not be parsed before, so such a graph did not round-trip).
TEST(GraphPrinter, ContainerTypesRoundTrip) {
  auto g = std::make_unique<Graph>();
  g->name = "containers";
  Value* s = g->add_input("s", TensorType::container(DType::kSequence, ty(DType::kFloat32, {Expr(3), var("e")}), var("n")));
  Value* o = g->add_input(
      "o", TensorType::container(DType::kOptional, TensorType::container(DType::kSequence, TensorType{DType::kInt64, std::nullopt},
                                                                         var("m")),
                                 var("k")));
  Node* at = g->add_node("SequenceLength", {s}, {"len"});
  at->output(0)->set_type(ty(DType::kInt64, {}));
  Node* get = g->add_node("OptionalGetElement", {o}, {"inner"});
  get->output(0)->set_type(TensorType::container(DType::kSequence, TensorType{DType::kInt64, std::nullopt}, var("m")));
  g->set_outputs({at->output(0), get->output(0)});
  std::string text = roundtrip_check(*g);
  EXPECT_NE(text.find("%s: seq<f32[3, e]>[n]"), std::string::npos) << text;
  EXPECT_NE(text.find("%o: opt<seq<i64[?]>[m]>[k]"), std::string::npos) << text;
  auto bare = parse_graph("graph g(%x: seq[2]) -> (%x) {\n}\n");
  ASSERT_FALSE(bare.is_ok());
  EXPECT_NE(bare.status().message().find("<"), std::string::npos) << bare.status().message();
  for (const char* bad : {"seq<f32[2]>[?]", "seq<f32[2]>[2, 3]"}) {
    auto r = parse_graph(std::string("graph g(%x: ") + bad + ") -> (%x) {\n}\n");
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("[LENGTH]"), std::string::npos) << r.status().message();
  }
}

TEST(GraphPrinter, ParsesHandWrittenText) {
  auto r = parse_graph(R"(
    // a comment
    graph g(%x: f32[n, 4]) -> (%y) {
      %y: f32[n, 4] = Relu(%x)
    }
  )");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(print_graph(*r.value()), "graph g(%x: f32[n, 4]) -> (%y) {\n  %y: f32[n, 4] = Relu(%x)\n}\n");
}

TEST(GraphVerify, CatchesUseBeforeDefinition) {
  Graph g;
  g.name = "g";
  Value* x = g.add_input("x", ty(DType::kFloat32, {2}));
  Node* a = g.add_node("Relu", {x}, {"a"});
  Node* b = g.add_node("Neg", {a->output(0)}, {"b"});
  g.set_outputs({b->output(0)});
  ASSERT_TRUE(g.verify().is_ok());
  // A node inserted before `a` that reads `b`: defined after use.
  Node* c = g.insert_node_before(a, "Abs", {b->output(0)}, {"c"});
  c->set_name("early");
  Status st = g.verify();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("Abs 'early'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not defined before"), std::string::npos) << st.message();
  // topo_sort repairs it.
  ASSERT_TRUE(g.topo_sort().is_ok());
  EXPECT_TRUE(g.verify().is_ok()) << g.verify().to_string();
  EXPECT_EQ(g.nodes().back(), c);
}

TEST(GraphVerify, CatchesUndefinedValuesAndOutputs) {
  Graph g;
  Value* x = g.add_input("x", ty(DType::kFloat32, {2}));
  Value* stray = g.add_value("stray", ty(DType::kFloat32, {2}));
  Node* a = g.add_node("Add", {x, stray}, {"a"}, "", "add0");
  g.set_outputs({a->output(0)});
  Status st = g.verify();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("Add 'add0'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("%stray"), std::string::npos) << st.message();

  Graph h;
  Value* hx = h.add_input("x", ty(DType::kFloat32, {2}));
  h.set_outputs({hx, h.add_value("never", TensorType{})});
  st = h.verify();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("%never"), std::string::npos) << st.message();
}

TEST(GraphVerify, CatchesCaptureOfMissingOuterValue) {
  Graph g;
  g.name = "outer";
  Value* c = g.add_input("c", ty(DType::kBool, {}));
  auto sub = std::make_shared<Graph>();
  sub->name = "branch";
  sub->set_outputs({sub->add_capture("ghost", ty(DType::kFloat32, {1}))});
  Node* n = g.add_node("If", {c}, {"o"}, "", "if0");
  Attribute a;
  a.kind = Attribute::Kind::kGraph;
  a.g = sub;
  n->set_attr("then_branch", a);
  g.set_outputs({n->output(0)});
  Status st = g.verify();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("If 'if0'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("%ghost"), std::string::npos) << st.message();
  // Once the outer graph defines it (before the If), verify passes.
  Graph g2;
  Value* c2 = g2.add_input("c", ty(DType::kBool, {}));
  Value* ghost = g2.add_input("ghost", ty(DType::kFloat32, {1}));
  Node* n2 = g2.add_node("If", {c2}, {"o"});
  n2->set_attr("then_branch", a);
  g2.set_outputs({n2->output(0)});
  EXPECT_TRUE(g2.verify().is_ok()) << g2.verify().to_string();
  EXPECT_EQ(g2.implicit_inputs(n2), std::vector<Value*>{ghost});
}

TEST(GraphTopoSort, ReportsACycleNamingANodeOnIt) {
  Graph g;
  g.name = "cyc";
  Value* x = g.add_input("x", ty(DType::kFloat32, {2}));
  Node* head = g.add_node("Relu", {x}, {"head"}, "", "head");
  Node* a = g.add_node("Add", {head->output(0), x}, {"a"}, "", "a");
  Node* b = g.add_node("Mul", {a->output(0), x}, {"b"}, "", "b");
  g.set_outputs({b->output(0)});
  g.set_input(a, 1, b->output(0));  // a <- b <- a
  Status st = g.topo_sort();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
  bool names_cycle_node = st.message().find("Add 'a'") != std::string::npos || st.message().find("Mul 'b'") != std::string::npos;
  EXPECT_TRUE(names_cycle_node) << st.message();
  EXPECT_EQ(st.message().find("cycle through node Relu"), std::string::npos) << st.message();
}

TEST(GraphTopoSort, KeepsOrderWhenAlreadySorted) {
  Graph g;
  Value* x = g.add_input("x", ty(DType::kFloat32, {2}));
  Node* a = g.add_node("Relu", {x}, {"a"});
  Node* b = g.add_node("Relu", {x}, {"b"});
  Node* c = g.add_node("Add", {a->output(0), b->output(0)}, {"c"});
  g.set_outputs({c->output(0)});
  ASSERT_TRUE(g.topo_sort().is_ok());
  EXPECT_EQ(g.nodes(), (std::vector<Node*>{a, b, c}));
}

TEST(GraphEdit, ReplaceRemoveAndDeadValues) {
  Graph g;
  Value* x = g.add_input("x", ty(DType::kFloat32, {2}));
  Value* unused = g.add_constant("unused", Tensor(DType::kFloat32, {2}));
  (void)unused;
  Node* a = g.add_node("Relu", {x}, {"a"});
  Node* b = g.add_node("Identity", {a->output(0)}, {"b"});
  Node* c = g.add_node("Neg", {b->output(0)}, {"c"});
  g.set_outputs({b->output(0), c->output(0)});
  g.replace_all_uses(b->output(0), a->output(0));
  EXPECT_EQ(c->input(0), a->output(0));
  EXPECT_EQ(g.outputs()[0], a->output(0));
  EXPECT_EQ(a->output(0)->uses().size(), 2u);  // b and c
  g.set_input(b, 0, nullptr);
  g.remove_node(b);
  EXPECT_EQ(g.find_value("b"), nullptr);
  g.remove_dead_values();
  EXPECT_EQ(g.find_value("unused"), nullptr);
  EXPECT_NE(g.find_value("x"), nullptr);
  EXPECT_TRUE(g.verify().is_ok()) << g.verify().to_string();
  EXPECT_EQ(g.unique_name("a"), "a_1");
  EXPECT_EQ(g.add_value("a", TensorType{})->name(), "a_1");
}

TEST(GraphEdit, ReplaceAllUsesFollowsCaptures) {
  Graph g;
  Value* c = g.add_input("c", ty(DType::kBool, {}));
  Value* old_v = g.add_input("old", ty(DType::kFloat32, {1}));
  Value* new_v = g.add_input("new", ty(DType::kFloat32, {1}));
  auto sub = std::make_shared<Graph>();
  Value* cap = sub->add_capture("old", old_v->type());
  Node* r = sub->add_node("Relu", {cap}, {"r"});
  sub->set_outputs({r->output(0)});
  Node* n = g.add_node("If", {c}, {"o"});
  Attribute a;
  a.kind = Attribute::Kind::kGraph;
  a.g = sub;
  n->set_attr("then_branch", a);
  g.set_outputs({n->output(0)});
  EXPECT_EQ(g.implicit_inputs(n), std::vector<Value*>{old_v});
  // Dead-value removal keeps values read only through captures.
  g.remove_dead_values();
  EXPECT_NE(g.find_value("old"), nullptr);
  g.replace_all_uses(old_v, new_v);
  EXPECT_EQ(sub->captures().size(), 1u);
  EXPECT_EQ(sub->captures()[0]->name(), "new");
  EXPECT_EQ(g.implicit_inputs(n), std::vector<Value*>{new_v});
  EXPECT_TRUE(g.verify().is_ok()) << g.verify().to_string();
}

TEST(GraphTypes, ToStringAndStatic) {
  TensorType t = ty(DType::kFloat32, {var("n"), 3});
  EXPECT_EQ(t.to_string(), "f32[n, 3]");
  EXPECT_FALSE(t.is_static());
  EXPECT_EQ(t.numel().to_string(), "3*n");
  TensorType s = ty(DType::kInt64, {2, 5});
  EXPECT_TRUE(s.is_static());
  EXPECT_EQ(s.static_shape(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(s.numel().as_const(), 10);
  EXPECT_EQ(TensorType{}.to_string(), "undef[?]");
}

}  // namespace
}  // namespace kiln
