#include "tir/tir.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace kiln::tir {

namespace {

// Heap scratch by size: how many blocks of it are live at once at most (nested
// Allocates), and whether any is inside a parallel loop.
struct ScratchWalk {
  std::map<int64_t, int> live;
  std::map<int64_t, ScratchUse> most;

  void walk(const Stmt& s, bool parallel) {
    if (s == nullptr) return;
    switch (s->kind) {
      case StmtKind::kFor:
        walk(s->body, parallel || s->for_kind == ForKind::kParallel);
        return;
      case StmtKind::kAllocate: {
        int64_t bytes = dtype_size(s->buffer.dtype);
        bool known = true;
        for (const Expr& d : s->buffer.shape) {
          auto c = d.as_const();
          known = known && c && *c >= 0 && bytes <= (int64_t{1} << 50) / std::max<int64_t>(*c, 1);
          if (known) bytes *= *c;
        }
        if (!known || bytes <= kStackScratchBytes) {
          walk(s->body, parallel);
          return;
        }
        const int64_t size = (bytes + 63) / 64 * 64;
        ScratchUse& u = most[size];
        u.bytes = size;
        u.count = std::max(u.count, ++live[size]);
        u.per_thread = u.per_thread || parallel;
        walk(s->body, parallel);
        --live[size];
        return;
      }
      case StmtKind::kIfThenElse:
        walk(s->then_case, parallel);
        walk(s->else_case, parallel);
        return;
      case StmtKind::kSeq:
        for (const Stmt& t : s->seq) walk(t, parallel);
        return;
      default:
        return;
    }
  }
};

}  // namespace

std::vector<ScratchUse> heap_scratch(const PrimFunc& f) {
  ScratchWalk w;
  w.walk(f.body, false);
  std::vector<ScratchUse> out;
  for (const auto& [size, u] : w.most) out.push_back(u);
  return out;
}

const char* for_kind_name(ForKind k) {
  switch (k) {
    case ForKind::kSerial: return "serial";
    case ForKind::kParallel: return "parallel";
    case ForKind::kVectorized: return "vectorized";
    case ForKind::kUnrolled: return "unrolled";
  }
  return "?";
}

Stmt make_for(std::string var, Expr extent, ForKind kind, Stmt body) {
  KILN_CHECK(extent.defined()) << "for " << var << ": undefined extent";
  KILN_CHECK(body != nullptr) << "for " << var << ": null body";
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kFor;
  n->var = std::move(var);
  n->extent = std::move(extent);
  n->for_kind = kind;
  n->body = std::move(body);
  return n;
}

Stmt make_store(std::string buffer, int buffer_index, std::vector<Expr> indices, Expr value) {
  KILN_CHECK(value.defined()) << "store to " << buffer << ": undefined value";
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kStore;
  n->buffer.name = std::move(buffer);
  n->buffer.dtype = value.dtype();
  n->buffer_index = buffer_index;
  n->indices = std::move(indices);
  n->value = std::move(value);
  return n;
}

Stmt make_allocate(Buffer buffer, Stmt body) {
  KILN_CHECK(body != nullptr) << "allocate " << buffer.name << ": null body";
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kAllocate;
  n->buffer = std::move(buffer);
  n->buffer_index = -1;
  n->body = std::move(body);
  return n;
}

Stmt make_if(Expr cond, Stmt then_case, Stmt else_case) {
  KILN_CHECK(cond.defined()) << "if: undefined condition";
  KILN_CHECK(cond.dtype() == DType::kBool) << "if: condition is not bool: " << print_expr(cond);
  KILN_CHECK(then_case != nullptr) << "if: null then branch";
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kIfThenElse;
  n->cond = std::move(cond);
  n->then_case = std::move(then_case);
  n->else_case = std::move(else_case);
  return n;
}

Stmt make_prefetch(std::string buffer, int buffer_index, DType dtype, std::vector<Expr> indices, int64_t elements) {
  KILN_CHECK(elements >= 1) << "prefetch of " << buffer << ": " << elements << " elements";
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kPrefetch;
  n->buffer.name = std::move(buffer);
  n->buffer.dtype = dtype;
  n->buffer_index = buffer_index;
  n->indices = std::move(indices);
  n->extent = int_imm(elements);
  return n;
}

