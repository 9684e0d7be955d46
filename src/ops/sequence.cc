// Sequences and optionals (ONNX 11+, 15+, 18): SequenceEmpty, SequenceConstruct,
// SequenceInsert, SequenceErase, SequenceAt, SequenceLength, SplitToSequence,
// ConcatFromSequence, Optional, OptionalHasElement and OptionalGetElement over
// containers. All are runtime kernels over container tensors (support/dtype.h:
// a kSequence or kOptional tensor whose elements are tensors); the compile-time
// type of a container is TensorType::container (its length, its element type).
//
// Elements are immutable once in a container, so containers share them: an
// insert copies tensor handles, not data. An element taken from memory the
// container does not own (the static arena, a caller's buffer) is copied when
// it enters, since that memory is reused after the producing node's last use.
//
// Element shapes: an element type keeps dims that are constants; other dims
// are placeholders (they vary per element), so a tensor read out of a
// container (SequenceAt, OptionalGetElement, ConcatFromSequence) gets fresh
// data-dependent symbols for them, bound when the kernel has run.
#include <algorithm>

#include "ops/common.h"

namespace kiln::ops {
namespace {

bool is_seq(const TensorType& t) { return t.dtype == DType::kSequence; }
bool is_opt(const TensorType& t) { return t.dtype == DType::kOptional; }

Result<TensorType> container_input(const Node& n, size_t i, DType kind) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
  if (t.dtype != kind || !t.elem)
    return node_invalid(n) << "input " << i << " ('" << n.input(i)->name() << "') is " << t.to_string() << ", expected a "
                           << (kind == DType::kSequence ? "sequence" : "optional");
  return t;
}

// The element type a tensor of type `t` contributes: its dtype and rank, the
// constant dims kept.
TensorType element_type(const TensorType& t, InferContext& ctx) {
  if (t.is_container()) return t;
  TensorType e{t.dtype, std::nullopt};
  if (t.shape) {
    Shape s;
    for (const Dim& d : *t.shape) s.push_back(d.is_const() ? d : ctx.fresh_symbol());
    e.shape = std::move(s);
  }
  return e;
}

// The common element type of a and b (same dtype required): dims equal where
// both are the same constant, placeholders elsewhere; no rank when ranks differ.
Result<TensorType> join_elements(const Node& n, const TensorType& a, const TensorType& b, InferContext& ctx) {
  if (a.dtype != b.dtype)
    return node_invalid(n) << "elements of dtype " << dtype_name(a.dtype) << " and " << dtype_name(b.dtype)
                           << " in one sequence";
  if (a.is_container() || b.is_container()) return node_unsupported(n) << "a sequence of containers";
  if (!a.shape || !b.shape || a.shape->size() != b.shape->size()) return TensorType{a.dtype, std::nullopt};
  TensorType j{a.dtype, Shape{}};
  for (size_t k = 0; k < a.shape->size(); ++k) {
    auto x = (*a.shape)[k].as_const(), y = (*b.shape)[k].as_const();
    j.shape->push_back(x && y && *x == *y ? (*a.shape)[k] : ctx.fresh_symbol());
  }
  return j;
}

// The type of a tensor read out of a container of element type `e`: the
// constant dims, fresh data-dependent symbols for the others.
Result<TensorType> read_out(const Node& n, const TensorType& e, InferContext& ctx) {
  if (e.is_container()) return node_unsupported(n) << "reading a container out of a container";
  if (!e.shape)
    return node_unsupported(n) << "the rank of the container's elements is unknown (no element was seen, or "
                                  "elements differ in rank, which Kiln does not support)";
  TensorType t{e.dtype, Shape{}};
  for (const Dim& d : *e.shape) t.shape->push_back(d.is_const() ? d : ctx.fresh_symbol());
  return t;
}

void set_type(Node& n, size_t i, TensorType t) {
  if (Value* v = n.output(i)) v->set_type(std::move(t));
}

// An element entering a container: owned storage (see the file comment).
Tensor owned(const Tensor& t) { return t.owns_storage() ? t : t.clone(); }

Result<Tensor> make_container(DType kind, const std::vector<Tensor>& elems, const char* what) {
  KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::allocate(kind, {static_cast<int64_t>(elems.size())}, what));
  for (size_t i = 0; i < elems.size(); ++i) c.data_as<Tensor>()[i] = owned(elems[i]);
  return c;
}

