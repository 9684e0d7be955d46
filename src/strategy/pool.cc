// Pooling candidates (MaxPool, AveragePool).
//
// pool.window: the window as one reduction over its k x k taps per output
// (ops/pool.cc), default schedule. Priority 10.
//
// pool.separable: two stages in one kernel (ops/pool.cc, Node attribute
// kiln_separable): the window's rows reduced at every input column, [N, C,
// OH, W], then its columns; 2k steps per output instead of k^2, and each
// strided column tap reads the rows stage once. Applies to 2-D pools with
// both kernel sides at least 2 (MaxPool without its Indices output). The
// rows stage passes through memory between the stages: priority 20 where it
// fits in half of the level-2 cache, else 5: a measured default (in
// squeezenet1_1's max pools separable won where the rows stage fit, and tied
// or lost where it did not); the tuner measures both candidates per host.
#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

bool separable_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (n.op_type() == "MaxPool" && n.num_outputs() > 1 && n.output(1) != nullptr && !n.output(1)->name().empty())
    return no("Indices output");
  const Value* x = n.input(0);
  if (x == nullptr || !x->type().shape || x->type().shape->size() != 4) return no("not a 2-D pool");
  std::vector<int64_t> k = n.attr_ints("kernel_shape", {});
  if (k.size() != 2 || k[0] < 2 || k[1] < 2) return no("a window side under 2");
  return true;
}

// Bytes of the rows stage [N, C, OH, W]; nullopt when symbolic.
std::optional<double> rows_stage_bytes(const Node& n) {
  const Shape& xs = *n.input(0)->type().shape;
  const Value* y = n.output(0);
  if (y == nullptr || !y->type().shape || y->type().shape->size() != 4) return std::nullopt;
  auto b = xs[0].as_const(), c = xs[1].as_const(), w = xs[3].as_const(), oh = (*y->type().shape)[2].as_const();
  if (!b || !c || !w || !oh) return std::nullopt;
  return static_cast<double>(dtype_size(n.input(0)->dtype())) * static_cast<double>(*b) * static_cast<double>(*c) *
         static_cast<double>(*w) * static_cast<double>(*oh);
}

int separable_priority(const Node& n, const Target& t) {
  std::optional<double> bytes = rows_stage_bytes(n);
  return bytes && *bytes <= static_cast<double>(t.l2_bytes) / 2 ? 20 : 5;
}

Status separable_transform(Graph&, Node& n, const tir::Knobs&) {
  set_int_attr(n, "kiln_separable", 1);
  return Status::ok();
}

}  // namespace

void register_pool_candidates() {
  for (const char* op : {"MaxPool", "AveragePool"}) {
    Candidate window;
    window.name = std::string(op[0] == 'M' ? "maxpool" : "averagepool") + ".window";
    window.op = op;
    window.priority = 10;
    window.summary = "the k x k window as one reduction per output";
    register_candidate(std::move(window));
    Candidate sep;
    sep.name = std::string(op[0] == 'M' ? "maxpool" : "averagepool") + ".separable";
    sep.op = op;
    sep.priority = 20;
    sep.summary = "rows of the window at every input column, then its columns (two stages, 2k steps per output)";
    sep.applies = separable_applies;
    sep.priority_for = separable_priority;
    sep.transform = separable_transform;
    register_candidate(std::move(sep));
  }
}

}  // namespace kiln::strategy
