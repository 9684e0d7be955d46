// Evolutionary search over one workload's schedule spaces, guided by a score
// (the cost model's prediction; higher is faster), in the spirit of Ansor's:
// a population seeded with the best measured points and draws from every
// candidate's space evolves for a few generations (parents chosen by score in
// tournaments; children by crossover, knob by knob, of two parents of one
// candidate, then mutation of one knob, often to a neighbouring value;
// invalid children are dropped), every point scored once, and the
// best-scored points not yet measured are returned. Nothing is measured
// here: the tuner measures what this proposes.
#pragma once

#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tir/knobs.h"
#include "tune/trial.h"

namespace kiln::tune {

struct EvolveOptions {
  int population = 24;
  int generations = 8;
  double crossover = 0.5;   // share of children bred from two parents (the rest copy one)
  double mutation = 0.85;   // chance a child has one knob moved
  int seeds = 8;            // measured points (the fastest) seeding the population
};

// Scores points (higher: predicted faster); a point it cannot score gets -inf.
using ScoreFn = std::function<std::vector<float>(const std::vector<Trial>&)>;

// Up to `n` points of `spaces` (per candidate), none in `measured_points` (by
// candidate and knobs), best score first. `measured` (seconds, point) seeds
// the population with its fastest. Deterministic for one rng state and score.
std::vector<Trial> evolve(const std::map<std::string, tir::KnobSpace>& spaces,
                          const std::vector<std::pair<double, Trial>>& measured,
                          const std::set<std::pair<std::string, std::string>>& measured_points, const ScoreFn& score,
                          int n, std::mt19937_64& rng, const EvolveOptions& options = {});

}  // namespace kiln::tune
