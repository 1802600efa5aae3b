// Greedy generation token for token equal to transformers' generate(do_sample=False) in fp32
// (tests/reference/generate_reference.py): 32 new tokens for 20 prompts of a tiny random LLaMA from
// `alpaca-train init-model` (GQA, two EOS ids) and 12 of SmolLM2-135M-Instruct (Alpaca prompts
// tokenized by its own tokenizer), as one left-padded batch and one prompt at a time (the
// fused CPU decode step where this CPU runs it; the module path too, on 5 prompts). Also:
// right padding gives the unpadded answers, any batch size gives the same answers, and a seed
// reproduces sampled answers.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/generate/generation_config.h"
#include "alpaca/generate/generator.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/cpu_decode.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_generate_parity {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::generate;
using nlohmann::json;

namespace {

struct Reference {
  fs::path model_dir;
  std::vector<std::vector<int64_t>> prompts, batched, single;
  GenerateOptions opts;
  double min_margin = 0;
};

std::optional<Reference> load_reference(const std::string& name, std::string* why) {
  const fs::path dir = alpaca::testing::binary_dir() / "fixtures" / "generate_ref" / name;
  if (fs::exists(dir / "SKIPPED")) {
    std::ifstream f(dir / "SKIPPED");
    *why = std::string(std::istreambuf_iterator<char>(f), {});
    return std::nullopt;
  }
  std::ifstream f(dir / "greedy.json");
  if (!f) {
    *why = "fixture missing: run ctest (fixture_generate_ref) first; looked in " + dir.string();
    return std::nullopt;
  }
  json j = json::parse(f);
  Reference r;
  r.model_dir = j["model_dir"].get<std::string>();
  r.prompts = j["prompts"].get<std::vector<std::vector<int64_t>>>();
  r.batched = j["batched"].get<std::vector<std::vector<int64_t>>>();
  r.single = j["single"].get<std::vector<std::vector<int64_t>>>();
  r.opts.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  r.opts.eos_token_ids = j["eos_token_id"].get<std::vector<int64_t>>();
  r.opts.pad_token_id = j["pad_token_id"].get<int64_t>();
  r.min_margin = std::min(j["min_margin_batched"].get<double>(), j["min_margin_single"].get<double>());
  return r;
}

std::vector<std::vector<int64_t>> ids_of(const std::vector<Generation>& gens) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& g : gens) out.push_back(g.ids);
  return out;
}

int64_t count_mismatches(const std::vector<std::vector<int64_t>>& got, const std::vector<std::vector<int64_t>>& want,
                         const std::string& what) {
  EXPECT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] == want[i]) continue;
    ++bad;
    size_t k = 0;
    while (k < got[i].size() && k < want[i].size() && got[i][k] == want[i][k]) ++k;
    ADD_FAILURE() << what << ": prompt " << i << " differs from token " << k << " of " << want[i].size();
  }
  return bad;
}

class GenerateParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    auto r = load_reference(GetParam(), &why);
    if (!r) {
      if (why.find("not found") != std::string::npos) GTEST_SKIP() << why;
      GTEST_FAIL() << why;
    }
    ref_ = std::move(*r);
    m_ = io::load_hf_model(ref_.model_dir.string());
    m_->eval();
  }
  Reference ref_;
  model::LlamaForCausalLM m_{nullptr};
  at::Generator gen_ = at::make_generator<at::CPUGeneratorImpl>(0);
};

