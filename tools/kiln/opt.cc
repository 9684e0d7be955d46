// kiln opt FILE [--infer-shapes] [--fuse-elementwise] [--lower] [--naive]
//               [--print-after-all] [--check-equiv] [--dim NAME=VALUE ...]
//
// FILE is a graph in Kiln's text form (.kir, see src/graph/graph.h) or an ONNX
// model. Steps run in the pipeline's order, whatever the flag order:
//   --fold-transposed-weights  transposes of constant weights done at compile time
//   --pack-conv-weights  after shape inference: constant 2-D Conv weights stored
//                       [I, KH, KW, O] where compile_graph does so (narrow or strided)
//   --infer-shapes      symbolic type inference; prints the graph
//   --fuse-elementwise  prints the fused groups ("group %root: Add Relu ...")
//   --lower             prints every kernel: compute definition, schedule, loop IR
//                       (default schedules; --naive for the reference ones)
//   --check-equiv       compiles the graph with naive and with default schedules,
//                       runs both on the same random inputs and compares; exit 1
//                       when they differ beyond 1e-5 + 1e-4*|ref|. Symbols not
//                       fixed by --dim are bound to 1, 3 and 8 in turn.
//   --check-equiv=PASS  the same comparison between the pipeline without PASS
//                       and with it (fold-transposed-weights, pack-conv-weights,
//                       fuse-elementwise): a wrong rewrite shows as a difference
// With no step flag the graph is printed as parsed. --print-after-all prints
// the graph after every step.
#include "opt.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "driver/pipeline.h"
#include "frontend/onnx/import.h"
#include "graph/graph.h"
#include "ops/registry.h"
#include "passes/fold_transposed_weights.h"
#include "passes/pack_conv_weights.h"
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
// default pipeline without PASS against the default pipeline (same schedules
// on both sides), so a wrong rewrite by PASS shows as a difference.
Result<EquivSides> equiv_sides(const std::string& pass) {
  EquivSides sides;
  sides.reference.threads = sides.test.threads = 2;
  if (pass.empty()) {
    sides.reference.naive = true;
    sides.what = "default vs naive schedules";
    return sides;
  }
  if (pass == "fold-transposed-weights") sides.reference.fold_transposed_weights = false;
  else if (pass == "pack-conv-weights") sides.reference.pack_conv_weights = false;
  else if (pass == "fuse-elementwise") sides.reference.fuse_elementwise = false;
  else
    return invalid_argument() << "--check-equiv=" << pass
                              << ": unknown pass (fold-transposed-weights, pack-conv-weights, fuse-elementwise)";
  sides.what = "with vs without " + pass;
  return sides;
}

// Compiles the graph both ways and compares outputs on random inputs, once per
// binding of the symbols not fixed by --dim (each bound to 1, 3 and 8).
Result<int> check_equiv(const std::string& path, const std::map<std::string, int64_t, std::less<>>& dims,
                        const std::string& pass) {
  KILN_ASSIGN_OR_RETURN(EquivSides sides, equiv_sides(pass));
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
        if (std::isnan(r) && std::isnan(a)) continue;
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

Result<int> cmd_opt(const std::vector<std::string>& argv) {
  std::string path;
  bool fold = false, pack = false;
  bool infer = false, fuse = false, lower = false, naive = false, all = false, equiv = false;
  std::string equiv_pass;
  std::map<std::string, int64_t, std::less<>> dims;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--infer-shapes") infer = true;
    else if (a == "--fold-transposed-weights") fold = true;
    else if (a == "--pack-conv-weights") pack = true;
    else if (a == "--fuse-elementwise") fuse = true;
    else if (a == "--lower") lower = true;
    else if (a == "--naive") naive = true;
    else if (a == "--print-after-all") all = true;
    else if (a == "--check-equiv") equiv = true;
    else if (a.rfind("--check-equiv=", 0) == 0) {
      equiv = true;
      equiv_pass = a.substr(std::string("--check-equiv=").size());
    }
    else if (a == "--dim" && i + 1 < argv.size()) {
      std::string kv = argv[++i];
      size_t eq = kv.find('=');
      if (eq == std::string::npos) return invalid_argument() << "--dim expects NAME=VALUE, got '" << kv << "'";
      try {
        dims[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
      } catch (...) {
        return invalid_argument() << "--dim expects an integer value, got '" << kv << "'";
      }
    } else if (!a.empty() && a[0] == '-') {
      return invalid_argument() << "unknown option '" << a << "' for opt";
    } else if (path.empty()) {
      path = a;
    } else {
      return invalid_argument() << "opt takes one file, got '" << path << "' and '" << a << "'";
    }
  }
  if (path.empty()) return invalid_argument() << "usage: kiln opt FILE [--infer-shapes] [--fuse-elementwise] "
                                                 "[--lower] [--naive] [--print-after-all] [--check-equiv]";
  if (equiv) return check_equiv(path, dims, equiv_pass);

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, load_graph(path));
  KILN_RETURN_IF_ERROR(g->verify().with_context(path));
  if (fuse || lower || pack) infer = true;
  if (fold) {
    KILN_ASSIGN_OR_RETURN(int rewrites, passes::fold_transposed_weights(*g));
    if (all || !infer)
      std::cout << "// after fold-transposed-weights (" << rewrites << " rewrites)\n" << print_graph(*g);
  }
  CompileOptions opts;
  opts.naive = naive;
  if (infer) {
    KILN_RETURN_IF_ERROR(driver::check_supported(*g));
    ops::InferContext ctx;
    ctx.graph = g.get();
    ctx.bounds = g->bounds;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ctx));
    if (all || (!fuse && !lower && !pack)) std::cout << "// after infer-shapes\n" << print_graph(*g);
    if (pack) {
      KILN_ASSIGN_OR_RETURN(int rewrites, passes::pack_conv_weights(*g));
      if (all || (!fuse && !lower))
        std::cout << "// after pack-conv-weights (" << rewrites << " rewrites)\n" << print_graph(*g);
    }
  } else {
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
    if (def->is_elementwise) how += ", fusable";
    std::cout << full << "\t" << how << "\n";
  }
  return 0;
}

}  // namespace kiln::cli
