// String ops (src/ops/strings.cc): kernels called directly against
// hand-written expectations (Python's str.split rules, shortest round-trip
// number text, Unicode case mapping), errors for bad strings, and a compiled
// model in which Cast, Equal and StringConcat on strings run their kernels
// while the numeric Cast stays compiled. A driver test: one case compiles.
#include <gtest/gtest.h>

#include <cmath>

#include "driver/compile.h"
#include "ops/registry.h"
#include "ops_test_harness.h"
#include "runtime/vm.h"

namespace kiln::ops {
namespace {

using testing::make_tensor;
using testing::try_kernel;
using testing::tt;

std::unique_ptr<Graph> new_graph() {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = 20;
  return g;
}

Tensor strings(std::vector<int64_t> shape, const std::vector<std::string>& v) {
  Tensor t(DType::kString, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.data_as<std::string>()[i] = v[i];
  return t;
}

std::vector<std::string> texts(const Tensor& t) {
  return std::vector<std::string>(t.data_as<std::string>(), t.data_as<std::string>() + t.numel());
}

TEST(StringOps, SplitFollowsPythonRules) {
  struct Case {
    const char* delimiter;  // nullptr: attribute absent
    int64_t maxsplit;       // -1: absent
    std::vector<std::string> in;
    std::vector<std::string> want;  // padded with ""
    std::vector<int64_t> counts;
  };
  for (const Case& c : std::vector<Case>{
           {".", -1, {"abc.com", "a..b", ""}, {"abc", "com", "", "a", "", "b", "", "", ""}, {2, 3, 1}},
           {nullptr, -1, {"  hello   world ! ", "x", "   "}, {"hello", "world", "!", "x", "", "", "", "", ""}, {3, 1, 0}},
           {"", 1, {" a b  c ", "one"}, {"a", "b  c", "one", ""}, {2, 1}},
           {"--", 1, {"a--b--c", "--"}, {"a", "b--c", "", ""}, {2, 2}},
       }) {
    SCOPED_TRACE(c.delimiter ? c.delimiter : "(whitespace)");
    auto g = new_graph();
    Value* x = g->add_input("x", tt(DType::kString, {static_cast<int64_t>(c.in.size())}));
    Node* n = g->add_node("StringSplit", {x}, {"y", "z"});
    if (c.delimiter) n->set_attr("delimiter", Attribute::of_string(c.delimiter));
    if (c.maxsplit >= 0) n->set_attr("maxsplit", Attribute::of_int(c.maxsplit));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    auto r = try_kernel(*n, {strings({static_cast<int64_t>(c.in.size())}, c.in)});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(texts(r->at(0)), c.want);
    EXPECT_EQ(r->at(0).shape()[0], static_cast<int64_t>(c.in.size()));
    for (size_t i = 0; i < c.counts.size(); ++i) EXPECT_EQ(r->at(1).get_i64(static_cast<int64_t>(i)), c.counts[i]);
  }
}

TEST(StringOps, CastPrintsShortestAndParsesNumbers) {
  auto g = new_graph();
  Value* f = g->add_input("f", tt(DType::kFloat32, {6}));
  Node* to_s = g->add_node("Cast", {f}, {"s"});
  to_s->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kString)));
  Value* s = g->add_input("t", tt(DType::kString, {5}));
  Node* to_d = g->add_node("Cast", {s}, {"d"});
  to_d->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kFloat64)));
  Node* to_i = g->add_node("Cast", {s}, {"i"});
  to_i->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt64)));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  const OpDef* cast = find_op("", "Cast");
  EXPECT_TRUE(cast->runs_kernel(*to_s) && cast->runs_kernel(*to_d));
  auto r = try_kernel(*to_s, {make_tensor(DType::kFloat32, {6}, {0.039187793, -2.5, 1e20, NAN, INFINITY, -INFINITY})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(texts(r->at(0)), (std::vector<std::string>{"0.039187793", "-2.5", "1e+20", "NaN", "INF", "-INF"}));
  r = try_kernel(*to_d, {strings({5}, {" 0.47892547", "-1e-3", "nan", "-INF", "0x10"})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->at(0).get_f64(0), 0.47892547);
  EXPECT_EQ(r->at(0).get_f64(1), -1e-3);
  EXPECT_TRUE(std::isnan(r->at(0).get_f64(2)));
  EXPECT_EQ(r->at(0).get_f64(3), -INFINITY);
  EXPECT_EQ(r->at(0).get_f64(4), 16.0);
  r = try_kernel(*to_i, {strings({5}, {"12", "-9007199254740993", "+4", "7", "0"})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->at(0).data_as<int64_t>()[1], -9007199254740993);  // exact, not through a double
  // To a narrower int: parsed as int64, then wrapped like C (300 -> 44 in int8, -1 -> 255 in uint8).
  for (auto [dt, want] : {std::pair{DType::kInt8, std::vector<double>{44, -1, 127}},
                          std::pair{DType::kUInt8, std::vector<double>{44, 255, 127}}}) {
    auto g8 = new_graph();
    Value* s8 = g8->add_input("t", tt(DType::kString, {3}));
    Node* to8 = g8->add_node("Cast", {s8}, {"b"});
    to8->set_attr("to", Attribute::of_int(static_cast<int64_t>(dt)));
    ASSERT_TRUE(testing::infer(*g8).is_ok());
    auto r8 = try_kernel(*to8, {strings({3}, {"300", "-1", "127"})});
    ASSERT_TRUE(r8.is_ok()) << r8.status().to_string();
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(r8->at(0).get_f64(k), want[static_cast<size_t>(k)]) << dtype_name(dt);
  }
  auto bad = try_kernel(*to_d, {strings({5}, {"1", "2", "three", "4", "5"})});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("'three' at element 2 is not a number"), std::string::npos)
      << bad.status().to_string();
  bad = try_kernel(*to_i, {strings({5}, {"1", "2.5", "3", "4", "5"})});
  ASSERT_FALSE(bad.is_ok());
}

TEST(StringOps, NormalizerStopWordsAndCase) {
  auto run = [](const char* action, int case_sensitive, std::vector<std::string> stops,
                const std::vector<std::string>& in, std::vector<int64_t> shape) {
    auto g = new_graph();
    Value* x = g->add_input("x", tt(DType::kString, shape.size() == 1 ? Shape{shape[0]} : Shape{1, shape[1]}));
    Node* n = g->add_node("StringNormalizer", {x}, {"y"});
    n->set_attr("case_change_action", Attribute::of_string(action));
    n->set_attr("is_case_sensitive", Attribute::of_int(case_sensitive));
    if (!stops.empty()) {
      Attribute a;
      a.kind = Attribute::Kind::kStrings;
      a.strings = stops;
      n->set_attr("stopwords", a);
    }
    EXPECT_TRUE(testing::infer(*g).is_ok());
    auto r = try_kernel(*n, {strings(shape, in)});
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::make_pair(texts(r->at(0)), r->at(0).shape()) : std::make_pair(std::vector<std::string>{}, std::vector<int64_t>{});
  };
  auto [a, sa] = run("UPPER", 1, {"monday"}, {"monday", "Monday", "tuesday"}, {3});
  EXPECT_EQ(a, (std::vector<std::string>{"MONDAY", "TUESDAY"}));
  auto [b, sb] = run("LOWER", 0, {"MONDAY"}, {"monday", "Monday", "Straße", "ÉTÉ"}, {1, 4});
  EXPECT_EQ(b, (std::vector<std::string>{"straße", "été"}));
  EXPECT_EQ(sb, (std::vector<int64_t>{1, 2}));
  auto [c, sc] = run("NONE", 0, {"monday"}, {"monday"}, {1});
  EXPECT_EQ(c, (std::vector<std::string>{""}));  // everything removed: one empty string
}

TEST(StringOps, RegexFullMatchAndRe2OnlySyntax) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kString, {4}));
  Node* n = g->add_node("RegexFullMatch", {x}, {"y"});
  n->set_attr("pattern", Attribute::of_string(R"((\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$))"));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  auto r = try_kernel(*n, {strings({4}, {"account@gmail.com", "account@hotmail.com", "not email", "a@yahoo.com."})});
  ASSERT_TRUE(r.is_ok());
  std::vector<double> got;
  for (int64_t i = 0; i < 4; ++i) got.push_back(r->at(0).get_f64(i));
  EXPECT_EQ(got, (std::vector<double>{1, 0, 0, 1}));
  auto g2 = new_graph();
  Value* x2 = g2->add_input("x", tt(DType::kString, {1}));
  g2->add_node("RegexFullMatch", {x2}, {"y"})->set_attr("pattern", Attribute::of_string("(?i)abc"));
  Status st = testing::infer(*g2);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("RE2 syntax"), std::string::npos) << st.to_string();
  auto g3 = new_graph();
  Value* x3 = g3->add_input("x", tt(DType::kString, {1}));
  g3->add_node("RegexFullMatch", {x3}, {"y"})->set_attr("pattern", Attribute::of_string("(unclosed"));
  EXPECT_FALSE(testing::infer(*g3).is_ok());
}