Stmt make_seq(std::vector<Stmt> seq) {
  std::vector<Stmt> flat;
  for (auto& s : seq) {
    KILN_CHECK(s != nullptr) << "seq: null statement";
    if (s->kind == StmtKind::kSeq) {
      flat.insert(flat.end(), s->seq.begin(), s->seq.end());
    } else {
      flat.push_back(std::move(s));
    }
  }
  if (flat.size() == 1) return flat[0];
  auto n = std::make_shared<StmtNode>();
  n->kind = StmtKind::kSeq;
  n->seq = std::move(flat);
  return n;
}

namespace {

std::string print_shape(const std::vector<Expr>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += print_expr(shape[i]);
  }
  return out + "]";
}

std::string print_buffer(const Buffer& b) {
  return b.name + ":" + dtype_name(b.dtype) + print_shape(b.shape);
}

void print_stmt_to(std::ostringstream& os, const Stmt& s, int indent) {
  std::string pad(static_cast<size_t>(indent) * 2, ' ');
  if (!s) {
    os << pad << "<null>\n";
    return;
  }
  switch (s->kind) {
    case StmtKind::kFor:
      os << pad << "for " << s->var << " in 0.." << print_expr(s->extent);
      if (s->for_kind != ForKind::kSerial) os << " " << for_kind_name(s->for_kind);
      os << " {\n";
      print_stmt_to(os, s->body, indent + 1);
      os << pad << "}\n";
      break;
    case StmtKind::kStore:
      os << pad << s->buffer.name << "#" << s->buffer_index << print_shape(s->indices) << " = "
         << print_expr(s->value) << "\n";
      break;
    case StmtKind::kAllocate:
      os << pad << "allocate " << print_buffer(s->buffer) << " {\n";
      print_stmt_to(os, s->body, indent + 1);
      os << pad << "}\n";
      break;
    case StmtKind::kIfThenElse:
      os << pad << "if (" << print_expr(s->cond) << ") {\n";
      print_stmt_to(os, s->then_case, indent + 1);
      if (s->else_case) {
        os << pad << "} else {\n";
        print_stmt_to(os, s->else_case, indent + 1);
      }
      os << pad << "}\n";
      break;
    case StmtKind::kSeq:
      for (const auto& c : s->seq) print_stmt_to(os, c, indent);
      break;
    case StmtKind::kPrefetch:
      os << pad << "prefetch " << s->buffer.name << "#" << s->buffer_index << print_shape(s->indices) << " x"
         << print_expr(s->extent) << "\n";
      break;
  }
}

std::string positional(char prefix, size_t i) {
  std::string s(1, prefix);
  s += std::to_string(i);
  return s;
}

const char* combiner_name(Combiner c) {
  switch (c) {
    case Combiner::kNone: return "none";
    case Combiner::kSum: return "sum";
    case Combiner::kProd: return "prod";
    case Combiner::kMax: return "max";
    case Combiner::kMin: return "min";
  }
  return "?";
}

}  // namespace

namespace {

// Symbols of e (variables that are not in `axes`), in order of first appearance.
void collect_symbols(const Expr& e, const std::set<std::string>& axes, std::vector<std::string>& out,
                     std::set<std::string>& seen) {
  if (!e.defined()) return;
  if (e.kind() == ExprKind::kVar) {
    // Not an axis, nor a finalize's accumulator ("acc", of the stage's dtype).
    bool symbol = e.dtype() == DType::kInt64 && !axes.count(e->name) && e->name != "acc";
    if (symbol && seen.insert(e->name).second) out.push_back(e->name);
    return;
  }
  for (const Expr& a : e->args) collect_symbols(a, axes, out, seen);
}

}  // namespace

