// GEMM candidates for MatMul and Gemm.
//
// gemm.packed: a constant 2-D B is packed at compile time into panels
// [ceil(N / nr), K, nr], zero-padded past N (attribute kiln_weight_layout
// "P<nr>", plus kiln_b_columns = N when nr does not divide N; ops/matmul.cc
// reads them), so that a tile of nr output columns streams
// one contiguous panel (K x nr floats) instead of K rows nr floats apart (one
// page per row once N is large). Template, for output axes [batch..., m, n]:
//   split n by nr, tile m by mr; loops batch..., n.o, m.o | k | m.i (unrolled),
//   n.i (vectorized); the mr x nr tile is accumulated in registers
//   (cache_write at m.o) and written once, through the fused epilogue
//   (Gemm's alpha, beta and C); the first outer loop with work is parallel.
// A partial last panel is split_padded: computed in full, written back
// guarded. Knobs: nr of one to four target vectors (16, 32, 48, 64 with
// AVX-512; 8 to 32 with AVX2) dividing N (all four when none does), mr in {1,
// 2, 3, 4, 6, 8, 12} with at most Target::accumulators() accumulator vectors
// (24 with AVX-512, 12 with AVX2).
//
// matmul.dynamic / gemm.dynamic: B computed at run time (an activation, a
// training step's parameter or gradient), 2-D f32. The same template over B
// either as stored (knob packb 0: a tile of nr columns reads nr floats of
// each of K rows) or packed into the same panels by a kernel each run
// (packb 1: kiln:PackPanels, transposed for B [K, N]; required for Gemm's
// transB, whose columns are B's rows). Knobs as gemm.packed's, plus packb;
// the panels' prefetch only when packed.
//
// matmul.default / gemm.default: the default schedule (any operands).
#include <algorithm>
#include <cstring>
#include <set>

#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

bool is_gemm(const Node& n) { return n.op_type() == "Gemm"; }

// N of a MatMul/Gemm whose B is a constant 2-D f32 tensor; 0 otherwise.
int64_t constant_b_columns(const Node& n, std::string* why) {
  const Value* b = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (b == nullptr || !b->is_constant()) {
    if (why) *why = "B is not a constant";
    return 0;
  }
  const Tensor& t = b->constant();
  if (t.rank() != 2 || t.dtype() != DType::kFloat32) {
    if (why) *why = "B is not a 2-D f32 constant";
    return 0;
  }
  bool tb = is_gemm(n) && n.attr_int("transB", 0) != 0;
  return tb ? t.shape()[0] : t.shape()[1];
}

// M (rows of the output) when known; nullopt when symbolic; 1 for a 1-D A.
std::optional<int64_t> output_rows(const Node& n) {
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || !y->type().shape) return std::nullopt;
  const Shape& s = *y->type().shape;
  const Value* a = n.input(0);
  if (a && a->type().shape && a->type().shape->size() == 1) return 1;
  if (s.size() < 2) return 1;
  return s[s.size() - 2].as_const();
}

bool gemm_packed_applies(const Node& n, std::string* why) {
  if (n.has_attr("kiln_weight_layout")) {
    if (why) *why = "B already packed";
    return false;
  }
  int64_t cols = constant_b_columns(n, why);
  if (cols == 0) return false;
  const Value* y = n.output(0);
  if (y == nullptr || !y->type().shape || y->dtype() != DType::kFloat32) {
    if (why) *why = "output type unknown or not f32";
    return false;
  }
  return true;
}

