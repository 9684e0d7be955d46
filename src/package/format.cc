// Package files: serialize() and load() (layout and checks in package.h).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "graph/graph.h"
#include "ops/registry.h"
#include "package/package.h"
#include "support/cpu_features.h"
#include "support/kernel_abi.h"

namespace kiln::package {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'K', 'G', '\0'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kChecksumAt = 40;
constexpr size_t kConstantAlign = 64;
constexpr size_t kLibraryAlign = 4096;

// 64-bit checksum of the bytes (four independent multiply-rotate lanes, so
// it runs near memory speed over the constants): not cryptographic, it
// detects truncation, corruption and edits.
uint64_t checksum(const uint8_t* p, size_t n, uint64_t seed) {
  constexpr uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full;
  uint64_t h[4] = {seed + k1 + k2, seed + k2, seed, seed - k1};
  auto round = [&](uint64_t acc, uint64_t w) {
    acc += w * k2;
    acc = (acc << 31) | (acc >> 33);
    return acc * k1;
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    for (int l = 0; l < 4; ++l) h[l] = round(h[l], w[l]);
  }
  uint64_t r = h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7) ^ n;
  for (; i < n; ++i) r = (r ^ p[i]) * 0x100000001B3ull;
  r ^= r >> 29;
  r *= k1;
  return r ^ (r >> 32);
}

uint64_t file_checksum(const uint8_t* file, size_t size) {
  return checksum(file + kHeaderBytes, size - kHeaderBytes, checksum(file, kChecksumAt, 0));
}