TEST_P(GenerateParity, GreedyBatchedAndOneByOneEqualTransformers) {
  std::cout << GetParam() << ": reference's smallest top-2 logit margin " << ref_.min_margin << "\n";
  auto t0 = std::chrono::steady_clock::now();
  auto batched = ids_of(generate_batch(m_, ref_.prompts, ref_.opts, gen_));
  auto t1 = std::chrono::steady_clock::now();
  std::vector<std::vector<int64_t>> single;
  for (const auto& p : ref_.prompts) single.push_back(generate_batch(m_, {p}, ref_.opts, gen_)[0].ids);
  auto t2 = std::chrono::steady_clock::now();
  int64_t tokens = 0, eos = 0;
  for (const auto& g : single) {
    tokens += static_cast<int64_t>(g.size());
    eos += !g.empty() && std::find(ref_.opts.eos_token_ids.begin(), ref_.opts.eos_token_ids.end(), g.back()) !=
                             ref_.opts.eos_token_ids.end();
  }
  std::cout << "  " << ref_.prompts.size() << " prompts, " << tokens << " new tokens (" << eos
            << " stop at EOS); one batch " << std::chrono::duration<double>(t1 - t0).count() << " s, one by one "
            << std::chrono::duration<double>(t2 - t1).count() << " s\n";
  EXPECT_EQ(count_mismatches(batched, ref_.batched, "batched"), 0);
  const std::string why = model::CpuDecoder::unsupported(*m_, 1);
  std::cout << "  one by one: " << (why.empty() ? "the fused CPU decode step" : "the module path (" + why + ")") << "\n";
  EXPECT_EQ(count_mismatches(single, ref_.single, "one by one"), 0);
  // The module path at batch 1 too (the reference the fused step is tested against), on 5 prompts.
  GenerateOptions unfused = ref_.opts;
  unfused.fused_cpu_decode = false;
  std::vector<std::vector<int64_t>> single5;
  for (size_t i = 0; i < 5; ++i) single5.push_back(generate_batch(m_, {ref_.prompts[i]}, unfused, gen_)[0].ids);
  EXPECT_EQ(count_mismatches(single5, {ref_.single.begin(), ref_.single.begin() + 5}, "one by one, module path"), 0);
}

TEST_P(GenerateParity, RightPaddingAndBatchSizeGiveTheUnpaddedAnswers) {
  GenerateOptions right = ref_.opts;
  right.padding_side = PaddingSide::kRight;
  std::vector<std::vector<int64_t>> first8(ref_.prompts.begin(), ref_.prompts.begin() + 8);
  std::vector<std::vector<int64_t>> want8(ref_.single.begin(), ref_.single.begin() + 8);
  EXPECT_EQ(count_mismatches(ids_of(generate_batch(m_, first8, right, gen_)), want8, "right-padded"), 0);
  EXPECT_EQ(count_mismatches(ids_of(generate_all(m_, first8, ref_.opts, 3, gen_)), want8, "batch size 3"), 0);
}

TEST_P(GenerateParity, SamplingWithASeedIsReproducible) {
  GenerateOptions s = ref_.opts;
  s.sampling.do_sample = true;
  s.sampling.temperature = 1.3;
  s.sampling.top_p = 0.95;
  s.sampling.repetition_penalty = 1.1;
  s.max_new_tokens = 12;
  std::vector<std::vector<int64_t>> four(ref_.prompts.begin(), ref_.prompts.begin() + 4);
  auto run = [&](uint64_t seed) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
    return ids_of(generate_all(m_, four, s, 2, g));
  };
  auto a = run(5), b = run(5), c = run(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, std::vector<std::vector<int64_t>>(ref_.single.begin(), ref_.single.begin() + 4))
      << "sampling at temperature 1.3 gave the greedy answers";
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateParity, ::testing::Values("tiny", "smollm2"));

TEST(GenerationConfigFile, ReadsTransformersFields) {
  GenerationConfig c = parse_generation_config(
      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64,
          "eos_token_id": [2, 7], "pad_token_id": 0, "repetition_penalty": 1.1})", "g.json");
  EXPECT_EQ(c.do_sample, true);
  EXPECT_EQ(c.temperature, 0.6);
  EXPECT_EQ(c.top_k, 20);
  EXPECT_EQ(c.max_new_tokens, 64);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(parse_generation_config(R"({"eos_token_id": 5})", "g").eos_token_id, std::vector<int64_t>{5});
  EXPECT_FALSE(parse_generation_config("{}", "g").do_sample.has_value());
  // What transformers' generate() would act on and we do not: named, so the caller warns; the values
  // that leave a field off (num_beams 1, typical_p 1.0, null, []) are not.
  EXPECT_TRUE(c.unimplemented.empty());
  EXPECT_EQ(parse_generation_config(R"({"num_beams": 4, "min_p": 0.05, "typical_p": 1.0, "no_repeat_ngram_size": 0,
                                        "bad_words_ids": null, "suppress_tokens": [], "min_new_tokens": 3})", "g")
                .unimplemented,
            (std::vector<std::string>{"num_beams 4", "min_p 0.05", "min_new_tokens 3"}));
  try {
    parse_generation_config(R"({"top_k": "many"})", "g.json");
    FAIL() << "expected an error";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(std::string(e.what()).find("g.json: field \"top_k\""), std::string::npos) << e.what();
  }
}

}  // namespace

}  // namespace test_generate_parity
