#include "test_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "frontend/onnx/import.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

bool read_varint(const std::string& b, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= b.size()) return false;
    auto byte = static_cast<unsigned char>(b[(*pos)++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

Result<std::vector<NamedTensor>> load_numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<NamedTensor> tensors;
  for (int i = 0;; ++i) {
    fs::path file = dir / (prefix + std::to_string(i) + ".pb");
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) break;
    std::ifstream in(file, std::ios::binary);
    if (!in) return io_error() << "cannot open '" << file.string() << "'";
    std::ostringstream ss;
    ss << in.rdbuf();
    KILN_ASSIGN_OR_RETURN(Tensor t, read_tensor_proto_file(file.string()));
    tensors.push_back({tensor_proto_name(ss.str()), file.string(), std::move(t)});
  }
  return tensors;
}

Result<TestDataSet> load_one(const fs::path& dir) {
  TestDataSet set;
  set.dir = dir.string();
  KILN_ASSIGN_OR_RETURN(set.inputs, load_numbered(dir, "input_"));
  KILN_ASSIGN_OR_RETURN(set.outputs, load_numbered(dir, "output_"));
  if (set.outputs.empty()) {
    return not_found() << "test data directory '" << set.dir << "' has no output_0.pb";
  }
  return set;
}

}  // namespace

std::string tensor_proto_name(const std::string& bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t key = 0;
    if (!read_varint(bytes, &pos, &key)) return "";
    uint64_t field = key >> 3;
    uint64_t wire = key & 7;
    uint64_t skip = 0;
    switch (wire) {
      case 0: {
        uint64_t ignored;
        if (!read_varint(bytes, &pos, &ignored)) return "";
        continue;
      }
      case 1: skip = 8; break;
      case 5: skip = 4; break;
      case 2: {
        uint64_t len = 0;
        if (!read_varint(bytes, &pos, &len) || len > bytes.size() - pos) return "";
        if (field == 8) return bytes.substr(pos, len);
        skip = len;
        break;
      }
      default: return "";
    }
    if (skip > bytes.size() - pos) return "";
    pos += skip;
  }
  return "";
}

Result<std::vector<TestDataSet>> load_test_data(const std::string& dir) {
  std::error_code ec;
  fs::path root(dir);
  if (!fs::is_directory(root, ec)) return not_found() << "test data directory '" << dir << "' does not exist";
  std::vector<TestDataSet> sets;
  if (fs::is_regular_file(root / "input_0.pb", ec) || fs::is_regular_file(root / "output_0.pb", ec)) {
    KILN_ASSIGN_OR_RETURN(TestDataSet set, load_one(root));
    sets.push_back(std::move(set));
    return sets;
  }
  std::vector<std::pair<int, fs::path>> subdirs;
  const std::string prefix = "test_data_set_";
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind(prefix, 0) != 0) continue;
    std::string num = name.substr(prefix.size());
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit) || num.size() > 6) continue;
    subdirs.emplace_back(std::stoi(num), entry.path());
  }
  if (ec) return io_error() << "cannot list '" << dir << "': " << ec.message();
  if (subdirs.empty()) {
    return not_found() << "'" << dir
                       << "' holds neither input_0.pb/output_0.pb nor test_data_set_* directories";
  }
  std::sort(subdirs.begin(), subdirs.end());
  for (const auto& [num, path] : subdirs) {
    KILN_ASSIGN_OR_RETURN(TestDataSet set, load_one(path));
    sets.push_back(std::move(set));
  }
  return sets;
}

}  // namespace kiln::cli