std::vector<Tensor> elements(const Tensor& c) {
  const Tensor* p = c.data_as<Tensor>();
  return std::vector<Tensor>(p, p + c.numel());
}

// A position input (a scalar integer) for a sequence of length `len`; valid in
// [-len, len + extra) (insert: extra 1).
Result<int64_t> position(const Node& n, const Tensor& p, int64_t len, int64_t extra) {
  if (p.numel() != 1 || !dtype_is_int(p.dtype()))
    return node_invalid(n) << "position must be an integer scalar, got " << p.describe();
  int64_t v = p.get_i64(0);
  if (v < -len || v >= len + extra)
    return invalid_argument() << n.describe() << ": position " << v << " is out of range for a sequence of length " << len;
  return v < 0 ? v + len : v;
}

// A position input (i32/i64 scalar or one element) when present; required where `required`.
Status check_position_input(const Node& n, size_t i, bool required) {
  if (!has_input(n, i)) {
    if (required) return node_invalid(n) << "missing the position input";
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(TensorType p, input_type(n, i));
  if ((p.dtype != DType::kInt32 && p.dtype != DType::kInt64) || (p.shape && p.shape->size() > 1))
    return node_invalid(n) << "position must be an int32/int64 scalar, got " << p.to_string();
  return Status::ok();
}

// ---- SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase -------------------

Status infer_sequence_empty(Node& n, InferContext&) {
  int64_t dt = n.attr_int("dtype", static_cast<int64_t>(DType::kFloat32));
  if (dt <= 0 || dt > kMaxDType) return node_invalid(n) << "invalid dtype " << dt;
  set_type(n, 0, TensorType::container(DType::kSequence, TensorType{static_cast<DType>(dt), std::nullopt}, Dim(int64_t{0})));
  return Status::ok();
}

Status infer_sequence_construct(Node& n, InferContext& ctx) {
  if (n.num_inputs() == 0) return node_invalid(n) << "needs at least one input";
  KILN_ASSIGN_OR_RETURN(TensorType first, input_type(n, 0));
  if (first.is_container()) return node_unsupported(n) << "a sequence of containers";
  TensorType e = element_type(first, ctx);
  for (size_t i = 1; i < n.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
    KILN_ASSIGN_OR_RETURN(e, join_elements(n, e, element_type(t, ctx), ctx));
  }
  set_type(n, 0, TensorType::container(DType::kSequence, e, Dim(static_cast<int64_t>(n.num_inputs()))));
  return Status::ok();
}

Status infer_sequence_insert(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType s, container_input(n, 0, DType::kSequence));
  KILN_RETURN_IF_ERROR(check_position_input(n, 2, false));
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 1));
  if (t.is_container()) return node_unsupported(n) << "inserting a container into a sequence";
  TensorType e = element_type(t, ctx);
  // An empty sequence's element type is only a dtype: the inserted tensor's rank is kept.
  bool empty = (*s.shape)[0].as_const() == std::optional<int64_t>(0);
  if (!empty) {
    KILN_ASSIGN_OR_RETURN(e, join_elements(n, *s.elem, e, ctx));
  } else if (s.elem->dtype != e.dtype) {
    return node_invalid(n) << "inserting " << dtype_name(e.dtype) << " into a sequence of " << dtype_name(s.elem->dtype);
  }
  set_type(n, 0, TensorType::container(DType::kSequence, e, simplify(add((*s.shape)[0], Expr(int64_t{1})), ctx.bounds)));
  return Status::ok();
}

Status infer_sequence_erase(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType s, container_input(n, 0, DType::kSequence));
  KILN_RETURN_IF_ERROR(check_position_input(n, 1, false));
  Dim len = (*s.shape)[0];
  auto c = len.as_const();
  Dim out = c ? (*c > 0 ? Dim(*c - 1) : ctx.fresh_symbol()) : ctx.fresh_symbol();
  set_type(n, 0, TensorType::container(DType::kSequence, *s.elem, out));
  return Status::ok();
}

Result<RuntimeKernel> sequence_empty_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>&, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kSequence, {}, "SequenceEmpty"));
    return Status::ok();
  });
}