CanonicalKernel canonicalize(const KernelDef& k, const SymbolBounds* bounds) {
  CanonicalKernel c;
  // Symbols: params' shapes first (dims in order), then the stages.
  std::set<std::string> axes, seen;
  for (const auto& st : k.stages) {
    axes.insert(st.axes.begin(), st.axes.end());
    axes.insert(st.reduce_axes.begin(), st.reduce_axes.end());
  }
  for (const auto& b : k.params)
    for (const Expr& d : b.shape) collect_symbols(d, axes, c.symbols, seen);
  for (const auto& st : k.stages) {
    for (const Expr& d : st.shape) collect_symbols(d, axes, c.symbols, seen);
    for (const Expr& d : st.reduce_extents) collect_symbols(d, axes, c.symbols, seen);
    for (const Expr* e : {&st.init, &st.body}) collect_symbols(*e, axes, c.symbols, seen);
    collect_symbols(st.finalize, axes, c.symbols, seen);
  }
  std::map<std::string, Expr, std::less<>> sym_repl;
  for (size_t i = 0; i < c.symbols.size(); ++i) sym_repl[c.symbols[i]] = var(positional('s', i));
  auto rename_syms = [&](const Expr& e) { return e.defined() ? simplify(substitute(e, sym_repl)) : e; };
  for (size_t i = 0; i < k.params.size(); ++i) c.names[k.params[i].name] = positional('p', i);
  // A stage named after another buffer ("b4.pad", the padded input of the
  // convolution writing b4) keeps its suffix on that buffer's canonical name:
  // templates find such stages by it.
  for (size_t s = 0; s < k.stages.size(); ++s)
    if (k.stages[s].name.find('.') == std::string::npos) c.names.emplace(k.stages[s].name, positional('t', s));
  for (size_t s = 0; s < k.stages.size(); ++s) {
    const std::string& name = k.stages[s].name;
    size_t dot = name.find('.');
    if (dot == std::string::npos) continue;
    auto base = c.names.find(name.substr(0, dot));
    c.names.emplace(name, base != c.names.end() ? base->second + name.substr(dot) : positional('t', s));
  }
  auto rename_buffers = [&](const Expr& e) {
    if (!e.defined()) return e;
    return rewrite(e, [&](const Expr& n) -> Expr {
      if (n.kind() != ExprKind::kLoad) return Expr();
      auto it = c.names.find(n->name);
      std::string name = it == c.names.end() ? n->name : it->second;
      return load(name, static_cast<int>(n->int_value), n->dtype, n->args);  // args rewritten already
    });
  };
  c.def.num_inputs = k.num_inputs;
  for (const auto& b : k.params) {
    std::vector<Expr> shape;
    for (const Expr& d : b.shape) shape.push_back(rename_syms(d));
    c.def.params.push_back({c.names[b.name], b.dtype, shape});
  }
  for (const auto& st : k.stages) {
    ComputeDef d = st;
    d.name = c.names[st.name];
    std::map<std::string, Expr, std::less<>> repl = sym_repl;
    for (size_t a = 0; a < st.axes.size(); ++a) {
      d.axes[a] = positional('a', a);
      repl[st.axes[a]] = var(d.axes[a]);
    }
    for (size_t a = 0; a < st.reduce_axes.size(); ++a) {
      d.reduce_axes[a] = positional('r', a);
      repl[st.reduce_axes[a]] = var(d.reduce_axes[a]);
    }
    for (Expr& e : d.shape) e = rename_syms(e);
    for (Expr& e : d.reduce_extents) e = rename_syms(e);
    for (Expr* e : {&d.body, &d.init, &d.finalize}) {
      if (e->defined()) *e = rename_buffers(substitute(*e, repl));
    }
    c.def.stages.push_back(std::move(d));
  }
  c.text = print_kernel_def(c.def);  // without the kernel's name
  c.def.name = k.name;
  for (size_t i = 0; i < c.symbols.size() && bounds; ++i) {
    auto b = bounds->find(c.symbols[i]);
    if (b == bounds->end()) continue;
    c.text += "bound " + positional('s', i) + " in [" + (b->second.lo ? std::to_string(*b->second.lo) : "-inf") + ", " +
              (b->second.hi ? std::to_string(*b->second.hi) : "inf") + "]\n";
  }
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : c.text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  c.hash = h;
  return c;
}

uint64_t structural_hash(const KernelDef& k) { return canonicalize(k).hash; }

std::string print_stmt(const Stmt& s, int indent) {
  std::ostringstream os;
  print_stmt_to(os, s, indent);
  return os.str();
}

std::string print_func(const PrimFunc& f) {
  std::ostringstream os;
  os << "func " << f.name << "(";
  for (size_t i = 0; i < f.params.size(); ++i) {
    if (i) os << ", ";
    os << print_buffer(f.params[i]);
  }
  os << ") syms(";
  for (size_t i = 0; i < f.sym_names.size(); ++i) {
    if (i) os << ", ";
    os << f.sym_names[i];
  }
  os << ") {\n";
  print_stmt_to(os, f.body, 1);
  os << "}\n";
  return os.str();
}

