// Shared by the ops unit tests: runs one node of a graph through its op's
// lower(), both the naive and the default schedule, and the loop-IR
// interpreter, and returns the outputs (after checking that both schedules
// agree).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "ops/registry.h"
#include "support/tensor.h"
#include "tir/interpret.h"
#include "tir/schedule.h"
#include "tir/tir.h"

namespace kiln::ops::testing {

using SymEnv = std::map<std::string, int64_t, std::less<>>;

inline TensorType tt(DType d, Shape s) { return TensorType{d, std::move(s)}; }

inline Tensor make_tensor(DType d, std::vector<int64_t> shape, const std::vector<double>& vals) {
  Tensor t(d, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(vals.size())) << "test data size";
  for (int64_t i = 0; i < t.numel() && i < static_cast<int64_t>(vals.size()); ++i) t.set_f64(i, vals[i]);
  return t;
}

inline std::vector<double> to_vector(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_f64(i));
  return v;
}

// Deterministic varied values in [lo, hi).
inline std::vector<double> ramp(int64_t n, double lo, double hi, int seed = 1) {
  std::vector<double> v;
  uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(seed);
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(lo + (hi - lo) * static_cast<double>((s >> 11) % 1000003) / 1000003.0);
  }
  return v;
}

inline Status infer(Graph& g) {
  InferContext ctx;
  ctx.bounds = g.bounds;
  return infer_shapes(g, ctx);
}

inline std::vector<int64_t> eval_shape(const std::vector<Expr>& shape, const SymEnv& env) {
  std::vector<int64_t> out;
  for (const Expr& d : shape) {
    auto r = evaluate(d, env);
    KILN_CHECK(r.is_ok()) << "cannot evaluate dim " << d.to_string() << ": " << r.status().to_string();
    out.push_back(*r);
  }
  return out;
}

// Builds node n's runtime kernel and runs it on `inputs`: the outputs, or the
// error the kernel (or its builder) returns.
inline Result<std::vector<Tensor>> try_kernel(const Node& n, const std::vector<Tensor>& inputs) {
  const ops::OpDef* def = ops::find_op(n.domain(), n.op_type());
  if (def == nullptr || !def->kernel) return internal_error() << "no kernel for " << n.op_type();
  KILN_ASSIGN_OR_RETURN(ops::RuntimeKernel k, def->kernel(n));
  std::vector<Tensor> out;
  KILN_RETURN_IF_ERROR(k(inputs, out));
  return out;
}

