// The generic schedule space of kernels without a candidate
// (strategy/generic.cc): its default point is the default schedule, every
// point is a different schedule, and every point computes what the naive
// lowering computes (both run by the loop-IR interpreter) on elementwise
// groups, Softmax, LayerNormalization, a global pool, reductions and transposes of
// odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "driver/compile.h"
#include "kernels/kernels.h"
#include "ops/registry.h"
#include "strategy/strategy.h"
#include "tir/interpret.h"
#include "tir/knobs.h"

namespace kiln::driver {
namespace {

struct Case {
  std::string name;
  std::function<void(Graph&, Value*)> build;  // nodes after the input x; sets the outputs
  std::vector<int64_t> x;
};

std::unique_ptr<Graph> graph_of(const Case& c) {
  auto g = std::make_unique<Graph>();
  g->name = c.name;
  g->source = c.name;
  g->opsets[""] = 17;
  Shape s;
  for (int64_t d : c.x) s.push_back(Expr(d));
  Value* x = g->add_input("x", TensorType{DType::kFloat32, s});
  c.build(*g, x);
  return g;
}

Tensor filled(const std::vector<int64_t>& shape, uint32_t seed) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return t;
}

// The kernel's outputs under `s` for fixed random inputs, interpreted.
Result<std::vector<Tensor>> interpret_under(const tir::KernelDef& k, const tir::Schedule& s) {
  KILN_ASSIGN_OR_RETURN(tir::PrimFunc f, tir::lower(k, s));
  std::vector<Tensor> bufs;
  std::vector<void*> ptrs;
  for (size_t i = 0; i < k.params.size(); ++i) {
    std::vector<int64_t> shape;
    for (const Expr& e : k.params[i].shape) shape.push_back(*e.as_const());
    bufs.push_back(i < static_cast<size_t>(k.num_inputs) ? filled(shape, 7 + static_cast<uint32_t>(i))
                                                         : Tensor(DType::kFloat32, shape));
  }
  for (Tensor& t : bufs) ptrs.push_back(t.data());
  KILN_RETURN_IF_ERROR(tir::interpret(f, ptrs, {}));
  return std::vector<Tensor>(bufs.begin() + k.num_inputs, bufs.end());
}

Node* add(Graph& g, const std::string& op, std::vector<Value*> ins, const std::string& out) {
  return g.add_node(op, std::move(ins), {out}, "", out);
}

TEST(GenericSpace, EveryPointMatchesNaive) {
  const std::vector<Case> cases = {
      {"elementwise",
       [](Graph& g, Value* x) {
         Value* b = g.add_constant("b", filled({70}, 3));
         Node* a = add(g, "Add", {x, b}, "a");
         Node* r = add(g, "Relu", {a->output(0)}, "r");
         Node* m = add(g, "Mul", {r->output(0), x}, "y");
         g.set_outputs({m->output(0)});
       },
       {3, 37, 70}},
      {"softmax",
       [](Graph& g, Value* x) { g.set_outputs({add(g, "Softmax", {x}, "y")->output(0)}); },
       {6, 100}},
      {"layernorm",
       [](Graph& g, Value* x) {
         Value* s = g.add_constant("s", filled({96}, 4));
         Value* b = g.add_constant("b", filled({96}, 5));
         Node* n = add(g, "LayerNormalization", {x, s, b}, "y");
         n->set_attr("axis", Attribute::of_int(-1));
         g.set_outputs({n->output(0)});
       },
       {4, 5, 96}},
      {"globalpool",
       [](Graph& g, Value* x) { g.set_outputs({add(g, "GlobalAveragePool", {x}, "y")->output(0)}); },
       {1, 24, 13, 13}},
      {"reducemean",
       [](Graph& g, Value* x) {
         Node* n = add(g, "ReduceMean", {x}, "y");
         n->set_attr("axes", Attribute::of_ints({1}));
         n->set_attr("keepdims", Attribute::of_int(0));
         g.set_outputs({n->output(0)});
       },
       {9, 33, 40}},
      {"transpose",
       [](Graph& g, Value* x) {
         Node* n = add(g, "Transpose", {x}, "y");
         n->set_attr("perm", Attribute::of_ints({0, 2, 1}));
         g.set_outputs({n->output(0)});
       },
       {5, 33, 17}},
  };
  const Target target = *Target::named("avx512");
  int spaces = 0;
  std::set<std::string> knob_names;
  for (const Case& c : cases) {
    auto g = graph_of(c);
    CompileOptions o;
    o.no_db = true;
    KernelEvaluator ev(o);
    auto ctx = pass_context(*g, o, &ev);
    ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
    ASSERT_TRUE(run_graph_passes(*g, o, *ctx).is_ok());
    ASSERT_TRUE(choose_kernels(*g, o, *ctx).is_ok());
    auto gws = kernels::generic_workloads(*g, ctx->infer.bounds, true, /*before_choice=*/false);
    ASSERT_FALSE(gws.empty()) << c.name;
    for (const kernels::GroupWorkload& gw : gws) {
      const tir::KernelDef& k = gw.def;
      const std::string what = c.name + " (" + gw.anchor->describe() + ")";
      auto want = interpret_under(k, tir::naive_schedule(k));
      ASSERT_TRUE(want.is_ok()) << what << ": " << want.status().to_string();
      for (int threads : {1, 2}) {
        tir::KnobSpace space = strategy::generic_space(k, target, threads);
        // The default point is the default schedule.
        EXPECT_EQ(strategy::generic_schedule(k, strategy::generic_defaults(space)).to_string(),
                  tir::default_schedule(k).to_string())
            << what;
        if (threads == 1) {
          for (const tir::Knob& knob : space.knobs) EXPECT_NE(knob.name, "par") << what << ": one thread has no choice of parallel loop";
        } else {
          // A point tuned at one thread (no par) is in the space of two, as par's default.
          tir::KnobSpace one = strategy::generic_space(k, target, 1);
          for (const tir::Knobs& p : tir::enumerate_knobs(one)) EXPECT_TRUE(space.contains(p)) << what << " " << tir::knobs_to_string(p);
        }
        if (space.knobs.empty()) continue;
        ++spaces;
        std::set<std::string> schedules;
        std::vector<tir::Knobs> points = tir::enumerate_knobs(space);
        for (const tir::Knobs& p : points) {
          for (const auto& [name, v] : p) knob_names.insert(name);
          const tir::Schedule s = strategy::generic_schedule(k, p);
          EXPECT_TRUE(schedules.insert(s.to_string()).second)
              << what << ": point " << tir::knobs_to_string(p) << " repeats another's schedule";
          auto got = interpret_under(k, s);
          ASSERT_TRUE(got.is_ok()) << what << " " << tir::knobs_to_string(p) << ": " << got.status().to_string()
                                   << "\n" << s.to_string();
          ASSERT_EQ(got->size(), want->size());
          for (size_t o2 = 0; o2 < got->size(); ++o2)
            for (int64_t i = 0; i < (*want)[o2].numel(); ++i) {
              float a = (*got)[o2].data_as<float>()[i], b = (*want)[o2].data_as<float>()[i];
              ASSERT_LE(std::fabs(a - b), 1e-5 * (1 + std::fabs(b)))
                  << what << " " << tir::knobs_to_string(p) << " element " << i << "\n" << s.to_string();
            }
        }
      }
    }
  }
  EXPECT_GE(spaces, 6) << "most of these kernels have a choice";
  for (const char* k : {"vec", "unroll", "par", "red"}) EXPECT_TRUE(knob_names.count(k)) << "no kernel varies " << k;
}

}  // namespace
}  // namespace kiln::driver
