// ONNX control flow through the whole pipeline: If, Loop and Scan built with
// the Graph API, compiled (If, Loop and Scan spliced into the program's own
// instructions; Scan of opset 8 to a Loop of Scans, or with scan8-to-loop
// disabled to a sub-program per batch element) and run on the VM, compared
// with C++ references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "driver/compile.h"
#include "runtime/vm.h"

namespace kiln::driver {
namespace {

TensorType f32(Shape s) { return TensorType{DType::kFloat32, std::move(s)}; }
TensorType i64(Shape s) { return TensorType{DType::kInt64, std::move(s)}; }
TensorType boolean(Shape s) { return TensorType{DType::kBool, std::move(s)}; }

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

Tensor scalar_i64(int64_t v) {
  Tensor t(DType::kInt64, {});
  t.data_as<int64_t>()[0] = v;
  return t;
}

Tensor scalar_bool(bool v) {
  Tensor t(DType::kBool, {});
  t.data_as<bool>()[0] = v;
  return t;
}

std::unique_ptr<Graph> new_graph(const std::string& name) {
  auto g = std::make_unique<Graph>();
  g->name = name;
  g->source = name;
  g->opsets[""] = 17;
  return g;
}

Result<std::vector<Tensor>> compile_and_run(std::unique_ptr<Graph> g, const std::vector<Tensor>& inputs,
                                            int threads = 1, CompiledProgram* keep = nullptr) {
  CompileOptions opts;
  opts.threads = threads;
  KILN_ASSIGN_OR_RETURN(CompiledProgram compiled, compile_graph(std::move(g), opts));
  runtime::VM vm(compiled.program, threads);
  auto out = vm.run(inputs);
  // Twice: sub-VMs and their arenas are reused across runs.
  if (out.is_ok()) out = vm.run(inputs);
  if (keep) *keep = std::move(compiled);
  return out;
}

void expect_close(const Tensor& got, const std::vector<float>& want, const std::vector<int64_t>& shape) {
  ASSERT_EQ(got.shape(), shape);
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data_as<float>()[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << "element " << i;
}

// y = cond ? x + x : x * x, or (different shapes) cond ? x : concat(x, x).
std::unique_ptr<Graph> if_graph(bool different_shapes) {
  auto g = new_graph("if");
  Value* c = g->add_input("c", boolean({}));
  Value* x = g->add_input("x", f32({4}));
  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  Value* tx = then_g->add_capture("x", f32({4}));
  if (different_shapes) {
    then_g->set_outputs({tx});
  } else {
    then_g->set_outputs({then_g->add_node("Add", {tx, tx}, {"t"})->output(0)});
  }
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  Value* ex = else_g->add_capture("x", f32({4}));
  Node* e = different_shapes ? else_g->add_node("Concat", {ex, ex}, {"e"}) : else_g->add_node("Mul", {ex, ex}, {"e"});
  if (different_shapes) e->set_attr("axis", Attribute::of_int(0));
  else_g->set_outputs({e->output(0)});
  Node* n = g->add_node("If", {c}, {"y"});
  n->set_attr("then_branch", Attribute::of_graph(then_g));
  n->set_attr("else_branch", Attribute::of_graph(else_g));
  (void)x;
  g->set_outputs({n->output(0)});
  return g;
}

TEST(ControlFlow, IfBranchesComputeDifferently) {
  Tensor x = random_tensor({4}, 1);
  for (bool cond : {true, false}) {
    for (int threads : {1, 2}) {
      auto out = compile_and_run(if_graph(false), {scalar_bool(cond), x}, threads);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      std::vector<float> want;
      for (int i = 0; i < 4; ++i) {
        float v = x.data_as<float>()[i];
        want.push_back(cond ? v + v : v * v);
      }
      expect_close((*out)[0], want, {4});
    }
  }
}

TEST(ControlFlow, IfWithDifferentOutputShapes) {
  Tensor x = random_tensor({4}, 2);
  CompiledProgram compiled;
  // The output shape is a fresh symbol, bound from the branch's result.
  auto probe = compile_graph(if_graph(true), CompileOptions{});
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  ASSERT_EQ(probe->outputs[0].dims.size(), 1u);
  EXPECT_NE(probe->outputs[0].dims[0], "4");
  for (bool cond : {true, false}) {
    auto out = compile_and_run(if_graph(true), {scalar_bool(cond), x});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<float> want(x.data_as<float>(), x.data_as<float>() + 4);
    if (!cond) want.insert(want.end(), x.data_as<float>(), x.data_as<float>() + 4);
    expect_close((*out)[0], want, {static_cast<int64_t>(want.size())});
  }
}

// A condition known at compile time, Equal(Size(x), 4) on x [4]: the output
// takes the taken branch's shape ([4], not a fresh symbol), and the run gives
// that branch's result. With x [5] the else branch's [10].
TEST(ControlFlow, IfWithConditionKnownAtCompileTime) {
  for (int64_t len : {4, 5}) {
    auto g = new_graph("if_static");
    Value* x = g->add_input("x", f32({len}));
    Value* size = g->add_node("Size", {x}, {"n"})->output(0);
    Value* c = g->add_node("Equal", {size, g->add_constant("four", scalar_i64(4))}, {"c"})->output(0);
    auto then_g = std::make_shared<Graph>();
    then_g->name = "then";
    then_g->set_outputs({then_g->add_capture("x", f32({len}))});
    auto else_g = std::make_shared<Graph>();
    else_g->name = "else";
    Value* ex = else_g->add_capture("x", f32({len}));
    Node* e = else_g->add_node("Concat", {ex, ex}, {"e"});
    e->set_attr("axis", Attribute::of_int(0));
    else_g->set_outputs({e->output(0)});
    Node* n = g->add_node("If", {c}, {"y"});
    n->set_attr("then_branch", Attribute::of_graph(then_g));
    n->set_attr("else_branch", Attribute::of_graph(else_g));
    g->set_outputs({n->output(0)});
    auto probe = compile_graph(std::move(g), CompileOptions{});
    ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
    ASSERT_EQ(probe->outputs[0].dims.size(), 1u);
    EXPECT_EQ(probe->outputs[0].dims[0], len == 4 ? "4" : "10");
    Tensor xt = random_tensor({len}, 3);
    runtime::VM vm(probe->program, 1);
    auto out = vm.run({xt});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<float> want(xt.data_as<float>(), xt.data_as<float>() + len);
    if (len != 4) want.insert(want.end(), xt.data_as<float>(), xt.data_as<float>() + len);
    expect_close((*out)[0], want, {static_cast<int64_t>(want.size())});
  }
}

// A branch capturing a value whose dim is an expression of the outer graph's
// symbols ([min(n, 3) + min(m, 3)], from slices): the sub-program is given
// the outer bindings, so the capture binds (before, its dim could not be
// evaluated in the branch).
TEST(ControlFlow, CapturesWithCompoundDimsBindInBranches) {
  auto g = new_graph("if_compound");
  Value* c = g->add_input("c", boolean({}));
  Value* a = g->add_input("a", f32({var("n")}));
  Value* b = g->add_input("b", f32({var("m")}));
  auto i64v = [&](const std::string& name, int64_t v) {
    Tensor t(DType::kInt64, {1});
    t.data_as<int64_t>()[0] = v;
    return g->add_constant(name, t);
  };
  Value* zero = i64v("zero", 0);
  Value* three = i64v("three", 3);
  Value* sa = g->add_node("Slice", {a, zero, three}, {"sa"})->output(0);
  Value* sb = g->add_node("Slice", {b, zero, three}, {"sb"})->output(0);
  Node* cat = g->add_node("Concat", {sa, sb}, {"s"});
  cat->set_attr("axis", Attribute::of_int(0));
  Shape s_shape = {min(var("n"), 3) + min(var("m"), 3)};
  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  Value* ts = then_g->add_capture("s", f32(s_shape));
  then_g->set_outputs({then_g->add_node("Neg", {ts}, {"neg"})->output(0)});
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  Value* es = else_g->add_capture("s", f32(s_shape));
  else_g->set_outputs({else_g->add_node("Abs", {es}, {"abs"})->output(0)});
  Node* n = g->add_node("If", {c}, {"y"});
  n->set_attr("then_branch", Attribute::of_graph(then_g));
  n->set_attr("else_branch", Attribute::of_graph(else_g));
  g->set_outputs({n->output(0)});
  g->bounds["n"] = Interval{1, std::nullopt};
  g->bounds["m"] = Interval{1, std::nullopt};
  Tensor av = random_tensor({5}, 1), bv = random_tensor({2}, 2);
  auto out = compile_and_run(std::move(g), {scalar_bool(true), av, bv});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  std::vector<float> want;
  for (int i = 0; i < 3; ++i) want.push_back(-av.data_as<float>()[i]);
  for (int i = 0; i < 2; ++i) want.push_back(-bv.data_as<float>()[i]);
  expect_close((*out)[0], want, {5});
}

// Loop body: s_out = s_in + x[i]; scan output s_out; cond_out = i + 1 < limit
// (with `limit` captured) or the input cond.
std::shared_ptr<Graph> running_sum_body(int64_t rows, bool early_exit) {
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* i = body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* s = body->add_input("s_in", f32({3}));
  Value* x = body->add_capture("x", f32({rows, 3}));
  Value* row = body->add_node("Gather", {x, i}, {"row"})->output(0);
  Value* s_out = body->add_node("Add", {s, row}, {"s_out"})->output(0);
  Value* scan = body->add_node("Identity", {s_out}, {"scan"})->output(0);
  Value* cond_out;
  if (early_exit) {
    Value* limit = body->add_capture("limit", i64({}));
    Value* one = body->add_constant("one", scalar_i64(1));
    Value* next = body->add_node("Add", {i, one}, {"next"})->output(0);
    cond_out = body->add_node("Less", {next, limit}, {"cond_out"})->output(0);
  } else {
    cond_out = body->add_node("Identity", {cin}, {"cond_out"})->output(0);
  }
  body->set_outputs({cond_out, s_out, scan});
  return body;
}

std::unique_ptr<Graph> loop_graph(int64_t rows, bool with_cond, bool with_m) {
  auto g = new_graph("loop");
  Value* m = g->add_input("m", i64({}));
  Value* s0 = g->add_input("s0", f32({3}));
  g->add_input("x", f32({rows, 3}));
  Value* limit = g->add_input("limit", i64({}));
  (void)limit;
  Value* cond = nullptr;
  if (with_cond) cond = g->add_constant("true", scalar_bool(true));
  Node* n = g->add_node("Loop", {with_m ? m : nullptr, cond, s0}, {"s_final", "sums"});
  n->set_attr("body", Attribute::of_graph(running_sum_body(rows, with_cond)));
  g->set_outputs({n->output(0), n->output(1)});
  return g;
}

TEST(ControlFlow, LoopRunningSumWithScanOutput) {
  const int64_t rows = 6;
  Tensor x = random_tensor({rows, 3}, 3), s0 = random_tensor({3}, 4);
  struct Case {
    bool with_cond, with_m;
    int64_t m, limit, expected_trips;
  };
  for (const Case& c : {Case{false, true, 4, 0, 4}, Case{true, true, 5, 3, 3}, Case{true, true, 2, 5, 2},
                        Case{true, false, 0, 6, 6}, Case{false, true, 0, 0, 0}}) {
    CompiledProgram compiled;
    auto out = compile_and_run(loop_graph(rows, c.with_cond, c.with_m),
                               {scalar_i64(c.m), s0, x, scalar_i64(c.limit)}, 1, &compiled);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<float> s(s0.data_as<float>(), s0.data_as<float>() + 3), sums;
    for (int64_t t = 0; t < c.expected_trips; ++t)
      for (int j = 0; j < 3; ++j) {
        s[j] += x.data_as<float>()[t * 3 + j];
        sums.push_back(s[j]);
      }
    expect_close((*out)[0], s, {3});
    expect_close((*out)[1], sums, {c.expected_trips, 3});
    // The carried value keeps its static shape.
    EXPECT_EQ(compiled.outputs[0].dims, (std::vector<std::string>{"3"}));
  }
}

// A carried value that doubles in length each iteration: v = concat(v, v + 1).
TEST(ControlFlow, LoopCarriedShapeChanges) {
  auto g = new_graph("grow");
  Value* m = g->add_input("m", i64({}));
  Value* v0 = g->add_input("v0", f32({1}));
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* v = body->add_input("v_in", f32({1}));
  Tensor one(DType::kFloat32, {});
  one.data_as<float>()[0] = 1.f;
  Value* onev = body->add_constant("one", one);
  Value* vp = body->add_node("Add", {v, onev}, {"vp"})->output(0);
  Node* cat = body->add_node("Concat", {v, vp}, {"v_out"});
  cat->set_attr("axis", Attribute::of_int(0));
  Value* cout = body->add_node("Identity", {cin}, {"cond_out"})->output(0);
  body->set_outputs({cout, cat->output(0)});
  Node* n = g->add_node("Loop", {m, nullptr, v0}, {"v"});
  n->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({n->output(0)});
  Tensor init(DType::kFloat32, {1});
  init.data_as<float>()[0] = 0.5f;
  auto out = compile_and_run(std::move(g), {scalar_i64(3), init});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  std::vector<float> want = {0.5f};
  for (int t = 0; t < 3; ++t) {
    std::vector<float> next = want;
    for (float f : want) next.push_back(f + 1.f);
    want = next;
  }
  expect_close((*out)[0], want, {8});
}

// If whose then branch runs a Loop (captures reach two levels down).
TEST(ControlFlow, LoopNestedInIf) {
  const int64_t rows = 5;
  auto g = new_graph("nested");
  Value* c = g->add_input("c", boolean({}));
  Value* m = g->add_input("m", i64({}));
  Value* s0 = g->add_input("s0", f32({3}));
  g->add_input("x", f32({rows, 3}));
  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  Value* tm = then_g->add_capture("m", i64({}));
  Value* ts = then_g->add_capture("s0", f32({3}));
  then_g->add_capture("x", f32({rows, 3}));
  Node* loop = then_g->add_node("Loop", {tm, nullptr, ts}, {"final", "sums"});
  loop->set_attr("body", Attribute::of_graph(running_sum_body(rows, false)));
  then_g->set_outputs({loop->output(0)});
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  Value* es = else_g->add_capture("s0", f32({3}));
  else_g->set_outputs({else_g->add_node("Neg", {es}, {"neg"})->output(0)});
  Node* n = g->add_node("If", {c}, {"y"});
  n->set_attr("then_branch", Attribute::of_graph(then_g));
  n->set_attr("else_branch", Attribute::of_graph(else_g));
  (void)m;
  (void)s0;
  g->set_outputs({n->output(0)});

  Tensor x = random_tensor({rows, 3}, 5), s = random_tensor({3}, 6);
  CompileOptions opts;
  auto compiled = compile_graph(std::move(g), opts);
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  EXPECT_EQ(compiled->outputs[0].dims, (std::vector<std::string>{"3"}));
  runtime::VM vm(compiled->program, 1);
  for (bool cond : {true, false}) {
    auto out = vm.run({scalar_bool(cond), scalar_i64(4), s, x});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<float> want(s.data_as<float>(), s.data_as<float>() + 3);
    if (cond) {
      for (int t = 0; t < 4; ++t)
        for (int j = 0; j < 3; ++j) want[j] += x.data_as<float>()[t * 3 + j];
    } else {
      for (float& f : want) f = -f;
    }
    expect_close((*out)[0], want, {3});
  }
}

// A Scan body over [2] rows: sum_out = sum_in + next, and (with `squares`)
// the scan output sum_out^2.
std::shared_ptr<Graph> running_sum_body(bool squares) {
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* s = body->add_input("sum_in", f32({2}));
  Value* next = body->add_input("next", f32({2}));
  Value* sum = body->add_node("Add", {s, next}, {"sum_out"})->output(0);
  if (squares) {
    Value* scan = body->add_node("Mul", {sum, sum}, {"scan_out"})->output(0);
    body->set_outputs({sum, scan});
  } else {
    body->set_outputs({sum});
  }
  return body;
}

// Scan: running sum over rows (or columns with scan_input_axes = 1), forward
// or reverse, scan output stacked along axis 0 or 1.
std::unique_ptr<Graph> scan_graph(Expr len, int64_t in_axis, int64_t in_dir, int64_t out_axis, int64_t out_dir) {
  auto g = new_graph("scan");
  Value* init = g->add_input("init", f32({2}));
  Shape xs = in_axis == 0 ? Shape{len, 2} : Shape{2, len};
  Value* x = g->add_input("x", f32(xs));
  if (len.is_var()) g->bounds[len->name] = Interval{1, std::nullopt};
  auto body = running_sum_body(true);
  Node* n = g->add_node("Scan", {init, x}, {"y", "z"});
  n->set_attr("body", Attribute::of_graph(body));
  n->set_attr("num_scan_inputs", Attribute::of_int(1));
  n->set_attr("scan_input_axes", Attribute::of_ints({in_axis}));
  n->set_attr("scan_input_directions", Attribute::of_ints({in_dir}));
  n->set_attr("scan_output_axes", Attribute::of_ints({out_axis}));
  n->set_attr("scan_output_directions", Attribute::of_ints({out_dir}));
  g->set_outputs({n->output(0), n->output(1)});
  return g;
}

TEST(ControlFlow, Scan) {
  const int64_t len = 4;
  Tensor init = random_tensor({2}, 7);
  for (bool symbolic : {false, true}) {
    for (int64_t in_axis : {0, 1}) {
      for (int64_t in_dir : {0, 1}) {
        for (int64_t out_axis : {0, -1}) {
          for (int64_t out_dir : {0, 1}) {
            Tensor x = random_tensor(in_axis == 0 ? std::vector<int64_t>{len, 2} : std::vector<int64_t>{2, len}, 8);
            Expr l = symbolic ? var("seq") : Expr(len);
            auto out = compile_and_run(scan_graph(l, in_axis, in_dir, out_axis, out_dir), {init, x});
            ASSERT_TRUE(out.is_ok()) << out.status().to_string();
            auto xat = [&](int64_t t, int j) {
              return in_axis == 0 ? x.data_as<float>()[t * 2 + j] : x.data_as<float>()[j * len + t];
            };
            std::vector<float> s(init.data_as<float>(), init.data_as<float>() + 2);
            std::vector<float> z(len * 2);
            for (int64_t t = 0; t < len; ++t) {
              int64_t src = in_dir ? len - 1 - t : t;
              int64_t dst = out_dir ? len - 1 - t : t;
              for (int j = 0; j < 2; ++j) {
                s[j] += xat(src, j);
                z[out_axis == 0 ? dst * 2 + j : j * len + dst] = s[j] * s[j];
              }
            }
            expect_close((*out)[0], s, {2});
            expect_close((*out)[1], z, out_axis == 0 ? std::vector<int64_t>{len, 2} : std::vector<int64_t>{2, len});
          }
        }
      }
    }
  }
}

// Scan of opset 8, with and without sequence_lens, runs as VM code
// (scan8-to-loop: a Loop over the batch of opset-9 Scans; no sub-program),
// with the same results bit for bit as the batched form's sub-program per
// element (lengths 5, 2 and 0 of 5 steps: the zero padding, the initial
// state as final state).
TEST(ControlFlow, ScanOpset8IsVmCode) {
  const int64_t batch = 3, len = 5;
  auto make = [&](int64_t dir, bool with_lens) {
    auto g = new_graph("scan8_vm");
    g->opsets[""] = 8;
    Value* lens = with_lens ? g->add_input("lens", TensorType{DType::kInt64, Shape{batch}}) : nullptr;
    Value* init = g->add_input("init", f32({batch, 2}));
    Value* x = g->add_input("x", f32({batch, len, 2}));
    Node* n = g->add_node("Scan", {lens, init, x}, {"y", "z"});
    n->set_attr("body", Attribute::of_graph(running_sum_body(true)));
    n->set_attr("num_scan_inputs", Attribute::of_int(1));
    n->set_attr("directions", Attribute::of_ints({dir}));
    g->set_outputs({n->output(0), n->output(1)});
    return g;
  };
  Tensor lens(DType::kInt64, {batch});
  const int64_t lv[batch] = {5, 2, 0};
  for (int64_t b = 0; b < batch; ++b) lens.data_as<int64_t>()[b] = lv[b];
  for (bool with_lens : {false, true}) {
    std::vector<Tensor> args = {random_tensor({batch, 2}, 21), random_tensor({batch, len, 2}, 22)};
    if (with_lens) args.insert(args.begin(), lens);
    for (int64_t dir : {0, 1}) {
      std::vector<std::vector<Tensor>> outs;
      for (bool pass : {true, false}) {
        CompileOptions opts;
        if (!pass) opts.disable_passes = {"scan8-to-loop"};
        auto compiled = compile_graph(make(dir, with_lens), opts);
        ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
        EXPECT_EQ(compiled->program->subprograms.empty(), pass) << "direction " << dir << " lens " << with_lens;
        runtime::VM vm(compiled->program, 2);
        auto out = vm.run(args);
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        outs.push_back(*out);
      }
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_EQ(outs[0][k].shape(), outs[1][k].shape());
        EXPECT_EQ(std::memcmp(outs[0][k].data(), outs[1][k].data(), static_cast<size_t>(outs[0][k].nbytes())), 0)
            << "output " << k << " direction " << dir << " lens " << with_lens;
      }
    }
  }
  // Lengths the batched form refused are refused as VM code too, naming the
  // node and the element.
  auto refuse = [&](Tensor bad, const std::string& expected) {
    auto compiled = compile_graph(make(0, true), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    runtime::VM vm(compiled->program, 1);
    auto out = vm.run({bad, random_tensor({batch, 2}, 21), random_tensor({batch, len, 2}, 22)});
    ASSERT_FALSE(out.is_ok()) << expected;
    EXPECT_NE(out.status().message().find(expected), std::string::npos) << out.status().message();
  };
  Tensor negative = lens.clone();
  negative.data_as<int64_t>()[1] = -1;
  refuse(negative, "sequence_lens[1] = -1 outside [0, 5]");
  Tensor past = lens.clone();
  past.data_as<int64_t>()[2] = 6;
  refuse(past, "sequence_lens[2] = 6 outside [0, 5]");
  // A sequence_lens of rank 2 with one element per batch element is refused
  // at compile time: shape inference of the batched form runs before the
  // pass and refuses it (the pass, whose check counts elements only, also
  // declines a lens of another rank, should it ever run on one).
  auto rank2 = new_graph("scan8_lens_rank2");
  rank2->opsets[""] = 8;
  Value* lens2 = rank2->add_input("lens", TensorType{DType::kInt64, Shape{batch, 1}});
  Value* init2 = rank2->add_input("init", f32({batch, 2}));
  Value* x2 = rank2->add_input("x", f32({batch, len, 2}));
  Node* scan2 = rank2->add_node("Scan", {lens2, init2, x2}, {"y", "z"});
  scan2->set_attr("body", Attribute::of_graph(running_sum_body(true)));
  scan2->set_attr("num_scan_inputs", Attribute::of_int(1));
  rank2->set_outputs({scan2->output(0), scan2->output(1)});
  auto refused = compile_graph(std::move(rank2), CompileOptions{});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("sequence_lens must be a 1-D int64 tensor"), std::string::npos)
      << refused.status().message();
}

// kiln:CheckInRange with a count passes no values through, even where its
// values are constants within range: a shape computed from them would fold
// and leave the check dead, so a count mismatch would go unreported (the
// node read its values from its inputs' expressions before the review fix).
TEST(ControlFlow, CheckInRangeWithCountIsNeverFoldedAway) {
  auto make = [] {
    auto g = new_graph("check_count");
    g->opsets[""] = 17;
    Value* y = g->add_input("y", f32({var("n")}));
    g->bounds["n"] = Interval{1, std::nullopt};
    Tensor xs(DType::kInt64, {2});
    xs.data_as<int64_t>()[0] = 1;
    xs.data_as<int64_t>()[1] = 2;
    Value* count = g->add_node("Size", {y}, {"count"})->output(0);
    Node* check = g->add_node("CheckInRange",
                              {g->add_constant("x", xs), g->add_constant("lo", scalar_i64(0)),
                               g->add_constant("hi", scalar_i64(5)), count},
                              {"z"}, "kiln");
    check->set_attr("what", Attribute::of_string("the sizes"));
    Node* fill = g->add_node("ConstantOfShape", {check->output(0)}, {"w"});
    g->set_outputs({fill->output(0)});
    return g;
  };
  auto ok = compile_and_run(make(), {random_tensor({2}, 3)});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)[0].shape(), (std::vector<int64_t>{1, 2}));
  auto bad = compile_and_run(make(), {random_tensor({3}, 3)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("the sizes has 2 elements, expected 3"), std::string::npos)
      << bad.status().message();
}

// Scan in opset 8: a batch axis on every operand, optional sequence_lens,
// `directions` per scan input. Batch element b sums its first lens[b] rows
// (reversed: counted back from lens[b] - 1); its scan output is zero past
// lens[b]; its final state is the sum.
TEST(ControlFlow, ScanOpset8BatchesWithSequenceLengths) {
  const int64_t batch = 3, len = 4;
  for (bool with_lens : {false, true}) {
    for (int64_t dir : {0, 1}) {
      auto g = new_graph("scan8");
      g->opsets[""] = 8;
      Value* lens = with_lens ? g->add_input("lens", TensorType{DType::kInt64, Shape{batch}}) : nullptr;
      Value* init = g->add_input("init", f32({batch, 2}));
      Value* x = g->add_input("x", f32({batch, len, 2}));
      auto body = running_sum_body(true);
      Node* n = g->add_node("Scan", {lens, init, x}, {"y", "z"});
      n->set_attr("body", Attribute::of_graph(body));
      n->set_attr("num_scan_inputs", Attribute::of_int(1));
      n->set_attr("directions", Attribute::of_ints({dir}));
      g->set_outputs({n->output(0), n->output(1)});
      Tensor init_t = random_tensor({batch, 2}, 11);
      Tensor x_t = random_tensor({batch, len, 2}, 12);
      Tensor lens_t(DType::kInt64, {batch});
      const int64_t lv[batch] = {4, 2, 0};
      for (int64_t b = 0; b < batch; ++b) lens_t.data_as<int64_t>()[b] = with_lens ? lv[b] : len;
      std::vector<Tensor> args = {init_t, x_t};
      if (with_lens) args.insert(args.begin(), lens_t);
      auto out = compile_and_run(std::move(g), args);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      std::vector<float> y(batch * 2), z(batch * len * 2, 0.f);
      for (int64_t b = 0; b < batch; ++b) {
        int64_t l = lens_t.data_as<int64_t>()[b];
        float acc[2] = {init_t.data_as<float>()[b * 2], init_t.data_as<float>()[b * 2 + 1]};
        for (int64_t t = 0; t < l; ++t) {
          int64_t src = dir ? l - 1 - t : t;
          for (int j = 0; j < 2; ++j) {
            acc[j] += x_t.data_as<float>()[(b * len + src) * 2 + j];
            z[(b * len + t) * 2 + j] = acc[j] * acc[j];
          }
        }
        y[b * 2] = acc[0];
        y[b * 2 + 1] = acc[1];
      }
      expect_close((*out)[0], y, {batch, 2});
      expect_close((*out)[1], z, {batch, len, 2});
    }
  }
  // A length past the sequence axis is an error naming the node.
  auto g = new_graph("scan8_bad");
  g->opsets[""] = 8;
  Value* lens = g->add_input("lens", TensorType{DType::kInt64, Shape{1}});
  Value* init = g->add_input("init", f32({1, 2}));
  Value* x = g->add_input("x", f32({1, 2, 2}));
  auto body = running_sum_body(false);
  Node* n = g->add_node("Scan", {lens, init, x}, {"y"});
  n->set_attr("body", Attribute::of_graph(body));
  n->set_attr("num_scan_inputs", Attribute::of_int(1));
  g->set_outputs({n->output(0)});
  Tensor bad(DType::kInt64, {1});
  bad.data_as<int64_t>()[0] = 3;
  auto out = compile_and_run(std::move(g), {bad, random_tensor({1, 2}, 1), random_tensor({1, 2, 2}, 2)});
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("sequence_lens[0] = 3 outside [0, 2]"), std::string::npos)
      << out.status().message();
}

