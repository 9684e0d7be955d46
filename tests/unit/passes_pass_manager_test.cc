// The pass manager, the pass registry and the default pipeline, and the
// rewrite driver's fixed point.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "graph/graph.h"
#include "passes/default_pipeline.h"
#include "passes/fold_constants.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"

namespace kiln::passes {
namespace {

std::unique_ptr<Graph> parse(const char* text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return std::move(g).value();
}

const char* kChain = R"(graph main(%x: f32[n, 4]) -> (%y) {
  opset "" 17
  bound n [1, inf]
  %a: f32[?] = Identity(%x)
  %b: f32[?] = Identity(%a)
  %c: f32[?] = Identity(%b)
  %y: f32[?] = Relu(%c)
}
)";

TEST(PassManager, UnknownPassFailsBeforeAnyPassRuns) {
  auto g = parse(kChain);
  std::string before = print_graph(*g);
  PassContext ctx;
  auto runs = run_passes(*g, {"infer-shapes", "eliminate-identities", "no-such-pass"}, ctx);
  ASSERT_FALSE(runs.is_ok());
  EXPECT_NE(runs.status().message().find("unknown pass 'no-such-pass'"), std::string::npos);
  EXPECT_EQ(print_graph(*g), before);
}

TEST(PassManager, PassNeedingShapesBeforeInferenceIsAnError) {
  auto g = parse(kChain);
  PassContext ctx;
  auto runs = run_passes(*g, {"eliminate-identities"}, ctx);
  ASSERT_FALSE(runs.is_ok());
  EXPECT_NE(runs.status().message().find("needs inferred shapes"), std::string::npos);
}

TEST(PassManager, RewritesToAFixedPointAndReinfers) {
  auto g = parse(kChain);
  PassContext ctx;
  auto runs = run_passes(*g, with_shape_inference({"eliminate-identities"}), ctx);
  ASSERT_TRUE(runs.is_ok()) << runs.status().to_string();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[1].name, "eliminate-identities");
  EXPECT_EQ((*runs)[1].rewrites, 3);
  EXPECT_EQ((*runs)[1].nodes, 1);
  ASSERT_EQ(g->num_nodes(), 1u);
  Node* relu = g->nodes()[0];
  EXPECT_EQ(relu->input(0), g->inputs()[0]);
  EXPECT_EQ(relu->output(0)->type().to_string(), "f32[n, 4]");
  EXPECT_TRUE(g->verify().is_ok());
}

TEST(PassManager, ShapeInferenceIsPlacedWhereNeeded) {
  EXPECT_EQ(with_shape_inference({}), std::vector<std::string>{"infer-shapes"});
  EXPECT_EQ(with_shape_inference({"eliminate-dead-code", "fold-constants"}),
            (std::vector<std::string>{"eliminate-dead-code", "infer-shapes", "fold-constants"}));
  EXPECT_EQ(with_shape_inference({"infer-shapes", "eliminate-dead-code"}),
            (std::vector<std::string>{"infer-shapes", "eliminate-dead-code"}));
  // kiln opt prints a structural pass's result uninferred: no infer-shapes at the end.
  EXPECT_EQ(with_shape_inference({"fold-transposed-weights"}, false),
            std::vector<std::string>{"fold-transposed-weights"});
  EXPECT_EQ(with_shape_inference({"fold-transposed-weights"}, true),
            (std::vector<std::string>{"fold-transposed-weights", "infer-shapes"}));
}

TEST(PassRegistry, EveryPassHasANameASummaryAndATestFile) {
  std::filesystem::path root = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  std::set<std::string> names;
  for (const PassInfo& p : registered_passes()) {
    EXPECT_TRUE(names.insert(p.name).second) << "registered twice: " << p.name;
    EXPECT_FALSE(p.summary.empty()) << p.name;
    EXPECT_NE(p.run, nullptr) << p.name;
    EXPECT_TRUE(std::filesystem::exists(root / p.test)) << p.name << ": " << p.test;
  }
  for (bool naive : {false, true})
    for (const std::string& name : default_pipeline(naive)) EXPECT_NE(find_pass(name), nullptr) << name;
}

// fold-constants materializes only what non-folded nodes read, evaluates the
// foldable part as one graph, and leaves the graph as it was when evaluation fails.
TEST(FoldConstants, EvaluatesTheFrontierOnceAndSurvivesFailure) {
  const char* text = R"(graph main(%x: f32[2]) -> (%y) {
  opset "" 17
  %c: f32[2] = const<f32[2] [1, 4]>
  %s: f32[?] = Sqrt(%c)
  %t: f32[?] = Neg(%s)
  %y: f32[?] = Add(%x, %t)
}
)";
  for (bool fail : {false, true}) {
    auto g = parse(text);
    PassContext ctx;
    // An evaluator that checks what it is given and answers fixed values.
    struct Stub : Evaluator {
      bool fail = false;
      int calls = 0;
      Result<std::vector<Tensor>> evaluate(std::unique_ptr<Graph> sub) override {
        ++calls;
        EXPECT_EQ(sub->num_nodes(), 2u);
        EXPECT_EQ(sub->outputs().size(), 1u);
        if (fail) return invalid_argument() << "evaluation failed";
        Tensor t(DType::kFloat32, {2});
        t.data_as<float>()[0] = -1;
        t.data_as<float>()[1] = -2;
        return std::vector<Tensor>{t};
      }
    } stub;
    stub.fail = fail;
    ctx.evaluator = &stub;
    const int& calls = stub.calls;
    ASSERT_TRUE(infer_shapes(*g, ctx).is_ok());
    auto rewrites = fold_constants(*g, ctx);
    ASSERT_TRUE(rewrites.is_ok()) << rewrites.status().to_string();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(*rewrites, fail ? 0 : 1);
    EXPECT_EQ(g->num_nodes(), fail ? 3u : 1u);
    if (!fail) {
      const Value* folded = g->nodes()[0]->input(1);
      ASSERT_TRUE(folded->is_constant());
      EXPECT_EQ(folded->constant().get_f64(1), -2);
    }
  }
}

}  // namespace
}  // namespace kiln::passes
