#include "strategy/strategy.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "strategy/template.h"

namespace kiln::strategy {

void register_gemm_candidates();  // gemm.cc
void register_conv_candidates();  // conv.cc
void register_pool_candidates();  // pool.cc
void register_attention_candidates();  // attention.cc
void register_blocked_candidates();  // blocked.cc
void register_conv_grad_candidates();  // conv_grad.cc

namespace {

struct Registry {
  std::vector<std::unique_ptr<Candidate>> candidates;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string key(const std::string& domain, const std::string& op) { return domain.empty() ? op : domain + ":" + op; }

int priority_of(const Candidate& c, const Node& n, const Target& t) {
  return c.priority_for ? c.priority_for(n, t) : c.priority;
}

tir::Knobs default_knobs_of(const Candidate& c, const Node& n, const Target& t) {
  return c.default_knobs ? c.default_knobs(n, t) : tir::Knobs{};
}

bool knobs_valid(const Candidate& c, const Node& n, const Target& t, const tir::Knobs& k) {
  tir::KnobSpace space = c.space ? c.space(n, t) : tir::KnobSpace{};
  return space.contains(k);
}

std::string format_ms(double seconds) {
  std::ostringstream os;
  os.precision(3);
  os << seconds * 1e3 << " ms";
  return os.str();
}

}  // namespace

void register_builtin_candidates() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_gemm_candidates();
    register_conv_candidates();
    register_pool_candidates();
    register_attention_candidates();
    register_blocked_candidates();
    register_conv_grad_candidates();
  });
}

void register_candidate(Candidate c) {
  registry().candidates.push_back(std::make_unique<Candidate>(std::move(c)));
}

std::vector<const Candidate*> candidates_for(const std::string& domain, const std::string& op) {
  register_builtin_candidates();
  std::vector<const Candidate*> out;
  std::string want = key(domain, op);
  for (const auto& c : registry().candidates)
    if (c->op == want) out.push_back(c.get());
  std::stable_sort(out.begin(), out.end(), [](const Candidate* a, const Candidate* b) { return a->priority > b->priority; });
  return out;
}

const Candidate* find_candidate(const std::string& name) {
  register_builtin_candidates();
  for (const auto& c : registry().candidates)
    if (c->name == name) return c.get();
  return nullptr;
}

std::vector<const Candidate*> all_candidates() {
  register_builtin_candidates();
  std::vector<const Candidate*> out;
  for (const auto& c : registry().candidates) out.push_back(c.get());
  return out;
}

namespace {
// A choice's source and why as one attribute, "database: record 1.2 ms ...".
void split_source(const std::string& text, Choice& c) {
  size_t colon = text.find(": ");
  c.source = text.substr(0, colon);
  if (colon != std::string::npos) c.why = text.substr(colon + 2);
}
std::string joined_source(const Choice& c) { return c.why.empty() ? c.source : c.source + ": " + c.why; }
}  // namespace

std::optional<Choice> recorded_choice(const Node& n) {
  if (!n.has_attr(kImplAttr)) return std::nullopt;
  Choice c;
  c.candidate = n.attr_string(kImplAttr, "");
  auto knobs = tir::parse_knobs(n.attr_string(kKnobsAttr, ""));
  if (knobs.is_ok()) c.knobs = *knobs;
  split_source(n.attr_string(kSourceAttr, ""), c);
  return c;
}

void record_choice(Node& n, const Choice& c) {
  set_string_attr(n, kImplAttr, c.candidate);
  set_string_attr(n, kKnobsAttr, tir::knobs_to_string(c.knobs));
  set_string_attr(n, kSourceAttr, joined_source(c));
}

std::optional<Choice> recorded_generic_choice(const Node& n) {
  if (!n.has_attr(kGenericKnobsAttr)) return std::nullopt;
  auto knobs = tir::parse_knobs(n.attr_string(kGenericKnobsAttr, ""));
  if (!knobs.is_ok()) return std::nullopt;
  Choice c;
  c.candidate = kGenericCandidate;
  c.knobs = *knobs;
  split_source(n.attr_string(kGenericSourceAttr, ""), c);
  return c;
}

void record_generic_choice(Node& n, const Choice& c) {
  set_string_attr(n, kGenericKnobsAttr, tir::knobs_to_string(c.knobs));
  set_string_attr(n, kGenericSourceAttr, joined_source(c));
}

