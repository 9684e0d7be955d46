#include "runtime/vm.h"

#include "support/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "support/memory.h"
#include "support/memory_limit.h"
#include "support/scratch.h"
#include "support/thread_pool.h"

namespace kiln::runtime {

namespace {

constexpr int64_t kAlign = 64;

// Size-class pool for symbolic-shape runs: blocks are rounded up to a power
// of two (at least 64 bytes) and kept on free lists between runs. The pool is
// bounded: it keeps at most as many free bytes as were ever live at once, so a
// model whose shapes change from run to run (a decoder over random sequence
// lengths) reaches a steady state with no malloc and no growth. Blocks may be
// returned from another thread (a buffer outlives its run inside a tensor the
// caller holds), and after the VM is gone: the state is shared and locked.
class BufferPool {
 public:
  BufferPool() : state_(std::make_shared<State>()) {}

  // A block of at least `bytes`, or null when the allocation fails.
  std::shared_ptr<void> acquire(int64_t bytes) {
    int64_t size = kAlign;
    while (size < bytes) size *= 2;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto& list = state_->free[size];
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
        state_->free_bytes -= size;
      }
    }
    if (p == nullptr) p = allocate_aligned(static_cast<size_t>(size));
    if (p == nullptr) return nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->live_bytes += size;
      state_->peak_live_bytes = std::max(state_->peak_live_bytes, state_->live_bytes);
    }
    std::shared_ptr<State> st = state_;
    return std::shared_ptr<void>(p, [st, size](void* q) { st->release(q, size); }, ControlAlloc<char>(state_));
  }

  int64_t live_bytes() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->live_bytes;
  }

 private:
  struct State {
    std::mutex mu;
    std::map<int64_t, std::vector<void*>> free;
    int64_t free_bytes = 0;
    int64_t live_bytes = 0;
    int64_t peak_live_bytes = 0;

    void release(void* q, int64_t size) {
      {
        std::lock_guard<std::mutex> lock(mu);
        live_bytes -= size;
        if (free_bytes + size <= peak_live_bytes) {
          free[size].push_back(q);
          free_bytes += size;
          return;
        }
      }
      std::free(q);
    }
    // Control blocks of the shared_ptrs acquire() hands out, recycled like
    // the blocks (a warm loop iteration that gets a buffer allocates none).
    std::map<size_t, std::vector<void*>> control_free;
    void* control_get(size_t bytes) {
      {
        std::lock_guard<std::mutex> lock(mu);
        auto& list = control_free[bytes];
        if (!list.empty()) {
          void* p = list.back();
          list.pop_back();
          return p;
        }
      }
      return ::operator new(bytes);
    }
    void control_put(void* p, size_t bytes) {
      {
        std::lock_guard<std::mutex> lock(mu);
        auto& list = control_free[bytes];
        if (list.size() < 4096) {
          list.push_back(p);
          return;
        }
      }
      ::operator delete(p);
    }
    ~State() {
      for (auto& [size, list] : free)
        for (void* p : list) std::free(p);
      for (auto& [size, list] : control_free)
        for (void* p : list) ::operator delete(p);
    }
  };
  // The allocator of those control blocks (it keeps the state alive).
  template <class T>
  struct ControlAlloc {
    using value_type = T;
    std::shared_ptr<State> st;
    explicit ControlAlloc(std::shared_ptr<State> s) : st(std::move(s)) {}
    template <class U>
    ControlAlloc(const ControlAlloc<U>& o) : st(o.st) {}  // NOLINT: rebinding
    T* allocate(size_t n) { return static_cast<T*>(st->control_get(n * sizeof(T))); }
    void deallocate(T* p, size_t n) { st->control_put(p, n * sizeof(T)); }
    template <class U>
    bool operator==(const ControlAlloc<U>& o) const { return st == o.st; }
    template <class U>
    bool operator!=(const ControlAlloc<U>& o) const { return st != o.st; }
  };
  std::shared_ptr<State> state_;
};

// Makes `limit` this thread's memory limit while in scope (support/memory_limit.h).
class ScopedMemoryLimit {
 public:
  explicit ScopedMemoryLimit(int64_t limit) : old_(set_current_memory_limit(limit)) {}
  ~ScopedMemoryLimit() { set_current_memory_limit(old_); }

 private:
  int64_t old_;
};

using Env = std::map<std::string, int64_t, std::less<>>;

// What an error names ("output 'y'"), spelled only when there is an error:
// building it for every instruction of every run cost an allocation each.
struct What {
  const char* prefix;  // "", "input ", "output "
  const std::string& name;
  std::string str() const { return prefix + ("'" + name + "'"); }
};
std::ostream& operator<<(std::ostream& os, const What& w) { return os << w.str(); }

// Evaluates into `out` (cleared first; its capacity is reused).
Status eval_shape_into(const std::vector<Expr>& shape, const Env& env, const What& what, std::vector<int64_t>& out) {
  out.clear();
  out.reserve(shape.size());
  for (const Expr& d : shape) {
    auto v = evaluate(d, env);
    if (!v.is_ok()) return internal_error() << "cannot compute the shape of " << what << ": " << v.status().message();
    if (*v < 0) return invalid_argument() << "shape of " << what << " has negative dim " << print_expr(d) << " = " << *v;
    out.push_back(*v);
  }
  return Status::ok();
}

Result<std::vector<int64_t>> eval_shape(const std::vector<Expr>& shape, const Env& env, const What& what) {
  std::vector<int64_t> out;
  KILN_RETURN_IF_ERROR(eval_shape_into(shape, env, what, out));
  return out;
}

// Symbol values by Program::symbols slot, set as symbols are bound.
struct SlotValues {
  const std::map<std::string, int, std::less<>>* slots = nullptr;
  std::vector<int64_t> values;
  std::vector<uint8_t> bound;
  void reset(const Program& p) {
    slots = &p.symbol_slots;
    values.resize(p.symbols.size());
    bound.assign(p.symbols.size(), 0);
    log.clear();
  }
  void set(const std::string& name, int64_t v) {
    if (slots == nullptr) return;
    auto it = slots->find(name);
    if (it == slots->end()) return;
    values[static_cast<size_t>(it->second)] = v;
    bound[static_cast<size_t>(it->second)] = 1;
  }
  // The symbols bind_dims bound, in order (names owned by the program's
  // shapes): a loop forgets those bound since it started at each iteration.
  std::vector<const std::string*> log;
  // Map nodes of forgotten symbols, kept to bind them again: a loop body
  // binding its carried shapes each iteration allocates no node once warm.
  std::vector<Env::node_type> spare;
  void bind(Env& env, const std::string& name, int64_t v) {
    for (size_t i = spare.size(); i-- > 0;) {
      if (spare[i].key() != name) continue;
      Env::node_type node = std::move(spare[i]);
      spare.erase(spare.begin() + static_cast<long>(i));
      node.mapped() = v;
      env.insert(std::move(node));
      return;
    }
    env[name] = v;
  }
  void forget_since(size_t mark, Env& env) {
    while (log.size() > mark) {
      const std::string& name = *log.back();
      log.pop_back();
      if (Env::node_type node = env.extract(name)) {
        if (spare.size() < 64) spare.push_back(std::move(node));
      }
      if (slots == nullptr) continue;
      if (auto it = slots->find(name); it != slots->end()) bound[static_cast<size_t>(it->second)] = 0;
    }
  }
};

// Binds the symbols of `pattern` from the concrete `dims`: a plain symbol
// takes the value (in `env` and in its slot); any other dim must evaluate to
// the value once bound.
Status bind_dims(const std::vector<Expr>& pattern, const std::vector<int64_t>& dims, Env& env,
                 const SymbolBounds& bounds, const What& what, SlotValues& slots) {
  auto show = [&] {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < pattern.size(); ++i) os << (i ? ", " : "") << print_expr(pattern[i]);
    os << "]";
    return os.str();
  };
  if (pattern.size() != dims.size())
    return invalid_argument() << what << " has rank " << dims.size() << " (shape " << shape_to_string(dims)
                              << "), expected rank " << pattern.size() << " " << show();
  for (size_t i = 0; i < dims.size(); ++i) {
    const Expr& p = pattern[i];
    if (p.is_var() && env.find(p->name) == env.end()) {
      auto it = bounds.find(p->name);
      if (it != bounds.end()) {
        if ((it->second.lo && dims[i] < *it->second.lo) || (it->second.hi && dims[i] > *it->second.hi))
          return invalid_argument() << what << " dim " << i << " (" << p->name << ") = " << dims[i]
                                    << " is outside its bounds";
      }
      slots.bind(env, p->name, dims[i]);
      slots.set(p->name, dims[i]);
      slots.log.push_back(&p->name);
    }
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    auto v = evaluate(pattern[i], env);
    if (!v.is_ok() || *v != dims[i])
      return invalid_argument() << what << " has shape " << shape_to_string(dims) << ", expected " << show()
                                << " (dim " << i << " mismatches)";
  }
  return Status::ok();
}