// ---- writing -------------------------------------------------------------

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { out_.append(reinterpret_cast<const char*>(&v), 4); }
  void i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out_ += s;
  }
  void ints(const std::vector<int>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (int x : v) i64(x);
  }
  void i64s(const std::vector<int64_t>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (int64_t x : v) i64(x);
  }
  void strs(const std::vector<std::string>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (const std::string& s : v) str(s);
  }
  void exprs(const std::vector<Expr>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (const Expr& e : v) str(e.defined() ? print_expr(e) : "");
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

struct ConstantSlot {
  DType dtype;
  std::vector<int64_t> shape;
  const Tensor* tensor;
  uint64_t offset = 0;
};

class Serializer {
 public:
  // `kernel_prefix`: what the library calls this program's kernels (and its
  // sub-programs') before their names.
  Status add_program(const std::shared_ptr<runtime::Program>& p, const std::string& kernel_prefix = "") {
    if (!p || index_.count(p.get())) return Status::ok();
    index_[p.get()] = -1;  // visiting
    prefix_[p.get()] = kernel_prefix;
    for (const auto& sub : p->subprograms)
      KILN_RETURN_IF_ERROR(add_program(std::const_pointer_cast<runtime::Program>(sub), kernel_prefix));
    for (const runtime::RegisterInfo& r : p->registers)
      if (r.is_constant) KILN_RETURN_IF_ERROR(add_constant(r.constant));
    index_[p.get()] = static_cast<int>(order_.size());
    order_.push_back(p.get());
    return Status::ok();
  }

  int program_index(const runtime::Program* p) const { return p ? index_.at(p) : -1; }

  void write_programs(Writer& w) const {
    w.i64(static_cast<int64_t>(order_.size()));
    for (const runtime::Program* p : order_) write_program(w, *p);
  }

  const std::vector<ConstantSlot>& constants() const { return constants_; }
  std::vector<ConstantSlot>& constants() { return constants_; }

 private:
  // Registers sharing a constant's storage share its record (each keeps its
  // own shape); zero-byte constants are told apart by dtype.
  static std::tuple<const void*, DType, int64_t> key(const Tensor& t) { return {t.data(), t.dtype(), t.nbytes()}; }

  Status add_constant(const Tensor& t) {
    if (constant_index_.count(key(t))) return Status::ok();
    if (dtype_is_container(t.dtype()) || t.dtype() == DType::kString)
      return unsupported() << "a constant of dtype " << dtype_name(t.dtype()) << " cannot be packaged";
    constant_index_[key(t)] = static_cast<int>(constants_.size());
    constants_.push_back({t.dtype(), t.shape(), &t});
    return Status::ok();
  }

  void write_program(Writer& w, const runtime::Program& p) const {
    w.i64(static_cast<int64_t>(p.registers.size()));
    for (const runtime::RegisterInfo& r : p.registers) {
      w.str(r.name);
      w.u32(static_cast<uint32_t>(r.dtype));
      w.exprs(r.shape);
      w.i64(r.is_constant ? constant_index_.at(key(r.constant)) : -1);
      if (r.is_constant) w.i64s(r.constant.shape());
      w.i64(r.arena_offset);
      w.u8(r.is_output ? 1 : 0);
      w.i64(static_cast<int64_t>(r.elem_dtypes.size()));
      for (DType t : r.elem_dtypes) w.u32(static_cast<uint32_t>(t));
    }
    w.i64(static_cast<int64_t>(p.instrs.size()));
    for (const runtime::Instr& in : p.instrs) {
      w.u8(static_cast<uint8_t>(in.op));
      w.i64(in.callee);
      w.ints(in.inputs);
      w.ints(in.outputs);
      w.ints(in.release);
      w.i64(in.target);
      w.i64(in.end);
      w.i64(in.loop);
      w.exprs(in.values);
      w.str(in.where);
      std::vector<int> subs;
      for (int s : in.subprograms) subs.push_back(s);
      w.ints(subs);
      w.i64(static_cast<int64_t>(in.captures.size()));
      for (const auto& c : in.captures) w.ints(c);
      w.i64s(in.attrs);
      w.u8(in.fills_outputs ? 1 : 0);
    }
    w.i64(static_cast<int64_t>(p.kernels.size()));
    for (const runtime::CompiledKernel& k : p.kernels) {
      w.str(prefix_.at(&p) + k.name);
      w.strs(k.sym_names);
      w.ints(k.sym_slots);
    }
    w.strs(p.host_kernel_nodes);
    std::vector<int> subs;
    for (const auto& s : p.subprograms) subs.push_back(index_.at(s.get()));
    w.ints(subs);
    w.ints(p.input_registers);
    w.ints(p.output_registers);
    w.i64(static_cast<int64_t>(p.bounds.size()));
    for (const auto& [name, b] : p.bounds) {
      w.str(name);
      w.u8((b.lo ? 1 : 0) | (b.hi ? 2 : 0));
      w.i64(b.lo.value_or(0));
      w.i64(b.hi.value_or(0));
    }
    w.strs(p.symbols);
    w.u8(p.static_plan ? 1 : 0);
    w.i64(p.arena_bytes);
  }

  std::map<const runtime::Program*, int> index_;
  std::map<const runtime::Program*, std::string> prefix_;
  std::vector<const runtime::Program*> order_;
  std::map<std::tuple<const void*, DType, int64_t>, int> constant_index_;
  std::vector<ConstantSlot> constants_;
};

void write_infos(Writer& w, const std::vector<TensorInfo>& infos) {
  w.i64(static_cast<int64_t>(infos.size()));
  for (const TensorInfo& t : infos) {
    w.str(t.name);
    w.u32(static_cast<uint32_t>(t.dtype));
    w.strs(t.dims);
  }
}

void pad_to(std::string& s, size_t align) { s.resize((s.size() + align - 1) / align * align, '\0'); }

}  // namespace

const char* kiln_version() { return KILN_VERSION; }

