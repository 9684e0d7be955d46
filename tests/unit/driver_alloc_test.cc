// Issue 6, item 7: once warm, a run allocates nothing of its own. The C
// library's allocation functions are replaced in this binary by counting
// wrappers (they forward to glibc's own), so every heap allocation the calling
// thread makes during a run is seen: std::vector, std::string, shared_ptr
// control blocks and tensor storage alike. What a warm run may allocate is the
// handles it returns: the vector of outputs, and per output its shape (its
// buffer, a pool block handed to the caller, and the block's shared owner
// are recycled by the pool). Kernels, registers,
// constants, intermediate tensors, error-message text and a recurrent host
// kernel's state allocate nothing, so the count does not grow with the model.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "driver/compile.h"
#include "runtime/vm.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define KILN_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_SANITIZED 1
#endif

namespace {
thread_local bool t_counting = false;
thread_local int64_t t_calls = 0;
thread_local int64_t t_bytes = 0;
void note(size_t bytes) {
  if (!t_counting) return;
  ++t_calls;
  t_bytes += static_cast<int64_t>(bytes);
}
}  // namespace

#ifndef KILN_SANITIZED
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  note(n);
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  note(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note(n);
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
void* memalign(size_t align, size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  note(n);
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}
}
#endif

namespace kiln::driver {
namespace {

struct Count {
  int64_t calls = 0, bytes = 0;
};

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, double scale = 0.5) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, dist(rng));
  return t;
}

// x [1, 16, 12, 12] -> `blocks` residual blocks (3x3 Conv + Relu, 1x1 Conv,
// Add) -> Flatten (a view) -> Gemm to 10.
std::unique_ptr<Graph> conv_net(int blocks) {
  auto g = std::make_unique<Graph>();
  g->source = "alloc";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{1, 16, 12, 12}});
  uint32_t seed = 1;
  for (int b = 0; b < blocks; ++b) {
    std::string s = std::to_string(b);
    Node* c1 = g->add_node("Conv", {x, g->add_constant("w1_" + s, random_tensor({16, 16, 3, 3}, seed++, 0.1)),
                                    g->add_constant("b1_" + s, random_tensor({16}, seed++))}, {"c1_" + s});
    c1->set_attr("kernel_shape", Attribute::of_ints({3, 3}));
    c1->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
    Node* r = g->add_node("Relu", {c1->output(0)}, {"r_" + s});
    Node* c2 = g->add_node("Conv", {r->output(0), g->add_constant("w2_" + s, random_tensor({16, 16, 1, 1}, seed++, 0.2)),
                                    g->add_constant("b2_" + s, random_tensor({16}, seed++))}, {"c2_" + s});
    c2->set_attr("kernel_shape", Attribute::of_ints({1, 1}));
    Node* add = g->add_node("Add", {c2->output(0), x}, {"a_" + s});
    x = add->output(0);
  }
  Node* flat = g->add_node("Flatten", {x}, {"flat"});
  Node* fc = g->add_node("Gemm", {flat->output(0), g->add_constant("wf", random_tensor({16 * 12 * 12, 10}, seed++, 0.02)),
                                  g->add_constant("bf", random_tensor({10}, seed++))}, {"y"});
  g->set_outputs({fc->output(0)});
  return g;
}

// An LSTM layer (projected input, packed R: the recurrent host kernel) over
// x [seq 6, batch 2, input 8], hidden 20, all three outputs, then a Relu of Y.
std::unique_ptr<Graph> lstm_net() {
  auto g = std::make_unique<Graph>();
  g->source = "alloc";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{6, 2, 8}});
  Node* n = g->add_node("LSTM", {x, g->add_constant("w", random_tensor({1, 80, 8}, 1)),
                                 g->add_constant("r", random_tensor({1, 80, 20}, 2, 0.2)),
                                 g->add_constant("b", random_tensor({1, 160}, 3))},
                        {"y", "yh", "yc"});
  n->set_attr("hidden_size", Attribute::of_int(20));
  Node* relu = g->add_node("Relu", {n->output(0)}, {"ry"});
  g->set_outputs({relu->output(0), n->output(1), n->output(2)});
  return g;
}

