// Sequences and optionals through the whole pipeline: container values made
// and read by runtime kernels, carried through Loop and If, passed in and
// returned; checked against C++ references, with the errors a user's input
// can cause.
#include <gtest/gtest.h>

#include <random>

#include "driver/compile.h"
#include "runtime/vm.h"

namespace kiln::driver {
namespace {

TensorType f32(Shape s) { return TensorType{DType::kFloat32, std::move(s)}; }
TensorType i64(Shape s) { return TensorType{DType::kInt64, std::move(s)}; }
TensorType boolean(Shape s) { return TensorType{DType::kBool, std::move(s)}; }

Tensor ramp(std::vector<int64_t> shape, float start) {
  Tensor t(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = start + static_cast<float>(i);
  return t;
}

Tensor scalar_i64(int64_t v) {
  Tensor t(DType::kInt64, {});
  t.data_as<int64_t>()[0] = v;
  return t;
}

Tensor sequence(std::vector<Tensor> elems) {
  Tensor s(DType::kSequence, {static_cast<int64_t>(elems.size())});
  for (size_t i = 0; i < elems.size(); ++i) s.data_as<Tensor>()[i] = std::move(elems[i]);
  return s;
}

std::unique_ptr<Graph> new_graph(const std::string& name) {
  auto g = std::make_unique<Graph>();
  g->name = name;
  g->source = name + ".onnx";
  g->opsets[""] = 18;
  return g;
}

Result<std::vector<Tensor>> compile_and_run(std::unique_ptr<Graph> g, const std::vector<Tensor>& inputs) {
  KILN_ASSIGN_OR_RETURN(CompiledProgram compiled, compile_graph(std::move(g), CompileOptions{}));
  runtime::VM vm(compiled.program, 1);
  auto first = vm.run(inputs);
  if (!first.is_ok()) return first;
  // Warm: a second run (arena and pool reused) gives the same values.
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> second, vm.run(inputs));
  for (size_t i = 0; i < second.size(); ++i)
    if (!same_contents((*first)[i], second[i])) return internal_error() << "output " << i << " differs on a warm run";
  return second;
}

std::vector<float> values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

// y = x * 2 (an intermediate in the static arena), split into rows; the row
// x[0] + 100 inserted at the front, the last element erased; the element at
// -1, the length, and the rows stacked back.
std::unique_ptr<Graph> split_edit_concat() {
  auto g = new_graph("seq");
  Value* x = g->add_input("x", f32({4, 3}));
  Tensor two(DType::kFloat32, {});
  two.data_as<float>()[0] = 2;
  Value* y = g->add_node("Mul", {x, g->add_constant("two", two)}, {"y"})->output(0);
  Node* split = g->add_node("SplitToSequence", {y}, {"rows"});
  split->set_attr("keepdims", Attribute::of_int(0));
  Tensor hundred(DType::kFloat32, {});
  hundred.data_as<float>()[0] = 100;
  Value* first = g->add_node("Gather", {x, g->add_constant("zero", scalar_i64(0))}, {"first"})->output(0);
  Value* front = g->add_node("Add", {first, g->add_constant("hundred", hundred)}, {"front"})->output(0);
  Value* ins = g->add_node("SequenceInsert", {split->output(0), front, g->add_constant("pos", scalar_i64(0))}, {"ins"})
                   ->output(0);
  Value* erased = g->add_node("SequenceErase", {ins}, {"erased"})->output(0);
  Value* last = g->add_node("SequenceAt", {erased, g->add_constant("minus1", scalar_i64(-1))}, {"last"})->output(0);
  Value* len = g->add_node("SequenceLength", {erased}, {"len"})->output(0);
  Node* cat = g->add_node("ConcatFromSequence", {erased}, {"stacked"});
  cat->set_attr("axis", Attribute::of_int(0));
  cat->set_attr("new_axis", Attribute::of_int(1));
  // Something computed after the split, so the arena slot of y is reused.
  Value* after = g->add_node("Mul", {x, x}, {"after"})->output(0);
  g->set_outputs({erased, last, len, cat->output(0), after});
  return g;
}

TEST(Sequences, SplitEditAndConcat) {
  Tensor x = ramp({4, 3}, 1);
  auto out = compile_and_run(split_edit_concat(), {x});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const Tensor& seq = (*out)[0];
  ASSERT_EQ(seq.dtype(), DType::kSequence);
  ASSERT_EQ(seq.numel(), 4);  // 100 + x[0], 2x[0], 2x[1], 2x[2]
  EXPECT_EQ(values(seq.data_as<Tensor>()[0]), (std::vector<float>{101, 102, 103}));
  for (int r = 0; r < 3; ++r) {
    std::vector<float> want;
    for (int c = 0; c < 3; ++c) want.push_back(2.f * (1 + 3 * r + c));
    EXPECT_EQ(values(seq.data_as<Tensor>()[r + 1]), want) << "row " << r;
  }
  EXPECT_EQ(values((*out)[1]), (std::vector<float>{14, 16, 18}));
  EXPECT_EQ((*out)[2].data_as<int64_t>()[0], 4);
  EXPECT_EQ((*out)[3].shape(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(values((*out)[3]), (std::vector<float>{101, 102, 103, 2, 4, 6, 8, 10, 12, 14, 16, 18}));
}

// A sequence input: its length and elements' dims are bound at run time; an
// element of the wrong dtype is an error naming the input.
TEST(Sequences, SequenceInputsAreChecked) {
  auto build = [] {
    auto g = new_graph("seq_in");
    Value* s = g->add_input("s", TensorType::container(DType::kSequence, f32({Expr(var("_e0"))}), var("n")));
    g->bounds["n"] = Interval{0, std::nullopt};
    Node* cat = g->add_node("ConcatFromSequence", {s}, {"cat"});
    cat->set_attr("axis", Attribute::of_int(0));
    g->set_outputs({cat->output(0)});
    return g;
  };
  auto out = compile_and_run(build(), {sequence({ramp({2}, 0), ramp({3}, 10)})});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(values((*out)[0]), (std::vector<float>{0, 1, 10, 11, 12}));

  Tensor wrong(DType::kInt64, {2});
  auto bad = compile_and_run(build(), {sequence({ramp({2}, 0), wrong})});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("input 's' element 1 has dtype i64, expected f32"), std::string::npos)
      << bad.status().to_string();

  auto empty = compile_and_run(build(), {sequence({})});
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("concatenating an empty sequence"), std::string::npos)
      << empty.status().to_string();
}

// Loop carrying a sequence that grows by one row per iteration (its length
// changes across iterations), stacked after the loop.
TEST(Sequences, LoopCarriesAGrowingSequence) {
  auto g = new_graph("loop_seq");
  Value* m = g->add_input("m", i64({}));
  g->add_input("x", f32({5, 2}));
  Node* empty = g->add_node("SequenceEmpty", {}, {"empty"});
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* i = body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* s = body->add_input("s_in", TensorType::container(DType::kSequence, f32({}), int64_t{0}));
  Value* bx = body->add_capture("x", f32({5, 2}));
  Value* row = body->add_node("Gather", {bx, i}, {"row"})->output(0);
  Value* s_out = body->add_node("SequenceInsert", {s, row}, {"s_out"})->output(0);
  Value* c_out = body->add_node("Identity", {cin}, {"cond_out"})->output(0);
  body->set_outputs({c_out, s_out});
  Node* loop = g->add_node("Loop", {m, nullptr, empty->output(0)}, {"rows"});
  loop->set_attr("body", Attribute::of_graph(body));
  Node* cat = g->add_node("ConcatFromSequence", {loop->output(0)}, {"stacked"});
  cat->set_attr("axis", Attribute::of_int(0));
  cat->set_attr("new_axis", Attribute::of_int(1));
  g->set_outputs({cat->output(0)});
  auto out = compile_and_run(std::move(g), {scalar_i64(3), ramp({5, 2}, 0)});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values((*out)[0]), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

// The iteration number itself inserted into a carried sequence: the VM
// rewrites its loop's iteration_num in place only while nothing else holds
// it, so every element keeps its own value, in this run and after the next.
TEST(Sequences, LoopCollectsItsIterationNumbers) {
  auto make = [] {
    auto g = new_graph("loop_iters");
    Value* m = g->add_input("m", i64({}));
    Node* empty = g->add_node("SequenceEmpty", {}, {"empty"});
    empty->set_attr("dtype", Attribute::of_int(7));  // INT64
    auto body = std::make_shared<Graph>();
    body->name = "body";
    Value* i = body->add_input("i", i64({}));
    Value* cin = body->add_input("cond_in", boolean({}));
    Value* s = body->add_input("s_in", TensorType::container(DType::kSequence, i64({}), int64_t{0}));
    Value* s_out = body->add_node("SequenceInsert", {s, i}, {"s_out"})->output(0);
    body->set_outputs({body->add_node("Identity", {cin}, {"cond_out"})->output(0), s_out});
    Node* loop = g->add_node("Loop", {m, nullptr, empty->output(0)}, {"iters"});
    loop->set_attr("body", Attribute::of_graph(body));
    g->set_outputs({loop->output(0)});
    return g;
  };
  CompileOptions opts;
  auto compiled = compile_graph(make(), opts);
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  runtime::VM vm(compiled->program, 1);
  auto first = vm.run({scalar_i64(4)});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto second = vm.run({scalar_i64(2)});
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  for (auto [out, n] : {std::pair{&*first, 4}, std::pair{&*second, 2}}) {
    const Tensor& seq = (*out)[0];
    ASSERT_EQ(seq.dtype(), DType::kSequence);
    ASSERT_EQ(seq.numel(), n);
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(seq.data_as<Tensor>()[k].get_i64(0), k) << "element " << k;
  }
}

// The same with the initial sequence a graph input of symbolic length: the
// body's length must be its own symbol, not the input's (the sub-program is
// given the caller's bindings, so the input's would be pinned to its value).
TEST(Sequences, LoopGrowsASequenceInput) {
  auto g = new_graph("loop_seq_in");
  Value* m = g->add_input("m", i64({}));
  Value* s0 = g->add_input("s0", TensorType::container(DType::kSequence, f32({2}), var("len")));
  g->bounds["len"] = Interval{0, std::nullopt};
  g->add_input("x", f32({5, 2}));
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* i = body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* s = body->add_input("s_in", TensorType::container(DType::kSequence, f32({2}), var("len")));
  Value* bx = body->add_capture("x", f32({5, 2}));
  Value* row = body->add_node("Gather", {bx, i}, {"row"})->output(0);
  Value* s_out = body->add_node("SequenceInsert", {s, row}, {"s_out"})->output(0);
  body->set_outputs({body->add_node("Identity", {cin}, {"cond_out"})->output(0), s_out});
  Node* loop = g->add_node("Loop", {m, nullptr, s0}, {"rows"});
  loop->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({g->add_node("SequenceLength", {loop->output(0)}, {"n"})->output(0)});
  auto out = compile_and_run(std::move(g), {scalar_i64(3), sequence({ramp({2}, 7)}), ramp({5, 2}, 0)});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 4);
}

// Optional(x) has an element; Optional of a type has none. Through If, the
// branches' optionals join (the element's rank comes from the branch that
// has one), and reading an empty one is an error naming the node.
TEST(Sequences, OptionalsHoldOneElementOrNone) {
  auto branch = [](const std::string& name, bool with_element) {
    auto b = std::make_shared<Graph>();
    b->name = name;
    Node* o;
    if (with_element) {
      o = b->add_node("Optional", {b->add_capture("x", f32({3}))}, {name + "_o"});
    } else {
      o = b->add_node("Optional", {}, {name + "_o"});
      o->set_attr("type", Attribute::of_ints({0, static_cast<int64_t>(DType::kFloat32)}));
    }
    b->set_outputs({o->output(0)});
    return b;
  };
  auto build = [&] {
    auto g = new_graph("opt");
    Value* c = g->add_input("c", boolean({}));
    g->add_input("x", f32({3}));
    Node* n = g->add_node("If", {c}, {"o"});
    n->set_attr("then_branch", Attribute::of_graph(branch("then", true)));
    n->set_attr("else_branch", Attribute::of_graph(branch("else", false)));
    Value* has = g->add_node("OptionalHasElement", {n->output(0)}, {"has"})->output(0);
    Value* got = g->add_node("OptionalGetElement", {n->output(0)}, {"got"}, "", "get")->output(0);
    Value* y = g->add_node("Neg", {got}, {"y"})->output(0);
    g->set_outputs({has, y, n->output(0)});
    return g;
  };
  Tensor yes(DType::kBool, {}), no(DType::kBool, {});
  yes.data_as<bool>()[0] = true;
  no.data_as<bool>()[0] = false;
  auto out = compile_and_run(build(), {yes, ramp({3}, 1)});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_TRUE((*out)[0].data_as<bool>()[0]);
  EXPECT_EQ(values((*out)[1]), (std::vector<float>{-1, -2, -3}));
  ASSERT_EQ((*out)[2].dtype(), DType::kOptional);
  EXPECT_EQ((*out)[2].numel(), 1);

  auto none = compile_and_run(build(), {no, ramp({3}, 1)});
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("OptionalGetElement 'get': the optional input has no element"),
            std::string::npos)
      << none.status().to_string();