// A container input's elements (and theirs) have the dtypes `chain` lists
// (RegisterInfo::elem_dtypes); an element of an optional or a sequence is
// never undefined.
Status check_elements(const Tensor& t, const std::vector<DType>& chain, const What& what, size_t depth = 0) {
  if (!dtype_is_container(t.dtype())) return Status::ok();
  if (depth >= chain.size()) return internal_error() << what << ": no element type recorded";
  for (int64_t i = 0; i < t.numel(); ++i) {
    const Tensor& e = t.data_as<Tensor>()[i];
    if (!e.defined()) return invalid_argument() << what << " element " << i << " is missing";
    if (e.dtype() != chain[depth])
      return invalid_argument() << what << " element " << i << " has dtype " << dtype_name(e.dtype()) << ", expected "
                                << dtype_name(chain[depth]);
    KILN_RETURN_IF_ERROR(check_elements(e, chain, what, depth + 1));
  }
  return Status::ok();
}

// kCheckIndices: every index within [-extent, extent) of its data dim.
Status check_indices(const Instr& in, const Tensor& indices, const Env& env) {
  std::vector<int64_t> extents;
  for (const Expr& e : in.values) {
    auto v = evaluate(e, env);
    if (!v.is_ok()) return internal_error() << in.where << ": cannot evaluate index extent " << print_expr(e);
    extents.push_back(*v);
  }
  if (extents.empty()) return Status::ok();
  int64_t n = indices.numel();
  size_t m = extents.size();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = indices.dtype() == DType::kInt32 ? indices.data_as<int32_t>()[i] : indices.get_i64(i);
    int64_t e = extents[static_cast<size_t>(i) % m];
    if (v < -e || v >= e) {
      std::vector<int64_t> pos(indices.shape().size());
      for (int64_t k = static_cast<int64_t>(pos.size()) - 1, r = i; k >= 0; --k) {
        pos[k] = indices.shape()[k] == 0 ? 0 : r % indices.shape()[k];
        r = indices.shape()[k] == 0 ? 0 : r / indices.shape()[k];
      }
      return invalid_argument() << in.where << ": index " << v << " at " << shape_to_string(pos)
                                << " of indices " << indices.describe() << " is out of range for a dim of " << e
                                << " (valid: " << -e << " to " << e - 1 << ")";
    }
  }
  return Status::ok();
}

// kCheckBroadcast: every input dim is 1 or the output's.
Status check_broadcast(const Instr& in, const Env& env) {
  for (size_t i = 0; i + 1 < in.values.size(); i += 2) {
    auto d_in = evaluate(in.values[i], env);
    auto d_out = evaluate(in.values[i + 1], env);
    if (!d_in.is_ok() || !d_out.is_ok())
      return internal_error() << in.where << ": cannot evaluate broadcast dims " << print_expr(in.values[i]) << ", "
                              << print_expr(in.values[i + 1]);
    size_t a = i / 2 * 3;
    int64_t input = a + 2 < in.attrs.size() ? in.attrs[a] : -1;
    int64_t axis = a + 2 < in.attrs.size() ? in.attrs[a + 1] : -1;
    bool exact = a + 2 < in.attrs.size() && in.attrs[a + 2] != 0;
    if (*d_in == *d_out || (*d_in == 1 && !exact)) continue;
    if (exact)
      return invalid_argument() << in.where << ": input " << input << " has " << *d_in << " on axis " << axis
                                << " where " << *d_out << " is needed (" << print_expr(in.values[i]) << " against "
                                << print_expr(in.values[i + 1]) << ")";
    if (auto one = in.values[i + 1].as_const(); one && *one == 1)  // a squeezed axis
      return invalid_argument() << in.where << ": input " << input << " has " << *d_in << " on axis " << axis
                                << " (" << print_expr(in.values[i]) << "), which must be 1 to be squeezed";
    return invalid_argument() << in.where << ": input " << input << " has " << *d_in << " on axis " << axis
                              << ", which cannot broadcast to " << *d_out << " (" << print_expr(in.values[i])
                              << " against " << print_expr(in.values[i + 1])
                              << "; a dim broadcasts only from 1 or to itself)";
  }
  return Status::ok();
}

// The shape a Reshape produces from a run-time shape tensor (allowzero = 0).
Result<std::vector<int64_t>> reshape_target(const Tensor& src, const Tensor& spec, const std::string& where) {
  std::vector<int64_t> shape;
  int64_t known = 1;
  int infer_at = -1;
  for (int64_t i = 0; i < spec.numel(); ++i) {
    int64_t d = spec.get_i64(i);
    if (d == 0) {
      if (i >= src.rank()) return invalid_argument() << where << ": shape element 0 at " << i << " beyond input rank";
      d = src.shape()[i];
    }
    if (d == -1) {
      if (infer_at >= 0) return invalid_argument() << where << ": more than one -1 in the target shape";
      infer_at = static_cast<int>(i);
      shape.push_back(1);
      continue;
    }
    if (d < 0) return invalid_argument() << where << ": negative dim " << d << " in the target shape";
    known *= d;
    shape.push_back(d);
  }
  if (infer_at >= 0) {
    if (known == 0 || src.numel() % known != 0)
      return invalid_argument() << where << ": cannot reshape " << src.describe() << " with a -1 dim";
    shape[infer_at] = src.numel() / known;
  }
  return shape;
}

// Element copy between tensors of the same dtype (strings by assignment).
void copy_elements(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t count) {
  if (count <= 0) return;
  if (src.dtype() == DType::kString) {
    for (int64_t i = 0; i < count; ++i)
      dst.data_as<std::string>()[dst_off + i] = src.data_as<std::string>()[src_off + i];
    return;
  }
  if (dtype_is_container(src.dtype())) {
    for (int64_t i = 0; i < count; ++i) dst.data_as<Tensor>()[dst_off + i] = src.data_as<Tensor>()[src_off + i];
    return;
  }
  int64_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.data()) + dst_off * es, static_cast<const char*>(src.data()) + src_off * es,
              static_cast<size_t>(count * es));
}

// (product of dims before axis, dim at axis, product of dims after axis)
void split_at(const std::vector<int64_t>& shape, int64_t axis, int64_t& outer, int64_t& len, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= shape[i];
  len = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
}

// A fresh tensor: slice `index` of `src` along `axis`, without that axis.
Result<Tensor> take_slice(const Tensor& src, int64_t axis, int64_t index, const std::string& what) {
  int64_t outer, len, inner;
  split_at(src.shape(), axis, outer, len, inner);
  std::vector<int64_t> shape = src.shape();
  shape.erase(shape.begin() + axis);
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::allocate(src.dtype(), std::move(shape), what));
  for (int64_t o = 0; o < outer; ++o) copy_elements(src, (o * len + index) * inner, out, o * inner, inner);
  return out;
}

// Writes `part` (dst's shape without `axis`) into slice `index` of dst along `axis`.
void put_slice(Tensor& dst, const Tensor& part, int64_t axis, int64_t index) {
  int64_t outer, len, inner;
  split_at(dst.shape(), axis, outer, len, inner);
  for (int64_t o = 0; o < outer; ++o) copy_elements(part, o * inner, dst, (o * len + index) * inner, inner);
}

// Stacks equally shaped parts along a new `axis` (part i at position order[i]).
// With no parts, the slice shape is `empty_shape`.
Result<Tensor> stack(const std::vector<Tensor>& parts, int64_t axis, bool reverse, DType dtype,
                     const std::vector<int64_t>& empty_shape, const std::string& what) {
  std::vector<int64_t> shape = parts.empty() ? empty_shape : parts[0].shape();
  if (axis < 0 || axis > static_cast<int64_t>(shape.size()))
    return invalid_argument() << what << ": scan output axis " << axis << " out of range for rank " << shape.size();
  for (const Tensor& t : parts)
    if (t.shape() != parts[0].shape())
      return invalid_argument() << what << ": scan output changes shape across iterations ("
                                << shape_to_string(parts[0].shape()) << " vs " << shape_to_string(t.shape()) << ")";
  shape.insert(shape.begin() + axis, static_cast<int64_t>(parts.size()));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::allocate(dtype, std::move(shape), what + " scan output"));
  int64_t n = static_cast<int64_t>(parts.size());
  for (int64_t i = 0; i < n; ++i) put_slice(out, parts[i], axis, reverse ? n - 1 - i : i);
  return out;
}

bool truth(const Tensor& t) { return t.get_f64(0) != 0.0; }

// Runs `f` when the scope ends (every return path of VM::Impl::run).
template <typename F>
class ScopeExit {
 public:
  explicit ScopeExit(F& f) : f_(f) {}
  ~ScopeExit() { f_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  F& f_;
};

}  // namespace

