// Conv on oneDNN (see conv.h).
//
// Threads: Debian's libdnnl runs its parallel loops on OpenMP (libgomp). A
// call sets the calling thread's OpenMP thread count to the model's (the
// size of the pool the VM installed, support/thread_pool.h) before it
// executes, so a model compiled for 2 threads runs the primitive on 2, and
// every call of the same compiled model partitions the work the same way
// (oneDNN's inference convolutions do not split a sum across threads, and
// the partition depends only on the thread count): a run gives what a serial
// run gives, bit for bit. Concurrent calls each take their own slot of
// memory objects, stream and scratchpad (scratchpad_mode::user), created on
// first need and reused, so a warm serial run creates none.
//
// libgomp's workers spin for milliseconds after a parallel region
// (OMP_WAIT_POLICY is read once, when the library loads), on the cores the
// model's own pool runs the next kernels on: resnet50 at 2 threads with
// --select measure, which put some of its convolutions on oneDNN (each faster
// alone), ran slower as a whole. Releasing them after each call
// (omp_pause_resource_all) cost thread creation on every call and still
// lost. So the candidate applies to models compiled for one thread
// (Candidate::max_threads); a Conv marked by hand still runs at any thread
// count.
#include "onednn/conv.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ops/common.h"
#include "support/thread_pool.h"

// libgomp, oneDNN's threading runtime.
extern "C" void omp_set_num_threads(int);
extern "C" int omp_get_max_threads();

namespace kiln::onednn {

namespace {

using ops::node_invalid;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// What one call in flight uses: the user's (NCHW) memories, whose data
// handles are set per call, the primitive's blocked copies when it chose
// another layout, a stream and the scratchpad.
struct Slot {
  dnnl::memory src, dst, src_blocked, dst_blocked, scratchpad;
  dnnl::stream stream;
  // The arguments of the reorders and the convolution, built once (the
  // memories are handles: a data handle set on src or dst is seen here).
  std::unordered_map<int, dnnl::memory> src_in_args, conv_args, dst_out_args;
};

// The primitive for one thread count: oneDNN partitions the work when the
// primitive is created, for the OpenMP thread count of the creating thread.
struct Variant {
  int threads = 1;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  dnnl::memory weights;
  std::optional<dnnl::reorder> src_in, dst_out;  // blocked only
  std::vector<std::unique_ptr<Slot>> free;       // guarded by State::mu
};

struct State {
  // The operator, fixed at compile time.
  std::optional<dnnl::convolution_forward::desc> desc;
  dnnl::memory::desc user_src, user_dst, user_w;
  Tensor weight;  // the constant as ONNX stores it (shared storage)
  dnnl::memory bias;
  bool blocked = false;
  std::vector<int64_t> x_dims, y_dims;
  std::string node;

  std::mutex mu;
  std::vector<std::unique_ptr<Variant>> variants;

  // The variant for `threads`, created on first need (primitive, weight
  // reorder); the caller has set its thread's OpenMP count to `threads`.
  Variant* variant(int threads) {
    for (auto& v : variants)
      if (v->threads == threads) return v.get();
    auto v = std::make_unique<Variant>();
    v->threads = threads;
    dnnl::engine& e = cpu_engine();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    v->pd = dnnl::convolution_forward::primitive_desc(*desc, attr, e);
    v->prim = dnnl::convolution_forward(v->pd);
    dnnl::memory wsrc(user_w, e, weight.data());
    v->weights = dnnl::memory(v->pd.weights_desc(), e);
    dnnl::stream s(e);
    dnnl::reorder(wsrc, v->weights).execute(s, wsrc, v->weights);
    s.wait();
    if (blocked && v->pd.src_desc() != user_src)
      v->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(e, user_src, e, v->pd.src_desc()));
    if (blocked && v->pd.dst_desc() != user_dst)
      v->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(e, v->pd.dst_desc(), e, user_dst));
    variants.push_back(std::move(v));
    return variants.back().get();
  }

