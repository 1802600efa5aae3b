// Logits processors against transformers' (tests/reference/generate_reference.py, fixed logits
// with deliberate ties): repetition penalty, temperature, top-k, top-p and the chain generate()
// builds, equal to 1e-6 with -inf in the same places; and sampling that a seed reproduces.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <filesystem>

#include "alpaca/generate/logits_process.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_logits_process {

namespace fs = std::filesystem;
using namespace alpaca;
using namespace alpaca::generate;

namespace {

class LogitsProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path p = alpaca::testing::binary_dir() / "fixtures" / "generate_ref" / "processors.safetensors";
    if (!fs::exists(p)) GTEST_FAIL() << "fixture missing: run ctest (fixture_generate_ref) first; looked for " << p;
    file_ = io::SafetensorsFile::open(p.string());
    scores_ = ref("scores");
    seen_ = ref("seen").to(at::kBool);
  }
  at::Tensor ref(const std::string& name) const { return file_->tensor(name).clone(); }
  void expect_same(const at::Tensor& got, const std::string& name) const {
    at::Tensor want = ref(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(at::equal(at::isinf(got), at::isinf(want))) << name << ": filtered tokens differ";
    at::Tensor finite = at::isfinite(want);
    const double diff = (got.masked_select(finite) - want.masked_select(finite)).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << name;
  }
  std::shared_ptr<io::SafetensorsFile> file_;
  at::Tensor scores_, seen_;
};

TEST_F(LogitsProcess, EachProcessorMatchesTransformers) {
  expect_same(apply_repetition_penalty(scores_, seen_, 1.3), "rep_1.3");
  expect_same(apply_repetition_penalty(scores_, seen_, 0.8), "rep_0.8");
  expect_same(apply_temperature(scores_, 0.7), "temp_0.7");
  for (int64_t k : {1, 5, 10, 25}) expect_same(apply_top_k(scores_, k), "topk_" + std::to_string(k));
  for (const char* p : {"0.1", "0.5", "0.8", "0.95"}) expect_same(apply_top_p(scores_, std::stod(p)), std::string("topp_") + p);
  SamplingParams off;
  off.do_sample = true;
  off.top_k = 0;
  expect_same(process_logits(scores_, seen_, off), "topp_1.0");  // every warper off = identity
}

TEST_F(LogitsProcess, ChainMatchesGeneratesOrder) {
  SamplingParams p;
  p.do_sample = true;
  p.repetition_penalty = 1.2;
  p.temperature = 0.8;
  p.top_k = 20;
  p.top_p = 0.9;
  expect_same(process_logits(scores_, seen_, p), "chain");
  // Greedy applies the repetition penalty only (transformers adds warpers only when sampling).
  p.do_sample = false;
  at::Tensor greedy = process_logits(scores_, seen_, p);
  EXPECT_TRUE(at::allclose(greedy, apply_repetition_penalty(scores_, seen_, 1.2)));
}

TEST_F(LogitsProcess, SamplingIsReproducibleFromTheSeed) {
  SamplingParams p;
  p.do_sample = true;
  p.top_k = 0;
  at::Tensor s = process_logits(scores_ / 3, {}, p);
  auto draw = [&](uint64_t seed) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 50; ++i) {
      at::Tensor t = select_next_tokens(s, p, g);
      out.insert(out.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
  // Top-k 1 leaves one token: sampling is then greedy (first of the tied maxima, as argmax).
  p.top_k = 1;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor only = process_logits(scores_.narrow(0, 1, 1), {}, p);
  EXPECT_EQ(select_next_tokens(only, p, g).item<int64_t>(), scores_[1].argmax().item<int64_t>());
}

TEST(SamplingParamsCheck, RejectsOutOfRangeValues) {
  SamplingParams p;
  for (double top_p : {0.0, -0.1, 1.5}) {
    p.top_p = top_p;
    EXPECT_THROW(validate(p), alpaca::Error) << top_p;
  }
  p = {};
  p.temperature = 0;
  EXPECT_THROW(validate(p), alpaca::Error);
  p = {};
  p.top_k = -1;
  EXPECT_THROW(validate(p), alpaca::Error);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THROW(validate(p), alpaca::Error);
  p = {};
  p.top_p = 1.0;
  EXPECT_NO_THROW(validate(p));
}

}  // namespace

}  // namespace test_logits_process
