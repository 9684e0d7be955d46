// The compile stages as they run (CompileStats::stages, recorded by
// src/driver/compile.cc) against the numbered list in docs/architecture.md:
// the two must not drift.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "driver/compile.h"
#include "frontend/onnx/export.h"

namespace kiln::driver {
namespace {

// The names of the list under "## The pipeline" in docs/architecture.md:
// lines "  N. name  ..." inside its fenced block, the name ending at two spaces.
std::vector<std::string> documented_stages() {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/docs/architecture.md");
  EXPECT_TRUE(in.good()) << "docs/architecture.md not found under " << KILN_SOURCE_DIR;
  std::string line;
  bool section = false, fence = false;
  std::vector<std::string> out;
  const std::regex item(R"(^\s*(\d+)\.\s+(\S+(?: \S+)*?)(?:\s{2,}.*)?$)");
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) section = line.rfind("## The pipeline", 0) == 0;
    if (!section) continue;
    if (line.rfind("```", 0) == 0) {
      if (fence) break;
      fence = true;
      continue;
    }
    std::smatch m;
    if (fence && std::regex_match(line, m, item)) {
      EXPECT_EQ(std::stoul(m[1]), out.size() + 1) << "numbering: " << line;
      out.push_back(m[2]);
    }
  }
  return out;
}

TEST(CompileStages, DocumentedListMatchesTheCompiler) {
  // A model with a kernel and an If of unknown condition: every stage has work.
  auto g = parse_graph(R"(graph main(%x: f32[4], %c: bool[]) -> (%y) {
  opset "" 17
  %r: f32[4] = Relu(%x)
  %y: f32[4] = If(%c) {else_branch = graph g2() -> (%e) {
    capture %r: f32[4]
    %e: f32[4] = Exp(%r)
  }, then_branch = graph g1() -> (%t) {
    capture %r: f32[4]
    %t: f32[4] = Neg(%r)
  }}
}
)");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto bytes = export_onnx_bytes(**g);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  ModelSource source;
  source.bytes = *bytes;
  source.name = "stages.onnx";
  auto compiled = compile_model(source, CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  std::vector<std::string> ran;
  for (const auto& [name, seconds] : compiled->stats.stages) {
    ran.push_back(name);
    EXPECT_GE(seconds, 0.0) << name;
  }
  std::vector<std::string> documented = documented_stages();
  ASSERT_FALSE(documented.empty()) << "no numbered stage list under '## The pipeline' in docs/architecture.md";
  EXPECT_EQ(ran, documented) << "src/driver/compile.cc and docs/architecture.md list different stages";
}

}  // namespace
}  // namespace kiln::driver
