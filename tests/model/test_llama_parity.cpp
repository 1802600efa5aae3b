// Parity with transformers' LlamaForCausalLM (llm.c style): tests/reference/model_parity_fixtures.py
// builds tiny random checkpoints and records logits, loss and every gradient; we load the same
// checkpoint and must reproduce them (fp32: logits 1e-4 abs, loss 1e-5 rel, grads 1e-4 rel; bf16
// loss 1e-2 rel), from config.json in transformers 5's form and in the checkpoint's own, and read
// both as transformers does. It also checks every HF weight layout loads to identical parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/generate/generator.h"
#include "alpaca/io/checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/rope.h"
#include "test_util.h"

namespace test_llama_parity {

namespace fs = std::filesystem;
using namespace alpaca;

namespace {

fs::path fixture_dir(const std::string& config) {
  return alpaca::testing::binary_dir() / "fixtures" / "model_parity" / config;
}

class LlamaParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fixture_dir(GetParam());
    if (!fs::exists(dir_ / "expected.safetensors"))
      GTEST_FAIL() << "fixture missing: run ctest (fixture_model_parity) first; looked in " << dir_;
    expected_ = io::SafetensorsFile::open((dir_ / "expected.safetensors").string());
  }
  at::Tensor ref(const std::string& name) const { return expected_->tensor(name).clone(); }
  bool has(const std::string& name) const { return expected_->contains(name); }

  fs::path dir_;
  std::shared_ptr<io::SafetensorsFile> expected_;
};

// Both config.json forms of the same weights: transformers 5's (rope_parameters) and the one the
// checkpoint shipped with (rope_theta, rope_scaling), against the same reference.
TEST_P(LlamaParity, Fp32LogitsLossAndGradients) {
 for (const std::string form : {"hf_safetensors", "hf_legacy"}) {
  SCOPED_TRACE(form);
  model::LlamaForCausalLM m = io::load_hf_model((dir_ / form).string());
  for (const std::string tag : {"pad", "nopad"}) {
    SCOPED_TRACE(tag);
    at::Tensor ids = ref(tag + ".input_ids");
    at::Tensor mask = has(tag + ".attention_mask") ? ref(tag + ".attention_mask") : at::Tensor();
    at::Tensor labels = ref(tag + ".labels");
    m->zero_grad();
    at::Tensor logits = m->forward(ids, mask);
    at::Tensor loss = model::causal_lm_loss(logits, labels);
    loss.backward();

    // Logits at padded query positions are never used; compare the real ones.
    at::Tensor real = mask.defined() ? mask.to(at::kBool) : at::ones_like(ids, at::kBool);
    at::Tensor ref_logits = ref(tag + ".logits");
    const double logit_diff =
        (logits.detach() - ref_logits).abs().amax(-1).masked_select(real).max().item<double>();
    const double ref_loss = ref(tag + ".loss").item<double>();
    const double loss_rel = std::abs(loss.item<double>() - ref_loss) / std::abs(ref_loss);
    std::cout << GetParam() << "/" << form << "/" << tag << ": logits max|diff| " << logit_diff << ", loss " << loss.item<double>()
              << " vs " << ref_loss << " (rel " << loss_rel << ")\n";
    EXPECT_LE(logit_diff, 1e-4);
    EXPECT_LE(loss_rel, 1e-5);

    double worst = 0;
    std::string worst_name;
    int64_t checked = 0;
    for (const auto& item : m->named_parameters(true)) {
      const std::string key = tag + ".grad." + item.key();
      ASSERT_TRUE(has(key)) << "reference has no gradient for " << item.key();
      ASSERT_TRUE(item.value().grad().defined()) << "no gradient for " << item.key();
      at::Tensor g_ref = ref(key);
      const double denom = std::max(g_ref.norm().item<double>(), 1e-12);
      const double rel = (item.value().grad() - g_ref).norm().item<double>() / denom;
      EXPECT_LE(rel, 1e-4) << "gradient of " << item.key();
      if (rel > worst) worst = rel, worst_name = item.key();
      ++checked;
    }
    std::cout << "  " << checked << " gradients, worst relative diff " << worst << " (" << worst_name << ")\n";
  }
  // An explicit all-ones mask is the unpadded case (transformers drops it; so do we).
  at::NoGradGuard no_grad;
  at::Tensor ids = ref("nopad.input_ids");
  at::Tensor ones_logits = m->forward(ids, at::ones_like(ids));
  EXPECT_LE((ones_logits - ref("nopad.logits")).abs().max().item<double>(), 1e-4);
 }
}