std::string print_kernel_def(const KernelDef& k) {
  std::ostringstream os;
  os << "kernel " << k.name << "(";
  for (size_t i = 0; i < k.params.size(); ++i) {
    if (i) os << ", ";
    if (static_cast<int>(i) == k.num_inputs) os << "-> ";
    os << print_buffer(k.params[i]);
  }
  os << ") {\n";
  for (const auto& st : k.stages) {
    os << "  " << st.name << ":" << dtype_name(st.dtype) << "[";
    for (size_t i = 0; i < st.axes.size(); ++i) {
      if (i) os << ", ";
      os << st.axes[i] << " < " << print_expr(st.shape[i]);
    }
    os << "]";
    if (!st.reduce_axes.empty() || st.combiner != Combiner::kNone) {
      os << " " << combiner_name(st.combiner) << "[";
      for (size_t i = 0; i < st.reduce_axes.size(); ++i) {
        if (i) os << ", ";
        os << st.reduce_axes[i] << " < " << print_expr(st.reduce_extents[i]);
      }
      os << "]";
      if (st.init.defined()) os << " init " << print_expr(st.init);
    }
    os << " = " << (st.body.defined() ? print_expr(st.body) : std::string("<undefined>"));
    if (st.finalize.defined()) os << " finalize " << print_expr(st.finalize);
    os << "\n";
  }
  os << "}\n";
  return os.str();
}

std::vector<std::pair<int, int>> in_place_pairs(const KernelDef& k) {
  const int np = static_cast<int>(k.params.size());
  if (np - k.num_inputs != 1 || k.stages.empty()) return {};
  const int out = np - 1;
  const Buffer& ob = k.params[static_cast<size_t>(out)];
  if (k.stages.back().name != ob.name) return {};  // nothing may run after the output is written
  auto same_shape = [](const std::vector<Expr>& a, const std::vector<Expr>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].same_as(b[i])) return false;
    return true;
  };
  // Every load of a stage's body: (param index or -1, stage name, at the stage's point).
  struct Read {
    int param;
    std::string stage;
    bool at_point;
  };
  std::vector<std::vector<Read>> reads(k.stages.size());
  for (size_t si = 0; si < k.stages.size(); ++si) {
    const ComputeDef& s = k.stages[si];
    std::vector<const ExprNode*> stack = {s.body.get(), s.init.get(), s.finalize.get()};
    while (!stack.empty()) {
      const ExprNode* e = stack.back();
      stack.pop_back();
      if (e == nullptr) continue;
      for (const Expr& a : e->args) stack.push_back(a.get());
      if (e->kind != ExprKind::kLoad) continue;
      bool at_point = e->args.size() == s.axes.size();
      for (size_t d = 0; at_point && d < s.axes.size(); ++d)
        at_point = e->args[d].is_var() && e->args[d]->name == s.axes[d];
      reads[si].push_back({static_cast<int>(e->int_value), e->int_value >= 0 ? std::string() : e->name, at_point});
      if (e->int_value == out) return {};  // the output is read back
    }
  }
  std::vector<std::pair<int, int>> pairs;
  for (int in = 0; in < k.num_inputs; ++in) {
    const Buffer& b = k.params[static_cast<size_t>(in)];
    if (b.dtype != ob.dtype || !same_shape(b.shape, ob.shape)) continue;
    // Stages that depend on the input: each must be pointwise over the
    // output's shape and read the input and such stages only at its point.
    std::set<std::string> depends;
    bool ok = true;
    for (size_t si = 0; ok && si < k.stages.size(); ++si) {
      const ComputeDef& s = k.stages[si];
      bool dep = false, displaced = false;
      for (const Read& r : reads[si]) {
        const bool on = r.param == in || (r.param < 0 && depends.count(r.stage));
        dep = dep || on;
        displaced = displaced || (on && !r.at_point);
      }
      if (!dep) continue;
      ok = !displaced && s.reduce_axes.empty() && s.axes.size() == ob.shape.size() && same_shape(s.shape, ob.shape);
      depends.insert(s.name);
    }
    if (ok && depends.count(ob.name)) pairs.push_back({in, out});
  }
  return pairs;
}

}  // namespace kiln::tir