// Lowers node n and runs it on `inputs` (one per node input, undefined for an
// omitted one). Returns one tensor per node output (undefined for an omitted
// one). Fails the test on errors; then the result is empty.
inline std::vector<Tensor> run_node(const Graph& g, const Node& n, const std::vector<Tensor>& inputs,
                                    const SymEnv& env = {}) {
  const OpDef* def = find_op(n.domain(), n.op_type());
  if (def == nullptr || !def->lower) {
    ADD_FAILURE() << "no lowering for " << n.op_type();
    return {};
  }
  int counter = 0;
  LowerContext ctx;
  ctx.name_counter = &counter;
  auto it = g.opsets.find("");
  ctx.opset = it == g.opsets.end() ? 0 : it->second;
  tir::KernelDef k;
  k.name = n.op_type();
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v == nullptr) {
      ctx.inputs.push_back(tir::Buffer{});
      ctx.input_index.push_back(-1);
      ctx.constants.push_back(nullptr);
      ctx.sym_values.push_back(std::nullopt);
      continue;
    }
    tir::Buffer b{v->name(), v->dtype(), *v->type().shape};
    ctx.inputs.push_back(b);
    ctx.input_index.push_back(static_cast<int>(k.params.size()));
    ctx.constants.push_back(v->is_constant() ? &v->constant() : nullptr);
    ctx.sym_values.push_back(v->sym_value());
    k.params.push_back(b);
  }
  k.num_inputs = static_cast<int>(k.params.size());
  std::vector<int> out_param(n.num_outputs(), -1);
  for (size_t i = 0; i < n.num_outputs(); ++i) {
    const Value* v = n.output(i);
    if (v == nullptr || v->name().empty()) {
      ctx.outputs.push_back(tir::Buffer{});
      continue;
    }
    tir::Buffer b{v->name(), v->dtype(), *v->type().shape};
    ctx.outputs.push_back(b);
    out_param[i] = static_cast<int>(k.params.size());
    k.params.push_back(b);
  }
  auto stages = def->lower(n, ctx);
  if (!stages.is_ok()) {
    ADD_FAILURE() << "lower failed: " << stages.status().to_string();
    return {};
  }
  k.stages = *stages;

  std::vector<std::vector<Tensor>> results;
  for (int which = 0; which < 2; ++which) {
    tir::Schedule s = which == 0 ? tir::naive_schedule(k) : tir::default_schedule(k);
    auto f = tir::lower(k, s);
    if (!f.is_ok()) {
      ADD_FAILURE() << "tir::lower failed (" << (which == 0 ? "naive" : "default")
                    << "): " << f.status().to_string() << "\n" << tir::print_kernel_def(k);
      return {};
    }
    std::vector<Tensor> params;
    size_t in_pos = 0;
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      if (n.input(i) == nullptr) continue;
      std::vector<int64_t> shape = eval_shape(k.params[in_pos].shape, env);
      const Tensor& t = inputs.at(i);
      if (t.shape() != shape || t.dtype() != k.params[in_pos].dtype) {
        ADD_FAILURE() << "input " << i << " is " << t.describe() << ", kernel expects " << shape_to_string(shape);
        return {};
      }
      params.push_back(t);
      ++in_pos;
    }
    for (size_t p = k.num_inputs; p < k.params.size(); ++p) {
      Tensor out(k.params[p].dtype, eval_shape(k.params[p].shape, env));
      // Poison outputs so that an unwritten element shows up.
      for (int64_t e = 0; e < out.numel(); ++e) out.set_f64(e, dtype_is_float(out.dtype()) ? NAN : 77);
      params.push_back(out);
    }
    std::vector<void*> ptrs;
    for (Tensor& t : params) ptrs.push_back(t.data());
    std::vector<int64_t> syms;
    for (const std::string& name : f->sym_names) {
      auto e = env.find(name);
      if (e == env.end()) {
        ADD_FAILURE() << "no value for symbol " << name;
        return {};
      }
      syms.push_back(e->second);
    }
    Status st = tir::interpret(*f, ptrs, syms);
    if (!st.is_ok()) {
      ADD_FAILURE() << "interpret failed (" << (which == 0 ? "naive" : "default") << "): " << st.to_string() << "\n"
                    << tir::print_func(*f);
      return {};
    }
    std::vector<Tensor> outs(n.num_outputs());
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      if (out_param[i] >= 0) outs[i] = params[static_cast<size_t>(out_param[i])];
    }
    results.push_back(std::move(outs));
  }
  // Both schedules must agree exactly (same operations, same order).
  for (size_t i = 0; i < results[0].size(); ++i) {
    if (!results[0][i].defined()) continue;
    std::vector<double> a = to_vector(results[0][i]), b = to_vector(results[1][i]);
    for (size_t e = 0; e < a.size(); ++e) {
      if (std::isnan(a[e]) && std::isnan(b[e])) continue;
      if (a[e] != b[e]) {
        ADD_FAILURE() << n.op_type() << " output " << i << " element " << e << ": naive " << a[e] << " vs default "
                      << b[e];
        break;
      }
    }
  }
  return results[0];
}

// Expects every element of t to be within tol (absolute + relative) of want.
inline void expect_close(const Tensor& t, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_TRUE(t.defined()) << what;
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    double got = t.get_f64(static_cast<int64_t>(i));
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got)) << what << " element " << i;
      continue;
    }
    if (std::isinf(want[i])) {
      EXPECT_EQ(got, want[i]) << what << " element " << i;
      continue;
    }
    EXPECT_NEAR(got, want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
  }
}

}  // namespace kiln::ops::testing