// The register-tile template's space for N = `cols` (0: unknown) and M = `rows`.
tir::KnobSpace gemm_space(int64_t cols, std::optional<int64_t> rows, int64_t lanes, int64_t acc) {
  tir::KnobSpace s;
  // Panel widths of one to four vectors that divide N, or all of them when
  // none does (the last panel is then zero-padded and its write-back guarded).
  tir::Knob nr{"nr", {}};
  for (int64_t v : {lanes, 2 * lanes, 3 * lanes, 4 * lanes})
    if (cols > 0 && cols % v == 0) nr.values.push_back(v);
  if (nr.values.empty()) nr.values = {lanes, 2 * lanes, 3 * lanes, 4 * lanes};
  s.knobs.push_back(tir::Knob{"mr", {1, 2, 3, 4, 6, 8, 12}});
  s.knobs.push_back(nr);
  s.knobs.push_back(tir::Knob{"prefetch", {0, 1, 2, 4}});
  s.knobs.push_back(tir::Knob{"kc", {0, 128, 256, 512, 1024, 2048}});
  s.knobs.push_back(tir::Knob{"order", {0, 1}, 0});
  s.knobs.push_back(tir::Knob{"mb", {0, 4, 8, 16, 32, 64}, 0});
  s.knobs.push_back(tir::Knob{"pack", {0, 1}, 0});
  // Three-vector panels only for one row: LLVM legalizes a register tile of
  // several <48 x float> rows through per-element inserts and spills (mr 6
  // nr 48 measured many times slower than nr 32). Row blocks (mb) fix the
  // loop order (blocks, panels, row tiles); packing A needs the rows of its
  // block outside the panels (a block, or order 1) and several panels.
  s.valid = [lanes, acc, rows, cols](const tir::Knobs& k) {
    if (k.at("mr") * k.at("nr") / lanes > acc || (k.at("nr") == 3 * lanes && k.at("mr") != 1)) return false;
    const int64_t mb = k.at("mb");
    if (mb > 0 && (k.at("order") != 0 || (rows && *rows <= mb * k.at("mr")))) return false;
    if (k.at("pack") != 0 && ((mb == 0 && k.at("order") == 0) || cols <= k.at("nr") || (rows && *rows <= k.at("mr")))) return false;
    return true;
  };
  return s;
}

tir::KnobSpace gemm_packed_space(const Node& n, const Target& t) {
  return gemm_space(constant_b_columns(n, nullptr), output_rows(n), t.lanes(), t.accumulators());
}

// The template's default point for N = `cols` and M = `rows`.
tir::Knobs gemm_defaults(int64_t cols, std::optional<int64_t> rows, int64_t lanes, int64_t acc) {
  if (rows && *rows == 1) {
    // Matrix-vector: one row, the widest panel (independent accumulators per vector).
    for (int64_t v : {4 * lanes, 3 * lanes, 2 * lanes, lanes})
      if (cols % v == 0) return {{"mr", 1}, {"nr", v}, {"prefetch", 0}, {"kc", 0}, {"order", 0}, {"mb", 0}, {"pack", 0}};
    return {{"mr", 1}, {"nr", 4 * lanes}, {"prefetch", 0}, {"kc", 0}, {"order", 0}, {"mb", 0}, {"pack", 0}};
  }
  // Two vectors of columns (16 accumulators with mr = 8 on AVX-512; one
  // vector leaves 8, too few to hide the FMA latency) unless padding N to
  // two vectors wastes more than an eighth. Rows: 8, or as many as the
  // register file holds (6 with AVX2's 16 registers: 12 accumulators).
  int64_t two = 2 * lanes;
  int64_t pad = (cols + two - 1) / two * two - cols;
  int64_t nr = cols % two == 0 || pad * 8 <= cols ? two : cols % lanes == 0 ? lanes : two;
  int64_t mr = std::min<int64_t>(8, acc / (nr / lanes));
  // Several row tiles use each panel: the first would otherwise wait on
  // memory for all of it (weights that do not stay in cache between runs).
  return {{"mr", mr}, {"nr", nr}, {"prefetch", 1}, {"kc", 0}, {"order", 0}, {"mb", 0}, {"pack", 0}};
}

tir::Knobs gemm_packed_defaults(const Node& n, const Target& t) {
  return gemm_defaults(constant_b_columns(n, nullptr), output_rows(n), t.lanes(), t.accumulators());
}