  // A slot of `v` for one call (locks mu; returns with it released).
  std::unique_ptr<Slot> take(Variant*& v, int threads) {
    std::lock_guard<std::mutex> lock(mu);
    v = variant(threads);
    if (!v->free.empty()) {
      std::unique_ptr<Slot> s = std::move(v->free.back());
      v->free.pop_back();
      return s;
    }
    auto s = std::make_unique<Slot>();
    dnnl::engine& e = cpu_engine();
    s->src = dnnl::memory(user_src, e, DNNL_MEMORY_NONE);
    s->dst = dnnl::memory(user_dst, e, DNNL_MEMORY_NONE);
    if (v->src_in) s->src_blocked = dnnl::memory(v->pd.src_desc(), e);
    if (v->dst_out) s->dst_blocked = dnnl::memory(v->pd.dst_desc(), e);
    s->scratchpad = dnnl::memory(v->pd.scratchpad_desc(), e);
    s->stream = dnnl::stream(e);
    dnnl::memory& src = v->src_in ? s->src_blocked : s->src;
    dnnl::memory& dst = v->dst_out ? s->dst_blocked : s->dst;
    s->src_in_args = {{DNNL_ARG_FROM, s->src}, {DNNL_ARG_TO, src}};
    s->dst_out_args = {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, s->dst}};
    s->conv_args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, v->weights}, {DNNL_ARG_DST, dst},
                    {DNNL_ARG_SCRATCHPAD, s->scratchpad}};
    if (bias) s->conv_args.emplace(DNNL_ARG_BIAS, bias);
    return s;
  }
  void give(Variant* v, std::unique_ptr<Slot> s) {
    std::lock_guard<std::mutex> lock(mu);
    v->free.push_back(std::move(s));
  }
};

dnnl::memory::dims dims_of(const std::vector<int64_t>& v) { return dnnl::memory::dims(v.begin(), v.end()); }

// The static dims of a value's shape (nullopt when any is symbolic).
std::optional<std::vector<int64_t>> static_dims(const Value* v) {
  if (v == nullptr || !v->type().shape) return std::nullopt;
  std::vector<int64_t> out;
  for (const Expr& d : *v->type().shape) {
    auto c = d.as_const();
    if (!c || *c < 1) return std::nullopt;
    out.push_back(*c);
  }
  return out;
}

Result<std::shared_ptr<State>> make_state(const Node& n) {
  if (n.has_attr("kiln_weight_layout"))
    return node_invalid(n) << "kiln_onednn needs the weight as ONNX stores it, not kiln_weight_layout "
                           << n.attr_string("kiln_weight_layout", "");
  if (n.num_inputs() < 2 || n.input(0) == nullptr || n.input(1) == nullptr || !n.input(1)->is_constant())
    return node_invalid(n) << "kiln_onednn needs a constant weight";
  const Tensor& w = n.input(1)->constant();
  const Value* b = n.num_inputs() > 2 ? n.input(2) : nullptr;
  if (b != nullptr && !b->is_constant()) return node_invalid(n) << "kiln_onednn needs a constant bias";
  auto x = static_dims(n.input(0));
  auto y = n.num_outputs() > 0 ? static_dims(n.output(0)) : std::nullopt;
  if (!x || !y || x->size() != 4 || y->size() != 4 || w.rank() != 4 || w.dtype() != DType::kFloat32 ||
      n.input(0)->type().dtype != DType::kFloat32)
    return node_invalid(n) << "kiln_onednn needs a 2-D f32 convolution with static shapes";
  const int64_t groups = n.attr_int("group", 1);
  const std::vector<int64_t>& ws = w.shape();
  if (groups < 1 || ws[0] % groups != 0 || (*x)[1] != groups * ws[1] || (*y)[1] != ws[0])
    return node_invalid(n) << "kiln_onednn: weight " << shape_to_string(ws) << " does not fit input "
                           << shape_to_string(*x) << " in " << groups << " groups";
  Shape xs;
  for (int64_t d : *x) xs.push_back(Expr(d));
  KILN_ASSIGN_OR_RETURN(ops::ConvGeometry g, ops::conv_geometry(n, xs, {Expr(ws[2]), Expr(ws[3])}, {}));
  dnnl::memory::dims strides, dilates, pad_l, pad_r;
  for (size_t d = 0; d < 2; ++d) {
    auto pb = g.pad_begin[d].as_const();
    auto out = g.out[d].as_const();
    if (!pb || !out || *out != (*y)[2 + d]) return node_invalid(n) << "kiln_onednn: padding is not static";
    // The padding after: what the last window needs past the input (never
    // negative: the rows it leaves out are not read either way).
    int64_t span = (*out - 1) * g.stride[d] + (ws[2 + d] - 1) * g.dilation[d] + 1;
    strides.push_back(g.stride[d]);
    dilates.push_back(g.dilation[d] - 1);
    pad_l.push_back(*pb);
    pad_r.push_back(std::max<int64_t>(0, span - (*x)[2 + d] - *pb));
  }
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  auto st = std::make_shared<State>();
  st->blocked = n.attr_int("kiln_onednn_blocked", 0) != 0;
  st->x_dims = *x;
  st->y_dims = *y;
  st->node = n.describe();
  st->weight = w;
  st->user_src = dnnl::memory::desc(dims_of(*x), dt::f32, tag::nchw);
  st->user_dst = dnnl::memory::desc(dims_of(*y), dt::f32, tag::nchw);
  dnnl::memory::dims wdims = groups == 1 ? dims_of(ws)
                                         : dnnl::memory::dims{groups, ws[0] / groups, ws[1], ws[2], ws[3]};
  st->user_w = dnnl::memory::desc(wdims, dt::f32, groups == 1 ? tag::oihw : tag::goihw);
  dnnl::memory::desc any_w(wdims, dt::f32, tag::any);
  dnnl::memory::desc src_md = st->blocked ? dnnl::memory::desc(dims_of(*x), dt::f32, tag::any) : st->user_src;
  dnnl::memory::desc dst_md = st->blocked ? dnnl::memory::desc(dims_of(*y), dt::f32, tag::any) : st->user_dst;
  dnnl::memory::desc bias_md = b ? dnnl::memory::desc({ws[0]}, dt::f32, tag::x) : dnnl::memory::desc();
  try {
    dnnl::engine& e = cpu_engine();
    st->desc.emplace(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                               src_md, any_w, bias_md, dst_md, strides, dilates, pad_l, pad_r);
    // Whether oneDNN implements it at all (the primitive itself is made per
    // thread count, on first use).
    dnnl::convolution_forward::primitive_desc probe(*st->desc, e);
    if (b) {
      const Tensor& bt = b->constant();
      if (bt.dtype() != DType::kFloat32 || bt.numel() != ws[0])
        return node_invalid(n) << "kiln_onednn: bias " << bt.describe() << " for " << ws[0] << " channels";
      st->bias = dnnl::memory(bias_md, e);
      std::copy(bt.data_as<float>(), bt.data_as<float>() + ws[0], static_cast<float*>(st->bias.get_data_handle()));
    }
  } catch (const dnnl::error& err) {
    return unsupported() << "oneDNN has no convolution for it (" << err.what() << ")";
  }
  return st;
}

}  // namespace

