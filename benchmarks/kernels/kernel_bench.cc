// Single-kernel benchmark: builds one Conv or MatMul with the Graph API,
// compiles it through the real pipeline (driver::compile_graph) and reports
// GFLOP/s with the share of this machine's FP32 peak, which the benchmark
// measures first (machine_peak.h: a register-resident FMA loop on as many
// threads). Matrix-vector products are memory bound: they report the weight
// bytes streamed per second as a share of the measured read bandwidth. It
// also times an empty parallel region on the kernels' thread pool (the
// runtime overhead every parallel loop pays).
//
//   kernel_bench [--threads N] [--naive] [--dump] [--filter SUBSTRING] [--json]
//                [--select measure] [--impl NAME[:KNOBS] ...]
//   kernel_bench --peak-only [--threads N] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/thread_pool.h"
#include "driver/compile.h"
#include "kernels/machine_peak.h"
#include "runtime/vm.h"

namespace {

using kiln::Attribute;
using kiln::DType;
using kiln::Graph;
using kiln::Tensor;
using kiln::TensorType;

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

Attribute ints_attr(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::kInts;
  a.ints = std::move(v);
  return a;
}

Attribute int_attr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}

struct Case {
  std::string name;
  std::unique_ptr<Graph> graph;
  Tensor input;
  double flops = 0;
  double bytes = 0;  // > 0: memory bound, judged against bandwidth
};

Case matmul_case(int64_t m, int64_t k, int64_t n) {
  Case c;
  c.name = "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  c.graph = std::make_unique<Graph>();
  c.graph->source = c.name;
  c.graph->opsets[""] = 17;
  kiln::Value* a = c.graph->add_input("a", TensorType{DType::kFloat32, kiln::Shape{m, k}});
  kiln::Value* b = c.graph->add_constant("b", random_tensor({k, n}, 2));
  kiln::Node* mm = c.graph->add_node("MatMul", {a, b}, {"y"});
  c.graph->set_outputs({mm->output(0)});
  c.input = random_tensor({m, k}, 1);
  c.flops = 2.0 * m * n * k;
  if (m == 1) c.bytes = 4.0 * k * n;
  return c;
}

// A kh x kw convolution of a square hw x hw image, padded to keep the plane
// at stride 1; with `silu`, followed by x * Sigmoid(x) (EfficientNet's
// activation, fused into the convolution's epilogue).
Case conv_case(std::string name, int64_t cin, int64_t cout, int64_t hw, int64_t kh, int64_t kw, int64_t stride,
               int64_t group, bool silu = false) {
  Case c;
  c.name = std::move(name);
  c.graph = std::make_unique<Graph>();
  c.graph->source = c.name;
  c.graph->opsets[""] = 17;
  int64_t ph = kh / 2, pw = kw / 2;
  kiln::Value* x = c.graph->add_input("x", TensorType{DType::kFloat32, kiln::Shape{1, cin, hw, hw}});
  kiln::Value* w = c.graph->add_constant("w", random_tensor({cout, cin / group, kh, kw}, 2));
  kiln::Value* bias = c.graph->add_constant("bias", random_tensor({cout}, 3));
  kiln::Node* conv = c.graph->add_node("Conv", {x, w, bias}, {"y"});
  conv->set_attr("kernel_shape", ints_attr({kh, kw}));
  conv->set_attr("strides", ints_attr({stride, stride}));
  conv->set_attr("pads", ints_attr({ph, pw, ph, pw}));
  conv->set_attr("group", int_attr(group));
  kiln::Value* y = conv->output(0);
  if (silu) {
    kiln::Node* sig = c.graph->add_node("Sigmoid", {y}, {"sig"});
    y = c.graph->add_node("Mul", {y, sig->output(0)}, {"silu"})->output(0);
  }
  c.graph->set_outputs({y});
  c.input = random_tensor({1, cin, hw, hw}, 1);
  int64_t oh = (hw + 2 * ph - kh) / stride + 1, ow = (hw + 2 * pw - kw) / stride + 1;
  c.flops = 2.0 * cout * oh * ow * (cin / group) * kh * kw;
  return c;
}