// B's columns (N) for a candidate reading B as stored or packed: a constant's,
// else its static type's (0 when symbolic or unknown).
int64_t b_columns(const Node& n) {
  const Value* b = n.input(1);
  if (b->is_constant()) return constant_b_columns(n, nullptr);
  const TensorType& t = b->type();
  if (t.rank() != 2) return 0;
  auto c = (*t.shape)[is_gemm(n) && n.attr_int("transB", 0) != 0 ? 0 : 1].as_const();
  return c ? *c : 0;
}

bool dynamic_trans_b(const Node& n) { return is_gemm(n) && n.attr_int("transB", 0) != 0; }

bool dynamic_b_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (n.has_attr("kiln_weight_layout")) return no("B already packed");
  const Value* b = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (b == nullptr) return no("no B");
  if (b->is_constant()) return no("B is a constant");
  const TensorType& t = b->type();
  if (t.dtype != DType::kFloat32 || t.rank() != 2) return no("B is not a 2-D f32 value");
  if (dynamic_trans_b(n) && !t.is_static()) return no("transB with a symbolic B (its panels need its shape)");
  const Value* a = n.input(0);
  if (a->type().dtype != DType::kFloat32 || !a->type().shape) return no("A is not f32 of known rank");
  const Value* y = n.output(0);
  if (y == nullptr || !y->type().shape || y->dtype() != DType::kFloat32) return no("output type unknown or not f32");
  return true;
}

tir::KnobSpace dynamic_b_space(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  const int64_t cols = b_columns(n);
  tir::KnobSpace s = gemm_space(cols, output_rows(n), lanes, acc);
  s.knobs.push_back(tir::Knob{"packb", {0, 1}, 0});
  const bool trans_b = dynamic_trans_b(n), static_b = n.input(1)->type().is_static();
  auto packed_valid = s.valid;
  s.valid = [packed_valid, trans_b, static_b](const tir::Knobs& k) {
    if (trans_b && k.at("packb") == 0) return false;  // as stored, a tile's columns would be a gather
    if ((k.at("packb") == 0 && k.at("prefetch") != 0) || (k.at("packb") != 0 && !static_b)) return false;
    return packed_valid(k);
  };
  return s;
}

tir::Knobs dynamic_b_defaults(const Node& n, const Target& t) {
  tir::Knobs k = gemm_defaults(b_columns(n), output_rows(n), t.lanes(), t.accumulators());
  const bool trans_b = dynamic_trans_b(n);
  k["packb"] = trans_b ? 1 : 0;
  k["prefetch"] = 0;  // B was just written (packed) or computed: it comes from cache
  // K in blocks where a whole panel (K x nr) would not stay in this core's L2
  // while every row tile reads it: blocks of a quarter of L2.
  const Value* b = n.input(1);
  auto kdim = (*b->type().shape)[trans_b ? 1 : 0].as_const();
  const int64_t panel_bytes = kdim ? *kdim * k["nr"] * 4 : 0;
  if (panel_bytes > t.l2_bytes / 2) {
    int64_t kc = 2048;
    while (kc > 128 && kc * k["nr"] * 4 > t.l2_bytes / 4) kc /= 2;
    k["kc"] = kc;
  }
  return k;
}

Status dynamic_b_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  if (!knob_on(knobs, "packb")) return Status::ok();
  const int64_t nr = knobs.at("nr");
  Value* b = n.input(1);
  const bool trans_b = dynamic_trans_b(n);
  if (!b->type().is_static() || b->type().rank() != 2)
    return invalid_argument() << n.describe() << ": matmul.dynamic packs B each run only with B's static 2-D shape";
  const std::vector<int64_t> bs = b->type().static_shape();
  const int64_t k = trans_b ? bs[1] : bs[0], cols = trans_b ? bs[0] : bs[1];
  if (cols % nr != 0) set_int_attr(n, "kiln_b_columns", cols);
  Value* packed = runtime_weight_node(g, n, b, "PackPanels", nullptr, {{"nr", nr}, {"transpose", trans_b ? 0 : 1}},
                                      "p" + std::to_string(nr), {(cols + nr - 1) / nr, k, nr});
  g.set_input(&n, 1, packed);
  set_string_attr(n, "kiln_weight_layout", "P" + std::to_string(nr));
  return Status::ok();
}

