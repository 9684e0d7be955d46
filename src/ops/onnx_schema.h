// ONNX's operator schemas, checked before Kiln's own inference of a node.
//
// The schemas (every version of every ai.onnx, ai.onnx.ml and
// ai.onnx.preview.training operator) are generated at build time from the
// pinned onnx package by scripts/gen_onnx_schemas.py. Shape inference checks
// the nodes of a model file (Node::onnx_schema_pending), not those Kiln makes
// (legacy broadcast alignment, loops made of Scans). For a node of those
// domains, the schema is the operator's newest version at or below the
// graph's opset for the domain. check_onnx_inputs verifies, before the op's
// inference runs:
//   - the number of inputs and outputs against the schema's ranges, and that
//     no required input is omitted;
//   - every attribute: declared by the schema, of the declared type; every
//     required attribute present (Kiln's own "kiln_" attributes are exempt);
//   - every present input's type (element type, and tensor / sequence /
//     optional) against the allowed types of its formal parameter, and that
//     inputs sharing a type variable (T of Add's A and B, a homogeneous
//     variadic) have one type.
// check_onnx_outputs verifies the inferred outputs the same way, with the
// type variables bound by the inputs. Kiln's inference and lowering thus only
// see types ONNX allows for the op. An ONNX operator used at an opset before
// it exists is an error; nodes of other domains are not checked here.
#pragma once

#include <map>
#include <string>

#include "graph/graph.h"
#include "support/status.h"

namespace kiln::ops {

struct OnnxSchema;

// The schema for `op` of `domain` ("" or "ai.onnx" for the default domain)
// at `opset`, or null when there is none.
const OnnxSchema* find_onnx_schema(const std::string& domain, const std::string& op, int64_t opset);

// The schema that applies to `n` in a graph with `opsets` (deprecated
// versions included: their formal parameters still hold), or null.
const OnnxSchema* onnx_schema_for(const Node& n, const std::map<std::string, int64_t>& opsets);
// The opset in which `op` of `domain` first appears, or 0 when ONNX has no
// such operator.
int onnx_first_version(const std::string& domain, const std::string& op);

// Errors are kInvalidModel, naming the input or attribute and the allowed
// types, without the node (infer_shapes prefixes the file and node).
Status check_onnx_inputs(const Node& n, const OnnxSchema& schema);
Status check_onnx_outputs(const Node& n, const OnnxSchema& schema);

// The element types (a bit per ONNX TensorProto.DataType) that input `index`
// of `schema` accepts as a tensor (the last formal parameter for the inputs of
// a variadic one); 0 when there is no such input.
uint32_t onnx_input_tensor_types(const OnnxSchema& schema, int index);

// "Add-14"
std::string onnx_schema_name(const OnnxSchema& schema);
// The onnx package the schemas were generated from ("onnx 1.17.0").
const char* onnx_schema_source();

}  // namespace kiln::ops
