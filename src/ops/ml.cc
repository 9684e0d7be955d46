// ai.onnx.ml ops as runtime kernels (LabelEncoder is with the string ops in
// strings.cc): Binarizer, ArrayFeatureExtractor and TreeEnsemble.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

OpDef ml_op(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
            std::function<Result<RuntimeKernel>(const Node&)> kernel) {
  OpDef def = kernel_op(name, std::move(infer), std::move(kernel));
  def.domain = "ai.onnx.ml";
  return def;
}

bool numeric(DType t) { return t != DType::kString && t != DType::kBool && dtype_is_compilable(t); }

// ---- Binarizer: y = x > threshold ? 1 : 0, in x's dtype ----------------------------------------------

Status infer_binarizer(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!numeric(t.dtype)) return node_unsupported(n) << "input of dtype " << dtype_name(t.dtype);
  if (t.has_shape()) set_output(n, 0, t.dtype, *t.shape, ctx);
  else set_output_unknown_rank(n, 0, t.dtype);
  return Status::ok();
}

Result<RuntimeKernel> binarizer_kernel(const Node& n) {
  double threshold = n.attr_float("threshold", 0.0);
  return RuntimeKernel([threshold](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (!numeric(x.dtype())) return unsupported() << "Binarizer on " << x.describe();
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), x.shape(), "the Binarizer output"));
    for (int64_t i = 0; i < x.numel(); ++i) out[0].set_f64(i, x.get_f64(i) > threshold ? 1.0 : 0.0);
    return Status::ok();
  });
}

// ---- ArrayFeatureExtractor: Y = X[..., indices] -------------------------------------------------------
// Indices (int64, any shape, flattened) select along X's last axis; a 1-D X
// gives a [1, k] result, as ONNX Runtime and the reference do.

Status infer_feature_extractor(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType it, input_type(n, 1));
  if (it.dtype != DType::kInt64) return node_invalid(n) << "indices must be int64, got " << dtype_name(it.dtype);
  if (!t.has_shape() || !it.has_shape()) {
    set_output_unknown_rank(n, 0, t.dtype);
    return Status::ok();
  }
  if (t.rank() < 1) return node_invalid(n) << "input must have rank >= 1";
  Expr k(1);
  for (const Expr& d : *it.shape) k = k * d;
  Shape out = t.rank() == 1 ? Shape{Expr(1), simplify(k)} : *t.shape;
  out.back() = simplify(k);
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> feature_extractor_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor &x = in[0], &idx = in[1];
    if (x.rank() < 1) return invalid_argument() << "input must have rank >= 1, got " << x.describe();
    const int64_t last = x.shape().back(), rows = last == 0 ? 0 : x.numel() / last, k = idx.numel();
    for (int64_t j = 0; j < k; ++j) {
      int64_t v = idx.get_i64(j);
      if (v < 0 || v >= last)
        return invalid_argument() << "index " << v << " at position " << j << " is outside [0, " << last << ")";
    }
    std::vector<int64_t> shape = x.rank() == 1 ? std::vector<int64_t>{1, k} : x.shape();
    shape.back() = k;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape, "the ArrayFeatureExtractor output"));
    const int64_t size = dtype_size(x.dtype());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j) {
        int64_t src = r * last + idx.get_i64(j), dst = r * k + j;
        if (x.dtype() == DType::kString) out[0].data_as<std::string>()[dst] = x.data_as<std::string>()[src];
        else std::memcpy(static_cast<char*>(out[0].data()) + dst * size, static_cast<const char*>(x.data()) + src * size,
                         static_cast<size_t>(size));
      }
    return Status::ok();
  });
}

// ---- TreeEnsemble (ai.onnx.ml 5) --------------------------------------------------------
// X [N, F] (float or double) -> Y [N, n_targets]. Each tree is walked from its
// root: node i compares X[row, nodes_featureids[i]] with nodes_splits[i] by
// nodes_modes[i] (LEQ, LT, GTE, GT, EQ, NEQ, or MEMBER of its run of
// membership_values up to a NaN; a NaN feature goes the true way where
// nodes_missing_value_tracks_true[i]); the true or false id then names a node
// or, where its *_leafs flag is set, a leaf (leaf_weights, leaf_targetids).
// A root whose two branches are the same leaf is that leaf. Leaves aggregate
// per target: SUM, AVERAGE (over the trees), MIN or MAX, as the ONNX
// reference; post_transform NONE, LOGISTIC, SOFTMAX and SOFTMAX_ZERO.

