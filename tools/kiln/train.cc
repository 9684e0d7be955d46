// Checkpoint files: "KILNCKPT 1\n", a line "epoch E batch B step S count N",
// then per tensor a line "NAME BYTES" and that many bytes of .npy.
#include "train.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "npy.h"

namespace kiln::cli {

namespace {
constexpr const char* kMagic = "KILNCKPT 1";
}

Status write_checkpoint(const std::string& path, const Checkpoint& c) {
  std::ostringstream os;
  os << kMagic << "\n"
     << "epoch " << c.epoch << " batch " << c.batch << " step " << c.step << " count " << c.tensors.size() << "\n";
  for (const auto& [name, t] : c.tensors) {
    if (name.find_first_of(" \n") != std::string::npos)
      return invalid_argument() << "checkpoint: the tensor name '" << name << "' holds a space or newline";
    KILN_ASSIGN_OR_RETURN(std::string npy, encode_npy(t));
    os << name << " " << npy.size() << "\n" << npy;
  }
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return io_error() << "cannot write the checkpoint '" << tmp << "'";
    const std::string bytes = os.str();
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return io_error() << "writing the checkpoint '" << tmp << "' failed (disk full?)";
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return io_error() << "cannot rename '" << tmp << "' to '" << path << "': " << std::strerror(err);
  }
  return Status::ok();
}

Result<Checkpoint> read_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found() << "cannot open the checkpoint '" << path << "'";
  std::ostringstream all;
  all << f.rdbuf();
  const std::string bytes = all.str();
  auto bad = [&](const std::string& what) -> Status {
    return invalid_argument() << "checkpoint '" << path << "' is damaged or not a Kiln checkpoint: " << what;
  };
  size_t at = 0;
  auto line = [&](std::string& out) {
    size_t nl = bytes.find('\n', at);
    if (nl == std::string::npos) return false;
    out = bytes.substr(at, nl - at);
    at = nl + 1;
    return true;
  };
  std::string text;
  if (!line(text) || text != kMagic) return bad("no checkpoint header");
  Checkpoint c;
  size_t count = 0;
  std::string e, b, s, n;
  if (!line(text)) return bad("no progress line");
  std::istringstream head(text);
  if (!(head >> e >> c.epoch >> b >> c.batch >> s >> c.step >> n >> count) || e != "epoch" || b != "batch" ||
      s != "step" || n != "count" || c.epoch < 0 || c.batch < 0 || c.step < 0)
    return bad("a malformed progress line");
  for (size_t i = 0; i < count; ++i) {
    if (!line(text)) return bad("it ends before tensor " + std::to_string(i));
    std::istringstream rec(text);
    std::string name;
    size_t size = 0;
    if (!(rec >> name >> size) || size > bytes.size() - at) return bad("tensor " + std::to_string(i) + " is cut off");
    KILN_ASSIGN_OR_RETURN(Tensor t, parse_npy(bytes.substr(at, size), path + ": " + name));
    at += size;
    c.tensors[name] = std::move(t);
  }
  if (at != bytes.size()) return bad("bytes after its last tensor");
  return c;
}

}  // namespace kiln::cli