std::vector<const Candidate*> applicable_candidates(const Graph& g, const Node& n, const SelectOptions& options,
                                                    std::vector<std::string>* rejected) {
  std::vector<const Candidate*> applicable;
  for (const Candidate* c : candidates_for(n.domain(), n.op_type())) {
    std::string why;
    if (c->max_threads > 0 && options.threads > c->max_threads) {
      if (rejected)
        rejected->push_back(c->name + " (more than " + std::to_string(c->max_threads) + " thread" +
                            (c->max_threads == 1 ? "" : "s") + ")");
    } else if ((!c->applies || c->applies(n, &why)) && (!c->applies_in_graph || c->applies_in_graph(g, n, &why))) {
      applicable.push_back(c);
    } else if (rejected) {
      rejected->push_back(c->name + " (" + why + ")");
    }
  }
  std::stable_sort(applicable.begin(), applicable.end(), [&](const Candidate* a, const Candidate* b) {
    return priority_of(*a, n, options.target) > priority_of(*b, n, options.target);
  });
  return applicable;
}

namespace {

// The first choice source's record that names an applicable candidate with
// knobs in its space (nullopt: none). A strict source's record with knobs
// outside the space is an error naming the node; a non-strict source's
// (a stale database record) is ignored.
Result<std::optional<Choice>> source_choice(const Node& n, const std::vector<const Candidate*>& applicable,
                                            const SelectOptions& options) {
  for (const auto& src : options.sources) {
    std::optional<Choice> r = src->lookup(n, applicable, options.target);
    if (!r) continue;
    const Candidate* c = find_candidate(r->candidate);
    bool ok = c && std::find(applicable.begin(), applicable.end(), c) != applicable.end() &&
              knobs_valid(*c, n, options.target, r->knobs);
    if (!ok && src->strict() && c) {
      return invalid_argument() << n.describe() << ": " << src->name() << " " << r->candidate << " with knobs '"
                                << tir::knobs_to_string(r->knobs) << "': outside the candidate's knob space";
    }
    if (!ok) {
      // A record whose schedule no longer applies (a template changed, a
      // candidate went away): skipped, and said so.
      std::fprintf(stderr, "kiln: warning: %s: ignoring the %s record %s '%s' (%s)\n", n.describe().c_str(),
                   src->name().c_str(), r->candidate.c_str(), tir::knobs_to_string(r->knobs).c_str(),
                   !c ? "no such candidate"
                   : std::find(applicable.begin(), applicable.end(), c) == applicable.end()
                       ? "the candidate does not apply here"
                       : "knobs outside the candidate's space");
      continue;
    }
    if (r->source.empty()) r->source = "database";
    if (r->why.empty()) r->why = "record of " + src->name();
    return r;
  }
  return std::optional<Choice>();
}

}  // namespace

// The fastest of `candidates` for `n`, each with its default knobs, timed
// by options.measure; its why lists every trial ("fastest of a 1.2 ms, b
// failed"). nullopt: every trial failed.
struct Measured {
  Choice choice;
  double seconds = 0;
};
static std::optional<Measured> measure_fastest(const Node& n, const std::vector<const Candidate*>& candidates,
                                               const SelectOptions& options) {
  if (!options.measure) return std::nullopt;
  std::optional<Measured> best;
  std::string timings;
  for (const Candidate* c : candidates) {
    Choice trial{c->name, default_knobs_of(*c, n, options.target), "measured", ""};
    auto t = options.measure(n, trial);
    if (!t.is_ok()) {
      timings += (timings.empty() ? "" : ", ") + c->name + " failed";
      continue;
    }
    timings += (timings.empty() ? "" : ", ") + c->name + " " + format_ms(*t);
    if (!best || *t < best->seconds) best = Measured{trial, *t};
  }
  if (best) best->choice.why = "fastest of " + timings;
  return best;
}

std::string unmeasured_choice(const Graph& g, const Node& n, const SelectOptions& options, bool* from_source) {
  if (from_source) *from_source = false;
  std::vector<const Candidate*> applicable = applicable_candidates(g, n, options, nullptr);
  if (applicable.empty()) return "";
  auto r = source_choice(n, applicable, options);
  if (!r.is_ok() || *r) {
    // A source decides (a strict one's error is select_kernels' to report).
    if (from_source) *from_source = true;
    return r.is_ok() ? (*r)->candidate : "";
  }
  return applicable.front()->name;
}