// A tensor attribute's numbers (a file's tensor attribute may hold any dtype).
Result<std::vector<double>> tensor_attr_values(const Node& n, const std::string& name) {
  std::vector<double> v;
  const Attribute* a = n.attr(name);
  if (a && a->kind == Attribute::Kind::kTensor) {
    if (!a->t.defined() || !dtype_is_compilable(a->t.dtype()))
      return node_invalid(n) << "attribute '" << name << "' holds " << a->t.describe() << ", not numbers";
    for (int64_t i = 0; i < a->t.numel(); ++i) v.push_back(a->t.get_f64(i));
  }
  else if (a && a->kind == Attribute::Kind::kFloats)
    v = a->floats;
  return v;
}

Status infer_tree_ensemble(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType x, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kFloat64)
    return node_unsupported(n) << "X of type " << dtype_name(x.dtype) << " (float and double are supported)";
  if (s.size() != 2) return node_invalid(n) << "X must be [N, features], got rank " << s.size();
  int64_t targets = n.attr_int("n_targets", -1);
  if (targets < 1) return node_invalid(n) << "n_targets must be positive";
  set_output(n, 0, x.dtype, {s[0], Expr(targets)}, ctx);
  return Status::ok();
}

struct TreeModel {
  std::vector<double> splits, weights;
  std::vector<int64_t> features, modes, true_ids, false_ids, true_leaf, false_leaf, targets, roots, missing_true;
  std::vector<std::vector<double>> members;  // per node (MEMBER nodes only)
  int64_t n_targets = 0, aggregate = 1, post = 0;
};