Result<RuntimeKernel> sequence_construct_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kSequence, in, "SequenceConstruct"));
    return Status::ok();
  });
}

Result<RuntimeKernel> sequence_insert_kernel(const Node& n) {
  return RuntimeKernel([node = &n](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    std::vector<Tensor> e = elements(in[0]);
    int64_t len = static_cast<int64_t>(e.size()), at = len;
    if (in.size() > 2 && in[2].defined()) {
      KILN_ASSIGN_OR_RETURN(at, position(*node, in[2], len, 1));
    }
    if (!e.empty() && in[1].dtype() != e[0].dtype())
      return invalid_argument() << node->describe() << ": inserting " << in[1].describe() << " into a sequence of "
                                << dtype_name(e[0].dtype());
    e.insert(e.begin() + at, in[1]);
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kSequence, e, "SequenceInsert"));
    return Status::ok();
  });
}

Result<RuntimeKernel> sequence_erase_kernel(const Node& n) {
  return RuntimeKernel([node = &n](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    std::vector<Tensor> e = elements(in[0]);
    int64_t len = static_cast<int64_t>(e.size());
    if (len == 0) return invalid_argument() << node->describe() << ": erasing from an empty sequence";
    int64_t at = len - 1;
    if (in.size() > 1 && in[1].defined()) {
      KILN_ASSIGN_OR_RETURN(at, position(*node, in[1], len, 0));
    }
    e.erase(e.begin() + at);
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kSequence, e, "SequenceErase"));
    return Status::ok();
  });
}

// ---- SequenceAt, SequenceLength --------------------------------------------------------

Status infer_sequence_at(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType s, container_input(n, 0, DType::kSequence));
  KILN_RETURN_IF_ERROR(check_position_input(n, 1, true));
  KILN_ASSIGN_OR_RETURN(TensorType t, read_out(n, *s.elem, ctx));
  set_type(n, 0, std::move(t));
  return Status::ok();
}

Result<RuntimeKernel> sequence_at_kernel(const Node& n) {
  return RuntimeKernel([node = &n](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(int64_t at, position(*node, in[1], in[0].numel(), 0));
    out[0] = in[0].data_as<Tensor>()[at];
    return Status::ok();
  });
}

Status infer_sequence_length(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType s, container_input(n, 0, DType::kSequence));
  set_output(n, 0, DType::kInt64, {}, ctx);
  // The length is known where the sequence's is (SequenceConstruct, inserts).
  if (Value* v = n.output(0)) v->set_sym_value(std::vector<Expr>{(*s.shape)[0]});
  return Status::ok();
}

Result<RuntimeKernel> sequence_length_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kInt64, {}, "SequenceLength"));
    out[0].data_as<int64_t>()[0] = in[0].numel();
    return Status::ok();
  });
}

// ---- SplitToSequence, ConcatFromSequence -----------------------------------------------

Status infer_split_to_sequence(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  if (xt.is_container()) return node_invalid(n) << "input 0 must be a tensor";
  if (has_input(n, 1)) {
    KILN_ASSIGN_OR_RETURN(TensorType st, input_type(n, 1));
    if ((st.dtype != DType::kInt32 && st.dtype != DType::kInt64) || (st.shape && st.shape->size() > 1))
      return node_invalid(n) << "split must be an int32/int64 scalar or 1-D tensor, got " << st.to_string();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(x.size())));
  bool keep = n.attr_int("keepdims", 1) != 0 || has_input(n, 1);
  TensorType e{xt.dtype, Shape{}};
  for (size_t k = 0; k < x.size(); ++k) {
    if (static_cast<int64_t>(k) == axis) {
      if (keep) e.shape->push_back(has_input(n, 1) ? ctx.fresh_symbol() : Dim(int64_t{1}));
    } else {
      e.shape->push_back(x[k].is_const() ? x[k] : ctx.fresh_symbol());
    }
  }
  Dim len = has_input(n, 1) ? ctx.fresh_symbol() : x[static_cast<size_t>(axis)];
  set_type(n, 0, TensorType::container(DType::kSequence, std::move(e), len));
  return Status::ok();
}