Result<int> select_kernels(Graph& g, const SelectOptions& options) {
  int chosen = 0;
  std::vector<Node*> nodes = g.nodes();
  for (Node* n : nodes) {
    // If branches and Loop/Scan bodies: their kernels run in the same
    // program (a loop body's on every iteration), chosen the same way; a
    // constant the body captures is a constant there, so weights are packed.
    for (const auto& [name, a] : n->attrs()) {
      std::vector<Graph*> subs;
      if (a.g) subs.push_back(a.g.get());
      for (const auto& sub : a.graphs)
        if (sub) subs.push_back(sub.get());
      for (Graph* sub : subs) {
        auto k = select_kernels(*sub, options);
        if (!k.is_ok()) return k.status().with_context(n->describe() + " " + name);
        chosen += *k;
      }
    }
    if (n->has_attr(kImplAttr) || candidates_for(n->domain(), n->op_type()).empty()) continue;
    std::vector<std::string> rejected;
    std::vector<const Candidate*> applicable = applicable_candidates(g, *n, options, &rejected);
    if (applicable.empty()) continue;
    KILN_ASSIGN_OR_RETURN(std::optional<Choice> choice, source_choice(*n, applicable, options));
    const bool measurable = std::none_of(applicable.begin(), applicable.end(),
                                         [](const Candidate* c) { return c->fuses_producers; });
    if (!choice && options.measure && applicable.size() > 1 && measurable) {
      if (std::optional<Measured> m = measure_fastest(*n, applicable, options)) choice = m->choice;
    }
    if (!choice) {
      const Candidate* c = applicable.front();
      choice = Choice{c->name, default_knobs_of(*c, *n, options.target), "priority", ""};
      choice->why = "priority " + std::to_string(priority_of(*c, *n, options.target));
      if (options.measure && !measurable) choice->why += " (not measured: its kernel computes the node's producers too)";
      if (applicable.size() > 1) {
        choice->why += " over";
        for (size_t i = 1; i < applicable.size(); ++i)
          choice->why += " " + applicable[i]->name + " " + std::to_string(priority_of(*applicable[i], *n, options.target));
      }
      for (const std::string& r : rejected) choice->why += "; not " + r;
    }
    const Candidate* c = find_candidate(choice->candidate);
    record_choice(*n, *choice);
    if (c->transform) {
      Status st = c->transform(g, *n, choice->knobs);
      if (!st.is_ok()) return st.with_context(c->name + " transform of " + n->op_type() + " '" + n->name() + "'");
    }
    ++chosen;
  }
  g.remove_dead_values();
  return chosen;
}

Result<tir::Schedule> schedule_for(const tir::KernelDef& k, const std::string& stage, const Node* anchor) {
  if (anchor == nullptr) return tir::default_schedule(k);
  std::optional<Choice> choice = recorded_choice(*anchor);
  if (!choice) return tir::default_schedule(k);
  const Candidate* c = find_candidate(choice->candidate);
  if (c == nullptr) {
    return invalid_argument() << anchor->op_type() << " '" << anchor->name() << "': unknown implementation '"
                              << choice->candidate << "'";
  }
  std::string op = anchor->domain().empty() ? anchor->op_type() : anchor->domain() + ":" + anchor->op_type();
  if (c->op != op) {
    return invalid_argument() << anchor->op_type() << " '" << anchor->name() << "': implementation '" << c->name
                              << "' is for " << c->op;
  }
  tir::Schedule s;
  if (c->schedule) {
    auto templ = c->schedule(k, stage, choice->knobs);
    if (!templ.is_ok()) return templ.status().with_context(anchor->op_type() + " '" + anchor->name() + "'");
    s = std::move(*templ);
  } else {
    s = tir::default_schedule(k);
  }
  // The epilogue in the register tile, unless the template placed it (deferred to a loop).
  bool placed = std::any_of(s.prims.begin(), s.prims.end(),
                            [&](const tir::Primitive& p) { return p.kind == "fuse_epilogue" && p.stage == stage; });
  for (const tir::ComputeDef& st : k.stages)
    if (!placed && st.name == stage && !st.reduce_axes.empty()) s.prims.push_back(prim("fuse_epilogue", stage, {}));
  return s;
}

}  // namespace kiln::strategy