struct VM::Impl {
  std::shared_ptr<const Program> prog;
  int num_threads = 1;
  ThreadPool* pool = nullptr;
  std::shared_ptr<void> arena;  // allocated on the first run
  BufferPool buffers;
  int64_t memory_limit = 0;  // bytes; 0: the limit of the calling thread
  bool profiling = false;
  std::vector<VM::InstrProfile> profile;
  trace::Recorder* tracer = nullptr;  // set_trace
  std::vector<std::unique_ptr<VM>> subvms;  // by Program::subprograms index, created on first use
  // Kept across runs (see run): the registers, whether the constants are
  // bound in them, and the argument arrays of kernel and host calls.
  std::vector<Tensor> regs;
  // Per register, the shape vector of the value it last released: the next
  // value it gets reuses that memory (a loop body's registers are released
  // and given values again every iteration).
  std::vector<std::vector<int64_t>> spare_shapes;
  bool constants_bound = false;
  std::vector<void*> args;
  std::vector<int64_t> syms;
  std::vector<Tensor> host_ins, host_outs;
  std::vector<void*> host_given;
  SlotValues sym_slots;

  // The state of a loop (kLoopBegin .. kLoopEnd), by its kLoopBegin's index;
  // kept across runs, so a warm loop reuses its scalars and accumulators.
  struct Accumulator {  // one scan output's slices, back to back
    std::vector<int64_t> shape;  // of a slice
    int64_t count = 0;
    int64_t slice_bytes = 0;
    std::shared_ptr<void> bytes;  // plain dtypes
    int64_t capacity = 0;         // bytes
    std::vector<Tensor> objects;  // strings
  };
  struct LoopState {
    int64_t i = 0, trip = 0;
    bool cond = true;
    size_t mark = 0;  // sym_slots.log size at the start
    Tensor iter, cond_t;  // the body's iteration_num and cond inputs
    std::vector<Accumulator> acc;
  };
  std::vector<std::unique_ptr<LoopState>> loops;
  std::vector<int> active;  // kLoopBegin indices of the loops running, outermost first
  std::vector<Tensor> moving;  // kMove's sources while they move in parallel
  std::vector<Tensor> staged;  // kMove's sources that overlap another pair's arena destination
  std::vector<int64_t> slice_shape, stack_shape;  // kLoopTest's and kLoopEnd's scratch

  // outer: the symbols bound in the calling program (a sub-program's captured
  // values may have dims such as min(n, 300) + min(m, 300) over them, which
  // only those bindings can evaluate); the ones this program uses are bound first.
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs, const Env* outer = nullptr,
                                  const std::vector<Tensor>* into = nullptr);
  // The symbols this program's register shapes and kernels name (computed once).
  const std::vector<std::string>& used_symbols();
  std::optional<std::vector<std::string>> used_symbols_;
  const Env* current_env = nullptr;  // the running program's bindings, for its sub-programs
  // Runs sub-program `index` on `inputs` followed by the captured registers.
  Result<std::vector<Tensor>> run_sub(int index, std::vector<Tensor> inputs, const std::vector<int>& captures,
                                      const std::vector<Tensor>& regs, const std::string& where);
  // kScan / kSequenceMap: the outputs, in the order of Instr::outputs.
  Result<std::vector<Tensor>> run_scan(const Instr& in, const std::vector<Tensor>& regs, const Env& env);
  Result<std::vector<Tensor>> run_sequence_map(const Instr& in, const std::vector<Tensor>& regs);
};

// The shape of one slice of a stacked output register along `axis`, for a
// loop that ran zero times: dims known now, 0 for dims not bound yet.
static std::vector<int64_t> empty_slice_shape(const RegisterInfo& info, size_t axis, const Env& env) {
  std::vector<int64_t> shape;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    if (d == axis) continue;
    auto v = evaluate(info.shape[d], env);
    shape.push_back(v.is_ok() ? *v : 0);
  }
  return shape;
}

Result<std::vector<Tensor>> VM::Impl::run_sub(int index, std::vector<Tensor> inputs, const std::vector<int>& captures,
                                              const std::vector<Tensor>& regs, const std::string& where) {
  if (subvms.size() < prog->subprograms.size()) subvms.resize(prog->subprograms.size());
  if (!subvms[index]) {
    subvms[index] = std::make_unique<VM>(prog->subprograms[index], num_threads);
    subvms[index]->set_memory_limit(memory_limit);
  }
  for (int r : captures) inputs.push_back(regs[r]);
  auto out = subvms[index]->impl_->run(inputs, current_env);
  if (!out.is_ok()) return out.status().with_context(where);
  return out;
}

Result<std::vector<Tensor>> VM::Impl::run_sequence_map(const Instr& in, const std::vector<Tensor>& regs) {
  size_t num_operands = in.attrs.size();
  const Tensor& first = regs[in.inputs[0]];
  if (first.dtype() != DType::kSequence) return internal_error() << in.where << ": input 0 is not a sequence";
  int64_t n = first.numel();
  for (size_t j = 0; j < num_operands; ++j) {
    const Tensor& t = regs[in.inputs[j]];
    if (in.attrs[j] != 0 && t.numel() != n)
      return invalid_argument() << in.where << ": input " << j << " is a sequence of " << t.numel()
                                << " elements, input 0 has " << n;
  }
  std::vector<std::vector<Tensor>> collected(in.outputs.size());
  for (int64_t i = 0; i < n; ++i) {
    std::vector<Tensor> args;
    for (size_t j = 0; j < num_operands; ++j) {
      const Tensor& t = regs[in.inputs[j]];
      args.push_back(in.attrs[j] != 0 ? t.data_as<Tensor>()[i] : t);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, run_sub(in.subprograms[0], std::move(args), in.captures[0], regs,
                                                            in.where + " element " + std::to_string(i)));
    if (outs.size() != in.outputs.size())
      return internal_error() << in.where << ": body returned " << outs.size() << " outputs";
    // Sub-program outputs are fresh tensors: the sequences own them.
    for (size_t k = 0; k < outs.size(); ++k) collected[k].push_back(std::move(outs[k]));
  }
  std::vector<Tensor> results;
  for (auto& elems : collected) {
    KILN_ASSIGN_OR_RETURN(Tensor s, Tensor::allocate(DType::kSequence, {n}, in.where + " output"));
    for (int64_t i = 0; i < n; ++i) s.data_as<Tensor>()[i] = std::move(elems[static_cast<size_t>(i)]);
    results.push_back(std::move(s));
  }
  return results;
}