// TfIdfVectorizer over a string pool (unigrams a, b; bigrams ab, bc), skips
// up to 1: in "a b x c a b" unigrams count once (a 2, b 2), ab twice
// (adjacent), bc once (one token skipped). The same counts over an int64 pool
// for a [2, C] batch, and the three weightings.
TEST(StringOps, TfIdfVectorizerCountsSkipGrams) {
  auto make = [](bool strings, const char* mode, Shape shape) {
    auto g = new_graph();
    Value* x = g->add_input("x", tt(strings ? DType::kString : DType::kInt64, std::move(shape)));
    Node* n = g->add_node("TfIdfVectorizer", {x}, {"y"});
    n->set_attr("mode", Attribute::of_string(mode));
    n->set_attr("min_gram_length", Attribute::of_int(1));
    n->set_attr("max_gram_length", Attribute::of_int(2));
    n->set_attr("max_skip_count", Attribute::of_int(1));
    n->set_attr("ngram_counts", Attribute::of_ints({0, 2}));
    n->set_attr("ngram_indexes", Attribute::of_ints({0, 1, 2, 3}));
    n->set_attr("weights", Attribute::of_floats({1, 0.5, 2, 3}));
    if (strings) {
      Attribute pool;
      pool.kind = Attribute::Kind::kStrings;
      pool.strings = {"a", "b", "a", "b", "b", "c"};
      n->set_attr("pool_strings", pool);
    } else {
      n->set_attr("pool_int64s", Attribute::of_ints({1, 2, 1, 2, 2, 3}));
    }
    EXPECT_TRUE(testing::infer(*g).is_ok());
    return std::make_pair(std::move(g), n);
  };
  auto values = [](const Tensor& t) {
    std::vector<double> v;
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_f64(i));
    return v;
  };
  for (const char* mode : {"TF", "IDF", "TFIDF"}) {
    SCOPED_TRACE(mode);
    std::vector<double> want = std::string(mode) == "TF"    ? std::vector<double>{2, 2, 2, 1}
                               : std::string(mode) == "IDF" ? std::vector<double>{1, 0.5, 2, 3}
                                                            : std::vector<double>{2, 1, 4, 3};
    auto [g, n] = make(true, mode, {6});
    EXPECT_EQ(n->output(0)->type().to_string(), "f32[4]");
    auto r = try_kernel(*n, {strings({6}, {"a", "b", "x", "c", "a", "b"})});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(values(r->at(0)), want);
    auto [gi, ni] = make(false, mode, {2, 6});
    EXPECT_EQ(ni->output(0)->type().to_string(), "f32[2, 4]");
    r = try_kernel(*ni, {make_tensor(DType::kInt64, {2, 6}, {1, 2, 9, 3, 1, 2, 3, 3, 3, 3, 3, 3})});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    std::vector<double> both = want;
    both.insert(both.end(), {0, 0, 0, 0});
    EXPECT_EQ(values(r->at(0)), both);
  }
  // ngram_indexes must name every n-gram of the pool.
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kInt64, {3}));
  Node* n = g->add_node("TfIdfVectorizer", {x}, {"y"});
  n->set_attr("ngram_counts", Attribute::of_ints({0}));
  n->set_attr("ngram_indexes", Attribute::of_ints({0}));
  n->set_attr("pool_int64s", Attribute::of_ints({4, 5}));
  Status st = testing::infer(*g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("ngram_indexes has 1 entries for 2 n-grams"), std::string::npos) << st.to_string();
}

