// ONNX export: a kiln Graph (typically after the graph passes) becomes a
// ModelProto that the onnx checker accepts and other runtimes can run.
//
// - Graph::opsets become opset_import; the IR version follows the newest
//   ai.onnx opset (8 up to opset 18, 9 for 19-20, 10 above).
// - Constants become initializers (raw little-endian data; strings as
//   string_data; 4-bit types packed two to a byte, low nibble first).
// - Graph inputs and outputs carry their types; a symbolic dim becomes a
//   dim_param holding its expression as Kiln prints it ("a*b", "n + 1").
// - Graph::training_info becomes ModelProto.training_info (its graphs'
//   captures are references to the model's names; bindings as they are).
// - Nested graphs are exported recursively; their captures are plain
//   references to the outer names, as ONNX has them.
// Attributes internal to Kiln (names starting "kiln_", set by passes such
// as select-kernels) have no ONNX meaning: a graph holding one is an
// unsupported-error naming the node, and so is a value without a dtype.
#pragma once

#include <string>

#include "graph/graph.h"
#include "support/status.h"

namespace kiln {

Result<std::string> export_onnx_bytes(const Graph& g);
Status export_onnx_file(const Graph& g, const std::string& path);

}  // namespace kiln