// Copies the slab [begin, begin + count) of `x` along `axis` into a new tensor.
Result<Tensor> slab(const Tensor& x, int64_t axis, int64_t begin, int64_t count, bool keep) {
  std::vector<int64_t> shape = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= shape[k];
  for (size_t k = static_cast<size_t>(axis) + 1; k < shape.size(); ++k) inner *= shape[k];
  int64_t len = shape[axis];
  shape[axis] = count;
  if (!keep) shape.erase(shape.begin() + axis);
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::allocate(x.dtype(), shape, "SplitToSequence element"));
  for (int64_t o = 0; o < outer; ++o) copy_elements(out, o * count * inner, x, (o * len + begin) * inner, count * inner);
  return out;
}

Result<RuntimeKernel> split_to_sequence_kernel(const Node& n) {
  int64_t axis_attr = n.attr_int("axis", 0);
  bool keepdims = n.attr_int("keepdims", 1) != 0;
  return RuntimeKernel([node = &n, axis_attr, keepdims](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    int64_t rank = x.rank();
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(*node, axis_attr, rank));
    int64_t len = x.shape()[axis];
    std::vector<int64_t> sizes;
    bool keep = true;
    if (in.size() > 1 && in[1].defined()) {
      const Tensor& s = in[1];
      if (s.rank() == 0) {
        int64_t step = s.get_i64(0);
        if (step <= 0) return invalid_argument() << node->describe() << ": split size " << step << " must be positive";
        for (int64_t b = 0; b < len; b += step) sizes.push_back(std::min(step, len - b));
      } else {
        int64_t total = 0;
        for (int64_t i = 0; i < s.numel(); ++i) {
          int64_t v = s.get_i64(i);
          if (v < 0) return invalid_argument() << node->describe() << ": negative split length " << v;
          sizes.push_back(v);
          total += v;
        }
        if (total != len)
          return invalid_argument() << node->describe() << ": split lengths sum to " << total << ", dim " << axis
                                    << " is " << len;
      }
    } else {
      sizes.assign(static_cast<size_t>(len), 1);
      keep = keepdims;
    }
    std::vector<Tensor> parts;
    int64_t b = 0;
    for (int64_t sz : sizes) {
      KILN_ASSIGN_OR_RETURN(Tensor p, slab(x, axis, b, sz, keep));
      parts.push_back(std::move(p));
      b += sz;
    }
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kSequence, parts, "SplitToSequence"));
    return Status::ok();
  });
}

Status infer_concat_from_sequence(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType s, container_input(n, 0, DType::kSequence));
  KILN_ASSIGN_OR_RETURN(TensorType e, read_out(n, *s.elem, ctx));
  bool new_axis = n.attr_int("new_axis", 0) != 0;
  if (!n.has_attr("axis")) return node_invalid(n) << "missing attribute 'axis'";
  int64_t rank = static_cast<int64_t>(e.shape->size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), rank + (new_axis ? 1 : 0)));
  Shape out = *e.shape;
  if (new_axis) {
    out.insert(out.begin() + axis, (*s.shape)[0].is_const() ? (*s.shape)[0] : ctx.fresh_symbol());
  } else {
    out[static_cast<size_t>(axis)] = ctx.fresh_symbol();
  }
  set_output(n, 0, e.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<RuntimeKernel> concat_from_sequence_kernel(const Node& n) {
  int64_t axis_attr = n.attr_int("axis", 0);
  bool new_axis = n.attr_int("new_axis", 0) != 0;
  return RuntimeKernel([node = &n, axis_attr, new_axis](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    std::vector<Tensor> e = elements(in[0]);
    if (e.empty()) return invalid_argument() << node->describe() << ": concatenating an empty sequence";
    int64_t rank = e[0].rank();
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(*node, axis_attr, rank + (new_axis ? 1 : 0)));
    std::vector<int64_t> shape = e[0].shape();
    if (new_axis) shape.insert(shape.begin() + axis, 1);
    int64_t total = 0;
    for (const Tensor& t : e) {
      std::vector<int64_t> s = t.shape();
      if (new_axis) s.insert(s.begin() + axis, 1);
      bool ok = t.dtype() == e[0].dtype() && s.size() == shape.size();
      for (size_t k = 0; ok && k < s.size(); ++k) ok = static_cast<int64_t>(k) == axis || s[k] == shape[k];
      if (!ok)
        return invalid_argument() << node->describe() << ": element " << t.describe() << " does not concatenate with "
                                  << e[0].describe() << " along axis " << axis;
      total += s[axis];
    }
    shape[axis] = total;
    KILN_ASSIGN_OR_RETURN(Tensor y, Tensor::allocate(e[0].dtype(), shape, node->describe() + " output"));
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < axis; ++k) outer *= shape[k];
    for (size_t k = static_cast<size_t>(axis) + 1; k < shape.size(); ++k) inner *= shape[k];
    int64_t at = 0;
    for (const Tensor& t : e) {
      int64_t len = new_axis ? 1 : t.shape()[axis];
      for (int64_t o = 0; o < outer; ++o) copy_elements(y, (o * total + at) * inner, t, o * len * inner, len * inner);
      at += len;
    }
    out[0] = std::move(y);
    return Status::ok();
  });
}

