// Round trips with transformers: a directory we save (single file, sharded, bf16, and one made
// by init-model) loads with from_pretrained and reproduces our logits.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/cli/commands.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "test_util.h"

namespace test_hf_roundtrip {

using namespace alpaca;
namespace fs = std::filesystem;

namespace {

// Collects (directory, our logits) checks and runs them in one Python process (loading
// transformers costs seconds; one start per test keeps the suite quick).
class TransformersCheck {
 public:
  // Computes our logits for `m` on a padded batch and stores them beside `dir`.
  void add(model::LlamaForCausalLM& m, const fs::path& dir, const std::string& dtype, double tol) {
    at::NoGradGuard no_grad;
    at::Tensor ids = at::randint(0, m->config().vocab_size, {2, 10}, at::kLong);
    at::Tensor mask = at::ones({2, 10}, at::kLong);
    mask[1].narrow(0, 7, 3).zero_();
    at::Tensor logits = m->forward(ids, mask).to(at::kFloat);
    const fs::path expected = dir.parent_path() / (dir.filename().string() + ".expected.safetensors");
    io::write_safetensors(expected.string(), {{"input_ids", ids}, {"attention_mask", mask}, {"logits", logits}});
    args_ += " --check " + dir.string() + " " + expected.string() + " " + dtype + " " + std::to_string(tol);
  }
  void expect_all_match() const {
    std::string out;
    const std::string cmd = alpaca::testing::python() + " " +
                            (alpaca::testing::source_dir() / "tests/reference/io_roundtrip_check.py").string() +
                            args_ + " 2>&1";
    const int rc = alpaca::testing::run_command(cmd, &out);
    std::cout << out;
    EXPECT_EQ(rc, 0) << out;
  }

 private:
  std::string args_;
};

fs::path fixture(const std::string& config) {
  return alpaca::testing::binary_dir() / "fixtures" / "model_parity" / config / "hf_safetensors";
}

TEST(HfRoundTrip, TransformersLoadsWhatWeSave) {
  alpaca::testing::TempDir tmp("hf_roundtrip");
  TransformersCheck check;
  for (const std::string config : {"tiny_mha_untied", "tiny_gqa_tied", "tiny_llama3_rope", "tiny_qwen2", "tiny_qwen2_yarn", "tiny_longrope"}) {
    SCOPED_TRACE(config);
    ASSERT_TRUE(fs::exists(fixture(config))) << "run the model_parity fixture first";
    model::LlamaForCausalLM m = io::load_hf_model(fixture(config).string());
    const fs::path single = tmp.path() / (config + "_single");
    io::save_hf_directory(m, single.string());
    check.add(m, single, "float32", 1e-5);
    const fs::path sharded = tmp.path() / (config + "_sharded");
    io::save_hf_directory(m, sharded.string(), std::nullopt, 10'000);
    ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
    check.add(m, sharded, "float32", 1e-5);
  }
  check.expect_all_match();
}

TEST(HfRoundTrip, ShardsExactlyLikeTransformers) {
  // The fixture saved each model with transformers' save_pretrained(max_shard_size="20KB").
  alpaca::testing::TempDir tmp("hf_shard_layout");
  for (const std::string config : {"tiny_mha_untied", "tiny_gqa_tied", "tiny_llama3_rope"}) {
    SCOPED_TRACE(config);
    const fs::path theirs = fixture(config).parent_path() / "hf_sharded";
    model::LlamaForCausalLM m = io::load_hf_model(fixture(config).string());
    const fs::path ours = tmp.path() / config;
    io::save_hf_directory(m, ours.string(), std::nullopt, io::parse_shard_size("20KB"));
    auto a = nlohmann::json::parse(std::ifstream(ours / "model.safetensors.index.json"));
    auto b = nlohmann::json::parse(std::ifstream(theirs / "model.safetensors.index.json"));
    EXPECT_EQ(a["weight_map"], b["weight_map"]);
    EXPECT_EQ(a["metadata"], b["metadata"]);
  }
}

TEST(HfRoundTrip, Bf16ExportAndInitModelLoadInTransformers) {
  alpaca::testing::TempDir tmp("hf_roundtrip_bf16");
  model::LlamaForCausalLM m = io::load_hf_model(fixture("tiny_gqa_tied").string());
  const fs::path dir = tmp.path() / "bf16";
  io::save_hf_directory(m, dir.string(), at::kBFloat16);
  model::LlamaForCausalLM bf = io::load_hf_model(dir.string(), at::kBFloat16);
  // Same bf16 weights, same ops: transformers in bf16 should agree to bf16 rounding.
  TransformersCheck check;
  check.add(bf, dir, "bfloat16", 2e-2);
  // A random model written by `alpaca-train init-model`.
  const fs::path out = tmp.path() / "init";
  const std::string cfg = (alpaca::testing::source_dir() / "tests/fixtures/configs/tiny_gqa_tied.json").string();
  ASSERT_EQ(cli::run_init_model({"--config", cfg, "--output_dir", out.string(), "--seed", "3"}), 0);
  model::LlamaForCausalLM init = io::load_hf_model(out.string());
  check.add(init, out, "float32", 1e-5);
  check.expect_all_match();
}

}  // namespace

}  // namespace test_hf_roundtrip
