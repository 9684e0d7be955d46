// The evolutionary search (tune/evolve.h) on spaces with a known optimum
// under a known score: it finds points a blind draw of the same number of
// scores rarely does, proposes only valid unmeasured points, and repeats
// itself for one seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tune/evolve.h"

namespace kiln::tune {
namespace {

tir::KnobSpace grid() {
  tir::KnobSpace s;
  for (const char* name : {"a", "b", "c", "d"}) {
    tir::Knob k;
    k.name = name;
    for (int64_t v = 0; v < 16; ++v) k.values.push_back(v);
    s.knobs.push_back(k);
  }
  // Half the points are invalid: a + b even.
  s.valid = [](const tir::Knobs& k) { return (k.at("a") + k.at("b")) % 2 == 0; };
  return s;
}

// Higher near (11, 5, 13, 2) on candidate "x"; candidate "y" scores lower everywhere.
float value(const Trial& t) {
  auto k = tir::parse_knobs(t.knobs);
  if (!k.is_ok()) return -1e9f;
  const int64_t target[4] = {11, 5, 13, 2};
  const char* names[4] = {"a", "b", "c", "d"};
  double d = 0;
  for (int i = 0; i < 4; ++i) {
    auto it = k->find(names[i]);
    d += std::abs(static_cast<double>((it == k->end() ? 0 : it->second) - target[i]));
  }
  return static_cast<float>(-d - (t.candidate == "y" ? 10 : 0));
}

struct Counting {
  int64_t scored = 0;
  ScoreFn fn() {
    return [this](const std::vector<Trial>& trials) {
      std::vector<float> out;
      for (const Trial& t : trials) out.push_back(value(t));
      scored += static_cast<int64_t>(trials.size());
      return out;
    };
  }
};

TEST(Evolve, FindsWhatTheScoreRewardsWithinItsBudget) {
  std::map<std::string, tir::KnobSpace> spaces = {{"x", grid()}, {"y", grid()}};
  std::vector<std::pair<double, Trial>> measured = {{2e-3, {"x", "a=0 b=0 c=0 d=0"}}, {1e-3, {"y", "a=1 b=1 c=1 d=1"}}};
  std::set<std::pair<std::string, std::string>> tried = {{"x", "a=0 b=0 c=0 d=0"}, {"y", "a=1 b=1 c=1 d=1"}};
  int better = 0, blind_better = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    Counting counter;
    std::mt19937_64 rng(seed);
    std::vector<Trial> out = evolve(spaces, measured, tried, counter.fn(), 8, rng);
    ASSERT_EQ(out.size(), 8u);
    std::set<std::pair<std::string, std::string>> distinct;
    for (const Trial& t : out) {
      auto k = tir::parse_knobs(t.knobs);
      ASSERT_TRUE(k.is_ok());
      EXPECT_TRUE(spaces.at(t.candidate).contains(*k)) << t.knobs;
      EXPECT_FALSE(tried.count({t.candidate, t.knobs})) << "measured points are not proposed again";
      EXPECT_TRUE(distinct.insert({t.candidate, t.knobs}).second);
    }
    for (size_t i = 1; i < out.size(); ++i) EXPECT_GE(value(out[i - 1]), value(out[i])) << "best score first";
    // The same number of scores spent on blind draws.
    std::mt19937_64 blind_rng(seed + 1000);
    float blind_best = -1e9f;
    for (int64_t i = 0; i < counter.scored; ++i) {
      auto k = tir::sample_knobs(spaces.at("x"), blind_rng);
      ASSERT_TRUE(k.is_ok());
      blind_best = std::max(blind_best, value(Trial{"x", tir::knobs_to_string(*k)}));
    }
    if (value(out[0]) > blind_best) ++better;
    if (value(out[0]) < blind_best) ++blind_better;
    std::printf("seed %d: evolve %.0f, blind %.0f over %lld scores\n", static_cast<int>(seed), value(out[0]), blind_best,
                static_cast<long long>(counter.scored));
    EXPECT_EQ(out[0].candidate, "x");
  }
  EXPECT_GE(better, 8) << "the search beats blind draws of as many scores";
  EXPECT_EQ(blind_better, 0);
}

TEST(Evolve, RepeatsItselfAndHandlesEdges) {
  std::map<std::string, tir::KnobSpace> spaces = {{"x", grid()}};
  Counting c1, c2;
  std::mt19937_64 r1(7), r2(7);
  std::vector<Trial> a = evolve(spaces, {}, {}, c1.fn(), 5, r1), b = evolve(spaces, {}, {}, c2.fn(), 5, r2);
  ASSERT_EQ(a.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].knobs, b[i].knobs);
  // No knob space, nothing asked, or a score that rates nothing: no proposals.
  std::mt19937_64 r3(1);
  EXPECT_TRUE(evolve({{"plain", tir::KnobSpace{}}}, {}, {}, c1.fn(), 4, r3).empty());
  EXPECT_TRUE(evolve(spaces, {}, {}, c1.fn(), 0, r3).empty());
  ScoreFn none = [](const std::vector<Trial>& t) { return std::vector<float>(t.size(), -INFINITY); };
  EXPECT_TRUE(evolve(spaces, {}, {}, none, 4, r3).empty());
  // A tiny space runs out: every unmeasured valid point at most.
  tir::KnobSpace two;
  two.knobs.push_back(tir::Knob{"m", {1, 2, 3}, std::nullopt});
  std::mt19937_64 r4(2);
  std::vector<Trial> small = evolve({{"x", two}}, {{1e-3, {"x", "m=2"}}}, {{"x", "m=2"}}, c1.fn(), 8, r4);
  EXPECT_EQ(small.size(), 2u);
}

}  // namespace
}  // namespace kiln::tune
