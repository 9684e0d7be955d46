// Tutorial step 5 (docs/tutorial/README.md): a new schedule template.
//
// Registers the candidate "gemm.tutorial" for Gemm: the product's output
// columns in vectors of `vw` lanes accumulated in registers (cache_write),
// the row loop parallel. Then compiles the model named on the command line
// with that candidate preferred, runs it and the default compilation on the
// same random input, and prints the kernels and the largest difference.
//
//   build/docs/tutorial/gemm_template tiny.onnx
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "kiln/kiln.h"
#include "strategy/strategy.h"
#include "strategy/template.h"

namespace {

using namespace kiln;

// The template: the stage the Gemm defines (its axes a0 rows, a1 columns, its
// reduction over r0) gets these primitives; the kernel's other stages (a fused
// bias or activation) keep the default schedule.
Result<tir::Schedule> tutorial_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  const tir::ComputeDef* def = strategy::find_stage(k, stage);
  if (def == nullptr || def->axes.size() != 2) return unsupported() << "gemm.tutorial: expected a 2-D product";
  KILN_ASSIGN_OR_RETURN(int64_t vw, strategy::knob(knobs, "vw", "gemm.tutorial"));
  const std::string rows = def->axes[0], cols = def->axes[1];
  std::vector<tir::Primitive> prims = {
      strategy::prim("split", stage, {cols}, vw),                           // cols -> cols.o, cols.i
      strategy::prim("reorder", stage, {rows, cols + ".o", cols + ".i"}),  // rows outermost
      strategy::prim("cache_write", stage, {cols + ".o"}),                 // a vw-lane accumulator per tile
      strategy::prim("vectorize", stage, {cols + ".i"}),
      strategy::prim("parallel", stage, {rows}),
  };
  return strategy::replace_stage_schedule(k, stage, prims);
}

void register_tutorial_candidate() {
  strategy::Candidate c;
  c.name = "gemm.tutorial";
  c.op = "Gemm";
  c.priority = 0;  // never chosen by priority: only when preferred (or measured, or tuned)
  c.summary = "tutorial: columns in vectors of vw lanes, rows in parallel";
  c.applies = [](const Node& n, std::string* why) {
    // The default lowering of Gemm (no transposed A) is what the template schedules.
    if (n.attr_int("transA", 0) != 0) {
      if (why) *why = "transA";
      return false;
    }
    return true;
  };
  c.space = [](const Node&, const Target&) {
    tir::KnobSpace s;
    s.knobs.push_back({"vw", {8, 16}, std::nullopt});
    return s;
  };
  c.default_knobs = [](const Node&, const Target&) { return tir::Knobs{{"vw", 16}}; };
  c.schedule = tutorial_schedule;
  strategy::register_candidate(std::move(c));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gemm_template MODEL.onnx\n");
    return 2;
  }
  register_tutorial_candidate();
  CompileOptions plain;
  plain.no_db = true;
  CompileOptions mine = plain;
  mine.prefer_impls = {"gemm.tutorial:vw=8"};
  auto reference = Model::compile_file(argv[1], plain);
  auto model = Model::compile_file(argv[1], mine);
  if (!reference.is_ok() || !model.is_ok()) {
    std::fprintf(stderr, "%s\n", (reference.is_ok() ? model.status() : reference.status()).to_string().c_str());
    return 2;
  }
  std::printf("%s", model->kernels_text().c_str());
  std::map<std::string, Tensor> inputs;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (const TensorInfo& info : model->inputs()) {
    std::vector<int64_t> shape;
    for (const std::string& d : info.dims) shape.push_back(std::stoll(d));
    Tensor t(DType::kFloat32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = normal(rng);
    inputs[info.name] = t;
  }
  auto want = reference->run(inputs);
  auto got = model->run(inputs);
  if (!want.is_ok() || !got.is_ok()) {
    std::fprintf(stderr, "run failed\n");
    return 2;
  }
  double diff = 0, scale = 0;
  for (const auto& [name, t] : *want) {
    const Tensor& g = got->at(name);
    for (int64_t i = 0; i < t.numel(); ++i) {
      diff = std::max(diff, std::fabs(double(g.data_as<float>()[i]) - t.data_as<float>()[i]));
      scale = std::max(scale, std::fabs(double(t.data_as<float>()[i])));
    }
  }
  std::printf("largest difference from the default compilation: %.3g (outputs up to %.3g)\n", diff, scale);
  return diff <= 1e-4 + 1e-4 * scale ? 0 : 1;
}