// Issue 8, item 6: a Loop whose body has static shapes: h = tanh(h W + b),
// then an If (iteration < 2: h * 2, else -h) over it; h carried, tanh's
// result also a scan output. Runs as instructions of one program.
std::unique_ptr<Graph> loop_net() {
  auto g = std::make_unique<Graph>();
  g->source = "alloc";
  g->opsets[""] = 17;
  Value* m = g->add_input("m", TensorType{DType::kInt64, Shape{}});
  Value* h0 = g->add_input("h0", TensorType{DType::kFloat32, Shape{1, 32}});
  auto body = std::make_shared<Graph>();
  body->name = "body";
  Value* i = body->add_input("i", TensorType{DType::kInt64, Shape{}});
  Value* c = body->add_input("c", TensorType{DType::kBool, Shape{}});
  Value* h = body->add_input("h", TensorType{DType::kFloat32, Shape{1, 32}});
  Value* mm = body->add_node("MatMul", {h, body->add_constant("w", random_tensor({32, 32}, 1, 0.3))}, {"mm"})->output(0);
  Value* a = body->add_node("Add", {mm, body->add_constant("b", random_tensor({32}, 2))}, {"a"})->output(0);
  Value* t = body->add_node("Tanh", {a}, {"t"})->output(0);
  Tensor two(DType::kInt64, {});
  two.data_as<int64_t>()[0] = 2;
  Value* early = body->add_node("Less", {i, body->add_constant("two", two)}, {"early"})->output(0);
  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  Value* tt = then_g->add_capture("t", TensorType{DType::kFloat32, Shape{1, 32}});
  then_g->set_outputs({then_g->add_node("Add", {tt, tt}, {"twice"})->output(0)});
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  Value* et = else_g->add_capture("t", TensorType{DType::kFloat32, Shape{1, 32}});
  else_g->set_outputs({else_g->add_node("Neg", {et}, {"neg"})->output(0)});
  Node* branch = body->add_node("If", {early}, {"h_out"});
  branch->set_attr("then_branch", Attribute::of_graph(then_g));
  branch->set_attr("else_branch", Attribute::of_graph(else_g));
  Value* c_out = body->add_node("Identity", {c}, {"c_out"})->output(0);
  Value* ts = body->add_node("Identity", {t}, {"t_scan"})->output(0);
  body->set_outputs({c_out, branch->output(0), ts});
  Node* loop = g->add_node("Loop", {m, nullptr, h0}, {"h_final", "ts"});
  loop->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({loop->output(0), loop->output(1)});
  return g;
}

// Runs `vm` three times (two to warm up) and counts the third run's
// allocations on this thread; the outputs are kept in *outputs (if given).
Count counted_third_run(runtime::VM& vm, const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(vm.run(inputs).is_ok());
  t_calls = t_bytes = 0;
  t_counting = true;
  auto out = vm.run(inputs);
  t_counting = false;
  EXPECT_TRUE(out.is_ok()) << out.status().message();
  if (outputs && out.is_ok()) *outputs = *out;
  return {t_calls, t_bytes};
}

// Runs the compiled graph three times (two to warm up) and counts the third
// run's allocations on this thread; the outputs are released outside the count.
Count warm_run(std::unique_ptr<Graph> g, int threads, std::vector<Tensor>* outputs = nullptr) {
  CompileOptions opts;
  opts.threads = threads;
  auto compiled = compile_graph(std::move(g), opts);
  EXPECT_TRUE(compiled.is_ok()) << compiled.status().message();
  if (!compiled.is_ok()) return {-1, -1};
  runtime::VM vm(compiled->program, threads);
  std::vector<Tensor> inputs;
  for (int r : compiled->program->input_registers) {
    std::vector<int64_t> shape;
    for (const Expr& d : compiled->program->registers[static_cast<size_t>(r)].shape) shape.push_back(*d.as_const());
    inputs.push_back(random_tensor(shape, 99, 1.0));
  }
  return counted_third_run(vm, inputs, outputs);
}