  // Without the read, an empty optional is a result like any other.
  auto g = new_graph("opt_none");
  g->add_input("x", f32({3}));
  Node* o = g->add_node("Optional", {}, {"o"});
  o->set_attr("type", Attribute::of_ints({0, static_cast<int64_t>(DType::kFloat32)}));
  g->set_outputs({g->add_node("OptionalHasElement", {o->output(0)}, {"has"})->output(0), o->output(0)});
  auto empty = compile_and_run(std::move(g), {ramp({3}, 1)});
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_FALSE((*empty)[0].data_as<bool>()[0]);
  EXPECT_EQ((*empty)[1].numel(), 0);
}

// SequenceMap over two sequences and a tensor: the body sees element i of
// each sequence (of a different length each) and the whole tensor; sequences
// of different lengths are an error naming the node. (sequence-map-to-loop
// makes it a Loop: VM code, no sub-program.)
TEST(Sequences, SequenceMapRunsTheBodyPerElement) {
  auto build = [] {
    auto g = new_graph("map");
    auto seq_type = TensorType::container(DType::kSequence, f32({Expr(var("_e0"))}), var("n"));
    Value* a = g->add_input("a", seq_type);
    Value* b = g->add_input("b", TensorType::container(DType::kSequence, f32({Expr(var("_e1"))}), var("m")));
    Value* t = g->add_input("t", f32({1}));
    g->bounds["n"] = Interval{0, std::nullopt};
    g->bounds["m"] = Interval{0, std::nullopt};
    auto body = std::make_shared<Graph>();
    body->name = "body";
    Value* x = body->add_input("x", f32({Expr(var("_e2"))}));
    Value* y = body->add_input("y", f32({Expr(var("_e3"))}));
    Value* z = body->add_input("z", f32({1}));
    Value* sum = body->add_node("Add", {x, y}, {"sum"})->output(0);
    Value* out = body->add_node("Mul", {sum, z}, {"out"})->output(0);
    Value* len = body->add_node("Shape", {x}, {"len"})->output(0);
    body->set_outputs({out, len});
    Node* n = g->add_node("SequenceMap", {a, b, t}, {"outs", "lens"}, "", "map");
    n->set_attr("body", Attribute::of_graph(body));
    g->set_outputs({n->output(0), n->output(1)});
    return g;
  };
  Tensor t(DType::kFloat32, {1});
  t.data_as<float>()[0] = 10;
  auto out = compile_and_run(build(), {sequence({ramp({2}, 1), ramp({3}, 0)}), sequence({ramp({2}, 5), ramp({1}, 1)}), t});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const Tensor& outs = (*out)[0];
  ASSERT_EQ(outs.numel(), 2);
  EXPECT_EQ(values(outs.data_as<Tensor>()[0]), (std::vector<float>{60, 80}));      // ([1, 2] + [5, 6]) * 10
  EXPECT_EQ(values(outs.data_as<Tensor>()[1]), (std::vector<float>{10, 20, 30}));  // ([0, 1, 2] + [1]) * 10
  EXPECT_EQ((*out)[1].data_as<Tensor>()[1].data_as<int64_t>()[0], 3);

  auto compiled = compile_graph(build(), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  EXPECT_TRUE(compiled->program->subprograms.empty());

  auto bad = compile_and_run(build(), {sequence({ramp({2}, 1), ramp({3}, 0)}), sequence({ramp({2}, 5)}), t});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("SequenceMap 'map': the length of sequence input 1 (input 0's is the expected) = 1, expected 2"),
            std::string::npos)
      << bad.status().to_string();
}

// Positions out of range are errors naming the node; a container fed to an
// op that takes tensors is refused when compiling.
TEST(Sequences, BadPositionsAndMisuseAreErrors) {
  auto at = [](int64_t pos) {
    auto g = new_graph("at");
    Value* x = g->add_input("x", f32({2}));
    Value* s = g->add_node("SequenceConstruct", {x, x}, {"s"})->output(0);
    Value* p = g->add_input("p", i64({}));
    g->set_outputs({g->add_node("SequenceAt", {s, p}, {"y"}, "", "pick")->output(0)});
    return compile_and_run(std::move(g), {ramp({2}, 0), scalar_i64(pos)});
  };
  EXPECT_TRUE(at(-2).is_ok());
  auto bad = at(2);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("SequenceAt 'pick': position 2 is out of range for a sequence of length 2"),
            std::string::npos)
      << bad.status().to_string();

