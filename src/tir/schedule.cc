#include "tir/schedule.h"

#include <cctype>
#include <map>
#include <set>

namespace kiln::tir {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_reduction(const ComputeDef& st) {
  return st.combiner != Combiner::kNone || !st.reduce_axes.empty();
}

Primitive prim(std::string kind, const std::string& stage, std::vector<std::string> axes = {},
               int64_t factor = 0) {
  Primitive p;
  p.kind = std::move(kind);
  p.stage = stage;
  p.axes = std::move(axes);
  p.factor = factor;
  return p;
}

}  // namespace

std::string Schedule::to_string() const {
  std::string out;
  for (const Primitive& p : prims) {
    out += p.kind + "(" + p.stage;
    for (const auto& a : p.axes) out += ", " + a;
    if (p.kind == "split") out += ", " + std::to_string(p.factor);
    out += ")\n";
  }
  return out;
}

Result<Schedule> parse_schedule(std::string_view text) {
  Schedule s;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    size_t open = line.find('(');
    if (open == std::string_view::npos || line.back() != ')') {
      return invalid_argument() << "schedule line " << line_no << ": expected kind(args): " << line;
    }
    Primitive p;
    p.kind = std::string(trim(line.substr(0, open)));
    std::vector<std::string> args;
    std::string_view rest = line.substr(open + 1, line.size() - open - 2);
    while (true) {
      size_t comma = rest.find(',');
      std::string_view arg = trim(rest.substr(0, comma));
      if (arg.empty() || arg.find_first_of("() \t") != std::string_view::npos) {
        return invalid_argument() << "schedule line " << line_no << ": bad argument in: " << line;
      }
      args.emplace_back(arg);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    static const std::map<std::string, std::pair<size_t, size_t>, std::less<>> kArity = {
        {"inline", {1, 1}},   {"split", {3, 3}},     {"reorder", {2, 1000}}, {"parallel", {2, 2}},
        {"vectorize", {2, 2}}, {"unroll", {2, 2}}, {"cache_write", {2, 2}}};
    auto ar = kArity.find(p.kind);
    if (ar == kArity.end()) {
      return invalid_argument() << "schedule line " << line_no << ": unknown primitive '" << p.kind
                                << "'";
    }
    if (args.size() < ar->second.first || args.size() > ar->second.second) {
      return invalid_argument() << "schedule line " << line_no << ": wrong number of arguments: "
                                << line;
    }
    p.stage = args[0];
    if (p.kind == "split") {
      const std::string& f = args[2];
      bool digits = !f.empty() && f.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || f.size() > 18) {
        return invalid_argument() << "schedule line " << line_no << ": bad split factor '" << f
                                  << "'";
      }
      p.factor = std::stoll(f);
      p.axes = {args[1]};
    } else {
      p.axes.assign(args.begin() + 1, args.end());
    }
    s.prims.push_back(std::move(p));
  }
  return s;
}

Schedule naive_schedule(const KernelDef&) { return Schedule(); }

Schedule default_schedule(const KernelDef& k) {
  Schedule s;
  std::set<std::string> params;
  for (const auto& b : k.params) params.insert(b.name);
  for (const ComputeDef& st : k.stages) {
    if (!params.count(st.name) && !is_reduction(st)) {
      s.prims.push_back(prim("inline", st.name));
      continue;
    }
    size_t n = st.axes.size();
    if (n == 0) continue;
    const std::string& innermost = st.axes[n - 1];
    auto inner_extent = st.shape[n - 1].as_const();
    if (is_reduction(st)) {
      if (n >= 2 && (!inner_extent || *inner_extent >= 8)) {
        s.prims.push_back(prim("cache_write", st.name, {st.axes[n - 2]}));
        s.prims.push_back(prim("vectorize", st.name, {innermost}));
      }
      s.prims.push_back(prim("parallel", st.name, {st.axes[0]}));
    } else {
      if (!inner_extent || *inner_extent > 1) {
        s.prims.push_back(prim("vectorize", st.name, {innermost}));
      }
      if (n >= 2) s.prims.push_back(prim("parallel", st.name, {st.axes[0]}));
    }
  }
  return s;
}

}  // namespace kiln::tir