TEST(WarmRun, AllocatesOnlyTheHandlesItReturns) {
#ifdef KILN_SANITIZED
  GTEST_SKIP() << "the sanitizer owns malloc";
#endif
  // The counter sees this thread's allocations: a vector of 4 ints is one.
  t_calls = 0;
  t_counting = true;
  std::vector<int>* probe = new std::vector<int>(4);
  t_counting = false;
  EXPECT_EQ(t_calls, 2);  // the vector object and its elements
  delete probe;

  // Allowed: the outputs vector; per input its handle in the registers;
  // per view of an input (a Reshape of it) the view's shape; per output its
  // shape (its pool block's shared owner is recycled by the pool).
  for (int threads : {1, 2}) {
    Count small = warm_run(conv_net(1), threads);
    Count large = warm_run(conv_net(6), threads);
    EXPECT_EQ(small.calls, 1 + 1 + 1) << threads << " threads, " << small.bytes << " bytes";
    EXPECT_EQ(large.calls, small.calls) << threads << " threads";  // nothing per kernel
    EXPECT_LE(large.bytes, 256) << threads << " threads";

    // The LSTM runs as a Scan (rnn-to-scan): its steps' carried values live
    // in the arena, its scan output in the VM's accumulator; the input
    // projection reads a view of x (as rows), the projection is viewed back
    // per step (two shapes), and Y, Y_h and Y_c are views (Reshape to add
    // the direction axis) of the Scan's results: one shape each.
    std::vector<Tensor> outs;
    Count lstm = warm_run(lstm_net(), threads, &outs);
    EXPECT_EQ(lstm.calls, 1 + 1 + 2 + 3) << threads << " threads, " << lstm.bytes << " bytes";
    EXPECT_LE(lstm.bytes, 640) << threads << " threads";
    ASSERT_EQ(outs.size(), 3u);
    EXPECT_EQ(outs[0].shape(), (std::vector<int64_t>{6, 1, 2, 20}));
    EXPECT_EQ(outs[1].shape(), (std::vector<int64_t>{1, 2, 20}));
  }
}

// A warm run of the loop above allocates what a run of any model does (the
// handles of its outputs), whatever the trip count: iterations reuse the
// arena (the body's intermediates, the carried value, the If's result), the
// loop's scalars and its scan accumulator.
// A loop model run warm with trip count `trips` (then `rest` of its inputs):
// the third run's allocations and outputs.
Count warm_loop_run(const CompiledProgram& compiled, int threads, int64_t trips, const Tensor& rest,
                    std::vector<Tensor>* outputs) {
  runtime::VM vm(compiled.program, threads);
  Tensor m(DType::kInt64, {});
  m.data_as<int64_t>()[0] = trips;
  return counted_third_run(vm, {m, rest}, outputs);
}

TEST(WarmRun, LoopIterationsAllocateNothing) {
#ifdef KILN_SANITIZED
  GTEST_SKIP() << "the sanitizer owns malloc";
#endif
  for (int threads : {1, 2}) {
    CompileOptions opts;
    opts.threads = threads;
    auto compiled = compile_graph(loop_net(), opts);
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
    // One program: no sub-programs, the body's kernels called from its own instructions.
    EXPECT_TRUE(compiled->program->subprograms.empty());
    EXPECT_TRUE(compiled->program->static_plan);
    Tensor h0 = random_tensor({1, 32}, 7, 1.0);
    std::vector<Count> counts;
    std::vector<std::vector<Tensor>> results;
    for (int64_t trips : {3, 40}) {
      std::vector<Tensor> out;
      counts.push_back(warm_loop_run(*compiled, threads, trips, h0, &out));
      ASSERT_EQ(out.size(), 2u);
      ASSERT_EQ(out[1].shape(), (std::vector<int64_t>{trips, 1, 32}));
      results.push_back(out);
    }
    // Allowed: the outputs vector, h0's handle in the registers (m is a
    // scalar: its handle has no dims to allocate), the binding of the scan
    // output's data-dependent length (a symbol), per output its shape (its
    // pool block's owner is recycled).
    EXPECT_EQ(counts[0].calls, 1 + 1 + 1 + 2) << threads << " threads, " << counts[0].bytes << " bytes";
    EXPECT_EQ(counts[1].calls, counts[0].calls) << threads << " threads: allocations grow with the trip count";
    EXPECT_EQ(counts[1].bytes, counts[0].bytes) << threads << " threads";
    // The first 3 iterations of the long run are the short run's.
    EXPECT_EQ(std::memcmp(results[0][1].data(), results[1][1].data(), 3 * 32 * sizeof(float)), 0);
  }
}

