// Helpers shared by the candidates' schedule templates and transforms
// (gemm.cc, conv.cc). Not part of the strategy's interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"
#include "tir/knobs.h"
#include "tir/schedule.h"

namespace kiln::strategy {

tir::Primitive prim(std::string kind, std::string stage, std::vector<std::string> axes, int64_t factor = 0);

// The default schedule of `k` with the primitives of `stage` replaced by
// `prims`: the kernel's other stages (fused producers and epilogues) keep theirs.
tir::Schedule replace_stage_schedule(const tir::KernelDef& k, const std::string& stage,
                                     const std::vector<tir::Primitive>& prims);
// The same for several stages at once (stage name -> its primitives), each
// placed where the default schedule had that stage's.
tir::Schedule replace_stage_schedules(const tir::KernelDef& k,
                                      const std::map<std::string, std::vector<tir::Primitive>>& prims);

// The stage of `k` named `name` (null: none).
const tir::ComputeDef* find_stage(const tir::KernelDef& k, const std::string& name);

// A knob a template needs: an error (not an exception) when the recorded
// choice lacks it or it is below 1 (a .kir file may carry any kiln_knobs).
Result<int64_t> knob(const tir::Knobs& knobs, const std::string& name, const std::string& candidate);

void set_string_attr(Node& n, const std::string& name, const std::string& value);
void set_int_attr(Node& n, const std::string& name, int64_t value);

// A 0/1 knob that is on; absent (a choice recorded before the knob existed) is off.
bool knob_on(const tir::Knobs& knobs, const std::string& name);

// Of `tiles` (size, relative rate), the one that tiles `extent` at the least
// cost: the positions computed (the last tile overlaps the one before it,
// ceil(extent / size) * size) over the rate. The first wins a tie; the first
// too for extents too large to matter (a fuzzed shape near INT64_MAX).
int64_t least_overlap_tile(int64_t extent, const std::vector<std::pair<int64_t, double>>& tiles);

// The columns of `axis` (extent `extent`) tiled by `mr` register columns:
// split, or split_overlap where mr does not divide a constant extent (the
// last tile overlaps the one before it); nothing where one tile covers the
// row. `outer` is the tile loop (empty: none), `inner` the columns in a
// tile, `count` the number of tiles where known.
struct ColumnTile {
  std::string outer, inner;
  std::optional<int64_t> count;
};
ColumnTile tile_columns(std::vector<tir::Primitive>& prims, const std::string& stage, const std::string& axis,
                        const Expr& extent, int64_t mr);

// The rule for the knob rows of the convolution templates: threads split
// the output rows (each reads its share of the input plus a halo, and all
// the weights) when the activation input (input 0) has more elements than
// the constant weights (input 1), else the output channels (each reads the
// whole input and its share of the weights), so that each core streams
// less: mobilenet_v2's 1x1 projections (1.8 MB of input, 14 KB of weights)
// ran slower on 2 threads than on 1 when split by their two channel panels.
// Symbolic or unknown input shapes count as the larger.
bool input_outweighs_weights(const Node& n);

// Threads split the output rows `rows_axis` (knob rows on and more than one
// row), else the loop of `outer` that tir::choose_parallel picks from
// `counts` (their trip counts); appended to `prims`.
void parallelize_rows_or_outer(std::vector<tir::Primitive>& prims, const std::string& stage, const tir::Knobs& knobs,
                               const std::string& rows_axis, const Expr& rows, const std::vector<std::string>& outer,
                               const std::vector<std::optional<int64_t>>& counts);

// A kernel-computed node `op` (domain kiln) reading `w` (and `extra`) with
// the int attributes `attrs`, of type `w`'s dtype by `dims`, inserted before n
// unless an equal one already reads `w`: one per operand and layout (a
// computed weight packed each run).
Value* runtime_weight_node(Graph& g, Node& n, Value* w, const std::string& op,
                           const std::function<std::vector<Value*>()>& extra,
                           const std::vector<std::pair<std::string, int64_t>>& attrs, const std::string& suffix,
                           std::vector<int64_t> dims);

}  // namespace kiln::strategy