// B [K, N] (or [N, K] with transB) -> panels [ceil(N / nr), K, nr], the
// columns past N zero.
Tensor pack_panels(const Tensor& b, bool trans_b, int64_t nr) {
  int64_t k = trans_b ? b.shape()[1] : b.shape()[0];
  int64_t n = trans_b ? b.shape()[0] : b.shape()[1];
  int64_t panels = (n + nr - 1) / nr;
  Tensor out(DType::kFloat32, {panels, k, nr});
  const float* src = b.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t j = 0; j < panels; ++j)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t i = 0; i < nr; ++i) {
        int64_t col = j * nr + i;
        dst[(j * k + kk) * nr + i] = col >= n ? 0.f : trans_b ? src[col * k + kk] : src[kk * n + col];
      }
  return out;
}

Status gemm_packed_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  int64_t nr = knobs.at("nr");
  Value* b = n.input(1);
  bool tb = is_gemm(n) && n.attr_int("transB", 0) != 0;
  int64_t cols = constant_b_columns(n, nullptr);
  if (cols % nr != 0) set_int_attr(n, "kiln_b_columns", cols);  // the panels hold N rounded up to nr
  Value* packed = g.add_constant(g.unique_name(b->name() + ".p" + std::to_string(nr)), pack_panels(b->constant(), tb, nr));
  g.set_input(&n, 1, packed);
  set_string_attr(n, "kiln_weight_layout", "P" + std::to_string(nr));
  return Status::ok();
}

// The input the stage reads as its left operand: the one param whose index
// uses the row axis `m` and not the column axis `n`; empty when there is not
// exactly one (A computed in the kernel by a fused producer).
std::string lhs_param(const tir::KernelDef& k, const tir::ComputeDef& st, const std::string& m, const std::string& n) {
  std::set<std::string> found;
  rewrite(st.body, [&](const Expr& e) -> Expr {
    if (e.kind() != ExprKind::kLoad) return Expr();
    bool uses_m = false, uses_n = false;
    for (const Expr& a : e->args)
      for (const std::string& v : free_vars(a)) {
        uses_m = uses_m || v == m;
        uses_n = uses_n || v == n;
      }
    if (uses_m && !uses_n) found.insert(e->name);
    return Expr();
  });
  if (found.size() != 1) return {};
  for (int i = 0; i < k.num_inputs; ++i)
    if (k.params[static_cast<size_t>(i)].name == *found.begin()) return *found.begin();
  return {};
}

