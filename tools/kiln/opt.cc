// kiln opt FILE [--PASS ...] [--passes=a,b,c] [--default-pipeline] [--disable=a,b]
//               [--print-after-all] [--print-after=PASS] [--verify-each] [--time-passes]
//               [--fuse-elementwise] [--lower [--naive]] [-o OUT.kir|OUT.onnx]
//               [--check-equiv[=PASS]] [--dim NAME=VALUE ...]
// kiln opt --list-passes [--markdown]
//
// FILE is a graph in Kiln's text form (.kir, see src/graph/graph.h) or an ONNX
// model. The passes run in the order given: each registered pass has its flag
// (--eliminate-dead-code, ...; `kiln opt --list-passes`), --passes= appends a
// list, --default-pipeline appends the pipeline compilation runs. infer-shapes
// is put before the first pass that needs shapes when none precedes it. The
// graph is printed after the last pass ("// after PASS (N rewrites)"), or as
// parsed when no pass runs; -o writes it to a file instead, as text (.kir) or
// as an ONNX model (.onnx; frontend/onnx/export.h). --disable drops passes
// from the list (e.g. select-kernels, whose weight layout ONNX lacks).
//   --fuse-elementwise  prints the fused groups ("group %root: Add Relu ...")
//   --lower             prints every kernel: compute definition, schedule, loop IR
//                       (default schedules; --naive for the reference ones)
//   --check-equiv       compiles the graph with naive and with default schedules,
//                       runs both on the same random inputs and compares; exit 1
//                       when they differ beyond 1e-5 + 1e-4*|ref|. Symbols not
//                       fixed by --dim are bound to 1, 3 and 8 in turn.
//   --check-equiv=PASS  the same comparison between the pipeline (the passes
//                       given, else the default pipeline) without PASS and with
//                       it: a wrong rewrite by PASS shows as a difference
#include "opt.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "driver/compile.h"
#include "frontend/onnx/export.h"
#include "frontend/onnx/import.h"
#include "graph/graph.h"
#include "ops/registry.h"
#include "passes/default_pipeline.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"
#include "runtime/vm.h"

namespace kiln::cli {
namespace {

Result<std::unique_ptr<Graph>> load_graph(const std::string& path) {
  if (path.size() > 5 && path.substr(path.size() - 5) == ".onnx") return import_onnx_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found() << "cannot open '" << path << "'";
  std::stringstream ss;
  ss << in.rdbuf();
  auto g = parse_graph(ss.str());
  if (!g.is_ok()) return g.status().with_context(path);
  if ((*g)->source.empty()) (*g)->source = path;
  return g;
}

Tensor random_input(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor t(dtype, shape);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> small(0, 4);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype_is_float(dtype))
      t.set_f64(i, normal(rng));
    else
      t.set_f64(i, small(rng));
  }
  return t;
}

// The two sides compared by --check-equiv: the reference and the compilation under test.
struct EquivSides {
  CompileOptions reference, test;
  std::string what;  // for the report
};

// --check-equiv: naive against default schedules. --check-equiv=PASS: the
// pipeline without PASS against the pipeline with it (same schedules on both
// sides), so a wrong rewrite by PASS shows as a difference.
Result<EquivSides> equiv_sides(const std::string& pass, const std::vector<std::string>& pipeline) {
  EquivSides sides;
  sides.reference.threads = sides.test.threads = 2;
  if (pass.empty()) {
    sides.reference.naive = true;
    sides.what = "default vs naive schedules";
    return sides;
  }
  if (pass != "fuse-elementwise" && passes::find_pass(pass) == nullptr)
    return invalid_argument() << "--check-equiv=" << pass << ": unknown pass (" << passes::pass_names()
                              << ", fuse-elementwise)";
  std::vector<std::string> with = pipeline.empty() ? passes::default_pipeline() : pipeline;
  if (pass != "fuse-elementwise" && std::find(with.begin(), with.end(), pass) == with.end()) with.push_back(pass);
  sides.test.passes = with;
  sides.reference.passes = with;
  sides.reference.disable_passes = {pass};
  sides.what = "with vs without " + pass;
  return sides;
}

