#include "passes/pass_manager.h"

#include <chrono>
#include <cstdio>
#include <ostream>

namespace kiln::passes {

std::vector<std::string> split_pass_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

Result<std::vector<PassRun>> run_passes(Graph& g, const std::vector<std::string>& pipeline, PassContext& ctx,
                                        const Instrumentation& inst) {
  // Check the whole list first: a typo fails before any work.
  std::vector<const PassInfo*> passes;
  bool inferred = ctx.shapes_inferred;
  for (const std::string& name : pipeline) {
    const PassInfo* p = find_pass(name);
    if (p == nullptr) return invalid_argument() << "unknown pass '" << name << "' (passes: " << pass_names() << ")";
    if (p->needs_shapes && !inferred)
      return invalid_argument() << "pass '" << name << "' needs inferred shapes: put infer-shapes before it";
    inferred |= p->run == &infer_shapes;
    passes.push_back(p);
  }

  std::vector<PassRun> runs;
  int nodes_before = static_cast<int>(g.num_nodes());
  for (const PassInfo* p : passes) {
    auto t0 = std::chrono::steady_clock::now();
    Result<int> rewrites = p->run(g, ctx);
    if (!rewrites.is_ok()) return rewrites.status().with_context("pass " + p->name);
    if (p->run == &infer_shapes) {
      ctx.shapes_inferred = true;
    } else if (*rewrites > 0 && ctx.shapes_inferred) {
      // New values get their types; rewritten ones are re-derived.
      Status st = ops::infer_shapes(g, ctx.infer);
      if (!st.is_ok()) return st.with_context("shape inference after pass " + p->name);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    runs.push_back({p->name, *rewrites, seconds, static_cast<int>(g.num_nodes())});
    if (inst.verify_each) {
      Status st = g.verify();
      if (!st.is_ok()) return st.with_context("verification after pass " + p->name);
    }
    if (inst.out != nullptr && (inst.print_after_all || inst.print_after.count(p->name)))
      *inst.out << "// after " << p->name << " (" << *rewrites << " rewrite" << (*rewrites == 1 ? "" : "s")
                << ")\n"
                << print_graph(g);
  }
  if (inst.time_passes && inst.out != nullptr) {
    double total = 0;
    for (const PassRun& r : runs) total += r.seconds;
    char line[200];
    std::snprintf(line, sizeof line, "// pass timing: %zu passes, %.3f ms; %d nodes before\n", runs.size(),
                  total * 1e3, nodes_before);
    *inst.out << line;
    for (const PassRun& r : runs) {
      std::snprintf(line, sizeof line, "//   %10.3f ms %6d rewrites %6d nodes  %s\n", r.seconds * 1e3, r.rewrites,
                    r.nodes, r.name.c_str());
      *inst.out << line;
    }
  }
  return runs;
}

}  // namespace kiln::passes