Result<tir::Schedule> gemm_packed_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto it = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& s) { return s.name == stage; });
  if (it == k.stages.end()) return invalid_argument() << "gemm.packed: kernel has no stage '" << stage << "'";
  const tir::ComputeDef& st = *it;
  KILN_ASSIGN_OR_RETURN(int64_t nr, knob(knobs, "nr", "gemm.packed"));
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", "gemm.packed"));
  size_t rank = st.axes.size();
  if (rank == 0) return tir::default_schedule(k);
  std::vector<tir::Primitive> prims;
  auto n_ext = st.shape[rank - 1].as_const();
  std::string n_outer, n_inner = st.axes[rank - 1];
  if (!n_ext || *n_ext > nr || *n_ext % nr != 0) {
    // Panels are zero-padded to a multiple of nr: a partial last panel is
    // computed in full and only its valid columns are written.
    prims.push_back(prim(n_ext && *n_ext % nr != 0 ? "split_padded" : "split", stage, {n_inner}, nr));
    n_outer = n_inner + ".o";
    n_inner += ".i";
  }
  std::string m_outer, m_inner;
  std::optional<int64_t> m_ext = rank >= 2 ? st.shape[rank - 2].as_const() : std::optional<int64_t>(1);
  // K blocking (knob kc): the reduction in blocks of kc, the block loop just
  // outside the row tiles, so that each row tile reuses the same kc x nr
  // block of the panel from cache (partial sums kept in the output between
  // blocks). Only with several row tiles (one tile reads its panel once
  // either way); their last one is then guarded, not overlapping (tiles
  // sharing rows would add a block twice to them).
  int64_t kc = knobs.count("kc") ? knobs.at("kc") : 0;
  auto k_ext = st.reduce_extents.size() == 1 ? st.reduce_extents[0].as_const() : std::nullopt;
  const bool block_k = kc > 0 && k_ext && *k_ext > kc && (!m_ext || *m_ext > mr);
  // Row blocks (knob mb, in row tiles): blocks of mb x mr rows outermost,
  // then the panels, then the block's row tiles, so that a block of A (with
  // kc, mb x mr rows by kc) stays in cache while every panel streams past it.
  const int64_t mb = knobs.count("mb") ? knobs.at("mb") : 0;
  const bool block_m = rank >= 2 && mb > 0 && (!m_ext || *m_ext > mb * mr);
  std::string m_block;
  if (rank >= 2) {
    m_inner = st.axes[rank - 2];
    if (block_m) {
      prims.push_back(prim("split", stage, {m_inner}, mb * mr));
      m_block = m_inner + ".o";
      prims.push_back(prim("split", stage, {m_inner + ".i"}, mr));
      m_outer = m_inner + ".i.o";
      m_inner += ".i.i";
    } else {
      if (!m_ext) {
        prims.push_back(prim("split", stage, {m_inner}, mr));
      } else if (*m_ext > mr) {
        prims.push_back(prim(*m_ext % mr == 0 || block_k ? "split" : "split_overlap", stage, {m_inner}, mr));
      }
      if (!m_ext || *m_ext > mr) {
        m_outer = m_inner + ".o";
        m_inner += ".i";
      }
    }
  }
  std::vector<std::string> outer;
  std::vector<std::optional<int64_t>> counts;
  for (size_t i = 0; i + 2 < rank; ++i) {
    outer.push_back(st.axes[i]);
    counts.push_back(st.shape[i].as_const());
  }
  // Knob order: 0 walks the panels outermost (each panel, or its kc block,
  // stays in cache while every row tile uses it); 1 the row tiles outermost
  // (each row tile of A, or its kc block, stays in cache while every panel
  // streams past it).
  const bool rows_outer = knobs.count("order") && knobs.at("order") == 1;
  auto push_n = [&] {
    if (n_outer.empty()) return;
    outer.push_back(n_outer);
    counts.push_back(n_ext ? std::optional<int64_t>((*n_ext + nr - 1) / nr) : std::nullopt);
  };
  auto push_m = [&] {
    if (m_outer.empty()) return;
    outer.push_back(m_outer);
    counts.push_back(block_m ? std::optional<int64_t>(mb)
                     : m_ext ? std::optional<int64_t>((*m_ext + mr - 1) / mr)
                             : std::nullopt);
  };
  if (block_m) {
    outer.push_back(m_block);
    counts.push_back(m_ext ? std::optional<int64_t>((*m_ext + mb * mr - 1) / (mb * mr)) : std::nullopt);
    push_n();
    push_m();
  } else if (rows_outer) {
    push_m();
    push_n();
  } else {
    push_n();
    push_m();
  }
  if (outer.empty()) return tir::default_schedule(k);  // one tile: nothing to block; the default schedule handles it
  std::vector<std::string> order = outer;
  if (!m_inner.empty()) order.push_back(m_inner);
  order.push_back(n_inner);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  if (!m_inner.empty() && (!m_ext || *m_ext > 1)) prims.push_back(prim("unroll", stage, {m_inner}));
  prims.push_back(prim("vectorize", stage, {n_inner}));
  if (int par = tir::choose_parallel(counts); par >= 0)
    prims.push_back(prim("parallel", stage, {outer[static_cast<size_t>(par)]}));
  // The loop whose one iteration fixes a block of A's rows while the panels
  // stream past: the row block, else (rows outermost) the row tile.
  std::string a_rows = block_m ? m_block : rows_outer && !n_outer.empty() ? m_outer : std::string();
  if (block_k) {
    // The block loop just outside the innermost tile loop, or, with rows
    // outside the panels, just inside the rows' loop (a kc block of A stays
    // in cache while the panels' blocks stream past).
    std::vector<std::string> args = {st.reduce_axes[0] + ".o"};
    if (!a_rows.empty()) args.push_back(a_rows);
    else if (outer.size() >= 2) args.push_back(outer[outer.size() - 2]);
    prims.push_back(prim("split", stage, {st.reduce_axes[0]}, kc));
    prims.push_back(prim("hoist_reduce", stage, args));
  }
  // Knob pack: A's block (its rows by K, or by kc) copied at the start of
  // each block into [row tiles][k][rows of a tile], read as one stream.
  if (knob_on(knobs, "pack") && !a_rows.empty() && !n_outer.empty()) {
    if (std::string a = lhs_param(k, st, st.axes[rank - 2], st.axes[rank - 1]); !a.empty()) {
      prims.push_back(prim("pack", stage, {a, block_k ? st.reduce_axes[0] + ".o" : a_rows}));
    }
  }
  // The next panel's prefetch serves a panel read once, start to end; with
  // K blocked the next block of the same panel comes first. Knob prefetch:
  // how many panels ahead (0: none).
  const int64_t ahead = knobs.count("prefetch") ? knobs.at("prefetch") : 0;
  if (ahead > 0 && !n_outer.empty() && !block_k)
    prims.push_back(prim("prefetch", stage, {n_outer}, ahead > 1 ? ahead : 0));
  return replace_stage_schedule(k, stage, prims);
}

