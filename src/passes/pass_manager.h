// The pass manager: runs a list of passes over a graph, with the
// instrumentation `kiln opt` exposes (print after a pass, verify after each,
// time each).
//
// Once infer-shapes has run, a pass that changes the graph is followed by
// shape inference again, so every pass sees the types of every value; passes
// before infer-shapes work on structure only (and say so: needs_shapes).
#pragma once

#include <iosfwd>
#include <set>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace kiln::passes {

struct Instrumentation {
  std::ostream* out = nullptr;          // where prints and timings go (null: nowhere)
  bool print_after_all = false;
  std::set<std::string> print_after;    // pass names
  bool verify_each = false;             // Graph::verify after every pass (error names the pass)
  bool time_passes = false;             // a table of seconds and rewrites per pass at the end
};

struct PassRun {
  std::string name;
  int rewrites = 0;
  double seconds = 0;  // including the re-inference that follows it
  int nodes = 0;       // nodes of the top-level graph after it
};

// Runs `pipeline` (pass names) in order. Unknown names, and a pass that needs
// shapes placed before infer-shapes, are errors before anything runs. A
// failing pass's error names it.
Result<std::vector<PassRun>> run_passes(Graph& g, const std::vector<std::string>& pipeline, PassContext& ctx,
                                        const Instrumentation& inst = {});

// "a,b,c" -> {"a", "b", "c"} (spaces ignored, empty entries dropped).
std::vector<std::string> split_pass_list(const std::string& text);

}  // namespace kiln::passes