// ---- Optional, OptionalHasElement, OptionalGetElement ----------------------------------

Status infer_optional(Node& n, InferContext& ctx) {
  if (has_input(n, 0)) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
    if (is_opt(t)) return node_invalid(n) << "an optional of an optional";
    set_type(n, 0, TensorType::container(DType::kOptional, t.is_container() ? t : element_type(t, ctx), Dim(int64_t{1})));
    return Status::ok();
  }
  std::vector<int64_t> type = n.attr_ints("type");
  if (type.size() != 2) return node_invalid(n) << "without an input, needs its 'type' attribute";
  if ((type[0] != 0 && type[0] != static_cast<int64_t>(DType::kSequence)) || type[1] < 1 || type[1] > kMaxDType)
    return node_invalid(n) << "'type' must name a tensor or a sequence of tensors";
  TensorType elem{static_cast<DType>(type[1]), std::nullopt};
  if (type[0] == static_cast<int64_t>(DType::kSequence))
    elem = TensorType::container(DType::kSequence, elem, ctx.fresh_symbol());
  set_type(n, 0, TensorType::container(DType::kOptional, std::move(elem), Dim(int64_t{0})));
  return Status::ok();
}

Result<RuntimeKernel> optional_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    std::vector<Tensor> e;
    if (!in.empty() && in[0].defined()) e.push_back(in[0]);
    KILN_ASSIGN_OR_RETURN(out[0], make_container(DType::kOptional, e, "Optional"));
    return Status::ok();
  });
}

bool reads_container(const Node& n) {
  return has_input(n, 0) && n.input(0)->type().is_container();
}

Result<RuntimeKernel> optional_has_element_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kBool, {}, "OptionalHasElement"));
    bool has = !in.empty() && in[0].defined() && (in[0].dtype() != DType::kOptional || in[0].numel() > 0);
    out[0].data_as<bool>()[0] = has;
    return Status::ok();
  });
}

Result<RuntimeKernel> optional_get_element_kernel(const Node& n) {
  return RuntimeKernel([node = &n](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in[0].dtype() != DType::kOptional) {
      out[0] = in[0];
      return Status::ok();
    }
    if (in[0].numel() == 0) return invalid_argument() << node->describe() << ": the optional input has no element";
    out[0] = in[0].data_as<Tensor>()[0];
    return Status::ok();
  });
}

// Element types for a join: an unknown rank yields to a known one (an empty
// sequence's element type is only a dtype; a rank claimed wrongly is caught by
// the VM when a tensor read out is bound to it).
Result<TensorType> join_types(const Node& n, const TensorType& a, const TensorType& b, InferContext& ctx) {
  if (a.is_container() && b.is_container() && a.dtype != b.dtype)
    return node_unsupported(n) << "a value is " << a.to_string() << " on one path and " << b.to_string()
                               << " on another (an optional that becomes its element)";
  if (a.dtype != b.dtype)
    return node_invalid(n) << "a value is " << a.to_string() << " on one path and " << b.to_string() << " on another";
  if (a.is_container()) {
    if (!a.elem || !b.elem || !a.shape || !b.shape) return node_invalid(n) << "a container without an element type";
    KILN_ASSIGN_OR_RETURN(TensorType e, join_types(n, *a.elem, *b.elem, ctx));
    Dim la = (*a.shape)[0], lb = (*b.shape)[0];
    return TensorType::container(a.dtype, std::move(e), prove_equal(la, lb, ctx.bounds) ? la : ctx.fresh_symbol());
  }
  if (!a.shape) return b.shape ? element_type(b, ctx) : a;
  if (!b.shape) return element_type(a, ctx);
  return join_elements(n, a, b, ctx);
}

}  // namespace

