#include "package/write.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/llvm/jit.h"
#include "package/package.h"
#include "support/cpu_features.h"
#include "support/json.h"
#include "tune/tune.h"

extern char** environ;

namespace kiln::package {

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error() << "cannot read '" << path << "'";
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

Status write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return io_error() << "cannot write '" << path << "'";
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return io_error() << "writing '" << path << "' failed (disk full?)";
  return Status::ok();
}

// A temporary directory, removed with this object.
struct TempDir {
  std::string path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The object linked into a shared library by the C compiler driver.
Result<std::string> link_library(const std::string& object) {
  TempDir dir;
  std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-package-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return io_error() << "cannot create a temporary directory: " << std::strerror(errno);
  dir.path = tmpl;
  const std::string obj = dir.path + "/kernels.o", lib = dir.path + "/kernels.so", log = dir.path + "/link.log";
  KILN_RETURN_IF_ERROR(write_file(obj, object));
  const char* env_cc = std::getenv("KILN_CC");
  std::string cc = env_cc && *env_cc ? env_cc : "cc";
  std::vector<std::string> args = {cc, "-shared", "-o", lib, obj, "-lm", "-Wl,-z,noexecstack", "-Wl,-z,now"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int err = posix_spawnp(&pid, cc.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return unsupported() << "writing a package links its kernels with a C compiler driver ('" << cc
                         << "', or $KILN_CC), which cannot be run: " << std::strerror(err);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    auto text = read_file(log);
    return internal_error() << "linking the package's kernels with '" << cc << "' failed: "
                            << (text.is_ok() ? *text : std::string("(no output)"));
  }
  return read_file(lib);
}

std::string infos_json(const std::vector<TensorInfo>& infos) {
  std::string s = "[";
  for (size_t i = 0; i < infos.size(); ++i) {
    s += std::string(i ? ", " : "") + "{\"name\": " + json_quote(infos[i].name) + ", \"dtype\": " +
         json_quote(dtype_name(infos[i].dtype)) + ", \"dims\": [";
    for (size_t d = 0; d < infos[i].dims.size(); ++d) s += (d ? ", " : "") + json_quote(infos[i].dims[d]);
    s += "]}";
  }
  return s + "]";
}

}  // namespace

Status write(const std::string& path, const driver::CompiledProgram& compiled, const std::string& source,
             const driver::CompiledProgram* empty_dims) {
  if (!compiled.program) return unsupported() << "this model has no program to package";
  Contents c;
  c.program = compiled.program;
  c.inputs = compiled.inputs;
  c.outputs = compiled.outputs;
  c.kernel_choices = compiled.kernel_choices;
  c.stats = compiled.stats;
  c.source = source;
  c.kiln_version = kiln_version();
  c.arch = host_arch();
  std::vector<tir::PrimFunc> funcs = compiled.funcs;
  if (empty_dims != nullptr && empty_dims->program) {
    c.empty_dims = empty_dims->program;
    for (tir::PrimFunc f : empty_dims->funcs) {
      f.name = kEmptyDimsPrefix + f.name;
      funcs.push_back(std::move(f));
    }
  }
  std::string library;
  if (!funcs.empty()) {
    auto object = codegen::compile_object(funcs);
    if (!object.is_ok()) return object.status().with_context("compiling the package's kernels");
    c.cpu = object->cpu;
    c.cpu_features = object->cpu_features;
    KILN_ASSIGN_OR_RETURN(library, link_library(object->bytes));
  }
  std::ostringstream meta;
  meta << "{\"format\": " << kFormatVersion << ", \"kiln_version\": " << json_quote(c.kiln_version)
       << ", \"source\": " << json_quote(source) << ", \"target_key\": " << json_quote(tune::TargetKey::host().text())
       << ", \"arch\": " << json_quote(c.arch) << ", \"cpu\": " << json_quote(c.cpu)
       << ", \"cpu_features\": [";
  for (size_t i = 0; i < c.cpu_features.size(); ++i) meta << (i ? ", " : "") << json_quote(c.cpu_features[i]);
  meta << "], \"inputs\": " << infos_json(c.inputs) << ", \"outputs\": " << infos_json(c.outputs)
       << ", \"empty_dims_program\": " << (c.empty_dims ? "true" : "false") << ", \"kernels\": " << c.stats.num_kernels << ", \"host_kernel_calls\": " << c.stats.num_runtime_kernels
       << ", \"arena_bytes\": " << c.stats.arena_bytes << ", \"library_bytes\": " << library.size() << "}";
  c.metadata_json = meta.str();
  KILN_ASSIGN_OR_RETURN(std::string bytes, serialize(c, library));
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  Status st = write_file(tmp, bytes);
  if (st.is_ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    st = io_error() << "cannot rename '" << tmp << "' to '" << path << "': " << std::strerror(errno);
  if (!st.is_ok()) std::remove(tmp.c_str());
  return st;
}

}  // namespace kiln::package