// ai.onnx.ml LabelEncoder: int64 keys to strings with a default, float keys
// (NaN a key like any other) to int64 from a values tensor; mismatched key
// and value counts are an error.
TEST(StringOps, LabelEncoderMapsKeysWithDefaults) {
  auto g = new_graph();
  g->opsets["ai.onnx.ml"] = 4;
  Value* x = g->add_input("x", tt(DType::kInt64, {5}));
  Node* n = g->add_node("LabelEncoder", {x}, {"y"}, "ai.onnx.ml");
  n->set_attr("keys_int64s", Attribute::of_ints({3, -1, 7}));
  n->set_attr("values_strings", Attribute::of_strings({"three", "minus one", "seven"}));
  n->set_attr("default_string", Attribute::of_string("?"));
  Value* f = g->add_input("f", tt(DType::kFloat32, {4}));
  Node* nf = g->add_node("LabelEncoder", {f}, {"z"}, "ai.onnx.ml");
  nf->set_attr("keys_floats", Attribute::of_floats({0.5, NAN, -2}));
  nf->set_attr("values_tensor", Attribute::of_tensor(make_tensor(DType::kInt64, {3}, {10, 20, 30})));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "string[5]");
  auto r = try_kernel(*n, {make_tensor(DType::kInt64, {5}, {7, 3, 4, -1, 7})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(texts(r->at(0)), (std::vector<std::string>{"seven", "three", "?", "minus one", "seven"}));
  r = try_kernel(*nf, {make_tensor(DType::kFloat32, {4}, {NAN, -2, 0.5, 1})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<int64_t> got(r->at(0).data_as<int64_t>(), r->at(0).data_as<int64_t>() + 4);
  EXPECT_EQ(got, (std::vector<int64_t>{20, 30, 10, -1}));  // -1: default_int64's default
  auto g2 = new_graph();
  Value* x2 = g2->add_input("x", tt(DType::kInt64, {1}));
  Node* bad = g2->add_node("LabelEncoder", {x2}, {"y"}, "ai.onnx.ml");
  bad->set_attr("keys_int64s", Attribute::of_ints({1, 2}));
  bad->set_attr("values_int64s", Attribute::of_ints({1}));
  EXPECT_FALSE(testing::infer(*g2).is_ok());
}

// A compiled model: y = Equal(StringConcat(a, b), c), n = Cast<string>(Cast<f32>(k) * 2):
// string nodes run kernels, the numeric Cast and Mul compile.
TEST(StringOps, CompiledModelMixesStringKernelsAndCompiledMath) {
  auto g = new_graph();
  Value* a = g->add_input("a", tt(DType::kString, {2, 2}));
  Value* b = g->add_input("b", tt(DType::kString, {2}));
  Value* c = g->add_input("c", tt(DType::kString, {2, 2}));
  Value* k = g->add_input("k", tt(DType::kInt32, {3}));
  Node* cat = g->add_node("StringConcat", {a, b}, {"ab"});
  Node* eq = g->add_node("Equal", {cat->output(0), c}, {"y"});
  Node* kf = g->add_node("Cast", {k}, {"kf"});
  kf->set_attr("to", Attribute::of_int(1));
  Node* twice = g->add_node("Add", {kf->output(0), kf->output(0)}, {"k2"});
  Node* ks = g->add_node("Cast", {twice->output(0)}, {"ks"});
  ks->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kString)));
  g->set_outputs({eq->output(0), ks->output(0), cat->output(0)});
  auto compiled = driver::compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  runtime::VM vm(compiled->program, 2);
  for (int pass = 0; pass < 2; ++pass) {  // warm runs reuse registers
    auto out = vm.run({strings({2, 2}, {"ab", "c", "x", ""}), strings({2}, {"c", "d"}),
                       strings({2, 2}, {"abc", "cc", "xd", "d"}), make_tensor(DType::kInt32, {3}, {1, -4, 7})});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(texts((*out)[2]), (std::vector<std::string>{"abc", "cd", "xc", "d"}));
    std::vector<double> eqv;
    for (int64_t i = 0; i < 4; ++i) eqv.push_back((*out)[0].get_f64(i));
    EXPECT_EQ(eqv, (std::vector<double>{1, 0, 0, 1}));
    EXPECT_EQ(texts((*out)[1]), (std::vector<std::string>{"2", "-8", "14"}));
  }
}

}  // namespace
}  // namespace kiln::ops
