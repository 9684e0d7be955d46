// ONNX import: a ModelProto (file or bytes) becomes a kiln Graph.
//
// What the importer does:
// - opset_import becomes Graph::opsets ("ai.onnx" is stored as "").
// - Initializers (dense and sparse) become constant Values; a graph input that
//   is also an initializer is a constant, not an input. Tensor data comes from
//   raw_data, the typed fields (float_data, int32_data, int64_data, ...) or an
//   external data file (location relative to the model's directory; absolute
//   paths and ".." are refused; offset/length are checked against the file).
// - Constant nodes become constant Values (value, sparse_value, value_float(s),
//   value_int(s), value_string(s)).
// - Shapes: dim_value is a constant dim; dim_param is a symbol of the same name
//   (names that the Expr printer could not read back, such as "batch size" or
//   "min", are made into identifiers: invalid characters become '_', a
//   keyword gets a trailing '_'); a dim with neither is a fresh symbol "_u<N>".
//   Bounds go to the top-level Graph::bounds: [1, inf) for named dims, [0, inf)
//   for fresh ones.
// - ModelProto.training_info becomes Graph::training_info: the algorithm and
//   initialization graphs are imported like nested graphs of the model's
//   (the model's values they read become captures; their inputs need types),
//   may not redefine the model's names, and their bindings must name
//   initializers (of the model or the algorithm) and outputs of the graph.
// - Nested graphs (If/Loop/Scan attributes) are imported recursively; names
//   they read from enclosing graphs become captures (see graph.h).
// - Model-local functions (ModelProto.functions) are expanded inline, also
//   inside subgraphs and other functions: formal inputs/outputs are replaced by
//   the call's names, every other name in the body gets the prefix
//   "<function>.<K>." (K counts expansions), attribute references
//   (ref_attr_name) take the caller's attribute or else the function's default
//   (attribute_proto, read from the unknown fields with the ONNX 1.12 protos),
//   and are dropped when neither exists.
// - Nodes are added in a topological order (the file's order when it is one).
// - Node output types are left undefined (op inference sets them); types of
//   graph inputs come from the file.
//
// Errors are kInvalidModel and start with the file name; they name the node
// and op type when one is involved: unparseable or truncated protobuf, no
// graph or no graph outputs, an input that is never defined, duplicate value
// names, a cycle, bad tensor data (unknown dtype, negative dims, size
// mismatch, bad external data). Non-tensor graph inputs (sequence, map,
// optional) and TYPE_PROTO attributes are kUnsupported. Unsupported ops are NOT
// reported here: the driver checks all nodes against the op registry at once.
#pragma once

#include <memory>
#include <string>

#include "graph/graph.h"
#include "support/status.h"
#include "support/tensor.h"

namespace onnx {
class TensorProto;
}  // namespace onnx

namespace kiln {

Result<std::unique_ptr<Graph>> import_onnx_file(const std::string& path);
// source_name is used in errors and as Graph::source; external data is read
// relative to its directory ("." when it has none).
Result<std::unique_ptr<Graph>> import_onnx_bytes(const std::string& bytes,
                                                 const std::string& source_name = "<bytes>");

// A serialized TensorProto file, as in ONNX test data (test_data_set_N/input_0.pb).
Result<Tensor> read_tensor_proto_file(const std::string& path);

// TensorProto -> Tensor. The dtype is kept (float16/bfloat16/float8 data are
// copied as bits); 4-bit types are unpacked to one element per byte (int4
// sign-extended). External data is read relative to base_dir. Errors start
// with `source`.
Result<Tensor> tensor_from_onnx(const onnx::TensorProto& proto, const std::string& base_dir,
                                const std::string& source);

}  // namespace kiln
