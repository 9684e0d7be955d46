// kiln::Model's state (include/kiln/kiln.h), shared by its run side
// (driver/model.cc, in libkiln_runtime too) and its compiler side
// (driver/compiled_model.cc).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver/pipeline.h"
#include "kiln/kiln.h"
#include "package/package.h"

namespace kiln {

struct Model::Impl {
  driver::CompiledProgram compiled;
  std::unique_ptr<runtime::VM> vm;
  std::mutex mu;  // run() is serialized: one VM, one arena
  // The model as given, to compile it again with relaxed assumptions.
  std::string path, bytes, source_name;
  CompileOptions options;
  // Compiles the model again (driver/compiled_model.cc): with every named
  // input dim at least 0, or specialized to `bind`. Null for a package.
  std::function<Result<std::unique_ptr<Impl>>(bool empty_dims, const std::map<std::string, Tensor>* bind)> rebuild;
  // A model loaded from a package: the file and kernel library its program uses.
  std::shared_ptr<package::Loaded> package;
  // Named input dims are compiled as at least 1 (the import's bound: shape
  // proofs such as max(1, n) = n rely on it). A run that gives one of them 0
  // (an empty batch or sequence) runs on a second program compiled with those
  // dims at least 0, made on first need.
  std::unique_ptr<Impl> empty_dims;
  // Set when a shape depends on the values of small integer inputs in a way
  // no symbolic shape can express (a rank that depends on whether a dim read
  // from an input is 1, If branches of different ranks on such a test): the
  // model is compiled at run time for each distinct set of input shapes and
  // small integer input values, those inputs bound as constants.
  bool specialize = false;
  Status general_error;  // why the general compile failed
  std::vector<bool> bind_values;  // per input: its values are bound (a small integer input)
  std::vector<int64_t> input_ranks;  // per input: its declared rank (-1: unknown; 0: a scalar)
  std::map<std::string, std::shared_ptr<Impl>> specialized;
  std::vector<std::string> specialized_order;  // oldest first (at most kMaxSpecializations kept)
};

}  // namespace kiln
