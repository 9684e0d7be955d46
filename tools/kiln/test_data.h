// ONNX backend-test data sets: a directory test_data_set_N holding input_0.pb,
// input_1.pb, ... and output_0.pb, ... (serialized TensorProto files).
#pragma once

#include <string>
#include <vector>

#include "support/status.h"
#include "support/tensor.h"

namespace kiln::cli {

struct NamedTensor {
  std::string name;  // TensorProto.name; empty when the file does not set it
  std::string path;
  Tensor tensor;
};

struct TestDataSet {
  std::string dir;
  std::vector<NamedTensor> inputs;   // input_0.pb, input_1.pb, ... in order
  std::vector<NamedTensor> outputs;  // output_0.pb, ...
};

// `dir` is either one data set (it holds input_0.pb) or a model directory holding
// test_data_set_* subdirectories, which are returned in numeric order.
Result<std::vector<TestDataSet>> load_test_data(const std::string& dir);

// The `name` field (8) of a serialized TensorProto, read from the protobuf wire
// format without a protobuf dependency; empty when unset or unreadable.
std::string tensor_proto_name(const std::string& bytes);

}  // namespace kiln::cli