Result<std::string> serialize(const Contents& c, const std::string& library) {
  Serializer ser;
  KILN_RETURN_IF_ERROR(ser.add_program(c.program));
  KILN_RETURN_IF_ERROR(ser.add_program(c.empty_dims, kEmptyDimsPrefix));

  // Constants and the library after the index, whose size must be known
  // first: lay them out relative to the data start, then shift.
  uint64_t data_bytes = 0;
  for (ConstantSlot& k : ser.constants()) {
    data_bytes = (data_bytes + kConstantAlign - 1) / kConstantAlign * kConstantAlign;
    k.offset = data_bytes;
    data_bytes += static_cast<uint64_t>(k.tensor->nbytes());
  }
  data_bytes = (data_bytes + kLibraryAlign - 1) / kLibraryAlign * kLibraryAlign;
  const uint64_t library_at = data_bytes;

  Writer w;
  w.str(c.kiln_version);
  w.str(c.arch);
  w.str(c.cpu);
  w.strs(c.cpu_features);
  w.str(c.source);
  w.str(c.metadata_json);
  write_infos(w, c.inputs);
  write_infos(w, c.outputs);
  w.i64(static_cast<int64_t>(c.kernel_choices.size()));
  for (const kernels::KernelChoiceInfo& k : c.kernel_choices) {
    for (const std::string* s : {&k.kernel, &k.node, &k.impl, &k.knobs, &k.source, &k.why, &k.schedule, &k.workload})
      w.str(*s);
  }
  w.i64(c.stats.num_kernels);
  w.i64(c.stats.num_runtime_kernels);
  w.i64(c.stats.arena_bytes);
  w.i64(c.stats.num_nodes_imported);
  w.i64(c.stats.num_nodes);
  w.i64(static_cast<int64_t>(ser.constants().size()));
  for (const ConstantSlot& k : ser.constants()) {
    w.u32(static_cast<uint32_t>(k.dtype));
    w.i64s(k.shape);
    w.i64(static_cast<int64_t>(k.offset));
    w.i64(k.tensor->nbytes());
  }
  w.i64(static_cast<int64_t>(library_at));
  w.i64(static_cast<int64_t>(library.size()));
  ser.write_programs(w);
  w.i64(ser.program_index(c.program.get()));
  w.i64(ser.program_index(c.empty_dims.get()));

  std::string file(kHeaderBytes, '\0');
  const uint64_t index_at = kHeaderBytes;
  file += w.bytes();
  pad_to(file, kLibraryAlign);
  const uint64_t data_at = file.size();
  file.resize(data_at + data_bytes + library.size(), '\0');
  for (const ConstantSlot& k : ser.constants())
    if (k.tensor->nbytes() > 0) std::memcpy(&file[data_at + k.offset], k.tensor->data(), static_cast<size_t>(k.tensor->nbytes()));
  std::memcpy(&file[data_at + library_at], library.data(), library.size());

  // The header: offsets of constants and library in the index are relative
  // to data_at, which the header records.
  std::memcpy(&file[0], kMagic, 8);
  uint32_t format = kFormatVersion, header = kHeaderBytes;
  uint64_t size = file.size(), index_bytes = w.bytes().size();
  std::memcpy(&file[8], &format, 4);
  std::memcpy(&file[12], &header, 4);
  std::memcpy(&file[16], &size, 8);
  std::memcpy(&file[24], &index_at, 8);
  std::memcpy(&file[32], &index_bytes, 8);
  std::memcpy(&file[48], &data_at, 8);
  std::strncpy(&file[56], c.kiln_version.c_str(), 7);
  uint64_t sum = file_checksum(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  std::memcpy(&file[kChecksumAt], &sum, 8);
  return file;
}

// ---- reading -------------------------------------------------------------

namespace {

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}

  Status error() const {
    return invalid_model() << "package '" << path_ << "' is corrupt: its index ends early or is inconsistent";
  }
  bool take(void* dst, size_t k) {
    if (!ok_ || k > n_ - at_) return ok_ = false;
    std::memcpy(dst, p_ + at_, k);
    at_ += k;
    return true;
  }
  uint8_t u8() {
    uint8_t v = 0;
    take(&v, 1);
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    take(&v, 4);
    return v;
  }
  int64_t i64() {
    int64_t v = 0;
    take(&v, 8);
    return v;
  }
  // A count of elements of at least `min_bytes` each that the rest can hold.
  size_t count(size_t min_bytes = 1) {
    int64_t v = i64();
    if (v < 0 || static_cast<uint64_t>(v) * min_bytes > n_ - at_) {
      ok_ = false;
      return 0;
    }
    return static_cast<size_t>(v);
  }
  std::string str() {
    size_t k = count();
    std::string s(k, '\0');
    if (k) take(s.data(), k);
    return s;
  }
  std::vector<int> ints() {
    std::vector<int> v(count(8));
    for (int& x : v) x = static_cast<int>(i64());
    return v;
  }
  std::vector<int64_t> i64s() {
    std::vector<int64_t> v(count(8));
    for (int64_t& x : v) x = i64();
    return v;
  }
  std::vector<std::string> strs() {
    std::vector<std::string> v(count(8));
    for (std::string& s : v) s = str();
    return v;
  }
  std::vector<Expr> exprs() {
    std::vector<Expr> v(count(8));
    for (Expr& e : v) {
      std::string text = str();
      if (text.empty()) continue;
      auto parsed = parse_expr(text);
      if (!parsed.is_ok()) {
        ok_ = false;
        continue;
      }
      e = *parsed;
    }
    return v;
  }
  DType dtype() {
    uint32_t v = u32();
    auto t = static_cast<DType>(v);
    if (v > 255 || (t != DType::kUndefined && dtype_from_name(dtype_name(t)) != t)) ok_ = false;
    return t;
  }
  bool ok() const { return ok_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  bool ok_ = true;
  const std::string& path_;
};

std::vector<TensorInfo> read_infos(Reader& r) {
  std::vector<TensorInfo> v(r.count(16));
  for (TensorInfo& t : v) {
    t.name = r.str();
    t.dtype = r.dtype();
    t.dims = r.strs();
  }
  return v;
}

struct ConstantRef {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t offset, bytes;
};

// Checks the indices a program holds against its own tables, so that a
// corrupt package is an error here, never an out-of-range access at run time.
bool program_consistent(const runtime::Program& p) {
  const int nregs = static_cast<int>(p.registers.size());
  auto reg_ok = [&](int r) { return r >= -1 && r < nregs; };
  auto regs_ok = [&](const std::vector<int>& v) { return std::all_of(v.begin(), v.end(), reg_ok); };
  const int ninstr = static_cast<int>(p.instrs.size());
  for (const runtime::Instr& in : p.instrs) {
    if (static_cast<int>(in.op) > static_cast<int>(runtime::OpCode::kSequenceMap)) return false;
    if (!regs_ok(in.inputs) || !regs_ok(in.outputs) || !regs_ok(in.release)) return false;
    if (in.target < -1 || in.target > ninstr || in.end < -1 || in.end >= ninstr || in.loop < -1 || in.loop >= ninstr)
      return false;
    if (in.op == runtime::OpCode::kCall && (in.callee < 0 || in.callee >= static_cast<int>(p.kernels.size()))) return false;
    if (in.op == runtime::OpCode::kCallHost &&
        (in.callee < 0 || in.callee >= static_cast<int>(p.host_kernel_nodes.size())))
      return false;
    for (int s : in.subprograms)
      if (s < 0 || s >= static_cast<int>(p.subprograms.size())) return false;
    for (const auto& c : in.captures)
      if (!regs_ok(c)) return false;
  }
  for (const runtime::CompiledKernel& k : p.kernels)
    for (int s : k.sym_slots)
      if (s < 0 || s >= static_cast<int>(p.symbols.size())) return false;
  return regs_ok(p.input_registers) && regs_ok(p.output_registers);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

bool is_package_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && std::memcmp(magic, kMagic, 8) == 0;
}

Result<std::shared_ptr<Loaded>> load(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return (err == ENOENT ? not_found() : io_error()) << "cannot open package '" << path << "': " << std::strerror(err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error() << "'" << path << "' is not a regular file";
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    return invalid_model() << "'" << path << "' is not a Kiln package (" << size << " bytes, shorter than its header)";
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return io_error() << "cannot map package '" << path << "': " << std::strerror(errno);
  auto out = std::make_shared<Loaded>();
  out->mapping = std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); });
  const auto* file = static_cast<const uint8_t*>(base);

  if (std::memcmp(file, kMagic, 8) != 0) return invalid_model() << "'" << path << "' is not a Kiln package (no package magic)";
  uint32_t format = 0;
  uint64_t recorded_size = 0, index_at = 0, index_bytes = 0, sum = 0, data_at = 0;
  std::memcpy(&format, file + 8, 4);
  char version[9] = {};
  std::memcpy(version, file + 56, 8);
  if (format != kFormatVersion) {
    return unsupported() << "package '" << path << "' has format " << format << " (written by Kiln " << version
                                 << "); this Kiln (" << KILN_VERSION << ") reads format " << kFormatVersion
                                 << ": compile the model again with this version";
  }
  std::memcpy(&recorded_size, file + 16, 8);
  std::memcpy(&index_at, file + 24, 8);
  std::memcpy(&index_bytes, file + 32, 8);
  std::memcpy(&sum, file + kChecksumAt, 8);
  std::memcpy(&data_at, file + 48, 8);
  if (recorded_size != size) {
    return invalid_model() << "package '" << path << "' is " << (size < recorded_size ? "truncated" : "longer than written")
                              << ": " << size << " bytes, written as " << recorded_size;
  }
  if (file_checksum(file, size) != sum)
    return invalid_model() << "package '" << path << "' is corrupt: its checksum does not match its contents";
  if (index_at < kHeaderBytes || index_at > size || index_bytes > size - index_at || data_at > size)
    return invalid_model() << "package '" << path << "' is corrupt: its header's offsets lie outside the file";

  Reader r(file + index_at, index_bytes, path);
  Contents& c = out->contents;
  c.kiln_version = r.str();
  c.arch = r.str();
  c.cpu = r.str();
  c.cpu_features = r.strs();
  c.source = r.str();
  c.metadata_json = r.str();
  if (!r.ok()) return r.error();
  if (c.arch != host_arch())
    return unsupported() << "package '" << path << "' was compiled for " << c.arch << "; this host is " << host_arch();
  std::vector<std::string> missing;
  const std::vector<std::string>& have = host_cpu_features();
  for (const std::string& f : c.cpu_features)
    if (!std::binary_search(have.begin(), have.end(), f)) missing.push_back(f);
  if (!missing.empty()) {
    return unsupported() << "package '" << path << "' was compiled for a " << c.cpu << " CPU; its kernels use "
                                 << join(missing) << ", which this host's CPU lacks: compile the model on this host";
  }
  c.inputs = read_infos(r);
  c.outputs = read_infos(r);
  c.kernel_choices.resize(r.count(64));
  for (kernels::KernelChoiceInfo& k : c.kernel_choices)
    for (std::string* s : {&k.kernel, &k.node, &k.impl, &k.knobs, &k.source, &k.why, &k.schedule, &k.workload}) *s = r.str();
  c.stats.num_kernels = static_cast<int>(r.i64());
  c.stats.num_runtime_kernels = static_cast<int>(r.i64());
  c.stats.arena_bytes = r.i64();
  c.stats.num_nodes_imported = static_cast<int>(r.i64());
  c.stats.num_nodes = static_cast<int>(r.i64());
  std::vector<Tensor> constants(r.count(28));
  for (Tensor& t : constants) {
    DType dtype = r.dtype();
    std::vector<int64_t> shape = r.i64s();
    int64_t offset = r.i64(), bytes = r.i64();
    if (!r.ok()) return r.error();
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 50) / d)) return r.error();
      numel *= d;
    }
    if (dtype_is_container(dtype) || dtype == DType::kString || dtype == DType::kUndefined ||
        numel * dtype_size(dtype) != bytes || offset < 0 || offset % kConstantAlign != 0 ||
        static_cast<uint64_t>(offset) > size - data_at || static_cast<uint64_t>(bytes) > size - data_at - offset)
      return r.error();
    void* data = const_cast<uint8_t*>(file + data_at + offset);
    t = Tensor::wrap(dtype, shape, std::shared_ptr<void>(out->mapping, data));
  }
  const int64_t library_at = r.i64(), library_bytes = r.i64();
  if (!r.ok() || library_at < 0 || library_bytes < 0 || static_cast<uint64_t>(library_at) > size - data_at ||
      static_cast<uint64_t>(library_bytes) > size - data_at - library_at)
    return r.error();

  std::vector<std::shared_ptr<runtime::Program>> programs(r.count(64));
  for (size_t pi = 0; pi < programs.size(); ++pi) {
    auto p = std::make_shared<runtime::Program>();
    p->registers.resize(r.count(40));
    for (runtime::RegisterInfo& reg : p->registers) {
      reg.name = r.str();
      reg.dtype = r.dtype();
      reg.shape = r.exprs();
      int64_t k = r.i64();
      if (k >= 0) {
        std::vector<int64_t> shape = r.i64s();
        if (!r.ok() || k >= static_cast<int64_t>(constants.size())) return r.error();
        reg.is_constant = true;
        reg.constant = constants[static_cast<size_t>(k)];
        if (reg.constant.dtype() != reg.dtype) return r.error();
        if (reg.constant.shape() != shape) {
          int64_t numel = 1;
          for (int64_t d : shape) numel = d < 0 ? -1 : numel * d;
          if (numel != reg.constant.numel()) return r.error();
          reg.constant = reg.constant.reshaped(shape);
        }
      }
      reg.arena_offset = r.i64();
      reg.is_output = r.u8() != 0;
      reg.elem_dtypes.resize(r.count(4));
      for (DType& t : reg.elem_dtypes) t = r.dtype();
    }
    p->instrs.resize(r.count(64));
    for (runtime::Instr& in : p->instrs) {
      in.op = static_cast<runtime::OpCode>(r.u8());
      in.callee = static_cast<int>(r.i64());
      in.inputs = r.ints();
      in.outputs = r.ints();
      in.release = r.ints();
      in.target = static_cast<int>(r.i64());
      in.end = static_cast<int>(r.i64());
      in.loop = static_cast<int>(r.i64());
      in.values = r.exprs();
      in.where = r.str();
      in.subprograms = r.ints();
      in.captures.resize(r.count(8));
      for (auto& cap : in.captures) cap = r.ints();
      in.attrs = r.i64s();
      in.fills_outputs = r.u8() != 0;
    }
    p->kernels.resize(r.count(24));
    for (runtime::CompiledKernel& k : p->kernels) {
      k.name = r.str();
      k.sym_names = r.strs();
      k.sym_slots = r.ints();
    }
    p->host_kernel_nodes = r.strs();
    for (int s : r.ints()) {
      if (s < 0 || static_cast<size_t>(s) >= pi) return r.error();
      p->subprograms.push_back(programs[static_cast<size_t>(s)]);
    }
    p->input_registers = r.ints();
    p->output_registers = r.ints();
    size_t nb = r.count(25);
    for (size_t i = 0; i < nb; ++i) {
      std::string name = r.str();
      uint8_t has = r.u8();
      int64_t lo = r.i64(), hi = r.i64();
      Interval b;
      if (has & 1) b.lo = lo;
      if (has & 2) b.hi = hi;
      p->bounds[name] = b;
    }
    p->symbols = r.strs();
    for (size_t i = 0; i < p->symbols.size(); ++i) p->symbol_slots[p->symbols[i]] = static_cast<int>(i);
    p->static_plan = r.u8() != 0;
    p->arena_bytes = r.i64();
    if (!r.ok() || !program_consistent(*p) || p->arena_bytes < 0) return r.error();
    programs[pi] = std::move(p);
  }
  const int64_t main_index = r.i64(), empty_index = r.i64();
  if (!r.ok() || main_index < 0 || main_index >= static_cast<int64_t>(programs.size()) || empty_index < -1 ||
      empty_index >= static_cast<int64_t>(programs.size()))
    return r.error();

  // The kernel library, from memory: the dynamic loader needs a file, which
  // a memfd is (never on disk; closed once the library is unloaded).
  if (library_bytes > 0) {
    int mfd = ::memfd_create("kiln-kernels", MFD_CLOEXEC);
    if (mfd < 0) return io_error() << "loading package '" << path << "': memfd_create: " << std::strerror(errno);
    const uint8_t* lib = file + data_at + library_at;
    for (int64_t done = 0; done < library_bytes;) {
      ssize_t k = ::write(mfd, lib + done, static_cast<size_t>(library_bytes - done));
      if (k <= 0) {
        ::close(mfd);
        return io_error() << "loading package '" << path << "': writing its kernel library: " << std::strerror(errno);
      }
      done += k;
    }
    std::string fd_path = "/proc/self/fd/" + std::to_string(mfd);
    void* handle = ::dlopen(fd_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      ::close(mfd);
      return invalid_model() << "package '" << path << "': its kernel library does not load: " << (why ? why : "?");
    }
    out->library = std::shared_ptr<void>(handle, [mfd](void* h) {
      ::dlclose(h);
      ::close(mfd);
    });
    for (const KernelCallback& cb : kernel_callbacks()) {
      std::string slot = std::string(kKernelSlotPrefix) + cb.name;
      if (void* at = ::dlsym(handle, slot.c_str())) *static_cast<void**>(at) = cb.address;
    }
  }
  ops::register_all_ops();
  for (const auto& p : programs) {
    for (runtime::CompiledKernel& k : p->kernels) {
      void* fn = out->library ? ::dlsym(out->library.get(), k.name.c_str()) : nullptr;
      if (fn == nullptr)
        return invalid_model() << "package '" << path << "' is corrupt: its library has no kernel " << k.name;
      k.fn = reinterpret_cast<runtime::KernelFn>(fn);
    }
    // Host kernels, rebuilt from their nodes; constant inputs from the registers.
    std::vector<const runtime::Instr*> caller(p->host_kernel_nodes.size(), nullptr);
    for (const runtime::Instr& in : p->instrs)
      if (in.op == runtime::OpCode::kCallHost) caller[static_cast<size_t>(in.callee)] = &in;
    for (size_t k = 0; k < p->host_kernel_nodes.size(); ++k) {
      auto g = parse_graph(p->host_kernel_nodes[k]);
      std::vector<Node*> nodes = g.is_ok() ? (*g)->nodes() : std::vector<Node*>{};
      if (nodes.size() != 1)
        return invalid_model() << "package '" << path << "' is corrupt: host kernel " << k << " has no valid node";
      Node* n = nodes[0];
      if (caller[k] != nullptr) {
        for (size_t i = 0; i < n->num_inputs() && i < caller[k]->inputs.size(); ++i) {
          int reg = caller[k]->inputs[i];
          if (n->input(i) && reg >= 0 && p->registers[static_cast<size_t>(reg)].is_constant)
            n->input(i)->set_constant(p->registers[static_cast<size_t>(reg)].constant);
        }
      }
      const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
      if (def == nullptr || !def->kernel)
        return invalid_argument() << "package '" << path << "': " << n->describe() << " has no runtime kernel in this Kiln";
      auto kernel = def->kernel(*n);
      if (!kernel.is_ok()) return kernel.status().with_context("package '" + path + "': " + n->describe());
      p->host_kernels.push_back(std::move(*kernel));
      out->host_graphs.push_back(std::shared_ptr<void>(std::move(*g)));
    }
  }
  c.program = programs[static_cast<size_t>(main_index)];
  if (empty_index >= 0) c.empty_dims = programs[static_cast<size_t>(empty_index)];
  // Programs keep the library and the mapping alive: a VM may outlive this object.
  return out;
}

}  // namespace kiln::package
