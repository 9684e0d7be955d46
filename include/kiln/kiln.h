// Kiln's public C++ API: compile an ONNX model, run it on tensors.
//
//   auto model = kiln::Model::compile_file("resnet18.onnx", {.threads = 2});
//   if (!model) { std::cerr << model.status().to_string(); ... }
//   auto out = model->run({{"input", tensor}});
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

// A training step compiled as one graph (src/train/step.h): forward,
// backward, gradient clipping and the optimizer's update.
struct TrainOptions {
  // The model's own training algorithm (ONNX's training_info: its loss,
  // Gradient and optimizer ops; docs/training.md) instead of the loss and
  // optimizer below; data_parallel and memory_budget still apply.
  bool model_algorithm = false;
  std::string loss;                 // the output to minimize (a float value of one element)
  std::vector<std::string> params;  // initializers to train; empty: every float constant of 2+ elements
  std::string optimizer = "sgd";    // "sgd", "adam" or "adamw"
  double momentum = 0;              // sgd
  bool nesterov = false;            // sgd with momentum
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double weight_decay = 0;          // sgd, adam: L2 added to the gradient; adamw: decoupled
  double clip_norm = 0;             // > 0: gradients scaled so their global norm is at most this
  // A loss Kiln appends, instead of `loss` naming the model's own: "mse",
  // "l1", "bce" (binary cross-entropy of logits) or "cross_entropy" (softmax
  // cross-entropy of logits [N, C, d...] against class indices [N, d...]),
  // each the mean over its elements, of the model output `prediction` (empty:
  // the first) against a new i64 (cross_entropy) or prediction-typed input
  // named `target`. The step's loss output is then named "kiln.loss".
  std::string loss_kind;
  std::string prediction;
  std::string target = "target";
  // Data-parallel: each process of a job (support/collective.h; kiln train
  // under mpirun) runs the step on its share of the batch; the gradients and
  // the reported loss are averaged over the processes (kiln:AllReduceMean)
  // before clipping and the update, so every process updates alike.
  bool data_parallel = false;
  // Automatic checkpointing (docs/training.md): > 0, the step's activation
  // memory (every intermediate: what the forward keeps for the backward,
  // gradients, temporaries; not its inputs or outputs) is kept under this
  // many bytes by computing some forward values again in the backward, at
  // the least estimated added compute. Needs static shapes. A budget the
  // step cannot meet is an error saying the least it can.
  int64_t memory_budget = 0;
  // "dp" (dynamic programming, the default) or "sqrt" (Chen et al.'s
  // equal segments, the baseline).
  std::string checkpoint_policy = "dp";
};