// Compiles the graph both ways and compares outputs on random inputs, once per
// binding of the symbols not fixed by --dim (each bound to 1, 3 and 8).
Result<int> check_equiv(const std::string& path, const std::map<std::string, int64_t, std::less<>>& dims,
                        const std::string& pass, const std::vector<std::string>& pipeline) {
  KILN_ASSIGN_OR_RETURN(EquivSides sides, equiv_sides(pass, pipeline));
  std::vector<driver::CompiledProgram> progs;
  for (const CompileOptions* opts : {&sides.reference, &sides.test}) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, load_graph(path));
    KILN_ASSIGN_OR_RETURN(driver::CompiledProgram prog, driver::compile_graph(std::move(g), *opts));
    progs.push_back(std::move(prog));
  }
  std::set<std::string> free_symbols;
  for (const TensorInfo& info : progs[0].inputs)
    for (const std::string& d : info.dims) {
      KILN_ASSIGN_OR_RETURN(Expr e, parse_expr(d));
      for (const std::string& v : free_vars(e))
        if (!dims.count(v)) free_symbols.insert(v);
    }
  std::vector<int64_t> bindings = free_symbols.empty() ? std::vector<int64_t>{0} : std::vector<int64_t>{1, 3, 8};
  bool ok = true;
  for (int64_t value : bindings) {
    std::map<std::string, int64_t, std::less<>> env(dims.begin(), dims.end());
    for (const std::string& v : free_symbols) env[v] = value;
    std::vector<std::vector<Tensor>> results;
    for (const driver::CompiledProgram& prog : progs) {
      std::mt19937 rng(1234);
      std::vector<Tensor> inputs;
      for (const TensorInfo& info : prog.inputs) {
        std::vector<int64_t> shape;
        for (const std::string& d : info.dims) {
          KILN_ASSIGN_OR_RETURN(Expr e, parse_expr(d));
          KILN_ASSIGN_OR_RETURN(int64_t v, evaluate(e, env));
          shape.push_back(v);
        }
        inputs.push_back(random_input(info.dtype, shape, rng));
      }
      runtime::VM vm(prog.program, 2);
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, vm.run(inputs));
      results.push_back(std::move(outs));
    }
    std::string binding;
    for (const std::string& v : free_symbols) binding += " " + v + "=" + std::to_string(value);
    for (size_t i = 0; i < progs[1].outputs.size(); ++i) {
      const std::string& name = progs[1].outputs[i].name;
      const Tensor& ref = results[0][i];
      const Tensor& got = results[1][i];
      if (ref.shape() != got.shape() || ref.dtype() != got.dtype()) {
        std::cout << "output " << name << binding << ": " << got.describe() << " vs reference " << ref.describe()
                  << " DIFFERENT\n";
        ok = false;
        continue;
      }
      double max_err = 0;
      bool within = true;
      for (int64_t k = 0; k < ref.numel(); ++k) {
        double r = ref.get_f64(k), a = got.get_f64(k);
        if ((std::isnan(r) && std::isnan(a)) || r == a) continue;  // NaN matches NaN, inf matches inf
        double err = std::fabs(a - r);
        max_err = std::max(max_err, err);
        if (!(err <= 1e-5 + 1e-4 * std::fabs(r))) within = false;
      }
      std::cout << "output " << name << binding << " " << got.describe() << " (" << sides.what << "): max abs err "
                << max_err << (within ? " equivalent" : " DIFFERENT") << "\n";
      ok &= within;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

// The pass table of docs/passes.md (--list-passes --markdown), or one line per pass.
int list_passes(bool markdown) {
  std::vector<std::string> pipeline = passes::default_pipeline();
  if (markdown) {
    std::cout << "| pass | in default pipeline | needs shapes | what | test |\n|---|---|---|---|---|\n";
  }
  for (const passes::PassInfo& p : passes::registered_passes()) {
    auto at = std::find(pipeline.begin(), pipeline.end(), p.name);
    std::string position = at == pipeline.end() ? "no" : std::to_string(at - pipeline.begin() + 1);
    if (markdown)
      std::cout << "| `--" << p.name << "` | " << position << " | " << (p.needs_shapes ? "yes" : "no") << " | "
                << p.summary << " | `" << p.test << "` |\n";
    else
      std::cout << p.name << "\t" << p.summary << "\n";
  }
  return 0;
}

Result<int> cmd_opt(const std::vector<std::string>& argv) {
  std::string path, out_path;
  bool fuse = false, lower = false, naive = false, equiv = false, list = false, markdown = false;
  std::string equiv_pass;
  std::vector<std::string> pipeline;
  bool pipeline_named = false;  // --passes, --default-pipeline or --PASS given
  std::set<std::string> disabled;
  passes::Instrumentation inst;
  std::map<std::string, int64_t, std::less<>> dims;
  auto value_of = [](const std::string& a, const char* flag) { return a.substr(std::string(flag).size()); };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--fuse-elementwise") fuse = true;
    else if (a == "--lower") lower = true;
    else if (a == "--naive") naive = true;
    else if (a == "--print-after-all") inst.print_after_all = true;
    else if (a.rfind("--print-after=", 0) == 0) {
      for (const std::string& p : passes::split_pass_list(value_of(a, "--print-after="))) inst.print_after.insert(p);
    } else if (a == "--verify-each") inst.verify_each = true;
    else if (a == "--time-passes") inst.time_passes = true;
    else if (a == "--list-passes") list = true;
    else if (a == "--markdown") markdown = true;
    else if (a == "--default-pipeline") {
      pipeline_named = true;
      for (const std::string& p : passes::default_pipeline(naive)) pipeline.push_back(p);
    } else if (a.rfind("--passes=", 0) == 0) {
      pipeline_named = true;
      for (const std::string& p : passes::split_pass_list(value_of(a, "--passes="))) pipeline.push_back(p);
    } else if (a.rfind("--disable=", 0) == 0) {
      for (const std::string& p : passes::split_pass_list(value_of(a, "--disable="))) disabled.insert(p);
    } else if (a == "--check-equiv") equiv = true;
    else if (a.rfind("--check-equiv=", 0) == 0) {
      equiv = true;
      equiv_pass = value_of(a, "--check-equiv=");
    } else if (a == "-o" && i + 1 < argv.size()) {
      out_path = argv[++i];
    } else if (a == "--dim" && i + 1 < argv.size()) {
      std::string kv = argv[++i];
      size_t eq = kv.find('=');
      if (eq == std::string::npos) return invalid_argument() << "--dim expects NAME=VALUE, got '" << kv << "'";
      try {
        dims[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
      } catch (...) {
        return invalid_argument() << "--dim expects an integer value, got '" << kv << "'";
      }
    } else if (a.rfind("--", 0) == 0 && passes::find_pass(a.substr(2)) != nullptr) {
      pipeline_named = true;
      pipeline.push_back(a.substr(2));
    } else if (!a.empty() && a[0] == '-') {
      return invalid_argument() << "unknown option '" << a << "' for opt (passes: " << passes::pass_names() << ")";
    } else if (path.empty()) {
      path = a;
    } else {
      return invalid_argument() << "opt takes one file, got '" << path << "' and '" << a << "'";
    }
  }
  if (list) return list_passes(markdown);
  if (path.empty())
    return invalid_argument() << "usage: kiln opt FILE [--PASS ...] [--passes=a,b] [--default-pipeline] "
                                 "[--print-after-all] [--print-after=PASS] [--verify-each] [--time-passes] "
                                 "[--fuse-elementwise] [--lower [--naive]] [--disable=a,b] [-o OUT.kir|OUT.onnx] [--check-equiv[=PASS]]";
  for (const std::string& p : inst.print_after)
    if (passes::find_pass(p) == nullptr)
      return invalid_argument() << "--print-after: unknown pass '" << p << "' (passes: " << passes::pass_names() << ")";
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (!out_path.empty() && !ends_with(out_path, ".kir") && !ends_with(out_path, ".onnx"))
    return invalid_argument() << "-o " << out_path << ": the output is Kiln's text IR (.kir) or ONNX (.onnx)";
  const bool to_onnx = ends_with(out_path, ".onnx");
  // `kiln opt MODEL -o out.onnx` alone: the optimized model, as far as ONNX
  // can express it (the default pipeline without the kiln-only passes).
  if (to_onnx && !pipeline_named && !equiv) pipeline = passes::onnx_pipeline();
  for (const std::string& p : disabled)
    if (passes::find_pass(p) == nullptr)
      return invalid_argument() << "--disable: unknown pass '" << p << "' (passes: " << passes::pass_names() << ")";
  pipeline.erase(std::remove_if(pipeline.begin(), pipeline.end(),
                                [&](const std::string& p) { return disabled.count(p) != 0; }),
                 pipeline.end());
  if (equiv) return check_equiv(path, dims, equiv_pass, pipeline);

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, load_graph(path));
  KILN_RETURN_IF_ERROR(g->verify().with_context(path));
  // Shapes are inferred before the first pass that needs them, and for fusion and lowering.
  std::vector<std::string> run = passes::with_shape_inference(pipeline, fuse || lower || to_onnx);
  CompileOptions opts;
  opts.naive = naive;
  // Kernel choices for one thread, whatever the machine's core count (a
  // candidate may be limited to fewer threads: Candidate::max_threads).
  opts.threads = 1;
  inst.out = &std::cout;
  std::vector<passes::PassRun> runs;
  if (!run.empty()) {
    KILN_ASSIGN_OR_RETURN(driver::OptimizedGraph optimized, driver::optimize_graph(*g, opts, run, inst));
    runs = std::move(optimized.runs);
  }
  bool printed_by_instrumentation = inst.print_after_all || !inst.print_after.empty();
  if (to_onnx) {
    // The passes rename and remove values a training algorithm may read:
    // the optimized model is written for inference.
    if (!g->training_info.empty()) {
      g->training_info.clear();
      std::cerr << "kiln: note: " << path << "'s training algorithm (training_info) is not written; "
                << "the optimized model is for inference\n";
    }
    KILN_RETURN_IF_ERROR(export_onnx_file(*g, out_path));
  } else if (!out_path.empty()) {
    std::ofstream out(out_path, std::ios::binary);
    if (!out) return io_error() << "cannot write '" << out_path << "'";
    out << print_graph(*g);
    if (!out) return io_error() << "writing '" << out_path << "' failed";
  } else if (!fuse && !lower && !printed_by_instrumentation) {
    if (!runs.empty())
      std::cout << "// after " << runs.back().name << " (" << runs.back().rewrites << " rewrite"
                << (runs.back().rewrites == 1 ? "" : "s") << ")\n";
    std::cout << print_graph(*g);
  }
  if (fuse) {
    KILN_ASSIGN_OR_RETURN(std::string text, driver::fused_groups_text(*g, opts));
    std::cout << "// after fuse-elementwise\n" << text;
  }
  if (lower) {
    KILN_ASSIGN_OR_RETURN(std::string text, driver::lowered_kernels_text(*g, opts));
    std::cout << "// after lower\n" << text;
  }
  return 0;
}

Result<int> cmd_ops(const std::vector<std::string>& argv) {
  if (!argv.empty()) return invalid_argument() << "ops takes no arguments";
  for (const std::string& full : ops::registered_op_names()) {
    size_t colon = full.rfind(':');
    std::string domain = colon == std::string::npos ? "" : full.substr(0, colon);
    std::string name = colon == std::string::npos ? full : full.substr(colon + 1);
    const ops::OpDef* def = ops::find_op(domain, name);
    if (def == nullptr) continue;
    std::string how;
    if (def->lower) how += "compiled";
    if (def->kernel) how += std::string(how.empty() ? "" : ", ") + "runtime kernel";
    if (def->is_view) how += std::string(how.empty() ? "" : ", ") + "view";
    if (def->expanded_by_autodiff) how += std::string(how.empty() ? "" : ", ") + "expanded into the backward graph";
    if (how.empty() && (name == "If" || name == "Loop" || name == "Scan" || name == "SequenceMap") && domain.empty())
      how = "control flow (VM code)";
    if (def->is_elementwise) how += ", fusable";
    if (def->gradient) how += ", differentiable";
    std::cout << full << "\t" << how << "\n";
  }
  return 0;
}

}  // namespace kiln::cli
