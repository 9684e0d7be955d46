// sequence-map-to-loop: a SequenceMap becomes a Loop over the first input's
// elements that carries one sequence per output: the body's nodes are copied
// into the Loop body, each sequence input read through SequenceAt at the
// iteration number (a tensor input is captured as it is), and each result
// appended with SequenceInsert to its carried sequence (SequenceEmpty of the
// body output's dtype at first). The Loop runs as VM code (runtime/vm.h),
// where SequenceMap ran a sub-program per element.
//
//   SequenceMap(s, x..) {body(e, y..) -> (r..)}
//     ->  n = SequenceLength(s), checked equal to SequenceLength(x) for
//         each sequence x (kiln::CheckInRange: an error naming the node)
//         Loop(n, -, SequenceEmpty..) body (i, cond, acc..):
//           e = SequenceAt(s, i); y = SequenceAt(x, i) or x
//           <the body's nodes>
//           -> (cond, SequenceInsert(acc, r)..)
//
// Applies where the body's dtypes are known. A body node with a subgraph
// captures body values by name, so then every body value keeps its name in
// the Loop body (a tensor input through an Identity of the body input's
// name); a body whose names clash with those the Loop body needs (the outer
// values it captures, "<output>." names) keeps the SequenceMap.
// A Loop's carried sequence appended to once per iteration ends with the
// count's length (ops/control_flow.cc), so the outputs keep the input's.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> sequence_map_to_loop(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