Result<TensorType> join_container_types(const Node& n, const TensorType& a, const TensorType& b, InferContext& ctx) {
  return join_types(n, a, b, ctx);
}

bool same_container_shape(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype || a.shape.has_value() != b.shape.has_value() || (a.elem == nullptr) != (b.elem == nullptr))
    return false;
  if (a.shape) {
    if (a.shape->size() != b.shape->size()) return false;
    for (size_t k = 0; k < a.shape->size(); ++k) {
      auto x = (*a.shape)[k].as_const(), y = (*b.shape)[k].as_const();
      if (x.has_value() != y.has_value() || (x && *x != *y)) return false;
    }
  }
  return a.elem == nullptr || same_container_shape(*a.elem, *b.elem);
}

// OptionalHasElement and OptionalGetElement over containers: the compiled
// definitions (misc.cc, elementwise.cc) cover a tensor or an omitted input.
Status infer_optional_get_element_container(Node& n, InferContext& ctx) {
  const TensorType& t = n.input(0)->type();
  if (is_seq(t)) {
    set_type(n, 0, t);
    return Status::ok();
  }
  if (is_opt(t) && t.elem) {
    if (t.elem->is_container()) {
      set_type(n, 0, TensorType::container(t.elem->dtype, *t.elem->elem, ctx.fresh_symbol()));
      return Status::ok();
    }
    KILN_ASSIGN_OR_RETURN(TensorType e, read_out(n, *t.elem, ctx));
    set_type(n, 0, std::move(e));
    return Status::ok();
  }
  return node_invalid(n) << "input is " << t.to_string();
}

void register_sequence_ops() {
  auto add = [](OpDef d) {
    d.takes_containers = true;
    register_op(std::move(d));
  };
  add(kernel_op("SequenceEmpty", infer_sequence_empty, sequence_empty_kernel));
  add(kernel_op("SequenceConstruct", infer_sequence_construct, sequence_construct_kernel));
  add(kernel_op("SequenceInsert", infer_sequence_insert, sequence_insert_kernel));
  add(kernel_op("SequenceErase", infer_sequence_erase, sequence_erase_kernel));
  add(kernel_op("SequenceAt", infer_sequence_at, sequence_at_kernel));
  add(kernel_op("SequenceLength", infer_sequence_length, sequence_length_kernel));
  add(kernel_op("SplitToSequence", infer_split_to_sequence, split_to_sequence_kernel));
  add(kernel_op("ConcatFromSequence", infer_concat_from_sequence, concat_from_sequence_kernel));
  add(kernel_op("Optional", infer_optional, optional_kernel));
  // Identity of a container is a view of it (the same elements).
  extend_op("", "Identity", [](OpDef& d) {
    auto tensor_infer = d.infer;
    d.takes_containers = true;
    d.infer = [tensor_infer](Node& n, InferContext& ctx) -> Status {
      if (!reads_container(n)) return tensor_infer(n, ctx);
      set_type(n, 0, n.input(0)->type());
      return Status::ok();
    };
  });
  // Over a container input these run their kernels (runs_kernel); over a
  // tensor or no input they stay compiled (known when compiling).
  extend_op("", "OptionalHasElement", [](OpDef& d) {
    auto tensor_infer = d.infer;
    d.takes_containers = true;
    d.infer = [tensor_infer](Node& n, InferContext& ctx) -> Status {
      if (!reads_container(n)) return tensor_infer(n, ctx);
      set_output(n, 0, DType::kBool, {}, ctx);
      return Status::ok();
    };
    d.kernel = optional_has_element_kernel;
    d.runs_kernel = reads_container;
  });
  extend_op("", "OptionalGetElement", [](OpDef& d) {
    auto tensor_infer = d.infer;
    d.takes_containers = true;
    d.infer = [tensor_infer](Node& n, InferContext& ctx) -> Status {
      if (!reads_container(n)) return tensor_infer(n, ctx);
      return infer_optional_get_element_container(n, ctx);
    };
    d.kernel = optional_get_element_kernel;
    d.runs_kernel = reads_container;
  });
}

}  // namespace kiln::ops
