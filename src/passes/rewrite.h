// The pattern-rewrite driver for local simplifications.
//
// A rule is a matcher and a rewrite in one small function: it looks at one
// node and, when the pattern matches, changes the graph (usually by
// redirecting the node's outputs with replace_value) and returns true. The
// driver sweeps every node with every rule until a sweep changes nothing,
// then removes the nodes left without uses. Rules see the types inferred
// before the sweep; they must keep every value's type valid (a rewrite that
// preserves semantics does).
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "passes/pass.h"

namespace kiln::passes {

struct RewriteRule {
  const char* name;  // for the rewrite log
  bool (*apply)(Graph& g, Node* n, PassContext& ctx);
};

// Applies `rules` to a fixed point (at most `max_sweeps` sweeps) and returns
// the number of rewrites.
Result<int> rewrite_to_fixed_point(Graph& g, const std::vector<RewriteRule>& rules, PassContext& ctx,
                                   int max_sweeps = 32);

// Redirects every use of `from` to `to`. A graph output keeps its name: when
// `from` is one, `to` takes over the name, which needs `to` to be produced by
// a node and not to be a graph output already; otherwise nothing changes and
// the result is false.
bool replace_value(Graph& g, Value* from, Value* to);
// Output k of `from` (where used or a graph output) replaced by output k of
// `to`, for a rewrite that makes a node anew (`pass` names it in the error
// when one cannot be replaced).
Status replace_outputs(Graph& g, Node* from, Node* to, const std::string& pass);

bool is_graph_output(const Graph& g, const Value* v);

// n is an op of the default (ai.onnx) domain named `op`.
bool is_op(const Node* n, const char* op);
// Random ops (RandomNormal, Bernoulli, ...): two draws are two values.
bool is_random_op(const Node& n);
// n carries a graph attribute (If, Loop, Scan).
bool has_subgraph(const Node& n);
// The permutation of a Transpose (its perm, or reversed axes without one),
// when the input's rank is known and perm is a permutation of it; else nullopt.
std::optional<std::vector<int64_t>> transpose_perm(const Node* t);

// The constant behind a value, or null.
const Tensor* constant_of(const Value* v);
// The integers of a constant int32/int64 tensor (any rank), or nullopt.
std::optional<std::vector<int64_t>> constant_ints(const Value* v);

// A constant tensor transposed by `perm` (element bytes copied as they are).
Tensor transpose_tensor(const Tensor& t, const std::vector<int64_t>& perm);

// A 1-D int64 constant tensor (shapes for Reshape, indices for Gather).
Tensor int64_vector(const std::vector<int64_t>& v);

// Row views, for products that should see one [rows, cols] operand:
// `x` viewed as [-1, cols] (a Reshape inserted before `pos`), and `y` viewed
// with the first `lead` dims of `like` followed by `last` (Reshape to
// Concat(Gather(Shape(like), 0..lead-1), [last]): shape ops that shape
// inference evaluates symbolically, so no kernel runs). `base` names them.
Value* view_as_rows(Graph& g, Node* pos, Value* x, int64_t cols, const std::string& base);
Value* view_with_leading_dims(Graph& g, Node* pos, Value* y, Value* like, int64_t lead, int64_t last,
                              const std::string& base);

// Inserts kiln:CheckInRange(x, lo, hi[, count]) before `pos` (named like
// it, so its errors name that node; `what` names the checked value in them)
// and returns its output, which readers should take so the check runs
// before them; adds the graph's `kiln` opset import. `out` names the output.
Value* insert_range_check(Graph& g, Node* pos, const std::vector<Value*>& inputs, const std::string& out,
                          const std::string& what);

// Shapes of two values proven equal (same rank, each dim equal under the bounds).
bool same_shape(const Value* a, const Value* b, const SymbolBounds& bounds);

}  // namespace kiln::passes