Case conv_case(std::string name, int64_t cin, int64_t cout, int64_t hw, int64_t ksize, int64_t stride,
               int64_t group) {
  return conv_case(std::move(name), cin, cout, hw, ksize, ksize, stride, group);
}

// The cost of a parallel loop whose iterations do nothing, on the pool that
// compiled kernels use (kiln_parallel_for): publish, wake or reach the
// workers, and wait for every chunk. Median of 20000 after a warm-up.
double empty_parallel_region_us(int threads) {
  kiln::ThreadPool* pool = kiln::shared_thread_pool(threads);
  auto noop = [](int64_t, int64_t, void*) {};
  for (int i = 0; i < 2000; ++i) pool->parallel_for(threads, noop, nullptr);
  std::vector<double> us;
  for (int i = 0; i < 20000; ++i) {
    auto s = std::chrono::steady_clock::now();
    pool->parallel_for(threads, noop, nullptr);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool naive = false;
  bool dump = false;  // loop IR and optimized LLVM IR to stderr
  bool json = false;
  bool peak_only = false;
  std::string filter, select = "priority";
  std::vector<std::string> impls;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--naive") naive = true;
    else if (a == "--dump") dump = true;
    else if (a == "--json") json = true;
    else if (a == "--peak-only") peak_only = true;
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (a == "--select" && i + 1 < argc) select = argv[++i];
    else if (a == "--impl" && i + 1 < argc) impls.push_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: kernel_bench [--threads N] [--naive] [--dump] [--filter S] [--json] [--peak-only]"
                   " [--select measure] [--impl NAME[:KNOBS]]\n");
      return 2;
    }
  }
  kiln::bench::MachinePeak peak = kiln::bench::measure_machine_peak(threads);
  double region_us = empty_parallel_region_us(threads);
  if (json) {
    std::printf("{\"threads\": %d, \"isa\": \"%s\", \"peak_gflops\": %.1f, \"bandwidth_gbs\": %.1f, "
                "\"empty_parallel_region_us\": %.3f, \"kernels\": [",
                threads, peak.isa, peak.gflops, peak.gbytes_s, region_us);
  } else {
    std::printf("measured peak at %d thread(s): %.1f GFLOP/s FP32 (%s FMA loop), %.1f GB/s read bandwidth\n",
                threads, peak.gflops, peak.isa, peak.gbytes_s);
    std::printf("empty parallel region at %d thread(s): %.3f us (median; the pool kernels run on)\n", threads,
                region_us);
  }
  if (peak_only) {
    if (json) std::printf("]}\n");
    return 0;
  }
  std::vector<Case> cases;
  for (int64_t s : {512, 1024, 2048}) cases.push_back(matmul_case(s, s, s));
  cases.push_back(matmul_case(128, 768, 768));
  cases.push_back(matmul_case(128, 768, 3072));
  cases.push_back(matmul_case(128, 3072, 768));
  // Long reductions, where a weight panel outgrows L2 (K blocking):
  // Faster R-CNN's box head (RoIs x 256*7*7 -> 1024) and a 8192-deep product.
  cases.push_back(matmul_case(150, 12544, 1024));
  cases.push_back(matmul_case(512, 8192, 512));
  cases.push_back(matmul_case(1, 768, 3072));
  cases.push_back(matmul_case(1, 768, 50257));
  cases.push_back(conv_case("conv 3x3 64->64 56x56", 64, 64, 56, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 s2 64->128 56x56", 64, 128, 56, 3, 2, 1));
  cases.push_back(conv_case("conv 3x3 s2 256->256 28x28", 256, 256, 28, 3, 2, 1));
  cases.push_back(conv_case("conv 3x3 s2 512->512 14x14", 512, 512, 14, 3, 2, 1));
  cases.push_back(conv_case("conv 1x1 256->64 56x56", 256, 64, 56, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 64->256 56x56", 64, 256, 56, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 512->128 28x28", 512, 128, 28, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 1024->256 14x14", 1024, 256, 14, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 s2 256->512 56x56", 256, 512, 56, 1, 2, 1));
  cases.push_back(conv_case("conv 1x1 s2 1024->2048 14x14", 1024, 2048, 14, 1, 2, 1));
  cases.push_back(conv_case("conv 1x1 512->1000 13x13", 512, 1000, 13, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 24->144 56x56", 24, 144, 56, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 144->24 56x56", 144, 24, 56, 1, 1, 1));
  cases.push_back(conv_case("conv 3x3 256->256 14x14", 256, 256, 14, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 32->64 147x147", 32, 64, 147, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 s2 288->384 35x35", 288, 384, 35, 3, 2, 1));
  cases.push_back(conv_case("conv 3x3 512->512 7x7", 512, 512, 7, 3, 1, 1));
  // 3x3 stride-1 shapes of the zoo for conv.winograd's rule: resnet's 28x28,
  // squeezenet's expand, densenet's growth, inception's 35x35 and 8x8.
  cases.push_back(conv_case("conv 3x3 128->128 28x28", 128, 128, 28, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 16->64 55x55", 16, 64, 55, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 64->256 13x13", 64, 256, 13, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 128->32 28x28", 128, 32, 28, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 128->32 7x7", 128, 32, 7, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 64->96 35x35", 64, 96, 35, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 448->384 8x8", 448, 384, 8, 3, 1, 1));
  cases.push_back(conv_case("conv 3x3 80->192 71x71", 80, 192, 71, 3, 1, 1));
  cases.push_back(conv_case("conv 1x1 2048->512 7x7", 2048, 512, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 256->512 7x7", 256, 512, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 512->2048 7x7", 512, 2048, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 960->160 7x7", 960, 160, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 1x1 1024->128 7x7", 1024, 128, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 1x7 128->128 17x17", 128, 128, 17, 1, 7, 1, 1));
  cases.push_back(conv_case("conv 7x1 128->192 17x17", 128, 192, 17, 7, 1, 1, 1));
  cases.push_back(conv_case("conv 7x7 s2 3->64 224x224", 3, 64, 224, 7, 2, 1));
  cases.push_back(conv_case("conv 3x3 s2 3->64 224x224", 3, 64, 224, 3, 2, 1));
  cases.push_back(conv_case("depthwise 3x3 32 112x112", 32, 32, 112, 3, 1, 32));
  cases.push_back(conv_case("depthwise 3x3 s2 96 112x112", 96, 96, 112, 3, 2, 96));
  cases.push_back(conv_case("depthwise 3x3 144 56x56", 144, 144, 56, 3, 1, 144));
  cases.push_back(conv_case("depthwise 3x3 s2 144 56x56", 144, 144, 56, 3, 2, 144));
  cases.push_back(conv_case("depthwise 3x3 s2 576 14x14", 576, 576, 14, 3, 2, 576));
  cases.push_back(conv_case("depthwise 5x5 240 28x28", 240, 240, 28, 5, 1, 240));
  cases.push_back(conv_case("depthwise 5x5 672 14x14", 672, 672, 14, 5, 1, 672));
  cases.push_back(conv_case("depthwise 3x3 960 7x7", 960, 960, 7, 3, 1, 960));
  // Grouped convolutions of several channels per group (ResNeXt-50 32x4d's
  // 3x3 layers, 4 to 32 channels per group; RegNetY's groups of 8 and 24).
  cases.push_back(conv_case("grouped 3x3 g32 128 56x56", 128, 128, 56, 3, 1, 32));
  cases.push_back(conv_case("grouped 3x3 g32 256 28x28", 256, 256, 28, 3, 1, 32));
  cases.push_back(conv_case("grouped 3x3 g32 512 14x14", 512, 512, 14, 3, 1, 32));
  cases.push_back(conv_case("grouped 3x3 g32 1024 7x7", 1024, 1024, 7, 3, 1, 32));
  cases.push_back(conv_case("grouped 3x3 s2 g32 256 56x56", 256, 256, 56, 3, 2, 32));
  cases.push_back(conv_case("grouped 3x3 g9 216 28x28", 216, 216, 28, 3, 1, 9));
  // EfficientNet-B0's largest kernels: expansion and depthwise with SiLU.
  cases.push_back(conv_case("conv 1x1 16->96 112x112 silu", 16, 96, 112, 1, 1, 1, 1, true));
  cases.push_back(conv_case("depthwise 3x3 s2 96 112x112 silu", 96, 96, 112, 3, 3, 2, 96, true));
  cases.push_back(conv_case("depthwise 5x5 240 28x28 silu", 240, 240, 28, 5, 5, 1, 240, true));

  if (!json) std::printf("%-28s %10s %10s %8s %10s %8s\n", "kernel", "ms", "GFLOP/s", "peak%", "GB/s", "bw%");
  bool first_row = true;
  for (Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    kiln::CompileOptions opts;
    opts.threads = threads;
    opts.naive = naive;
    opts.dump_ir = dump;
    opts.select = select;
    opts.prefer_impls = impls;
    auto compiled = kiln::driver::compile_graph(std::move(c.graph), opts);
    if (!compiled.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), compiled.status().to_string().c_str());
      return 1;
    }
    kiln::runtime::VM vm(compiled->program, threads);
    auto first = vm.run({c.input});
    if (!first.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), first.status().to_string().c_str());
      return 1;
    }
    // Enough repetitions for ~0.3 s, at least 3; report the median.
    auto t0 = std::chrono::steady_clock::now();
    (void)vm.run({c.input});
    double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int reps = std::clamp(static_cast<int>(0.3 / std::max(once, 1e-6)), 3, 200);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      auto s = std::chrono::steady_clock::now();
      auto out = vm.run({c.input});
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
      if (!out.is_ok()) return 1;
    }
    std::sort(times.begin(), times.end());
    double t = times[times.size() / 2];
    double gflops = c.flops / t * 1e-9;
    double gbs = c.bytes / t * 1e-9;
    double peak_share = 100.0 * gflops / peak.gflops;
    double bw_share = c.bytes > 0 ? 100.0 * gbs / peak.gbytes_s : 0.0;
    if (json) {
      std::printf("%s{\"kernel\": \"%s\", \"ms\": %.4f, \"gflops\": %.2f, \"peak_share\": %.3f, \"gbs\": %.2f, "
                  "\"bandwidth_share\": %.3f}",
                  first_row ? "" : ", ", c.name.c_str(), t * 1e3, gflops, peak_share / 100, gbs, bw_share / 100);
    } else if (c.bytes > 0) {
      std::printf("%-28s %10.3f %10.2f %7.1f%% %10.2f %7.1f%%\n", c.name.c_str(), t * 1e3, gflops, peak_share, gbs,
                  bw_share);
    } else {
      std::printf("%-28s %10.3f %10.2f %7.1f%% %10s %8s\n", c.name.c_str(), t * 1e3, gflops, peak_share, "-", "-");
    }
    first_row = false;
    if (!json) {
      for (const kiln::driver::KernelChoiceInfo& k : compiled->kernel_choices)
        if (k.source != "no candidates")
          std::printf("    %s (%s) by %s\n", k.impl.c_str(), k.knobs.c_str(), k.source.c_str());
    }
    std::fflush(stdout);
  }
  if (json) std::printf("]}\n");
  return 0;
}