void register_default(const std::string& name, const std::string& op) {
  Candidate c;
  c.name = name;
  c.op = op;
  c.priority = 10;
  c.summary = "default schedule: register-tiled reduction over the operands as stored";
  register_candidate(std::move(c));
}

}  // namespace

void register_gemm_candidates() {
  // Both templates for MatMul and Gemm: `name` gets the op's prefix.
  auto both = [](const std::string& name, int priority, const std::string& summary, Candidate c) {
    for (const char* op : {"MatMul", "Gemm"}) {
      c.name = std::string(op == std::string("MatMul") ? "matmul" : "gemm") + "." + name;
      c.op = op;
      c.priority = priority;
      c.summary = summary;
      c.schedule = gemm_packed_schedule;
      register_candidate(c);
    }
  };
  Candidate packed;
  packed.applies = gemm_packed_applies;
  packed.space = gemm_packed_space;
  packed.default_knobs = gemm_packed_defaults;
  packed.transform = gemm_packed_transform;
  both("packed", 20, "constant B packed into [N/nr, K, nr] panels; mr x nr register tile, panel outermost", packed);
  Candidate dynamic;
  dynamic.applies = dynamic_b_applies;
  dynamic.space = dynamic_b_space;
  dynamic.default_knobs = dynamic_b_defaults;
  dynamic.transform = dynamic_b_transform;
  both("dynamic", 15, "B computed at run time, as stored or packed into panels each run; the packed template's tile",
       dynamic);
  register_default("matmul.default", "MatMul");
  register_default("gemm.default", "Gemm");
}

}  // namespace kiln::strategy
