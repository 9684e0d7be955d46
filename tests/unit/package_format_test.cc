// Packages (src/package): a program with symbolic dims, If, Loop, a host
// kernel and constants is written, read back and run beside the compiled
// program (equal bit for bit); damaged, foreign and incompatible files are
// refused with errors that say why.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "driver/compile.h"
#include "graph/graph.h"
#include "package/package.h"
#include "package/write.h"
#include "support/cpu_features.h"

namespace kiln::package {
namespace {

constexpr const char* kModel = R"(
graph main(%x: f32[n, 4], %c: bool[], %m: i64[]) -> (%y, %nz, %s, %acc) {
  opset "" 17
  bound n [1, inf]
  %w: f32[4, 3] = const<f32[4,3] [0.5, -1, 0.25, 0.75, 2, -0.5, 1, 1.5, -2, 0.125, 3, -0.25]>
  %s0: f32[3] = const<f32[3] [1, 2, 3]>
  %h: f32[n, 3] = MatMul(%x, %w)
  %r: f32[n, 3] = Relu(%h)
  %y: f32[?] = If(%c) {else_branch = graph e() -> (%o) {
    capture %r: f32[n, 3]
    %o: f32[n, 3] = Neg(%r)
  }, then_branch = graph t() -> (%o) {
    capture %r: f32[n, 3]
    %o: f32[n, 3] = Add(%r, %r)
  }}
  %nz: i64[?] = NonZero(%x)
  %s: f32[?], %acc: f32[?] = Loop(%m, _, %s0) {body = graph b(%i: i64[], %cond: bool[], %v: f32[3]) -> (%cond, %v2, %v3) {
    %v2: f32[3] = Mul(%v, %v)
    %v3: f32[3] = Sqrt(%v2)
  }}
}
)";

Result<driver::CompiledProgram> compile_text(const char* text) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, parse_graph(text));
  g->source = "package_format_test";
  CompileOptions options;
  options.threads = 2;
  return driver::compile_graph(std::move(g), options);
}

std::string temp_path(const std::string& name) { return testing::TempDir() + "/" + name; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<Tensor> inputs_for(int64_t n, bool c, int64_t m, uint32_t seed) {
  Tensor x(DType::kFloat32, {n, 4});
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = i % 3 == 0 ? 0.f : dist(rng);
  Tensor ct(DType::kBool, {}), mt(DType::kInt64, {});
  ct.data_as<bool>()[0] = c;
  mt.data_as<int64_t>()[0] = m;
  return {x, ct, mt};
}

void expect_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].dtype(), b[i].dtype()) << what << " output " << i;
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what << " output " << i;
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), static_cast<size_t>(a[i].nbytes())), 0) << what << " output " << i;
  }
}

class PackageTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto compiled = compile_text(kModel);
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    compiled_ = new driver::CompiledProgram(std::move(*compiled));
    path_ = temp_path("model.kiln");
    Status st = write(path_, *compiled_, "package_format_test");
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  static void TearDownTestSuite() { delete compiled_; }

  // Loads a damaged copy of the package and returns the error.
  static Status load_changed(const std::string& name, const std::function<void(std::string&)>& change) {
    std::string bytes = read_all(path_);
    change(bytes);
    std::string path = temp_path(name);
    write_all(path, bytes);
    auto loaded = load(path);
    return loaded.is_ok() ? Status::ok() : loaded.status();
  }

  static driver::CompiledProgram* compiled_;
  static std::string path_;
};

driver::CompiledProgram* PackageTest::compiled_ = nullptr;
std::string PackageTest::path_;

TEST_F(PackageTest, RunsLikeTheCompiledProgram) {
  auto loaded = load(path_);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const Contents& c = (*loaded)->contents;
  EXPECT_EQ(c.inputs.size(), 3u);
  EXPECT_EQ(c.inputs[0].dims, (std::vector<std::string>{"n", "4"}));
  EXPECT_EQ(c.outputs.size(), 4u);
  EXPECT_EQ(c.source, "package_format_test");
  EXPECT_EQ(c.kernel_choices.size(), compiled_->kernel_choices.size());
  EXPECT_FALSE(c.program->host_kernels.empty());  // NonZero
  runtime::VM from_compile(compiled_->program, 2), from_package(c.program, 2);
  uint32_t seed = 1;
  for (int64_t n : {1, 3, 17})
    for (bool cond : {true, false})
      for (int64_t m : {0, 1, 4}) {
        std::vector<Tensor> in = inputs_for(n, cond, m, seed++);
        auto a = from_compile.run(in);
        auto b = from_package.run(in);
        ASSERT_TRUE(a.is_ok()) << a.status().to_string();
        ASSERT_TRUE(b.is_ok()) << b.status().to_string();
        expect_identical(*a, *b, "n=" + std::to_string(n) + " c=" + std::to_string(cond) + " m=" + std::to_string(m));
      }
  // A wrong input is the same error as from a compile.
  std::vector<Tensor> bad = inputs_for(2, true, 1, 9);
  bad[0] = Tensor(DType::kFloat32, {2, 5});
  auto err = from_package.run(bad);
  ASSERT_FALSE(err.is_ok());
  EXPECT_EQ(err.status().to_string(), from_compile.run(bad).status().to_string());
}