TEST(ControlFlow, IfConditionMustBeScalar) {
  auto g = if_graph(false);
  // Replace the condition type with a vector: inference accepts it, the VM rejects it at run time.
  g->inputs()[0]->set_type(boolean({2}));
  Tensor c(DType::kBool, {2});
  c.data_as<bool>()[0] = true;
  c.data_as<bool>()[1] = false;
  auto out = compile_and_run(std::move(g), {c, random_tensor({4}, 9)});
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("not a scalar"), std::string::npos) << out.status().message();
}

// Carried values that trade places: (a, b) -> (b, a + b) and a rotation
// (x, y, z) -> (y, z, x). The moves are parallel: each new value is computed
// from the old ones, never from one already overwritten.
std::unique_ptr<Graph> trade_graph() {
  auto g = new_graph("trade");
  Value* m = g->add_input("m", i64({}));
  std::vector<Value*> init;
  for (const char* name : {"a0", "b0", "x0", "y0", "z0"}) init.push_back(g->add_input(name, f32({2})));
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  std::vector<Value*> v;
  for (const char* name : {"a", "b", "x", "y", "z"}) v.push_back(body->add_input(name, f32({2})));
  Value* sum = body->add_node("Add", {v[0], v[1]}, {"sum"})->output(0);
  Value* cout = body->add_node("Identity", {cin}, {"cond_out"})->output(0);
  body->set_outputs({cout, v[1], sum, v[3], v[4], v[2]});
  std::vector<Value*> operands = {m, nullptr};
  operands.insert(operands.end(), init.begin(), init.end());
  Node* n = g->add_node("Loop", operands, {"a", "b", "x", "y", "z"});
  n->set_attr("body", Attribute::of_graph(body));
  g->set_outputs(n->outputs());
  return g;
}

