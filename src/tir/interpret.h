// A reference interpreter for the loop IR: runs a PrimFunc on host buffers,
// one statement at a time, with no tricks. It is the ground truth that lowered
// schedules and generated code are checked against.
//
// Semantics: loops of every kind run serially in order; integer arithmetic
// wraps at the width of its dtype; f32 arithmetic is rounded to f32 after each
// operation; floordiv and mod round toward negative infinity (float mod is
// fmod); float min/max propagate NaN; select, && and || evaluate only the
// operands they need; casts from float to integer truncate toward zero.
// Scratch buffers (Allocate) start filled with 0xff bytes (NaN for floats), so
// a read before a write shows up in the results.
#pragma once

#include <cstdint>
#include <vector>

#include "support/status.h"
#include "tir/tir.h"

namespace kiln::tir {

// buffers[i] points to the row-major data of f.params[i] (its dtype); syms[j]
// is the value of f.sym_names[j]. Errors: wrong argument counts, an index out
// of bounds, integer division by zero, a dtype mismatch or a dtype the
// compiler does not support, an unknown intrinsic or variable.
Status interpret(const PrimFunc& f, const std::vector<void*>& buffers,
                 const std::vector<int64_t>& syms);

}  // namespace kiln::tir