// A loop whose carried value changes shape (v = Concat(v, v * 0.5), so it
// doubles each iteration): its registers come from the pool each iteration,
// but the shape vectors, the blocks' shared owners and the symbol the body
// binds (v's length) are recycled, so a warm run allocates the same at 3, 6
// and 9 iterations (only what it returns grows).
std::unique_ptr<Graph> grow_net() {
  auto g = std::make_unique<Graph>();
  g->source = "grow";
  g->opsets[""] = 17;
  Value* m = g->add_input("m", TensorType{DType::kInt64, Shape{}});
  Value* v0 = g->add_input("v0", TensorType{DType::kFloat32, Shape{4}});
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->add_input("i", TensorType{DType::kInt64, Shape{}});
  Value* c = body->add_input("c", TensorType{DType::kBool, Shape{}});
  Value* v = body->add_input("v", TensorType{DType::kFloat32, Shape{Expr(var("k"))}});
  Tensor half(DType::kFloat32, {});
  half.data_as<float>()[0] = 0.5f;
  Value* h = body->add_node("Mul", {v, body->add_constant("half", half)}, {"h"})->output(0);
  Node* cat = body->add_node("Concat", {v, h}, {"v2"});
  cat->set_attr("axis", Attribute::of_int(0));
  Value* c_out = body->add_node("Identity", {c}, {"c_out"})->output(0);
  body->set_outputs({c_out, cat->output(0)});
  Node* loop = g->add_node("Loop", {m, nullptr, v0}, {"v_final"});
  loop->set_attr("body", Attribute::of_graph(body));
  g->set_outputs({loop->output(0)});
  return g;
}

TEST(WarmRun, ShapeChangingLoopIterationsAllocateNothing) {
#ifdef KILN_SANITIZED
  GTEST_SKIP() << "the sanitizer owns malloc";
#endif
  for (int threads : {1, 2}) {
    CompileOptions opts;
    opts.threads = threads;
    auto compiled = compile_graph(grow_net(), opts);
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
    EXPECT_TRUE(compiled->program->subprograms.empty());
    Tensor v0 = random_tensor({4}, 3, 1.0);
    std::vector<Count> counts;
    for (int64_t trips : {3, 6, 9}) {
      std::vector<Tensor> out;
      counts.push_back(warm_loop_run(*compiled, threads, trips, v0, &out));
      ASSERT_EQ(out.size(), 1u);
      // The reference: v doubles each iteration, its second half half the first.
      std::vector<float> want(v0.data_as<float>(), v0.data_as<float>() + 4);
      for (int64_t t = 0; t < trips; ++t) {
        size_t n = want.size();
        for (size_t e = 0; e < n; ++e) want.push_back(want[e] * 0.5f);
      }
      const Tensor& got = out[0];
      ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
      for (size_t e = 0; e < want.size(); ++e) ASSERT_EQ(got.data_as<float>()[e], want[e]) << "element " << e;
    }
    EXPECT_EQ(counts[1].calls, counts[0].calls) << threads << " threads: allocations grow with the trip count";
    EXPECT_EQ(counts[2].calls, counts[0].calls) << threads << " threads: allocations grow with the trip count";
  }
}

// Warm runs reuse registers, pool blocks and the host kernel's buffers: each
// result must still equal the first run's bit for bit, and a result the
// caller holds must not change when the model runs again.
TEST(WarmRun, ReusedBuffersKeepResults) {
  for (auto make : {+[] { return conv_net(3); }, +[] { return lstm_net(); }}) {
    CompileOptions opts;
    opts.threads = 2;
    auto compiled = compile_graph(make(), opts);
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().message();
    runtime::VM vm(compiled->program, 2);
    std::vector<int64_t> shape;
    for (const Expr& d : compiled->program->registers[static_cast<size_t>(compiled->program->input_registers[0])].shape)
      shape.push_back(*d.as_const());
    Tensor a = random_tensor(shape, 5, 1.0), b = random_tensor(shape, 6, 1.0);
    auto first = vm.run({a});
    ASSERT_TRUE(first.is_ok()) << first.status().message();
    std::vector<Tensor> held;
    for (const Tensor& t : *first) held.push_back(t.clone());
    auto other = vm.run({b});
    ASSERT_TRUE(other.is_ok());
    auto again = vm.run({a});
    ASSERT_TRUE(again.is_ok());
    for (size_t i = 0; i < held.size(); ++i) {
      ASSERT_EQ((*first)[i].nbytes(), held[i].nbytes());
      EXPECT_EQ(std::memcmp((*first)[i].data(), held[i].data(), static_cast<size_t>(held[i].nbytes())), 0)
          << "output " << i << " changed under the caller";
      EXPECT_EQ(std::memcmp((*again)[i].data(), held[i].data(), static_cast<size_t>(held[i].nbytes())), 0)
          << "output " << i << " differs between runs of the same input";
      EXPECT_NE(std::memcmp((*other)[i].data(), held[i].data(), static_cast<size_t>(held[i].nbytes())), 0)
          << "output " << i << " does not depend on the input";
    }
  }
}

}  // namespace
}  // namespace kiln::driver