TEST(ControlFlow, LoopCarriedValuesTradePlaces) {
  std::vector<Tensor> values;
  for (uint32_t k = 0; k < 5; ++k) values.push_back(random_tensor({2}, 20 + k));
  for (int64_t trips : {0, 1, 2, 7}) {
    std::vector<Tensor> inputs = {scalar_i64(trips)};
    inputs.insert(inputs.end(), values.begin(), values.end());
    auto out = compile_and_run(trade_graph(), inputs);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    std::vector<std::vector<float>> want;
    for (const Tensor& t : values) want.emplace_back(t.data_as<float>(), t.data_as<float>() + 2);
    for (int64_t t = 0; t < trips; ++t) {
      std::vector<float> a = want[0], b = want[1];
      for (int j = 0; j < 2; ++j) want[1][j] = a[j] + b[j];
      want[0] = b;
      std::rotate(want.begin() + 2, want.begin() + 3, want.end());
    }
    for (size_t k = 0; k < 5; ++k) expect_close((*out)[k], want[k], {2});
  }
}

// A Loop inside a Loop: iteration i of the outer loop runs an inner loop i
// times over v = concat(v, v) from [1], so v has 2^i elements, a length
// bound afresh each outer iteration; the outer loop sums them: 2^M - 1.
std::unique_ptr<Graph> nested_loops_graph() {
  auto g = new_graph("nested_loops");
  Value* m = g->add_input("m", i64({}));
  Value* total0 = g->add_input("total0", f32({}));
  auto inner = std::make_shared<Graph>();
  inner->name = "inner";
  inner->add_input("j", i64({}));
  Value* icond = inner->add_input("cond_in", boolean({}));
  Value* iv = inner->add_input("v_in", f32({var("vlen")}));
  Node* cat = inner->add_node("Concat", {iv, iv}, {"v_out"});
  cat->set_attr("axis", Attribute::of_int(0));
  inner->set_outputs({inner->add_node("Identity", {icond}, {"icond_out"})->output(0), cat->output(0)});
  auto outer = std::make_shared<Graph>();
  outer->name = "outer";
  Value* i = outer->add_input("i", i64({}));
  Value* ocond = outer->add_input("cond_in", boolean({}));
  Value* total = outer->add_input("total", f32({}));
  Tensor one(DType::kFloat32, {1});
  one.data_as<float>()[0] = 1.f;
  Node* in_loop = outer->add_node("Loop", {i, nullptr, outer->add_constant("one", one)}, {"v"});
  in_loop->set_attr("body", Attribute::of_graph(inner));
  Node* rs = outer->add_node("ReduceSum", {in_loop->output(0)}, {"s"});
  rs->set_attr("keepdims", Attribute::of_int(0));
  Value* next = outer->add_node("Add", {total, rs->output(0)}, {"total_out"})->output(0);
  outer->set_outputs({outer->add_node("Identity", {ocond}, {"ocond_out"})->output(0), next});
  Node* n = g->add_node("Loop", {m, nullptr, total0}, {"total"});
  n->set_attr("body", Attribute::of_graph(outer));
  g->set_outputs({n->output(0)});
  return g;
}