TEST_F(PackageTest, EmptyConstantsOfDifferentDtypesKeepTheirOwn) {
  // Two zero-byte constants (their storage may be the same null pointer).
  auto compiled = compile_text(R"(
graph main(%x: f32[n], %xi: i64[n]) -> (%y, %z) {
  opset "" 17
  bound n [1, inf]
  %ef: f32[0] = const<f32[0] []>
  %ei: i64[0] = const<i64[0] []>
  %y: f32[n] = Concat(%x, %ef) {axis = 0}
  %z: i64[n] = Concat(%xi, %ei) {axis = 0}
}
)");
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  std::string path = temp_path("empty_constants.kiln");
  ASSERT_TRUE(write(path, *compiled, "empty").is_ok());
  auto loaded = load(path);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  int constants = 0;
  for (const runtime::RegisterInfo& r : (*loaded)->contents.program->registers) {
    if (!r.is_constant) continue;
    ++constants;
    EXPECT_EQ(r.constant.dtype(), r.dtype) << r.name;
  }
  EXPECT_EQ(constants, 2);
  Tensor x(DType::kFloat32, {3}), xi(DType::kInt64, {3});
  for (int i = 0; i < 3; ++i) {
    x.data_as<float>()[i] = 0.5f * static_cast<float>(i);
    xi.data_as<int64_t>()[i] = 7 - i;
  }
  runtime::VM a(compiled->program, 1), b((*loaded)->contents.program, 1);
  auto ra = a.run({x, xi});
  auto rb = b.run({x, xi});
  ASSERT_TRUE(ra.is_ok() && rb.is_ok()) << rb.status().to_string();
  expect_identical(*ra, *rb, "empty constants");
}

TEST_F(PackageTest, OutlivesTheLoadedObject) {
  std::shared_ptr<runtime::Program> program;
  {
    auto loaded = load(path_);
    ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    program = (*loaded)->contents.program;
    // The caller keeps the Loaded object (Model does); the program alone
    // must not be used after it: checked by keeping both alive here.
    runtime::VM vm(program, 1);
    auto out = vm.run(inputs_for(3, true, 2, 5));
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  }
}

TEST_F(PackageTest, TruncatedFileIsRefused) {
  Status st = load_changed("truncated.kiln", [](std::string& b) { b.resize(b.size() - 100); });
  EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
  EXPECT_NE(st.message().find("is truncated"), std::string::npos) << st.to_string();
  st = load_changed("header_only.kiln", [](std::string& b) { b.resize(20); });
  EXPECT_NE(st.message().find("shorter than its header"), std::string::npos) << st.to_string();
}

TEST_F(PackageTest, ChangedByteIsRefusedByTheChecksum) {
  // One byte in the middle (constants or library) and one in the index.
  for (size_t at : {size_t{0}, size_t{1}}) {
    Status st = load_changed("flipped.kiln", [at](std::string& b) { b[at == 0 ? b.size() / 2 : 100] ^= 0x10; });
    EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
    EXPECT_NE(st.message().find("checksum does not match"), std::string::npos) << st.to_string();
  }
}

TEST_F(PackageTest, OtherFormatVersionIsRefusedNamingBoth) {
  Status st = load_changed("format.kiln", [](std::string& b) {
    uint32_t v = kFormatVersion + 1;
    std::memcpy(&b[8], &v, 4);
  });
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("has format " + std::to_string(kFormatVersion + 1)), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("reads format " + std::to_string(kFormatVersion)), std::string::npos) << st.to_string();
}

TEST_F(PackageTest, ForeignFilesAreRefused) {
  Status st = load_changed("onnx.kiln", [](std::string& b) { std::memcpy(&b[0], "\x08\x07\x12\x04onnx", 8); });
  EXPECT_NE(st.message().find("is not a Kiln package"), std::string::npos) << st.to_string();
  EXPECT_FALSE(is_package_file(temp_path("onnx.kiln")));
  EXPECT_TRUE(is_package_file(path_));
  auto missing = load(temp_path("no_such.kiln"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(PackageTest, KernelsForCpuFeaturesTheHostLacksAreRefused) {
  const std::vector<std::string>& have = host_cpu_features();
  std::string lacking;
  for (const std::string& f : checked_cpu_features())
    if (!std::binary_search(have.begin(), have.end(), f)) lacking = f;
  if (lacking.empty()) GTEST_SKIP() << "this host has every checked CPU feature";
  Contents c;
  c.program = compiled_->program;
  c.inputs = compiled_->inputs;
  c.outputs = compiled_->outputs;
  c.kiln_version = kiln_version();
  c.arch = host_arch();
  c.cpu = "future-cpu";
  c.cpu_features = {lacking};
  auto bytes = serialize(c, "");
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  std::string path = temp_path("future.kiln");
  write_all(path, *bytes);
  auto loaded = load(path);
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(loaded.status().message().find("its kernels use " + lacking + ", which this host's CPU lacks"),
            std::string::npos)
      << loaded.status().to_string();
}

TEST_F(PackageTest, WritingReplacesAFileOnlyWhenComplete) {
  std::string path = temp_path("kept.kiln");
  write_all(path, "previous contents");
  driver::CompiledProgram empty;
  Status st = write(path, empty, "nothing");
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(read_all(path), "previous contents");
}

}  // namespace
}  // namespace kiln::package
