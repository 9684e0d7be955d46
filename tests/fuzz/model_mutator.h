// Structure-aware mutation of ONNX models, and the whole path a user's model
// takes (import, inference, compilation, one run with random inputs), for the
// fuzzers model_fuzzer (libFuzzer's custom mutator) and mutate_models (a
// forking driver that classifies crashes and hangs in any build).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::fuzz {

// One structured mutation of a serialized ModelProto, chosen by `seed`:
// a dtype of a graph input, output, value_info or initializer; a dim of a
// graph input; an attribute's value or type, or its removal; a node's op
// type; an input swapped, replaced by another value, deleted or duplicated;
// an output deleted or duplicated; the values of a small integer initializer;
// every value of one dtype made another (any, or one that the ONNX schema of
// a node reading it accepts, so that the model passes the schema check with a
// rare dtype); or, rarely, a few bytes flipped. `what` (if not null) receives a one-line
// description. Returns the mutated bytes, or `bytes` unchanged when they do
// not parse as a model or the result would exceed `max_size`.
std::string mutate_model(const std::string& bytes, uint32_t seed, size_t max_size, std::string* what = nullptr);

// Compiles `bytes` (1 thread, a 1 GiB memory limit) and, when it compiles,
// runs it once on random inputs (symbolic dims bound to 2; integers 0-9, so
// zero divisors occur; floats in [-1, 1]). Returns "" when both succeed, else
// the error. Whatever the model, this must return: a crash, hang or sanitizer
// report is a bug.
std::string compile_and_run(const std::string& bytes, const std::string& source_name);

}  // namespace kiln::fuzz