TEST(ControlFlow, NestedLoopsRebindShapesEachIteration) {
  Tensor zero(DType::kFloat32, {});
  zero.data_as<float>()[0] = 0.f;
  for (int64_t trips : {0, 1, 5}) {
    auto out = compile_and_run(nested_loops_graph(), {scalar_i64(trips), zero});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    expect_close((*out)[0], {static_cast<float>((1 << trips) - 1)}, {});
  }
}

// An error inside a loop body names the loop and the iteration: a Gather at
// index i of a 3-element tensor fails in iteration 3.
std::unique_ptr<Graph> gather_loop_graph() {
  auto g = new_graph("gather_loop");
  Value* m = g->add_input("m", i64({}));
  Value* s0 = g->add_input("s0", f32({}));
  g->add_input("data", f32({3}));
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* i = body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* s = body->add_input("s", f32({}));
  Value* data = body->add_capture("data", f32({3}));
  Value* picked = body->add_node("Gather", {data, i}, {"picked"})->output(0);
  Value* next = body->add_node("Add", {s, picked}, {"s_out"})->output(0);
  body->set_outputs({body->add_node("Identity", {cin}, {"cond_out"})->output(0), next});
  Node* n = g->add_node("Loop", {m, nullptr, s0}, {"s"});
  n->set_name("loop");
  n->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({n->output(0)});
  return g;
}