struct CompileOptions {
  int threads = 0;             // 0: all hardware threads
  bool naive = false;          // naive (reference) schedules: no inlining, serial loops
  bool dump_ir = false;        // print graph, loop IR and LLVM IR to stderr
  // Graph passes, by their `kiln opt --passes` names, in order. Unset: the
  // default pipeline (src/passes/default_pipeline.cc). Shape inference is
  // added where the list needs it.
  std::optional<std::vector<std::string>> passes;
  // Passes taken out of that list (e.g. to compare a graph with and without
  // one: `kiln opt --check-equiv=PASS`). "fuse-elementwise" turns off the
  // fusion of elementwise chains into one kernel.
  std::vector<std::string> disable_passes;
  // Bytes one run may allocate: each tensor, and the intermediates alive at
  // once. 0: 80% of the machine's physical memory. Exceeding it is an error
  // naming the node and the shape (StatusCode::kResourceExhausted).
  int64_t max_memory_bytes = 0;
  // Operator strategy (src/strategy): how each MatMul/Gemm/Conv gets its
  // implementation. "priority" (default): the applicable candidate with the
  // highest priority. "measure": every applicable candidate, with its default
  // knobs, is compiled and timed on the node's real shapes at compile time and
  // the fastest kept (nodes with symbolic shapes fall back to priority).
  std::string select = "priority";
  // Implementations preferred wherever they apply, before measurement and
  // priority: "conv.panels" or with knobs "matmul.packed:mr=6 nr=64"
  // (`kiln info --kernels` lists the names). An unknown name is an error.
  std::vector<std::string> prefer_impls;
  // The tuning database kernel choice asks first (src/db): a path or a
  // postgresql:// URL. Empty: $KILN_DB, else ~/.cache/kiln/tuning.db where it
  // exists. A hit uses the best record of the node's workload on this target
  // (an exact target, else a compatible one); a miss decides as if there
  // were none. KILN_DB=off, or no_db, asks none.
  std::string db;
  bool no_db = false;
  // Kernels the database has no record of (for this target and thread
  // count) are queued there as tuning jobs for `kiln tune-worker`: those of
  // a model read from a file, with static shapes. The compile itself still
  // takes the cost model's pick or the priority choice.
  bool tune_missing = false;
  // Gradients (reverse mode, src/train): the gradient of the output named
  // `gradient_of` (a float value of one element) with respect to the values
  // named in `gradient_wrt` (graph inputs or initializers; empty: every float
  // constant, Constant nodes' included, zeros for those the output does not
  // depend on), appended to the graph before the
  // graph passes and returned as outputs "<name>_grad" after the model's own.
  // An op without a gradient rule on the way is an error naming all of them.
  std::string gradient_of;
  std::vector<std::string> gradient_wrt;
  // Set: the model becomes one training step (TrainOptions; its inputs and
  // outputs in src/train/step.h). Excludes gradient_of.
  std::optional<TrainOptions> train;
  // Called as each stage of the compilation starts ("import", "graph passes",
  // "code generation", ...; src/driver/compile.cc), on the compiling thread:
  // the command line's progress display on a terminal.
  std::function<void(const std::string& stage)> on_stage;
};

// Description of one graph input or output. Dims print symbolically ("n", "s + 1").
struct TensorInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<std::string> dims;
};

struct CompileStats {
  double compile_seconds = 0;
  int num_kernels = 0;          // compiled kernels (after fusion)
  int num_runtime_kernels = 0;  // calls to C++ runtime kernels
  int64_t arena_bytes = 0;      // static memory plan size (0 with symbolic shapes)
  int num_nodes_imported = 0;   // graph nodes as imported (top-level graph)
  int num_nodes = 0;            // graph nodes after the graph passes
  // What one run allocates beyond its inputs and constants, known at compile
  // time where shapes are static and there is no control flow
  // (memory_known): every intermediate at the peak (the arena and what host
  // kernels allocate), the outputs, the kernels' own scratch buffers (kept
  // per thread across runs: each size once, on every thread where a parallel
  // loop allocates it), and all of it at its peak.
  bool memory_known = false;
  int64_t activation_bytes = 0;
  int64_t output_bytes = 0;
  int64_t scratch_bytes = 0;
  int64_t peak_bytes = 0;
  // A training step under TrainOptions::memory_budget: its activation bytes
  // without checkpointing, the forward segments computed again, the values
  // computed again alone (each by the call that made it), the kernel calls
  // that adds, and their estimated compute over the forward's.
  // Where the most arena bytes are live at once (the instruction's node) and
  // the largest values live there (at most five, largest first).
  std::string peak_at;
  std::vector<std::pair<std::string, int64_t>> peak_values;
  int64_t unbudgeted_activation_bytes = 0;
  int recomputed_segments = 0;
  int recomputed_values = 0;
  int recomputed_calls = 0;
  double recompute_share = 0;
  // Each compile stage (import, support check, graph passes, ...) in the
  // order it ran, with its seconds (src/driver/compile.cc).
  std::vector<std::pair<std::string, double>> stages;
};

class Model {
 public:
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  static Result<Model> compile_file(const std::string& path, const CompileOptions& options = {});
  static Result<Model> compile_bytes(const std::string& bytes, const CompileOptions& options = {},
                                     const std::string& source_name = "<bytes>");

