// scan8-to-loop: a Scan of opset 8 (a batch axis in front of every state and
// scan input, the body run per batch element) without sequence_lens becomes
// a Loop over the batch whose body takes element b of each input (Gather on
// axis 0) and runs one Scan of the opset-9 form over its steps; the Loop's
// scan outputs stack the final states and the scan outputs along the batch,
// which is Scan-8's output layout. Both run as VM code (runtime/vm.h: loop
// instructions, no sub-program), where Scan-8 ran a sub-program per element.
//
//   Scan8(-, s.., x..) {body, num_scan_inputs, directions}
//     ->  Loop(Gather(Shape(first input), 0), -) body (b, cond):
//           Scan(Gather(s, b).., Gather(x, b)..) {body, num_scan_inputs,
//                scan_input_directions = directions, kiln_scan_opset9}
//           -> (cond, final states.., scan outputs..)
//
// With sequence_lens (int64; the body's scan outputs of known rank and a
// numeric dtype), element b scans the first lens[b] steps and its scan
// outputs are padded with zeros to the steps, as the batched form did:
//
//     lens' = kiln::CheckInRange(lens, 0, steps, batch)   (an error naming
//             the node and the element: "sequence_lens[1] = 7 outside [0, 5]")
//     Loop body (b, cond): len = lens'[b]
//       Scan(Gather(s, b).., Slice(Gather(x, b), [0], [len]).. )
//       -> (cond, final states.., Pad(scan output, steps - len after dim 0)..)
//
// The Loop body then has ai.onnx opset 13 (Slice and Pad with inputs); the
// user's Scan body keeps the graph's. The inner Scan carries kiln_scan_opset9:
// the graph's opset (8) would otherwise give it the batched semantics.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

inline constexpr const char* kScanOpset9Attr = "kiln_scan_opset9";

Result<int> scan8_to_loop(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
