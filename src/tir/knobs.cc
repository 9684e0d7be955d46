#include "tir/knobs.h"

#include <algorithm>
#include <cctype>

namespace kiln::tir {

int64_t KnobSpace::size() const {
  int64_t n = 1;
  for (const Knob& k : knobs) n *= static_cast<int64_t>(k.values.size());
  return n;
}

Knobs KnobSpace::complete(const Knobs& point) const {
  Knobs full = point;
  for (const Knob& k : knobs)
    if (k.absent && !full.count(k.name)) full[k.name] = *k.absent;
  return full;
}

bool KnobSpace::contains(const Knobs& point) const {
  const Knobs full = complete(point);
  if (full.size() != knobs.size()) return false;
  for (const Knob& k : knobs) {
    auto it = full.find(k.name);
    if (it == full.end() || std::find(k.values.begin(), k.values.end(), it->second) == k.values.end())
      return false;
  }
  return !valid || valid(full);
}

std::string knobs_to_string(const Knobs& k) {
  std::string out;
  for (const auto& [name, v] : k) {
    if (!out.empty()) out += ' ';
    out += name + "=" + std::to_string(v);
  }
  return out;
}

Result<Knobs> parse_knobs(std::string_view text) {
  Knobs k;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    std::string_view item = text.substr(i, end - i);
    size_t eq = item.find('=');
    if (eq == 0 || eq == std::string_view::npos || eq + 1 == item.size())
      return invalid_argument() << "knobs: expected name=value, got '" << item << "'";
    std::string_view value = item.substr(eq + 1);
    bool neg = value.front() == '-';
    std::string_view digits = neg ? value.substr(1) : value;
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return invalid_argument() << "knobs: bad value in '" << item << "'";
    int64_t v = std::stoll(std::string(digits));
    if (!k.emplace(std::string(item.substr(0, eq)), neg ? -v : v).second)
      return invalid_argument() << "knobs: '" << item.substr(0, eq) << "' given twice";
    i = end;
  }
  return k;
}

Result<Knobs> sample_knobs(const KnobSpace& space, std::mt19937_64& rng) {
  for (const Knob& k : space.knobs)
    if (k.values.empty()) return invalid_argument() << "knob '" << k.name << "' has no values";
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Knobs point;
    for (const Knob& k : space.knobs) {
      std::uniform_int_distribution<size_t> pick(0, k.values.size() - 1);
      point[k.name] = k.values[pick(rng)];
    }
    if (!space.valid || space.valid(point)) return point;
  }
  return invalid_argument() << "no valid knob values found in 1000 draws";
}

std::vector<Knobs> enumerate_knobs(const KnobSpace& space, size_t limit) {
  std::vector<Knobs> out;
  std::vector<size_t> pos(space.knobs.size(), 0);
  for (const Knob& k : space.knobs)
    if (k.values.empty()) return out;
  while (out.size() < limit) {
    Knobs point;
    for (size_t i = 0; i < space.knobs.size(); ++i) point[space.knobs[i].name] = space.knobs[i].values[pos[i]];
    if (!space.valid || space.valid(point)) out.push_back(point);
    size_t d = 0;
    while (d < pos.size() && ++pos[d] == space.knobs[d].values.size()) pos[d++] = 0;
    if (d == pos.size()) break;
  }
  return out;
}

}  // namespace kiln::tir
