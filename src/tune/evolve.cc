#include "tune/evolve.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::tune {

namespace {

using Key = std::pair<std::string, std::string>;

struct Point {
  std::string candidate;
  tir::Knobs knobs;
  Key key() const { return {candidate, tir::knobs_to_string(knobs)}; }
};

// One knob of `p` moved to another value of its range: half the time a
// neighbouring one (ranges are ordered: tile sizes, distances), else any;
// false when none can move.
bool mutate(Point& p, const tir::KnobSpace& space, std::mt19937_64& rng) {
  std::vector<const tir::Knob*> movable;
  for (const tir::Knob& k : space.knobs)
    if (k.values.size() > 1) movable.push_back(&k);
  if (movable.empty()) return false;
  const tir::Knob& k = *movable[rng() % movable.size()];
  auto it = p.knobs.find(k.name);
  const int64_t old = it == p.knobs.end() ? k.absent.value_or(k.values.front()) : it->second;
  auto at = std::find(k.values.begin(), k.values.end(), old);
  if (at != k.values.end() && rng() % 2 == 0) {
    const size_t i = static_cast<size_t>(at - k.values.begin());
    const bool up = i == 0 || (i + 1 < k.values.size() && rng() % 2 == 0);
    p.knobs[k.name] = k.values[up ? i + 1 : i - 1];
    return true;
  }
  std::vector<int64_t> others;
  for (int64_t v : k.values)
    if (v != old) others.push_back(v);
  if (others.empty()) return false;
  p.knobs[k.name] = others[rng() % others.size()];
  return true;
}

}  // namespace

std::vector<Trial> evolve(const std::map<std::string, tir::KnobSpace>& spaces,
                          const std::vector<std::pair<double, Trial>>& measured,
                          const std::set<std::pair<std::string, std::string>>& measured_points, const ScoreFn& score,
                          int n, std::mt19937_64& rng, const EvolveOptions& options) {
  std::vector<std::string> searchable;
  for (const auto& [name, space] : spaces)
    if (!space.knobs.empty()) searchable.push_back(name);
  if (n <= 0 || searchable.empty()) return {};

  std::map<Key, float> scores;  // every point scored so far
  std::vector<Point> population;
  std::set<Key> in_population;
  auto add = [&](Point p) {
    auto sp = spaces.find(p.candidate);
    if (sp == spaces.end() || !sp->second.contains(p.knobs)) return false;
    if (!in_population.insert(p.key()).second) return false;
    population.push_back(std::move(p));
    return true;
  };
  auto score_new = [&](const std::vector<Point>& points) {
    std::vector<Trial> fresh;
    for (const Point& p : points)
      if (!scores.count(p.key())) fresh.push_back(Trial{p.candidate, tir::knobs_to_string(p.knobs)});
    if (fresh.empty()) return;
    std::vector<float> s = score(fresh);
    for (size_t i = 0; i < fresh.size(); ++i)
      scores[{fresh[i].candidate, fresh[i].knobs}] =
          i < s.size() && std::isfinite(s[i]) ? s[i] : -std::numeric_limits<float>::infinity();
  };

  // Seeds: the fastest measured points of the searchable candidates.
  std::vector<std::pair<double, Trial>> fastest = measured;
  std::stable_sort(fastest.begin(), fastest.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [s, tr] : fastest) {
    if (static_cast<int>(population.size()) >= options.seeds) break;
    if (std::find(searchable.begin(), searchable.end(), tr.candidate) == searchable.end()) continue;
    auto k = tir::parse_knobs(tr.knobs);
    if (k.is_ok()) add(Point{tr.candidate, *k});
  }
  // The rest drawn from the candidates' spaces, the candidates in turn.
  for (int attempt = 0; static_cast<int>(population.size()) < options.population && attempt < 4 * options.population;
       ++attempt) {
    const std::string& c = searchable[static_cast<size_t>(attempt) % searchable.size()];
    auto k = tir::sample_knobs(spaces.at(c), rng);
    if (k.is_ok()) add(Point{c, *k});
  }
  score_new(population);

  auto score_of = [&](const Point& p) { return scores.at(p.key()); };
  auto tournament = [&]() -> const Point& {
    const Point& a = population[rng() % population.size()];
    const Point& b = population[rng() % population.size()];
    return score_of(a) >= score_of(b) ? a : b;
  };
  for (int g = 0; g < options.generations && !population.empty(); ++g) {
    std::vector<Point> children;
    std::set<Key> seen;
    std::uniform_real_distribution<double> u(0, 1);
    for (int attempt = 0; static_cast<int>(children.size()) < options.population && attempt < 8 * options.population;
         ++attempt) {
      Point child = tournament();
      if (u(rng) < options.crossover) {
        const Point& other = tournament();
        if (other.candidate == child.candidate)
          for (const auto& [name, v] : other.knobs)
            if (rng() % 2) child.knobs[name] = v;
      }
      const tir::KnobSpace& space = spaces.at(child.candidate);
      if (u(rng) < options.mutation) mutate(child, space, rng);
      if (!space.contains(child.knobs) || !seen.insert(child.key()).second) continue;
      children.push_back(std::move(child));
    }
    score_new(children);
    // The next population: the best of parents and children by score.
    for (Point& c : children)
      if (!in_population.count(c.key())) {
        in_population.insert(c.key());
        population.push_back(std::move(c));
      }
    std::stable_sort(population.begin(), population.end(),
                     [&](const Point& a, const Point& b) { return score_of(a) > score_of(b); });
    if (static_cast<int>(population.size()) > options.population) {
      for (size_t i = static_cast<size_t>(options.population); i < population.size(); ++i)
        in_population.erase(population[i].key());
      population.resize(static_cast<size_t>(options.population));
    }
  }

  // The best-scored points of everything scored, measured ones left out.
  std::vector<std::pair<float, Key>> ranked;
  for (const auto& [key, s] : scores)
    if (!measured_points.count(key) && std::isfinite(s)) ranked.push_back({s, key});
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Trial> out;
  for (const auto& [s, key] : ranked) {
    if (static_cast<int>(out.size()) >= n) break;
    out.push_back(Trial{key.first, key.second});
  }
  return out;
}

}  // namespace kiln::tune