Result<std::vector<Tensor>> VM::Impl::run_scan(const Instr& in, const std::vector<Tensor>& regs, const Env& env) {
  size_t num_operands = in.inputs.size() - in.captures[0].size();
  KILN_CHECK(in.attrs.size() >= 2) << "malformed kScan";
  size_t num_scan_in = static_cast<size_t>(in.attrs[0]);
  const bool batched = in.attrs[1] != 0;
  size_t first = 1;  // operand 0: sequence_lens
  size_t num_state = num_operands - first - num_scan_in;
  size_t num_scan_out = in.outputs.size() - num_state;
  KILN_CHECK(in.attrs.size() == 2 + 2 * (num_scan_in + num_scan_out)) << "malformed kScan";
  auto in_axis = [&](size_t j) { return in.attrs[2 + 2 * j]; };
  auto in_rev = [&](size_t j) { return in.attrs[3 + 2 * j] != 0; };
  auto out_axis = [&](size_t k) { return in.attrs[2 + 2 * (num_scan_in + k)]; };
  auto out_rev = [&](size_t k) { return in.attrs[3 + 2 * (num_scan_in + k)] != 0; };
  // One scan: `len` steps over xs (the first `len` slices along each axis,
  // reversed ones counted from `len`), from `state`; the final state and each
  // scan output's slices.
  auto scan = [&](std::vector<Tensor> state, const std::vector<Tensor>& xs, int64_t len,
                  const std::string& where) -> Result<std::vector<std::vector<Tensor>>> {
    std::vector<std::vector<Tensor>> scans(num_scan_out);
    for (int64_t t = 0; t < len; ++t) {
      std::vector<Tensor> args = state;
      for (size_t j = 0; j < num_scan_in; ++j) {
        KILN_ASSIGN_OR_RETURN(Tensor x, take_slice(xs[j], in_axis(j), in_rev(j) ? len - 1 - t : t, where + " scan input"));
        args.push_back(std::move(x));
      }
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, run_sub(in.subprograms[0], std::move(args), in.captures[0], regs,
                                                              where + " iteration " + std::to_string(t)));
      if (outs.size() != num_state + num_scan_out)
        return internal_error() << in.where << ": body returned " << outs.size() << " outputs";
      for (size_t j = 0; j < num_state; ++j) state[j] = std::move(outs[j]);
      for (size_t k = 0; k < num_scan_out; ++k) scans[k].push_back(std::move(outs[num_state + k]));
    }
    std::vector<std::vector<Tensor>> result;
    for (Tensor& t : state) result.push_back({len == 0 ? t.clone() : std::move(t)});
    for (auto& sc : scans) result.push_back(std::move(sc));
    return result;
  };
  // The common length of the scan inputs along their axes.
  auto length_of = [&](const std::vector<Tensor>& xs) -> Result<int64_t> {
    int64_t len = -1;
    for (size_t j = 0; j < num_scan_in; ++j) {
      if (in_axis(j) >= xs[j].rank())
        return invalid_argument() << in.where << ": scan axis " << in_axis(j) << " out of range for " << xs[j].describe();
      int64_t l = xs[j].shape()[in_axis(j)];
      if (len >= 0 && l != len)
        return invalid_argument() << in.where << ": scan inputs have different lengths (" << len << " vs " << l << ")";
      len = l;
    }
    return len < 0 ? 0 : len;
  };
  auto operand = [&](size_t i) -> const Tensor& { return regs[in.inputs[first + i]]; };
  if (!batched) return internal_error() << in.where << ": an unbatched Scan runs as loop instructions";
  // Opset 8: every operand has a leading batch axis; each element is scanned
  // on its own for its sequence length.
  int64_t batch = -1;
  for (size_t i = 0; i < num_state + num_scan_in; ++i) {
    const Tensor& x = operand(i);
    if (x.rank() < 1) return invalid_argument() << in.where << ": operand " << i << " has no batch axis";
    if (batch >= 0 && x.shape()[0] != batch)
      return invalid_argument() << in.where << ": batch sizes differ (" << batch << " vs " << x.shape()[0] << ")";
    batch = x.shape()[0];
  }
  const Tensor* lens = in.inputs[0] >= 0 ? &regs[in.inputs[0]] : nullptr;
  if (lens && (lens->rank() != 1 || lens->shape()[0] != batch))
    return invalid_argument() << in.where << ": sequence_lens has shape " << shape_to_string(lens->shape())
                              << ", expected [" << batch << "]";
  std::vector<std::vector<Tensor>> finals(num_state), outs(num_scan_out);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> state, xs;
    for (size_t j = 0; j < num_state + num_scan_in; ++j) {
      KILN_ASSIGN_OR_RETURN(Tensor x, take_slice(operand(j), 0, b, in.where + " operand " + std::to_string(j)));
      (j < num_state ? state : xs).push_back(std::move(x));
    }
    KILN_ASSIGN_OR_RETURN(int64_t steps, length_of(xs));
    int64_t len = steps;
    if (lens) {
      len = lens->get_i64(b);
      if (len < 0 || len > steps)
        return invalid_argument() << in.where << ": sequence_lens[" << b << "] = " << len << " outside [0, " << steps << "]";
    }
    std::string where = in.where + " batch element " + std::to_string(b);
    KILN_ASSIGN_OR_RETURN(auto parts, scan(std::move(state), xs, len, where));
    for (size_t j = 0; j < num_state; ++j) finals[j].push_back(std::move(parts[j][0]));
    for (size_t k = 0; k < num_scan_out; ++k) {
      const RegisterInfo& info = prog->registers[in.outputs[num_state + k]];
      std::vector<int64_t> step = empty_slice_shape(info, 0, env);  // [T, ...] of one element
      step.erase(step.begin());
      std::vector<Tensor>& p = parts[num_state + k];
      if (!p.empty()) step = p[0].shape();
      while (static_cast<int64_t>(p.size()) < steps) {  // zero past the length
        KILN_ASSIGN_OR_RETURN(Tensor zero, Tensor::allocate(info.dtype, step, in.where + " scan output"));
        p.push_back(std::move(zero));
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, stack(p, out_axis(k), out_rev(k), info.dtype, step, where));
      outs[k].push_back(std::move(t));
    }
  }
  std::vector<Tensor> results;
  for (size_t j = 0; j < num_state; ++j) {
    const RegisterInfo& info = prog->registers[in.outputs[j]];
    KILN_ASSIGN_OR_RETURN(Tensor t, stack(finals[j], 0, false, info.dtype, empty_slice_shape(info, 0, env), in.where));
    results.push_back(std::move(t));
  }
  for (size_t k = 0; k < num_scan_out; ++k) {
    const RegisterInfo& info = prog->registers[in.outputs[num_state + k]];
    KILN_ASSIGN_OR_RETURN(Tensor t, stack(outs[k], 0, false, info.dtype, empty_slice_shape(info, 0, env), in.where));
    results.push_back(std::move(t));
  }
  return results;
}

VM::VM(std::shared_ptr<const Program> program, int num_threads) : impl_(std::make_unique<Impl>()) {
  impl_->prog = std::move(program);
  impl_->num_threads = num_threads < 1 ? 1 : num_threads;
  impl_->pool = impl_->num_threads > 1 ? shared_thread_pool(impl_->num_threads) : nullptr;
}

void VM::set_memory_limit(int64_t bytes) { impl_->memory_limit = bytes > 0 ? bytes : 0; }

VM::~VM() = default;

Result<std::vector<Tensor>> VM::run(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into) {
  return impl_->run(inputs, nullptr, into);
}

void VM::set_trace(trace::Recorder* recorder) { impl_->tracer = recorder; }

void VM::set_profiling(bool enabled) {
  impl_->profiling = enabled;
  impl_->profile.assign(impl_->prog->instrs.size(), InstrProfile{});
}
const std::vector<VM::InstrProfile>& VM::profile() const { return impl_->profile; }
const Program& VM::program() const { return *impl_->prog; }

const std::vector<std::string>& VM::Impl::used_symbols() {
  if (!used_symbols_) {
    std::set<std::string> names;
    auto add = [&](const Expr& e) {
      for (const std::string& v : free_vars(e)) names.insert(v);
    };
    for (const RegisterInfo& r : prog->registers)
      for (const Expr& d : r.shape) add(d);
    for (const Instr& in : prog->instrs)
      for (const Expr& e : in.values) add(e);
    for (const std::string& s : prog->symbols) names.insert(s);
    used_symbols_ = std::vector<std::string>(names.begin(), names.end());
  }
  return *used_symbols_;
}