// What our parser reads from each form is what transformers read (transformers_config.json, written
// by the fixture after loading both forms): shapes, heads, head_dim, tying, biases, special
// tokens, RoPE parameters; and the RoPE inverse frequencies and attention scaling it derived.
TEST_P(LlamaParity, BothConfigFormsReadAsTransformersReadsThem) {
  std::ifstream f(dir_ / "transformers_config.json");
  ASSERT_TRUE(f) << "fixture has no transformers_config.json";
  const nlohmann::json hf = nlohmann::json::parse(f);
  const auto& rp = hf["rope_parameters"];
  const std::string hf_rope = rp.value("rope_type", "default");
  for (const std::string form : {"hf_safetensors", "hf_legacy"}) {
    SCOPED_TRACE(form);
    const model::LlamaConfig c = model::LlamaConfig::from_json_file((dir_ / form / "config.json").string());
    EXPECT_EQ(c.model_type, hf["model_type"].get<std::string>());
    EXPECT_EQ(c.vocab_size, hf["vocab_size"].get<int64_t>());
    EXPECT_EQ(c.hidden_size, hf["hidden_size"].get<int64_t>());
    EXPECT_EQ(c.intermediate_size, hf["intermediate_size"].get<int64_t>());
    EXPECT_EQ(c.num_hidden_layers, hf["num_hidden_layers"].get<int64_t>());
    EXPECT_EQ(c.num_attention_heads, hf["num_attention_heads"].get<int64_t>());
    EXPECT_EQ(c.num_key_value_heads, hf["num_key_value_heads"].get<int64_t>());
    const int64_t hf_head_dim = hf["head_dim"].is_null() ? c.hidden_size / c.num_attention_heads  // qwen2: derived
                                                         : hf["head_dim"].get<int64_t>();
    EXPECT_EQ(c.head_dim, hf_head_dim);
    EXPECT_EQ(c.max_position_embeddings, hf["max_position_embeddings"].get<int64_t>());
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, hf["rms_norm_eps"].get<double>());
    EXPECT_EQ(c.tie_word_embeddings, hf["tie_word_embeddings"].get<bool>());
    if (!hf["attention_bias"].is_null()) {
      EXPECT_EQ(c.attention_bias, hf["attention_bias"].get<bool>());
    }
    if (!hf["mlp_bias"].is_null()) {
      EXPECT_EQ(c.mlp_bias, hf["mlp_bias"].get<bool>());
    }
    if (!hf["bos_token_id"].is_null()) {
      EXPECT_EQ(c.bos_token_id.value_or(-2), hf["bos_token_id"].get<int64_t>());
    }
    const auto& eos = hf["eos_token_id"];
    EXPECT_EQ(c.eos_token_id, eos.is_array() ? eos.get<std::vector<int64_t>>() : std::vector<int64_t>{eos.get<int64_t>()});
    // LLaMA-1's -1 is "none" for us; transformers keeps the number.
    const auto& pad = hf["pad_token_id"];
    const int64_t hf_pad = pad.is_null() ? -1 : pad.get<int64_t>();
    EXPECT_EQ(c.pad_token_id.value_or(-1), hf_pad < 0 ? -1 : hf_pad);
    // Sliding windows: Mistral's on every layer, Qwen2's on the layers its layer_types names.
    if (hf.contains("sliding_window") && c.model_type != "llama") {
      const auto& sw = hf["sliding_window"];
      EXPECT_EQ(c.sliding_window, sw.is_null() ? std::nullopt : std::optional<int64_t>(sw.get<int64_t>()));
      const auto& lt = hf["layer_types"];
      for (int64_t i = 0; i < c.num_hidden_layers; ++i)
        EXPECT_EQ(c.layer_slides(i), lt.is_array() ? lt[i] == "sliding_attention" : !sw.is_null()) << "layer " << i;
    }
    EXPECT_DOUBLE_EQ(c.rope_theta, rp["rope_theta"].get<double>());
    EXPECT_EQ(c.rope_scaling.type.empty() ? std::string("default") : c.rope_scaling.type, hf_rope);
    if (hf_rope != "default" && rp.contains("factor")) {  // longrope may leave it to the context lengths
      EXPECT_DOUBLE_EQ(c.rope_scaling.factor, rp["factor"].get<double>());
    }
    if (hf_rope == "llama3") {
      EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, rp["low_freq_factor"].get<double>());
      EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, rp["high_freq_factor"].get<double>());
    }
    if (hf_rope == "longrope") {
      EXPECT_EQ(c.rope_scaling.short_factor, rp["short_factor"].get<std::vector<double>>());
      EXPECT_EQ(c.rope_scaling.long_factor, rp["long_factor"].get<std::vector<double>>());
    }
    // (transformers' rope_parameters may still hold the rope dict's original_max_position_embeddings
    // where a top-level field overrides it at use: the frequencies below are the check.)
    // The frequencies transformers' rotary embedding holds (its rope init function), and its
    // attention scaling (yarn's and longrope's attention factor; 1 for the other types).
    const at::Tensor inv = model::rope_inv_freq(c, 1, at::Device(at::kCPU));
    const at::Tensor want = ref("rope.inv_freq");
    ASSERT_EQ(inv.sizes(), want.sizes());
    const double rel = ((inv - want).abs() / want.abs()).max().item<double>();
    std::cout << GetParam() << "/" << form << ": rope " << hf_rope << ", inv_freq max rel diff " << rel << "\n";
    EXPECT_LE(rel, 1e-6);
    EXPECT_DOUBLE_EQ(model::rope_attention_scaling(c), ref("rope.attention_scaling").item<double>());
    // What we write back (exports) reads as the same RoPE, past the context too (longrope's long factors).
    const model::LlamaConfig back = model::LlamaConfig::from_json_string(c.to_json(), "to_json");
    EXPECT_DOUBLE_EQ(model::rope_attention_scaling(back), model::rope_attention_scaling(c));
    for (const int64_t len : {int64_t{1}, c.max_position_embeddings * 2})
      EXPECT_TRUE(at::equal(model::rope_inv_freq(back, len, at::kCPU), model::rope_inv_freq(c, len, at::kCPU)));
  }
}