  // A package written by save() or `kiln compile MODEL -o model.kiln`: no
  // compiler runs; its constants stay in the mapped file. Only
  // options.threads and options.max_memory_bytes apply. A truncated,
  // corrupt or foreign file, one of another package format, or one whose
  // kernels use CPU features this host lacks is an error saying so.
  static Result<Model> load(const std::string& path, const CompileOptions& options = {});
  // Writes the compiled model as a package (src/package/package.h): its
  // kernels compiled again into a shared library (linked by $KILN_CC, else
  // `cc`), the programs, the constants, the signatures and the kernel
  // choices. The file appears complete or not at all.
  Status save(const std::string& path) const;
  bool is_package() const;
  // True when the file starts with a package's magic (a package, not ONNX).
  static bool is_package_file(const std::string& path);
  // A loaded package's description as JSON (empty for a compiled model).
  std::string package_metadata() const;
  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  const CompileStats& stats() const;

  // Runs the model. Errors name the input for a missing input, wrong dtype or
  // a shape that does not match the model's (static or symbolic) shape.
  //
  // Thread safety: any number of models may run at once from any number of
  // threads, and each result equals a serial run's bit for bit. Calls to one
  // model from several threads are serialized (one VM and arena per model):
  // to run one model in parallel, compile it once per thread.
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, Tensor>& inputs);

  // Runs the model into the caller's buffers: `outputs` maps output names to
  // tensors whose memory the caller owns (Tensor::borrow). The kernels write
  // into a buffer of the output's dtype that is 64-byte aligned; any other is
  // filled with a copy. Outputs not in the map are allocated by Kiln and
  // added to it. A buffer whose dtype or shape is not the output's, an
  // unknown output name, or a buffer that overlaps an input is an error.
  Status run_into(const std::map<std::string, Tensor>& inputs, std::map<std::string, Tensor>& outputs);

  // Text of the optimized graph (graph IR printer); empty for a package.
  std::string graph_text() const;

  // (Empty for a package.) The optimized graph as one self-contained HTML page (`kiln info --graph
  // -o graph.html`): nodes laid out in layers, every fused kernel in its own
  // colour, each node's kernel choice shown when it is clicked.
  std::string graph_html() const;

  // One line per compiled kernel: its name, the node it computes, the
  // implementation the operator strategy chose (src/strategy), its knob
  // values and why (priority, measured, database).
  std::string kernels_text() const;

  // Runs the model `runs` times with per-instruction timing and returns a
  // report: instructions by total time (kernel, node, calls, ms, share).
  // `trace_path`, when not empty, also gets a Chrome trace / Perfetto JSON
  // file: a span per instruction of every timed run on the calling thread
  // (kernels with their node, implementation, knobs and workload key), and a
  // span per chunk each worker thread ran of a kernel's parallel loops.
  Result<std::string> profile(const std::map<std::string, Tensor>& inputs, int runs,
                              const std::string& trace_path = "");

  struct Impl;  // opaque (driver/compiled_model.cc)

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  Result<std::map<std::string, Tensor>> run_specialized(const std::map<std::string, Tensor>& inputs,
                                                        const std::map<std::string, Tensor>* into);
  // Shared: a profile keeps the one it times alive while concurrent runs
  // evict it from the cache.
  Result<std::shared_ptr<Impl>> specialization(const std::map<std::string, Tensor>& inputs);
  static Result<std::map<std::string, Tensor>> run_on(Impl& spec, const std::map<std::string, Tensor>& inputs,
                                                      const std::map<std::string, Tensor>* into = nullptr);
  Result<std::map<std::string, Tensor>> run_checked(const std::map<std::string, Tensor>& inputs,
                                                    const std::map<std::string, Tensor>* into);
  std::unique_ptr<Impl> impl_;
};

// A human-readable report on a model file: inputs, outputs, op histogram,
// inferred (symbolic) type of every value. Does not compile.
Result<std::string> describe_model_file(const std::string& path);

}  // namespace kiln