Result<std::vector<Tensor>> VM::Impl::run(const std::vector<Tensor>& inputs, const Env* outer,
                                          const std::vector<Tensor>* into) {
  const Program& p = *prog;
  if (into != nullptr && into->size() != p.output_registers.size())
    return invalid_argument() << "expected " << p.output_registers.size() << " output buffers, got " << into->size();
  // The caller's buffer an output register is allocated in (see allocate):
  // one the register's dtype, 64-byte aligned as kernels assume, of a plain
  // dtype. Any other given buffer gets the output copied in at the end.
  auto buffer_mismatch = [](const std::string& output, const Tensor& given, DType dtype,
                            const std::vector<int64_t>& shape) -> Status {
    return invalid_argument() << "output '" << output << "': the buffer given is " << dtype_name(given.dtype())
                              << shape_to_string(given.shape()) << ", the output is " << dtype_name(dtype)
                              << shape_to_string(shape);
  };
  auto given_for = [&](int r) -> const Tensor* {
    if (into == nullptr || !p.registers[r].is_output) return nullptr;
    for (size_t i = 0; i < p.output_registers.size(); ++i) {
      const Tensor& g = (*into)[i];
      if (p.output_registers[i] == r && g.defined() && g.dtype() == p.registers[r].dtype &&
          reinterpret_cast<uintptr_t>(g.data()) % kAlign == 0)
        return &g;
    }
    return nullptr;
  };
  const int64_t limit = memory_limit > 0 ? memory_limit : current_memory_limit();
  ScopedMemoryLimit scoped_limit(limit);
  if (p.static_plan && p.arena_bytes > 0 && !arena) {
    if (p.arena_bytes > limit)
      return resource_exhausted() << "the model's memory plan needs " << format_bytes(p.arena_bytes)
                                  << ", more than the memory limit of " << format_bytes(limit) << " (--max-memory)";
    // In 2 MB pages from 4 MB up (support/memory.h): a CNN's
    // arena spans thousands of 4 KB pages, and a kernel walking a 5 MB
    // activation after a convolution has filled the TLB with its own pages
    // paid for the misses. A measured default.
    void* a = allocate_aligned(static_cast<size_t>((p.arena_bytes + kAlign - 1) / kAlign * kAlign));
    if (a == nullptr)
      return resource_exhausted() << "out of memory allocating the model's arena (" << format_bytes(p.arena_bytes) << ")";
    arena = std::shared_ptr<void>(a, [](void* q) { std::free(q); });
  }
  // Registers persist across runs (a VM runs one call at a time): a tensor
  // borrowed from the arena, a constant, and a view of either keep their
  // handles, so a warm run of a static-shape program builds no tensor for
  // them. Everything else (inputs, outputs, pool and host-kernel buffers) is
  // dropped when the run ends, successful or not, so the VM holds no memory
  // of the caller's between runs.
  if (regs.size() != p.registers.size()) {
    regs.assign(p.registers.size(), Tensor());
    spare_shapes.resize(p.registers.size());
    constants_bound = false;
  }
  const char* arena_begin = static_cast<const char*>(arena.get());
  const char* arena_end = arena_begin ? arena_begin + p.arena_bytes : nullptr;
  auto in_arena = [&](const Tensor& t) {
    const char* d = static_cast<const char*>(t.data());
    return arena_begin != nullptr && t.defined() && !t.owns_storage() && d >= arena_begin && d < arena_end;
  };
  auto drop_transient = [&] {
    for (size_t r = 0; r < regs.size(); ++r)
      if (regs[r].defined() && !p.registers[r].is_constant && !in_arena(regs[r])) regs[r] = Tensor();
    // After an error inside a loop or a move: what they held of the run.
    for (Tensor& t : moving) t = Tensor();
    for (Tensor& t : staged) t = Tensor();
    for (auto& st : loops)
      if (st)
        for (Accumulator& a : st->acc) a.objects.clear();
  };
  ScopeExit<decltype(drop_transient)> drop(drop_transient);
  // The calling thread's trace scope as it was (an instruction sets its own).
  auto restore_trace = [saved = trace::current()] { trace::current() = saved; };
  ScopeExit<decltype(restore_trace)> restore(restore_trace);
  Env env;
  sym_slots.reset(p);
  current_env = &env;
  if (outer != nullptr)
    for (const std::string& name : used_symbols())
      if (auto it = outer->find(name); it != outer->end()) {
        env[name] = it->second;
        sym_slots.set(name, it->second);
      }

  if (inputs.size() != p.input_registers.size())
    return invalid_argument() << "expected " << p.input_registers.size() << " inputs, got " << inputs.size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    int r = p.input_registers[i];
    const RegisterInfo& info = p.registers[r];
    const Tensor& t = inputs[i];
    What what{"input ", info.name};
    if (!t.defined()) return invalid_argument() << what << " is missing";
    if (t.dtype() != info.dtype)
      return invalid_argument() << what << " has dtype " << dtype_name(t.dtype()) << ", expected "
                                << dtype_name(info.dtype);
    KILN_RETURN_IF_ERROR(bind_dims(info.shape, t.shape(), env, p.bounds, what, sym_slots));
    KILN_RETURN_IF_ERROR(check_elements(t, info.elem_dtypes, what));
    // Kernels assume 64-byte aligned buffers: copy a misaligned input.
    // (Not object dtypes: strings and containers are never read by kernels as
    // bytes, and new[] of non-trivial objects is not 64-byte aligned.)
    if (reinterpret_cast<uintptr_t>(t.data()) % kAlign != 0 && t.nbytes() > 0 && t.dtype() != DType::kString &&
        !dtype_is_container(t.dtype()))
      regs[r] = t.clone();
    else
      regs[r] = t;
  }
  if (!constants_bound) {
    for (size_t r = 0; r < p.registers.size(); ++r)
      if (p.registers[r].is_constant) regs[r] = p.registers[r].constant;
    constants_bound = true;
  }

  // True when regs[r] already holds `data` with the shape info.shape takes
  // now (a warm run of a static plan): nothing to build.
  auto holds = [&](int r, const void* data) {
    const Tensor& t = regs[r];
    const std::vector<Expr>& shape = p.registers[r].shape;
    if (!t.defined() || t.data() != data || t.dtype() != p.registers[r].dtype || static_cast<size_t>(t.rank()) != shape.size())
      return false;
    for (size_t i = 0; i < shape.size(); ++i) {
      auto v = evaluate(shape[i], env);
      if (!v.is_ok() || *v != t.shape()[i]) return false;
    }
    return true;
  };
  auto allocate = [&](int r) -> Status {
    const RegisterInfo& info = p.registers[r];
    bool object_dtype = info.dtype == DType::kString || dtype_is_container(info.dtype);
    bool planned = info.arena_offset >= 0 && !info.is_output && !object_dtype && arena_begin;
    if (planned && holds(r, arena_begin + info.arena_offset)) return Status::ok();
    What what{"", info.name};
    // The register's last shape vector is reused (a loop iteration then
    // allocates none for it).
    std::vector<int64_t> shape =
        regs[r].defined() ? regs[r].release_shape() : std::move(spare_shapes[static_cast<size_t>(r)]);
    KILN_RETURN_IF_ERROR(eval_shape_into(info.shape, env, what, shape));
    const Tensor* given = object_dtype ? nullptr : given_for(r);
    if (given != nullptr && given->shape() != shape) return buffer_mismatch(info.name, *given, info.dtype, shape);
    if (object_dtype) {
      KILN_ASSIGN_OR_RETURN(regs[r], Tensor::allocate(info.dtype, std::move(shape), what.str()));
    } else if (given != nullptr) {
      regs[r] = Tensor::borrow(info.dtype, std::move(shape), const_cast<void*>(given->data()));
    } else if (info.arena_offset >= 0 && !info.is_output) {
      regs[r] = Tensor::borrow(info.dtype, std::move(shape), static_cast<char*>(arena.get()) + info.arena_offset);
    } else {
      // Outputs, and intermediates of a symbolic-shape run, come from the
      // pool: an output the caller has dropped by the next run is reused
      // (fresh memory from the OS cost a page fault per 4 KB page on every
      // run, more than a short kernel with a large output took to compute it).
      // Together they must fit under the limit.
      int64_t in_use = buffers.live_bytes();
      int64_t room = std::max<int64_t>(limit - in_use, 0);
      std::optional<int64_t> fits = checked_nbytes(info.dtype, shape);
      if (!fits || *fits > room) KILN_RETURN_IF_ERROR(check_allocation(info.dtype, shape, room, what.str()));
      int64_t bytes = *fits;
      std::shared_ptr<void> block = buffers.acquire(bytes);
      if (block == nullptr)
        return resource_exhausted() << what << ": out of memory allocating " << dtype_name(info.dtype)
                                    << shape_to_string(shape) << " (" << format_bytes(bytes) << ")";
      regs[r] = Tensor::wrap(info.dtype, std::move(shape), std::move(block));
    }
    return Status::ok();
  };

  // kMove and kLoopEnd: moves pair i from inputs[src0 + i] to outputs[i] with
  // flags attrs[flags0 + i] (vm.h), in parallel.
  Tensor wrapped;
  auto move_pairs = [&](const Instr& in, size_t src0, size_t flags0, size_t n) -> Status {
    bool overlap = false;  // a source is another pair's destination: read every source first
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) overlap = overlap || (i != j && in.inputs[src0 + i] == in.outputs[j]);
    if (overlap) {
      moving.resize(n);
      for (size_t i = 0; i < n; ++i) moving[i] = regs[in.inputs[src0 + i]];
    }
    // A source whose bytes lie in another pair's arena destination (a view
    // of a carried value, a slice of an in-place Concat) is copied before
    // any pair is written (an allocation, in this rare case only).
    auto into_slot = [&](size_t i, const char*& begin, const char*& end) {
      const RegisterInfo& info = p.registers[in.outputs[i]];
      if (!(in.attrs[flags0 + i] & kMoveInto) || info.arena_offset < 0 || info.is_output || !arena_begin ||
          info.dtype == DType::kString || dtype_is_container(info.dtype))
        return false;
      int64_t bytes = dtype_size(info.dtype);
      for (const Expr& d : info.shape) bytes *= *d.as_const();
      begin = arena_begin + info.arena_offset;
      end = begin + bytes;
      return true;
    };
    staged.assign(n, Tensor());
    bool any_staged = false;
    for (size_t j = 0; n > 1 && j < n; ++j) {
      const Tensor& s = overlap ? moving[j] : regs[in.inputs[src0 + j]];
      if (!s.defined() || s.nbytes() == 0 || s.dtype() == DType::kString || dtype_is_container(s.dtype())) continue;
      const char* sb = static_cast<const char*>(s.data());
      const char* se = sb + s.nbytes();
      bool clash = false;
      for (size_t i = 0; i < n && !clash; ++i) {
        const char *db, *de;
        clash = i != j && into_slot(i, db, de) && sb < de && db < se;
      }
      if (!clash) continue;
      any_staged = true;
      KILN_ASSIGN_OR_RETURN(staged[j], Tensor::allocate(s.dtype(), s.shape(), in.where));  // rare: a fresh copy
      std::memcpy(staged[j].data(), s.data(), static_cast<size_t>(s.nbytes()));
    }
    for (size_t i = 0; i < n; ++i) {
      const int src = in.inputs[src0 + i], dst = in.outputs[i];
      const int64_t flags = in.attrs[flags0 + i];
      if (src == dst) continue;
      const RegisterInfo& info = p.registers[dst];
      Tensor* sp = any_staged && staged[i].defined() ? &staged[i] : overlap ? &moving[i] : &regs[src];
      if (info.dtype == DType::kOptional && sp->defined() && sp->dtype() != DType::kOptional) {
        // An optional carried value the body returned as its element: wrapped
        // (inference typed the carried value optional throughout).
        wrapped = Tensor(DType::kOptional, {1});
        wrapped.data_as<Tensor>()[0] = *sp;
        sp = &wrapped;
      }
      Tensor& s = *sp;
      if (!s.defined()) return internal_error() << in.where << ": no value to move into '" << info.name << "'";
      if (s.dtype() != info.dtype)
        return invalid_argument() << in.where << ": produced " << s.describe() << " for " << dtype_name(info.dtype)
                                  << " '" << info.name << "'";
      const bool object_dtype = info.dtype == DType::kString || dtype_is_container(info.dtype);
      if ((flags & kMoveInto) && info.arena_offset >= 0 && !info.is_output && !object_dtype && arena_begin) {
        // A static carried value in the arena: the data is copied there.
        bool same = static_cast<size_t>(s.rank()) == info.shape.size();
        for (size_t d = 0; same && d < info.shape.size(); ++d) same = *info.shape[d].as_const() == s.shape()[d];
        if (!same)
          return invalid_argument() << in.where << ": '" << info.name << "' gets " << s.describe()
                                    << ", but its shape is static: " << shape_to_string(eval_shape(info.shape, env, What{"", info.name}).value());
        KILN_RETURN_IF_ERROR(allocate(dst).with_context(in.where));
        if (regs[dst].data() != s.data() && s.nbytes() > 0)
          std::memcpy(regs[dst].data(), s.data(), static_cast<size_t>(s.nbytes()));
        continue;
      }
      KILN_RETURN_IF_ERROR(
          bind_dims(info.shape, s.shape(), env, p.bounds, What{"", info.name}, sym_slots).with_context(in.where));
      if ((flags & kMoveAlias) != 0 && regs[dst].data() == s.data() && regs[dst].shape() == s.shape() &&
          regs[dst].dtype() == s.dtype() && s.nbytes() > 0)
        continue;  // the same value as in the last iteration or run (an arena buffer)
      bool copy = in_arena(s) && (flags & kMoveAlias) == 0;
      if (!copy && (flags & kMoveDetach) != 0) {
        // The result must own its storage. A source whose last use this is
        // and that no one else holds is handed over; anything else is copied.
        bool dies = !overlap && std::find(in.release.begin(), in.release.end(), src) != in.release.end() &&
                    std::count(in.inputs.begin() + static_cast<long>(src0), in.inputs.begin() + static_cast<long>(src0 + n), src) == 1;
        if (dies) {
          Tensor t = std::move(s);
          if (t.sole_owner()) {
            regs[dst] = std::move(t);
            continue;
          }
          s = std::move(t);
        }
        copy = true;
      }
      if (!copy) {
        regs[dst] = s;
        continue;
      }
      KILN_RETURN_IF_ERROR(allocate(dst).with_context(in.where));
      copy_elements(s, 0, regs[dst], 0, s.numel());
    }
    if (overlap)
      for (Tensor& t : moving) t = Tensor();
    if (any_staged)
      for (Tensor& t : staged) t = Tensor();
    wrapped = Tensor();
    return Status::ok();
  };
  // kLoopNext: appends a scan output's slice of this iteration.
  // `trip`: the iterations certain to run (int64 max when unknown).
  auto append = [&](const Instr& in, Accumulator& a, const Tensor& t, size_t k, int64_t iteration,
                    int64_t trip) -> Status {
    if (a.count == 0) {
      a.shape = t.shape();
      a.slice_bytes = t.nbytes();
      // A trip count whose scan output cannot fit fails now, not after the
      // iterations that fill the memory.
      const int64_t room = limit - std::min(limit, buffers.live_bytes());
      if (trip != std::numeric_limits<int64_t>::max() && a.slice_bytes > 0 && trip > room / a.slice_bytes)
        return resource_exhausted() << in.where << ": scan output " << k << " of " << trip << " iterations of "
                                    << format_bytes(a.slice_bytes) << " would exceed the memory limit of "
                                    << format_bytes(limit);
    } else if (t.shape() != a.shape) {
      return invalid_argument() << in.where << ": scan output " << k << " has shape " << shape_to_string(t.shape())
                                << " in iteration " << iteration << ", " << shape_to_string(a.shape) << " before";
    }
    if (t.dtype() == DType::kString || dtype_is_container(t.dtype())) {
      if (static_cast<size_t>(a.count) < a.objects.size()) a.objects[static_cast<size_t>(a.count)] = t;
      else a.objects.push_back(t);
    } else if (a.slice_bytes > 0) {
      int64_t need = (a.count + 1) * a.slice_bytes;
      if (need > a.capacity) {
        int64_t cap = std::max<int64_t>({need, 2 * a.capacity, 4096});
        if (cap > limit - std::min(limit, buffers.live_bytes()))
          return resource_exhausted() << in.where << ": scan output " << k << " needs more than the memory limit of "
                                      << format_bytes(limit) << " after " << a.count << " iterations";
        void* q = allocate_aligned(static_cast<size_t>(cap));
        if (q == nullptr) return resource_exhausted() << in.where << ": out of memory for scan output " << k;
        std::shared_ptr<void> grown(q, [](void* x) { std::free(x); });
        if (a.count > 0) std::memcpy(q, a.bytes.get(), static_cast<size_t>(a.count * a.slice_bytes));
        a.bytes = std::move(grown);
        a.capacity = cap;
      }
      std::memcpy(static_cast<char*>(a.bytes.get()) + a.count * a.slice_bytes, t.data(), static_cast<size_t>(a.slice_bytes));
    }
    ++a.count;
    return Status::ok();
  };
  // kLoopEnd: scan output register `r` from accumulator `a`, stacked along `axis`.
  auto stack_into = [&](const Instr& in, const Accumulator& a, int r, int64_t axis, bool reverse) -> Status {
    const RegisterInfo& info = p.registers[r];
    std::vector<int64_t>& shape = stack_shape;
    if (a.count > 0) shape.assign(a.shape.begin(), a.shape.end());
    else shape = empty_slice_shape(info, static_cast<size_t>(axis), env);
    if (axis < 0 || axis > static_cast<int64_t>(shape.size()))
      return invalid_argument() << in.where << ": scan output axis " << axis << " out of range for rank " << shape.size();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) (d < axis ? outer : inner) *= shape[d];
    shape.insert(shape.begin() + axis, a.count);
    KILN_RETURN_IF_ERROR(bind_dims(info.shape, shape, env, p.bounds, What{"output ", info.name}, sym_slots).with_context(in.where));
    KILN_RETURN_IF_ERROR(allocate(r).with_context(in.where));
    Tensor& out = regs[r];
    const int64_t n = a.count;
    for (int64_t i = 0; i < n; ++i) {
      int64_t at = reverse ? n - 1 - i : i;
      if (!a.objects.empty() || info.dtype == DType::kString || dtype_is_container(info.dtype)) {
        put_slice(out, a.objects[static_cast<size_t>(i)], axis, at);
        continue;
      }
      const int64_t es = dtype_size(info.dtype);
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(static_cast<char*>(out.data()) + ((o * n + at) * inner) * es,
                    static_cast<const char*>(a.bytes.get()) + (i * outer * inner + o * inner) * es,
                    static_cast<size_t>(inner * es));
    }
    return Status::ok();
  };

  active.clear();
  size_t pc = 0;
  auto execute = [&]() -> Status {
  while (pc < p.instrs.size()) {
    const Instr& in = p.instrs[pc];
    size_t next = pc + 1;
    auto started = profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    int64_t span_begin = 0;
    if (tracer != nullptr) {
      trace::current() = trace::Scope{tracer, static_cast<int32_t>(pc)};
      span_begin = trace::now_ns();
    }
    switch (in.op) {
      case OpCode::kCall: {
        const CompiledKernel& k = p.kernels[in.callee];
        for (int r : in.outputs) KILN_RETURN_IF_ERROR(allocate(r).with_context(in.where));
        args.clear();
        for (int r : in.inputs) args.push_back(regs[r].data());
        for (int r : in.outputs) args.push_back(regs[r].data());
        syms.clear();
        for (size_t i = 0; i < k.sym_slots.size(); ++i) {
          size_t slot = static_cast<size_t>(k.sym_slots[i]);
          KILN_CHECK(slot < sym_slots.bound.size() && sym_slots.bound[slot])
              << "kernel " << k.name << " needs unbound symbol " << k.sym_names[i];
          syms.push_back(sym_slots.values[slot]);
        }
        int64_t scratch_failures = kiln_scratch_failures();
        set_current_thread_pool(pool);
        k.fn(args.data(), syms.data());
        set_current_thread_pool(nullptr);
        if (kiln_scratch_failures() != scratch_failures)
          return resource_exhausted() << in.where << ": kernel " << k.name
                                      << " could not allocate its scratch memory (out of memory, or more than "
                                      << format_bytes(default_memory_limit()) << ")";
        break;
      }
      case OpCode::kCallHost: {
        host_outs.resize(in.outputs.size());
        for (Tensor& t : host_outs) t = Tensor();
        if (in.fills_outputs) {
          // Outputs whose shapes are known before the call are the kernel's
          // to fill: from the memory plan or the run's pool.
          for (size_t i = 0; i < in.outputs.size(); ++i) {
            int r = in.outputs[i];
            bool known = true;
            for (const Expr& d : p.registers[r].shape) known = known && evaluate(d, env).is_ok();
            if (!known) continue;
            KILN_RETURN_IF_ERROR(allocate(r).with_context(in.where));
            host_outs[i] = std::move(regs[r]);
          }
        }
        // The operands are moved into the argument array and back (a copy
        // of each tensor handle was an allocation per operand and call); an
        // operand named twice is copied from its first slot.
        auto first_slot = [&](size_t i) {
          return static_cast<size_t>(std::find(in.inputs.begin(), in.inputs.end(), in.inputs[i]) - in.inputs.begin());
        };
        host_ins.resize(in.inputs.size());
        for (size_t i = 0; i < in.inputs.size(); ++i) {
          int r = in.inputs[i];
          if (r < 0) host_ins[i] = Tensor();
          else if (size_t f = first_slot(i); f != i) host_ins[i] = host_ins[f];
          else host_ins[i] = std::move(regs[r]);
        }
        host_given.resize(in.outputs.size());
        for (size_t i = 0; i < in.outputs.size(); ++i) host_given[i] = host_outs[i].data();
        // Host kernels may run parallel loops on the model's pool too (the recurrent ops do).
        set_current_thread_pool(pool);
        Status host_status = p.host_kernels[in.callee](host_ins, host_outs);
        set_current_thread_pool(nullptr);
        for (size_t i = 0; i < in.inputs.size(); ++i) {
          if (in.inputs[i] >= 0 && first_slot(i) == i) regs[in.inputs[i]] = std::move(host_ins[i]);
          host_ins[i] = Tensor();
        }
        KILN_RETURN_IF_ERROR(std::move(host_status).with_context(in.where));
        for (size_t i = 0; i < in.outputs.size(); ++i) {
          int r = in.outputs[i];
          const RegisterInfo& info = p.registers[r];
          if (host_given[i] != nullptr && host_outs[i].data() != host_given[i])
            return internal_error() << in.where << ": host kernel replaced the buffer of output '" << info.name
                                    << "' it was given";
          if (host_outs[i].dtype() != info.dtype)
            return internal_error() << in.where << ": host kernel produced " << host_outs[i].describe()
                                    << " for " << dtype_name(info.dtype) << " output '" << info.name << "'";
          KILN_RETURN_IF_ERROR(bind_dims(info.shape, host_outs[i].shape(), env, p.bounds, What{"output ", info.name}, sym_slots)
                                   .with_context(in.where));
          regs[r] = std::move(host_outs[i]);
        }
        break;
      }
      case OpCode::kView: {
        int out = in.outputs[0];
        const RegisterInfo& info = p.registers[out];
        const Tensor& src = regs[in.inputs[0]];
        if (in.inputs.size() == 1 && in_arena(src) && holds(out, src.data())) break;  // the same view as last run
        std::vector<int64_t> shape;
        if (in.inputs.size() > 1) {
          // Reshape to a shape tensor known only now (0 copies a dim, -1 is inferred).
          KILN_ASSIGN_OR_RETURN(shape, reshape_target(src, regs[in.inputs[1]], in.where));
          KILN_RETURN_IF_ERROR(bind_dims(info.shape, shape, env, p.bounds, What{"", info.name}, sym_slots).with_context(in.where));
        } else {
          KILN_ASSIGN_OR_RETURN(shape, eval_shape(info.shape, env, What{"", info.name}));
        }
        int64_t n = 1;
        bool overflow = false;
        for (int64_t d : shape) overflow |= __builtin_mul_overflow(n, d, &n);
        if (overflow || n != src.numel())
          return invalid_argument() << in.where << ": cannot view " << src.describe() << " as "
                                    << shape_to_string(shape);
        regs[out] = src.reshaped(std::move(shape));
        break;
      }
      case OpCode::kBind:
        for (int r : in.outputs) KILN_RETURN_IF_ERROR(allocate(r).with_context(in.where));
        break;
      case OpCode::kShapeOf: {
        int out = in.outputs[0];
        KILN_RETURN_IF_ERROR(allocate(out).with_context(in.where));
        Tensor& t = regs[out];
        for (size_t i = 0; i < in.values.size(); ++i) {
          auto v = evaluate(in.values[i], env);
          if (!v.is_ok()) return v.status().with_context(in.where);
          t.set_f64(static_cast<int64_t>(i), static_cast<double>(*v));
          if (t.dtype() == DType::kInt64) t.data_as<int64_t>()[i] = *v;
        }
        break;
      }
      case OpCode::kCopy: {
        int out = in.outputs[0];
        KILN_RETURN_IF_ERROR(allocate(out).with_context(in.where));
        const Tensor& src = regs[in.inputs[0]];
        if (src.dtype() == DType::kString || dtype_is_container(src.dtype())) {
          copy_elements(src, 0, regs[out], 0, src.numel());
        } else if (src.nbytes() > 0) {
          std::memcpy(regs[out].data(), src.data(), static_cast<size_t>(src.nbytes()));
        }
        break;
      }
      case OpCode::kCheckIndices:
        KILN_RETURN_IF_ERROR(check_indices(in, regs[in.inputs[0]], env));
        break;
      case OpCode::kCheckBroadcast:
        KILN_RETURN_IF_ERROR(check_broadcast(in, env));
        break;
      case OpCode::kJump:
        next = static_cast<size_t>(in.target);
        break;
      case OpCode::kBranch: {
        const Tensor& c = regs[in.inputs[0]];
        if (c.numel() != 1) return invalid_argument() << in.where << ": condition is not a scalar";
        if (c.get_f64(0) == 0.0) next = static_cast<size_t>(in.target);
        break;
      }
      case OpCode::kRet:
        next = p.instrs.size();
        break;
      case OpCode::kMove:
        KILN_RETURN_IF_ERROR(move_pairs(in, 0, 0, in.outputs.size()));
        break;
      case OpCode::kEndIf:
        break;
      case OpCode::kLoopBegin: {
        if (loops.size() < p.instrs.size()) loops.resize(p.instrs.size());
        std::unique_ptr<LoopState>& slot = loops[pc];
        if (!slot) {
          slot = std::make_unique<LoopState>();
          slot->iter = Tensor(DType::kInt64, {});
          slot->cond_t = Tensor(DType::kBool, {});
        }
        LoopState& st = *slot;
        st.i = 0;
        st.cond = true;
        st.mark = sym_slots.log.size();
        if (in.attrs[0] == 0) {  // Loop: M and cond, each optional
          st.trip = std::numeric_limits<int64_t>::max();
          if (in.inputs[0] >= 0) {
            const Tensor& m = regs[in.inputs[0]];
            if (m.numel() != 1) return invalid_argument() << in.where << ": M " << m.describe() << " is not a scalar";
            st.trip = m.get_i64(0);
          }
          if (in.inputs[1] >= 0) {
            const Tensor& c = regs[in.inputs[1]];
            if (c.numel() != 1) return invalid_argument() << in.where << ": cond " << c.describe() << " is not a scalar";
            st.cond = truth(c);
          }
          if (in.attrs.size() > 1 && in.attrs[1] != 0 && st.cond && st.trip == std::numeric_limits<int64_t>::max())
            return invalid_argument() << in.where
                                      << ": the condition is true, there is no trip count M, and the body passes the "
                                         "condition through unchanged: the loop would never end";
        } else {  // Scan: the common length of the scan inputs along their axes
          int64_t len = -1;
          for (size_t j = 0; j < in.inputs.size(); ++j) {
            const Tensor& x = regs[in.inputs[j]];
            int64_t axis = in.attrs[1 + 2 * j];
            if (axis >= x.rank())
              return invalid_argument() << in.where << ": scan axis " << axis << " out of range for " << x.describe();
            int64_t l = x.shape()[axis];
            if (len >= 0 && l != len)
              return invalid_argument() << in.where << ": scan inputs have different lengths (" << len << " vs " << l << ")";
            len = l;
          }
          st.trip = len < 0 ? 0 : len;
        }
        const Instr& end = p.instrs[in.end];
        st.acc.resize((end.attrs.size() - end.inputs.size()) / 2);
        for (Accumulator& a : st.acc) {
          a.count = 0;
          a.objects.clear();
        }
        active.push_back(static_cast<int>(pc));
        break;
      }
      case OpCode::kLoopTest: {
        LoopState& st = *loops[in.loop];
        const Instr& begin = p.instrs[in.loop];
        if (st.i >= st.trip || !st.cond) {
          next = static_cast<size_t>(in.target);
          break;
        }
        if (begin.attrs[0] == 0) {
          // Written in place, unless anything still holds last iteration's
          // value (a sequence it was inserted into, a carried view of it):
          // then a fresh scalar.
          for (size_t k = 0; k < 2 && k < in.outputs.size(); ++k) {
            if (in.outputs[k] >= 0) regs[in.outputs[k]] = Tensor();
            Tensor& t = k == 0 ? st.iter : st.cond_t;
            if (!t.sole_owner()) t = Tensor(k == 0 ? DType::kInt64 : DType::kBool, {});
            if (k == 0) t.data_as<int64_t>()[0] = st.i;
            else t.data_as<bool>()[0] = st.cond;
            if (in.outputs[k] >= 0) regs[in.outputs[k]] = t;
          }
          break;
        }
        // Scan: slice i (or len - 1 - i) of each scan input, without its axis.
        for (size_t j = 0; j < in.inputs.size(); ++j) {
          const Tensor& x = regs[in.inputs[j]];
          const int64_t axis = begin.attrs[1 + 2 * j];
          const int64_t at = begin.attrs[2 + 2 * j] != 0 ? st.trip - 1 - st.i : st.i;
          const int r = in.outputs[j];
          slice_shape.assign(x.shape().begin(), x.shape().end());
          slice_shape.erase(slice_shape.begin() + axis);
          KILN_RETURN_IF_ERROR(bind_dims(p.registers[r].shape, slice_shape, env, p.bounds, What{"", p.registers[r].name}, sym_slots)
                                   .with_context(in.where));
          KILN_RETURN_IF_ERROR(allocate(r).with_context(in.where));
          int64_t outer, len, inner;
          split_at(x.shape(), axis, outer, len, inner);
          for (int64_t o = 0; o < outer; ++o) copy_elements(x, (o * len + at) * inner, regs[r], o * inner, inner);
        }
        break;
      }
      case OpCode::kLoopNext: {
        LoopState& st = *loops[in.loop];
        const size_t first = in.attrs[0] == 0 ? 1 : 0;
        const size_t carried = in.outputs.size();
        if (first == 1 && in.inputs[0] >= 0) {
          const Tensor& c = regs[in.inputs[0]];
          if (c.numel() != 1) return invalid_argument() << in.where << ": the body's condition " << c.describe() << " is not a scalar";
          st.cond = truth(c);
        }
        // The iterations certain to run: a Scan's length, a Loop's trip count
        // when no condition can end it sooner.
        const int64_t runs = first == 0 || in.inputs[0] < 0 ? st.trip : std::numeric_limits<int64_t>::max();
        for (size_t k = 0; first + carried + k < in.inputs.size(); ++k)
          KILN_RETURN_IF_ERROR(append(in, st.acc[k], regs[in.inputs[first + carried + k]], k, st.i, runs));
        // The next iteration binds the body's symbols afresh.
        sym_slots.forget_since(st.mark, env);
        KILN_RETURN_IF_ERROR(move_pairs(in, first, 1, carried));
        ++st.i;
        next = static_cast<size_t>(in.target);
        break;
      }
      case OpCode::kLoopEnd: {
        LoopState& st = *loops[in.loop];
        sym_slots.forget_since(st.mark, env);
        const size_t carried = in.inputs.size();
        // attrs: move flags per carried value, then (axis, reverse) per scan output
        KILN_RETURN_IF_ERROR(move_pairs(in, 0, 0, carried));
        for (size_t k = 0; carried + k < in.outputs.size(); ++k) {
          KILN_RETURN_IF_ERROR(stack_into(in, st.acc[k], in.outputs[carried + k], in.attrs[carried + 2 * k],
                                          in.attrs[carried + 2 * k + 1] != 0));
          st.acc[k].objects.clear();  // the VM keeps no value of the run
        }
        active.pop_back();
        break;
      }
      case OpCode::kScan:
      case OpCode::kSequenceMap: {
        Result<std::vector<Tensor>> outs =
            in.op == OpCode::kSequenceMap ? run_sequence_map(in, regs) : run_scan(in, regs, env);
        if (!outs.is_ok()) return outs.status();
        if (outs->size() != in.outputs.size())
          return internal_error() << in.where << ": produced " << outs->size() << " outputs, expected "
                                  << in.outputs.size();
        for (size_t i = 0; i < in.outputs.size(); ++i) {
          int r = in.outputs[i];
          const RegisterInfo& info = p.registers[r];
          Tensor& t = (*outs)[i];
          if (t.dtype() != info.dtype)
            return invalid_argument() << in.where << ": produced " << t.describe() << " for "
                                      << dtype_name(info.dtype) << " output '" << info.name << "'";
          KILN_RETURN_IF_ERROR(bind_dims(info.shape, t.shape(), env, p.bounds, What{"output ", info.name}, sym_slots)
                                   .with_context(in.where));
          regs[r] = std::move(t);
        }
        break;
      }
    }
    for (int r : in.release)
      if (!in_arena(regs[r])) {
        if (regs[r].defined()) spare_shapes[static_cast<size_t>(r)] = regs[r].release_shape();
        regs[r] = Tensor();
      }
    if (profiling) {
      profile[pc].calls += 1;
      profile[pc].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }
    if (tracer != nullptr) {
      trace::Span span;
      span.begin_ns = span_begin;
      span.end_ns = trace::now_ns();
      span.thread = trace::thread_id();
      span.label = static_cast<int32_t>(pc);
      tracer->add(span);
    }
    pc = next;
  }
  return Status::ok();
  };
  if (Status st = execute(); !st.is_ok()) {
    // Name the loops the error happened in, innermost first.
    for (auto it = active.rbegin(); it != active.rend(); ++it)
      if (loops[*it]) st = st.with_context(p.instrs[*it].where + " iteration " + std::to_string(loops[*it]->i));
    active.clear();
    return st;
  }

  // A caller's buffer gets the value (written in place by the kernels, else
  // copied in) and stands for the output.
  auto deliver = [&](size_t i, const Tensor& v) -> Result<Tensor> {
    const Tensor& g = (*into)[i];
    const std::string& name = p.registers[p.output_registers[i]].name;
    if (g.dtype() != v.dtype() || g.shape() != v.shape()) return buffer_mismatch(name, g, v.dtype(), v.shape());
    if (v.data() != g.data()) {
      if (v.dtype() == DType::kString || dtype_is_container(v.dtype())) {
        return invalid_argument() << "output '" << name << "' has dtype " << dtype_name(v.dtype())
                                  << ", which cannot be written into a caller's buffer";
      }
      if (v.nbytes() > 0) std::memcpy(const_cast<void*>(g.data()), v.data(), static_cast<size_t>(v.nbytes()));
    }
    return g;
  };
  std::vector<Tensor> outputs;
  outputs.reserve(p.output_registers.size());
  for (size_t i = 0; i < p.output_registers.size(); ++i) {
    int r = p.output_registers[i];
    bool to_caller = into != nullptr && (*into)[i].defined();
    auto first = std::find(p.output_registers.begin(), p.output_registers.begin() + static_cast<long>(i), r);
    if (first != p.output_registers.begin() + static_cast<long>(i)) {
      const Tensor& v = outputs[static_cast<size_t>(first - p.output_registers.begin())];
      if (!to_caller) {
        outputs.push_back(v);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Tensor g, deliver(i, v));
      outputs.push_back(std::move(g));
      continue;
    }
    if (!regs[r].defined()) return internal_error() << "output '" << p.registers[r].name << "' was not computed";
    if (to_caller) {
      KILN_ASSIGN_OR_RETURN(Tensor g, deliver(i, regs[r]));
      outputs.push_back(std::move(g));
      continue;
    }
    // Moved out unless the register is kept (a constant output is copied).
    outputs.push_back(p.registers[r].is_constant || in_arena(regs[r]) ? regs[r] : std::move(regs[r]));
  }
  return outputs;
}

}  // namespace kiln::runtime
