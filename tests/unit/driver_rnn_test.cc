// The projected recurrent kernels (passes/project_rnn_inputs.h, ops/rnn.cc)
// against the reference form (the op as imported, run with no graph passes):
// LSTM (with peepholes), GRU with and without linear_before_reset, RNN;
// forward, reverse and bidirectional; layouts 0 and 1; hidden sizes around
// the 64-unit panel (1, 3, 17, 64, 65, 130); batch entries with shorter
// sequence_lens; f32 and f64; 1 and 2 threads, which must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "driver/compile.h"
#include "runtime/vm.h"
#include "support/target.h"

namespace kiln::driver {
namespace {

struct RnnCase {
  std::string op;  // LSTM, GRU, RNN
  std::string direction = "forward";
  int64_t hidden = 17;
  int64_t seq = 5, batch = 1, input = 7;
  int64_t layout = 0;
  bool linear_before_reset = false;
  bool lens = false;  // sequence_lens [seq, 1, seq - 1, ...]
  DType dtype = DType::kFloat32;
  bool peepholes = true;  // LSTM
  double clip = 0;        // 0: no clip attribute
  bool input_forget = false;
  std::vector<std::string> activations;  // empty: the op's defaults
  double x_scale = 1.0;                  // inputs uniform in [-x_scale, x_scale]
};

Tensor random_tensor(DType dt, std::vector<int64_t> shape, uint32_t seed, double scale) {
  Tensor t(dt, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, dist(rng));
  return t;
}

int gates(const std::string& op) { return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1; }

std::unique_ptr<Graph> rnn_graph(const RnnCase& c) {
  auto g = std::make_unique<Graph>();
  g->source = "rnn";
  g->opsets[""] = 17;
  int64_t nd = c.direction == "bidirectional" ? 2 : 1, gh = gates(c.op) * c.hidden;
  std::vector<int64_t> xs = c.layout == 0 ? std::vector<int64_t>{c.seq, c.batch, c.input}
                                          : std::vector<int64_t>{c.batch, c.seq, c.input};
  Shape x_shape;
  for (int64_t d : xs) x_shape.push_back(Expr(d));
  Value* x = g->add_input("x", TensorType{c.dtype, x_shape});
  double scale = 1.0 / std::sqrt(static_cast<double>(c.hidden));
  std::vector<Value*> ins = {x, g->add_constant("w", random_tensor(c.dtype, {nd, gh, c.input}, 1, 0.5)),
                             g->add_constant("r", random_tensor(c.dtype, {nd, gh, c.hidden}, 2, scale)),
                             g->add_constant("b", random_tensor(c.dtype, {nd, 2 * gh}, 3, 0.5))};
  if (c.lens) {
    Tensor lens(DType::kInt32, {c.batch});
    for (int64_t b = 0; b < c.batch; ++b) lens.set_f64(b, static_cast<double>(b % 3 == 0 ? c.seq : b % 3 == 1 ? 1 : c.seq - 1));
    ins.push_back(g->add_constant("lens", lens));
  } else {
    ins.push_back(nullptr);
  }
  std::vector<int64_t> state = c.layout == 0 ? std::vector<int64_t>{nd, c.batch, c.hidden}
                                             : std::vector<int64_t>{c.batch, nd, c.hidden};
  ins.push_back(g->add_constant("h0", random_tensor(c.dtype, state, 4, 0.5)));
  std::vector<std::string> outs = {"y", "yh"};
  if (c.op == "LSTM") {
    ins.push_back(g->add_constant("c0", random_tensor(c.dtype, state, 5, 0.5)));
    if (c.peepholes) ins.push_back(g->add_constant("p", random_tensor(c.dtype, {nd, 3 * c.hidden}, 6, 0.5)));
    outs.push_back("yc");
  }
  Node* n = g->add_node(c.op, ins, outs);
  n->set_attr("hidden_size", Attribute::of_int(c.hidden));
  n->set_attr("direction", Attribute::of_string(c.direction));
  n->set_attr("layout", Attribute::of_int(c.layout));
  if (c.linear_before_reset) n->set_attr("linear_before_reset", Attribute::of_int(1));
  if (c.clip > 0) n->set_attr("clip", Attribute::of_float(c.clip));
  if (c.input_forget) n->set_attr("input_forget", Attribute::of_int(1));
  if (!c.activations.empty()) {
    std::vector<std::string> acts;
    for (int64_t d = 0; d < nd; ++d) acts.insert(acts.end(), c.activations.begin(), c.activations.end());
    n->set_attr("activations", Attribute::of_strings(acts));
  }
  std::vector<Value*> results;
  for (size_t i = 0; i < outs.size(); ++i) results.push_back(n->output(i));
  g->set_outputs(results);
  return g;
}

// Outputs of the graph compiled with the default pipeline (projected) or no
// passes (the reference), at `threads`.
std::vector<Tensor> run(const RnnCase& c, bool projected, int threads, bool* was_projected) {
  CompileOptions opts;
  opts.threads = threads;
  if (!projected) opts.passes = std::vector<std::string>{};
  auto compiled = compile_graph(rnn_graph(c), opts);
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().message();
  if (!compiled.is_ok()) return {};
  if (was_projected) {
    // Projected by project-rnn-inputs, or (an LSTM rnn-to-scan takes) a
    // projection MatMul and a Scan in place of the recurrent op.
    bool op_left = false, scan = false;
    *was_projected = false;
    for (const Node* n : compiled->graph->nodes()) {
      if (n->op_type() == c.op && n->attr_int("kiln_projected_input", 0) == 1) *was_projected = true;
      op_left = op_left || n->op_type() == c.op;
      scan = scan || n->op_type() == "Scan";
    }
    if (!op_left && scan) *was_projected = true;
  }
  runtime::VM vm(compiled->program, threads);
  Tensor x = random_tensor(c.dtype, c.layout == 0 ? std::vector<int64_t>{c.seq, c.batch, c.input}
                                                  : std::vector<int64_t>{c.batch, c.seq, c.input},
                           9, c.x_scale);
  auto out = vm.run({x});
  EXPECT_TRUE(out.is_ok()) << out.status().message();
  return out.is_ok() ? *out : std::vector<Tensor>{};
}

std::string describe(const RnnCase& c) {
  std::string acts;
  for (const std::string& a : c.activations) acts += " " + a;
  return c.op + " " + c.direction + " hidden " + std::to_string(c.hidden) + " batch " + std::to_string(c.batch) +
         " layout " + std::to_string(c.layout) + (c.linear_before_reset ? " lbr" : "") + (c.lens ? " lens" : "") +
         " " + dtype_name(c.dtype) + (c.peepholes ? "" : " no-peepholes") +
         (c.clip > 0 ? " clip " + std::to_string(c.clip) : "") + (c.input_forget ? " input_forget" : "") + acts +
         " x_scale " + std::to_string(c.x_scale);
}

void check(const RnnCase& c) {
  SCOPED_TRACE(describe(c));
  bool projected = false;
  std::vector<Tensor> ref = run(c, false, 1, nullptr);
  std::vector<Tensor> one = run(c, true, 1, &projected);
  std::vector<Tensor> two = run(c, true, 2, nullptr);
  EXPECT_TRUE(projected) << "neither project-rnn-inputs nor rnn-to-scan applied";
  ASSERT_EQ(ref.size(), one.size());
  ASSERT_EQ(ref.size(), two.size());
  double tol = c.dtype == DType::kFloat32 ? 2e-5 : 1e-12;
  double spread = 0;  // over every output: the comparison means something only if they are not all ~0
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(ref[i].shape(), one[i].shape());
    for (int64_t e = 0; e < ref[i].numel(); ++e) {
      double r = ref[i].get_f64(e), a = one[i].get_f64(e);
      spread = std::max(spread, std::fabs(r));
      ASSERT_NEAR(a, r, tol * (1 + std::fabs(r))) << "output " << i << " element " << e;
      // The thread count changes only which thread runs a block of units.
      ASSERT_EQ(std::memcmp(one[i].data(), two[i].data(), static_cast<size_t>(one[i].nbytes())), 0) << "output " << i;
    }
  }
  EXPECT_GT(spread, 0.05) << "the outputs have no spread";
}

TEST(ProjectedRnn, LstmMatchesReference) {
  for (int64_t h : {1, 3, 17, 64, 65, 130}) check({.op = "LSTM", .hidden = h});
  check({.op = "LSTM", .direction = "bidirectional", .hidden = 17, .batch = 3, .lens = true});
  check({.op = "LSTM", .direction = "reverse", .hidden = 70, .batch = 2, .layout = 1});
  check({.op = "LSTM", .hidden = 33, .batch = 2, .dtype = DType::kFloat64});
}

// Float LSTMs and GRUs with the default activations update their cells in
// float vectors (exp, sigmoid, tanh of ops/rnn.cc); the reference uses libm
// in double. Saturated gates (inputs up to 40), clip, input_forget and no
// peepholes go through that path too; other activations do not.
TEST(ProjectedRnn, VectorCellsMatchReference) {
  for (bool lbr : {false, true}) {
    for (double scale : {0.05, 8.0, 40.0})
      check({.op = "GRU", .hidden = 70, .batch = 2, .linear_before_reset = lbr, .x_scale = scale});
    check({.op = "GRU", .direction = "bidirectional", .hidden = 30, .linear_before_reset = lbr, .clip = 0.7,
           .x_scale = 4.0});
    check({.op = "GRU", .hidden = 40, .linear_before_reset = lbr, .activations = {"Sigmoid", "Relu"}});
  }
  for (double scale : {0.05, 1.0, 8.0, 40.0}) check({.op = "LSTM", .hidden = 96, .batch = 2, .x_scale = scale});
  check({.op = "LSTM", .hidden = 65, .peepholes = false});
  check({.op = "LSTM", .direction = "bidirectional", .hidden = 30, .clip = 0.7, .x_scale = 4.0});
  check({.op = "LSTM", .hidden = 40, .input_forget = true});
  check({.op = "LSTM", .hidden = 40, .activations = {"Sigmoid", "Tanh", "Relu"}});
  check({.op = "LSTM", .hidden = 40, .activations = {"HardSigmoid", "Tanh", "Tanh"}});
}

TEST(ProjectedRnn, GruMatchesReference) {
  for (int64_t h : {1, 17, 65}) {
    check({.op = "GRU", .hidden = h});
    check({.op = "GRU", .hidden = h, .linear_before_reset = true});
  }
  check({.op = "GRU", .direction = "bidirectional", .hidden = 20, .batch = 4, .lens = true});
  check({.op = "GRU", .direction = "reverse", .hidden = 40, .batch = 3, .layout = 1, .linear_before_reset = true,
         .lens = true, .dtype = DType::kFloat64});
}

// Panels of 256 bytes of hidden units with 32 vector registers, 64 with 16
// (the suite runs under KILN_TARGET=avx512 and avx2).
TEST(ProjectedRnn, PanelsFollowTheRegisterFile) {
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    RnnCase c{.op = "LSTM", .hidden = 40, .dtype = dt};
    auto compiled = compile_graph(rnn_graph(c), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
    int64_t bytes = 0;
    for (const Node* n : compiled->graph->nodes())
      if (n->op_type() == "LSTM" && n->attr_int("kiln_projected_input", 0) == 1)
        bytes = n->input(2)->constant().shape()[4] * static_cast<int64_t>(dtype_size(dt));
    EXPECT_EQ(bytes, Target::host().vector_registers >= 32 ? 256 : 64) << Target::host().name << " " << dtype_name(dt);
  }
}

TEST(ProjectedRnn, RnnMatchesReference) {
  check({.op = "RNN", .hidden = 3});
  check({.op = "RNN", .direction = "bidirectional", .hidden = 130, .batch = 2, .lens = true});
}

}  // namespace
}  // namespace kiln::driver