Result<TreeModel> tree_model(const Node& n) {
  TreeModel m;
  KILN_ASSIGN_OR_RETURN(m.splits, tensor_attr_values(n, "nodes_splits"));
  KILN_ASSIGN_OR_RETURN(m.weights, tensor_attr_values(n, "leaf_weights"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> modes, tensor_attr_values(n, "nodes_modes"));
  for (double v : modes) m.modes.push_back(saturate_to_i64(v));
  m.features = n.attr_ints("nodes_featureids");
  m.true_ids = n.attr_ints("nodes_truenodeids");
  m.false_ids = n.attr_ints("nodes_falsenodeids");
  m.true_leaf = n.attr_ints("nodes_trueleafs");
  m.false_leaf = n.attr_ints("nodes_falseleafs");
  m.targets = n.attr_ints("leaf_targetids");
  m.roots = n.attr_ints("tree_roots");
  m.missing_true = n.attr_ints("nodes_missing_value_tracks_true", std::vector<int64_t>{});
  m.n_targets = n.attr_int("n_targets", -1);
  m.aggregate = n.attr_int("aggregate_function", 1);
  m.post = n.attr_int("post_transform", 0);
  size_t nodes = m.splits.size();
  for (const auto* v : {&m.features, &m.modes, &m.true_ids, &m.false_ids, &m.true_leaf, &m.false_leaf})
    if (v->size() != nodes) return node_invalid(n) << "the nodes_* attributes have different lengths";
  if (!m.missing_true.empty() && m.missing_true.size() != nodes)
    return node_invalid(n) << "nodes_missing_value_tracks_true has " << m.missing_true.size() << " entries for " << nodes
                           << " nodes";
  if (m.targets.size() != m.weights.size()) return node_invalid(n) << "leaf_targetids and leaf_weights differ in length";
  if (m.aggregate < 0 || m.aggregate > 3) return node_invalid(n) << "aggregate_function " << m.aggregate;
  if (m.post == 4) return node_unsupported(n) << "post_transform PROBIT";
  if (m.post < 0 || m.post > 4) return node_invalid(n) << "post_transform " << m.post;
  if (m.roots.empty()) return node_invalid(n) << "no tree_roots";
  auto check_id = [&](int64_t id, bool leaf) {
    return id >= 0 && static_cast<size_t>(id) < (leaf ? m.weights.size() : nodes);
  };
  for (int64_t t : m.targets)
    if (t < 0 || t >= m.n_targets) return node_invalid(n) << "leaf target " << t << " outside [0, " << m.n_targets << ")";
  for (int64_t r : m.roots) {
    if (r < 0 || static_cast<size_t>(r) >= nodes) return node_invalid(n) << "tree root " << r << " outside the nodes";
    // A root whose branches are one leaf is that leaf, read at the root's
    // index as the ONNX reference does: it must name a leaf too.
    size_t i = static_cast<size_t>(r);
    if (m.true_leaf[i] && m.false_leaf[i] && m.true_ids[i] == m.false_ids[i] && i >= m.weights.size())
      return node_invalid(n) << "tree root " << r << " is a leaf but there are only " << m.weights.size() << " leaves";
  }
  KILN_ASSIGN_OR_RETURN(std::vector<double> members, tensor_attr_values(n, "membership_values"));
  size_t next = 0;
  m.members.resize(nodes);
  for (size_t i = 0; i < nodes; ++i) {
    if (m.modes[i] < 0 || m.modes[i] > 6) return node_invalid(n) << "node " << i << " has mode " << m.modes[i];
    if (!check_id(m.true_ids[i], m.true_leaf[i] != 0) || !check_id(m.false_ids[i], m.false_leaf[i] != 0))
      return node_invalid(n) << "node " << i << " branches outside the nodes or leaves";
    if (m.features[i] < 0) return node_invalid(n) << "node " << i << " has feature " << m.features[i];
    if (m.modes[i] != 6) continue;
    // MEMBER: the next run of membership_values, up to a NaN.
    while (next < members.size() && !std::isnan(members[next])) m.members[i].push_back(members[next++]);
    if (next >= members.size()) return node_invalid(n) << "membership_values ends before node " << i << "'s set";
    ++next;
  }
  return m;
}

Result<RuntimeKernel> tree_ensemble_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(TreeModel m, tree_model(n));
  std::string where = n.name().empty() ? "TreeEnsemble" : "TreeEnsemble '" + n.name() + "'";
  return RuntimeKernel([m, where](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    int64_t rows = x.shape()[0], feats = x.shape()[1];
    for (int64_t f : m.features)
      if (f >= feats) return invalid_argument() << where << ": a node reads feature " << f << " of " << feats;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), {rows, m.n_targets}, where + " output"));
    if (rows == 0) return Status::ok();  // (the row accumulator is no larger than the output)
    const size_t nodes = m.splits.size();
    const double init = m.aggregate == 2 ? std::numeric_limits<double>::max()
                        : m.aggregate == 3 ? std::numeric_limits<double>::lowest() : 0.0;
    std::vector<double> acc(static_cast<size_t>(m.n_targets));
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(acc.begin(), acc.end(), x.dtype() == DType::kFloat32 && m.aggregate >= 2
                                            ? (m.aggregate == 2 ? std::numeric_limits<float>::max()
                                                                : std::numeric_limits<float>::lowest())
                                            : init);
      for (int64_t root : m.roots) {
        size_t i = static_cast<size_t>(root);
        int64_t leaf = -1;
        if (m.true_leaf[i] && m.false_leaf[i] && m.true_ids[i] == m.false_ids[i]) leaf = root;
        for (size_t steps = 0; leaf < 0; ++steps) {
          if (steps > nodes) return invalid_argument() << where << ": tree at root " << root << " has a cycle";
          double v = x.get_f64(r * feats + m.features[i]);
          double split = m.splits[i];
          bool go = false;
          switch (m.modes[i]) {
            case 0: go = v <= split; break;
            case 1: go = v < split; break;
            case 2: go = v >= split; break;
            case 3: go = v > split; break;
            case 4: go = v == split; break;
            case 5: go = v != split; break;
            default: go = std::find(m.members[i].begin(), m.members[i].end(), v) != m.members[i].end(); break;
          }
          if (std::isnan(v) && !m.missing_true.empty() && m.missing_true[i]) go = true;
          int64_t id = go ? m.true_ids[i] : m.false_ids[i];
          if (go ? m.true_leaf[i] : m.false_leaf[i]) leaf = id;
          else i = static_cast<size_t>(id);
        }
        double w = m.weights[static_cast<size_t>(leaf)];
        double& a = acc[static_cast<size_t>(m.targets[static_cast<size_t>(leaf)])];
        switch (m.aggregate) {
          case 0: a += w / static_cast<double>(m.roots.size()); break;
          case 1: a += w; break;
          case 2: a = std::min(a, w); break;
          default: a = std::max(a, w); break;
        }
      }
      if (m.post == 2) {
        for (double& a : acc) a = 1.0 / (1.0 + std::exp(-a));
      } else if (m.post == 1 || m.post == 3) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double a : acc)
          if (m.post == 1 || a != 0) mx = std::max(mx, a);
        for (double& a : acc) {
          if (m.post == 3 && a == 0) continue;
          a = std::exp(a - mx);
          sum += a;
        }
        for (double& a : acc)
          if (m.post == 1 || a != 0) a /= sum;
      }
      for (int64_t t = 0; t < m.n_targets; ++t) out[0].set_f64(r * m.n_targets + t, acc[static_cast<size_t>(t)]);
    }
    return Status::ok();
  });
}

}  // namespace

void register_ml_ops() {
  register_op(ml_op("TreeEnsemble", infer_tree_ensemble, tree_ensemble_kernel));
  register_op(ml_op("Binarizer", infer_binarizer, binarizer_kernel));
  register_op(ml_op("ArrayFeatureExtractor", infer_feature_extractor, feature_extractor_kernel));
}

}  // namespace kiln::ops