TEST(ControlFlow, LoopErrorNamesTheIteration) {
  Tensor zero(DType::kFloat32, {});
  zero.data_as<float>()[0] = 0.f;
  Tensor data_t = random_tensor({3}, 5);
  auto ok = compile_and_run(gather_loop_graph(), {scalar_i64(3), zero, data_t});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  float sum = data_t.data_as<float>()[0] + data_t.data_as<float>()[1] + data_t.data_as<float>()[2];
  expect_close((*ok)[0], {sum}, {});
  auto bad = compile_and_run(gather_loop_graph(), {scalar_i64(5), zero, data_t});
  ASSERT_FALSE(bad.is_ok());
  const std::string msg = bad.status().to_string();
  EXPECT_NE(msg.find("Loop 'loop' iteration 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Gather"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

// Carried values that trade places through views: (a, b) -> (Identity(b),
// Identity(a)), static, so both live in the arena and each move is a copy;
// the second copy must read b's old bytes, not the first copy's result.
TEST(ControlFlow, LoopCarriedViewsTradePlaces) {
  auto make = [] {
    auto g = new_graph("swap_views");
    Value* m = g->add_input("m", i64({}));
    Value* a0 = g->add_input("a0", f32({3}));
    Value* b0 = g->add_input("b0", f32({3}));
    auto body = std::make_shared<Graph>();
    body->name = "body";
    body->add_input("i", i64({}));
    Value* cin = body->add_input("cond_in", boolean({}));
    Value* a = body->add_input("a", f32({3}));
    Value* b = body->add_input("b", f32({3}));
    Value* na = body->add_node("Identity", {b}, {"na"})->output(0);
    Value* nb = body->add_node("Identity", {a}, {"nb"})->output(0);
    body->set_outputs({body->add_node("Identity", {cin}, {"cond_out"})->output(0), na, nb});
    Node* n = g->add_node("Loop", {m, nullptr, a0, b0}, {"a", "b"});
    n->set_attr("body", Attribute::of_graph(body));
    Value* sum = g->add_node("Add", {n->output(0), n->output(0)}, {"twice_a"})->output(0);
    g->set_outputs({sum, n->output(1)});
    return g;
  };
  Tensor a0 = random_tensor({3}, 11), b0 = random_tensor({3}, 12);
  for (int64_t trips : {1, 2, 3}) {
    auto out = compile_and_run(make(), {scalar_i64(trips), a0, b0});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const Tensor& a = trips % 2 ? b0 : a0;
    const Tensor& b = trips % 2 ? a0 : b0;
    std::vector<float> twice_a, want_b;
    for (int k = 0; k < 3; ++k) {
      twice_a.push_back(2 * a.data_as<float>()[k]);
      want_b.push_back(b.data_as<float>()[k]);
    }
    expect_close((*out)[0], twice_a, {3});
    expect_close((*out)[1], want_b, {3});
  }
}

// Without a cond operand the body's cond output is ignored: a for loop whose
// body returns false still runs M times. The carried value is the previous
// iteration number (a view of iteration_num, carried by reference in a
// program with symbolic shapes), and it is also a scan output.
TEST(ControlFlow, ForLoopIgnoresTheBodysCondition) {
  auto make = [] {
    auto g = new_graph("for_loop");
    Value* m = g->add_input("m", i64({}));
    Value* prev0 = g->add_input("prev0", i64({}));
    Value* x = g->add_input("x", f32({var("n")}));
    auto body = std::make_shared<Graph>();
    body->name = "body";
    Value* i = body->add_input("i", i64({}));
    body->add_input("cond_in", boolean({}));
    Value* prev = body->add_input("prev", i64({}));
    Value* stop = body->add_constant("false", scalar_bool(false));
    Value* next = body->add_node("Identity", {i}, {"next"})->output(0);
    Value* scanned = body->add_node("Identity", {prev}, {"scanned"})->output(0);
    body->set_outputs({stop, next, scanned});
    Node* n = g->add_node("Loop", {m, nullptr, prev0}, {"last", "prevs"});
    n->set_attr("body", Attribute::of_graph(body));
    g->set_outputs({n->output(0), n->output(1), g->add_node("Relu", {x}, {"rx"})->output(0)});
    g->bounds["n"] = Interval{1, std::nullopt};
    return g;
  };
  auto out = compile_and_run(make(), {scalar_i64(3), scalar_i64(-1), random_tensor({4}, 3)});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].get_i64(0), 2);
  ASSERT_EQ((*out)[1].shape(), (std::vector<int64_t>{3}));
  for (int64_t k = 0; k < 3; ++k) EXPECT_EQ((*out)[1].get_i64(k), k - 1) << "scan element " << k;
}

// Kernels inside a loop body are chosen by the operator strategy like any
// other: a MatMul whose weights the body captures from the outer graph (a
// constant there) gets packed panels, with the bias and Tanh in its tile.
TEST(ControlFlow, LoopBodyKernelsAreSelected) {
  auto g = new_graph("rnn");
  Value* m = g->add_input("m", i64({}));
  Value* h0 = g->add_input("h0", f32({1, 64}));
  Tensor w = random_tensor({64, 64}, 31);
  for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] *= 0.125f;
  g->add_constant("w", w);
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->add_input("i", i64({}));
  Value* cin = body->add_input("cond_in", boolean({}));
  Value* h = body->add_input("h", f32({1, 64}));
  Value* bw = body->add_capture("w", f32({64, 64}));
  Value* mm = body->add_node("MatMul", {h, bw}, {"mm"})->output(0);
  Value* t = body->add_node("Tanh", {mm}, {"t"})->output(0);
  body->set_outputs({body->add_node("Identity", {cin}, {"cond_out"})->output(0), t});
  Node* n = g->add_node("Loop", {m, nullptr, h0}, {"h_final"});
  n->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({n->output(0)});
  Tensor x0 = random_tensor({1, 64}, 32);
  CompiledProgram compiled;
  auto out = compile_and_run(std::move(g), {scalar_i64(5), x0}, 1, &compiled);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  bool packed = false;
  for (const KernelChoiceInfo& k : compiled.kernel_choices) packed = packed || k.impl == "matmul.packed";
  EXPECT_TRUE(packed) << "the body's MatMul was not selected";
  std::vector<float> hv(x0.data_as<float>(), x0.data_as<float>() + 64);
  for (int it = 0; it < 5; ++it) {
    std::vector<float> next(64);
    for (int j = 0; j < 64; ++j) {
      double acc = 0;
      for (int k = 0; k < 64; ++k) acc += hv[k] * w.data_as<float>()[k * 64 + j];
      next[j] = static_cast<float>(std::tanh(acc));
    }
    hv = next;
  }
  expect_close((*out)[0], hv, {1, 64});
}

}  // namespace
}  // namespace kiln::driver