bool runs_conv(const Node& n) { return n.attr_int("kiln_onednn", 0) != 0; }

Result<ops::RuntimeKernel> conv_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<State> st, make_state(n));
  return ops::RuntimeKernel([st](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.empty() || in[0].shape() != st->x_dims || in[0].dtype() != DType::kFloat32)
      return invalid_argument() << st->node << ": input " << (in.empty() ? std::string("missing") : in[0].describe())
                                << ", compiled for f32" << shape_to_string(st->x_dims);
    if (out.empty()) return internal_error() << st->node << ": no output slot";
    if (!out[0].defined() || out[0].shape() != st->y_dims) {
      KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kFloat32, st->y_dims, st->node + " output"));
    }
    ThreadPool* pool = current_thread_pool();
    const int threads = pool ? pool->num_threads() : 1;
    Variant* v = nullptr;
    std::unique_ptr<Slot> slot;
    // The calling thread's OpenMP count for this call only: an application
    // that uses OpenMP on the same thread keeps its own.
    struct OmpThreads {
      int saved = omp_get_max_threads();
      explicit OmpThreads(int n) { omp_set_num_threads(n); }
      ~OmpThreads() { omp_set_num_threads(saved); }
    } omp_threads(threads);
    try {
      slot = st->take(v, threads);
    } catch (const dnnl::error& err) {
      return internal_error() << st->node << ": oneDNN could not create its primitive: " << err.what();
    }
    try {
      slot->src.set_data_handle(const_cast<void*>(in[0].data()));
      slot->dst.set_data_handle(out[0].data());
      if (v->src_in) v->src_in->execute(slot->stream, slot->src_in_args);
      v->prim.execute(slot->stream, slot->conv_args);
      if (v->dst_out) v->dst_out->execute(slot->stream, slot->dst_out_args);
      slot->stream.wait();
    } catch (const dnnl::error& err) {
      st->give(v, std::move(slot));
      return internal_error() << st->node << ": oneDNN failed: " << err.what();
    }
    st->give(v, std::move(slot));
    return Status::ok();
  });
}

}  // namespace kiln::onednn