TEST_P(LlamaParity, Bf16Loss) {
  model::LlamaForCausalLM m = io::load_hf_model((dir_ / "hf_safetensors").string(), at::kBFloat16);
  at::NoGradGuard no_grad;
  at::Tensor logits = m->forward(ref("pad.input_ids"), ref("pad.attention_mask"));
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  const double loss = model::causal_lm_loss(logits, ref("pad.labels")).item<double>();
  const double want = ref("pad.bf16_loss").item<double>();
  std::cout << GetParam() << " bf16 loss " << loss << " vs transformers " << want << " (rel "
            << std::abs(loss - want) / want << ")\n";
  EXPECT_LE(std::abs(loss - want) / want, 1e-2);
}

// transformers' greedy generate through its KV cache, 10 new tokens after 5: past a dynamic or
// longrope config's context mid-generation, so each step's RoPE must come from that step's
// positions while the cache keeps what earlier steps wrote. Both of our decode paths.
TEST_P(LlamaParity, GreedyDecodeThroughTheCache) {
  model::LlamaForCausalLM m = io::load_hf_model((dir_ / "hf_safetensors").string());
  m->eval();
  const at::Tensor p = ref("generate.prompt");
  const std::vector<int64_t> prompt(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
  const at::Tensor w = ref("generate.ids").flatten();
  const std::vector<int64_t> want(w.data_ptr<int64_t>(), w.data_ptr<int64_t>() + w.numel());
  const double margin = ref("generate.margin").item<double>();
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused CPU decode" : "module path");
    generate::GenerateOptions opts;
    opts.max_new_tokens = static_cast<int64_t>(want.size());
    opts.fused_cpu_decode = fused;
    at::Generator gen = at::detail::createCPUGenerator(0);
    const auto got = generate::generate_batch(m, {prompt}, opts, gen);
    if (margin < 1e-4 && got[0].ids != want) {
      std::cout << GetParam() << ": greedy ids differ at a near tie (margin " << margin << "); not compared\n";
      continue;
    }
    EXPECT_EQ(got[0].ids, want) << "smallest top-2 margin " << margin;
  }
}

TEST_P(LlamaParity, EveryHfLayoutLoadsTheSameWeights) {
  model::LlamaForCausalLM base = io::load_hf_model((dir_ / "hf_safetensors").string());
  for (const std::string layout : {"hf_sharded", "hf_bin", "hf_bin_sharded"}) {
    SCOPED_TRACE(layout);
    io::CheckpointReader r = io::CheckpointReader::open((dir_ / layout).string());
    EXPECT_FALSE(r.format().empty());
    model::LlamaForCausalLM m = io::load_hf_model((dir_ / layout).string());
    auto a = base->named_parameters(true);
    auto b = m->named_parameters(true);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& item : a) EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key() << " in " << layout;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LlamaParity,
                         ::testing::Values("tiny_mha_untied", "tiny_gqa_tied", "tiny_llama3_rope", "tiny_linear_rope",
                                           "tiny_dynamic_rope", "tiny_mistral", "tiny_qwen2", "tiny_llama1",
                                           "tiny_llama2_gqa", "tiny_llama3", "tiny_llama32", "tiny_yarn_rope",
                                           "tiny_qwen2_yarn", "tiny_longrope", "tiny_longrope_short",
                                           "tiny_mistral_sliding", "tiny_qwen2_sliding"));

}  // namespace

}  // namespace test_llama_parity