  {
    // SequenceAt without its position, an If on a sequence: refused when compiling.
    auto g2 = new_graph("no_position");
    Value* x2 = g2->add_input("x", f32({2}));
    Value* s2 = g2->add_node("SequenceConstruct", {x2}, {"s"})->output(0);
    g2->set_outputs({g2->add_node("SequenceAt", {s2}, {"y"})->output(0)});
    auto r2 = compile_graph(std::move(g2), CompileOptions{});
    ASSERT_FALSE(r2.is_ok());
    EXPECT_NE(r2.status().message().find("missing the position input"), std::string::npos) << r2.status().to_string();

    auto g3 = new_graph("if_on_sequence");
    Value* x3 = g3->add_input("x", f32({2}));
    Value* s3 = g3->add_node("SequenceConstruct", {x3}, {"s"})->output(0);
    auto branch = [&](const std::string& name) {
      auto b = std::make_shared<Graph>();
      b->name = name;
      b->set_outputs({b->add_node("Neg", {b->add_capture("x", f32({2}))}, {name + "_y"})->output(0)});
      return b;
    };
    Node* n3 = g3->add_node("If", {s3}, {"y"});
    n3->set_attr("then_branch", Attribute::of_graph(branch("then")));
    n3->set_attr("else_branch", Attribute::of_graph(branch("else")));
    g3->set_outputs({n3->output(0)});
    auto r3 = compile_graph(std::move(g3), CompileOptions{});
    ASSERT_FALSE(r3.is_ok());
    EXPECT_NE(r3.status().message().find("expected a bool tensor"), std::string::npos) << r3.status().to_string();
  }

  auto g = new_graph("misuse");
  Value* x = g->add_input("x", f32({2}));
  Value* s = g->add_node("SequenceConstruct", {x}, {"s"})->output(0);
  g->set_outputs({g->add_node("Relu", {s}, {"y"})->output(0)});
  auto refused = compile_graph(std::move(g), CompileOptions{});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("input 0 ('s') is a sequence; Relu takes tensors only"), std::string::npos)
      << refused.status().to_string();
}

}  // namespace
}  // namespace kiln::driver
