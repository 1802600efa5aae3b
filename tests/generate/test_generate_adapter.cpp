// Greedy generation with an unmerged peft LoRA adapter token for token equal to peft
// (PeftModel.from_pretrained + generate(do_sample=False), fp32; tests/reference/
// generate_adapter_reference.py): a tiny random LLaMA with a random non-zero adapter (LoRA on
// q/v/o/down_proj, lm_head in modules_to_save, trainable-token rows of embed_tokens) on 6 prompts x
// 16 new tokens as one left-padded batch and one by one, through the library and through
// `alpaca-train generate --adapter` (text prompts, the bundled tokenizer); a plain LoRA adapter on
// all seven linears one by one. One by one runs the fused CPU decode step (LoRA branches and
// token rows included) where this CPU has it. Adapters that do not fit
// the base (a module it lacks, a wrong shape) fail naming the module.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/io/peft_adapter.h"
#include "alpaca/generate/generator.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/model/cpu_decode.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_generate_adapter {

namespace fs = std::filesystem;
using namespace alpaca;
using nlohmann::json;
using alpaca::testing::run_command;

namespace {

using Ids = std::vector<std::vector<int64_t>>;

class GenerateAdapter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = alpaca::testing::binary_dir() / "fixtures" / "generate_adapter_ref";
    std::ifstream f(dir_ / "adapter.json");
    ASSERT_TRUE(f) << "fixture missing: run ctest (fixture_generate_adapter_ref) first; looked in " << dir_;
    ref_ = json::parse(f);
    opts_.max_new_tokens = ref_["max_new_tokens"].get<int64_t>();
    opts_.eos_token_ids = ref_["eos_token_id"].get<std::vector<int64_t>>();
    opts_.pad_token_id = ref_["pad_token_id"].get<int64_t>();
  }
  model::LlamaForCausalLM load(const std::string& adapter) const {
    model::LlamaForCausalLM m = io::load_hf_model((dir_ / "model").string());
    if (!adapter.empty()) io::attach_lora_adapter(*m, io::read_lora_adapter((dir_ / adapter).string()), (dir_ / "model").string());
    m->eval();
    return m;
  }
  static Ids ids_of(const std::vector<generate::Generation>& gens) {
    Ids out;
    for (const auto& g : gens) out.push_back(g.ids);
    return out;
  }
  fs::path dir_;
  json ref_;
  generate::GenerateOptions opts_;
  at::Generator gen_ = at::make_generator<at::CPUGeneratorImpl>(0);
};

TEST_F(GenerateAdapter, GreedyWithAdapterEqualsPeftBatchedAndOneByOne) {
  std::cout << "reference's smallest top-2 logit margin " << ref_["min_margin"] << "\n";
  const Ids prompts = ref_["prompts"].get<Ids>();
  model::LlamaForCausalLM m = load("adapter");
  int64_t lora_params = 0;
  for (const auto& item : m->named_parameters())
    if (item.key().find("lora_") != std::string::npos) ++lora_params;
  EXPECT_EQ(lora_params, 2 * 4 * 2);  // A and B on 4 linears of 2 layers: unmerged
  const std::string why = model::CpuDecoder::unsupported(*m, 1);
  std::cout << "one by one: " << (why.empty() ? "the fused CPU decode step" : "the module path (" + why + ")") << "\n";
  EXPECT_EQ(ids_of(generate::generate_batch(m, prompts, opts_, gen_)), ref_["batched"].get<Ids>());
  Ids single;
  for (const auto& p : prompts) single.push_back(generate::generate_batch(m, {p}, opts_, gen_)[0].ids);
  EXPECT_EQ(single, ref_["single"].get<Ids>());
  // Without the adapter the answers are the base's (and differ: the adapter is not a no-op).
  model::LlamaForCausalLM base = load("");
  const Ids base_ids = ids_of(generate::generate_batch(base, prompts, opts_, gen_));
  EXPECT_EQ(base_ids, ref_["base_batched"].get<Ids>());
  EXPECT_NE(base_ids, ref_["batched"].get<Ids>());
}

TEST_F(GenerateAdapter, PlainLoraOneByOneThroughTheFusedStepEqualsPeft) {
  std::cout << "reference's smallest top-2 logit margin " << ref_["lora_only_min_margin"] << "\n";
  model::LlamaForCausalLM m = load("lora_only");
  const std::string why = model::CpuDecoder::unsupported(*m, 1);
  std::cout << "one by one: " << (why.empty() ? "the fused CPU decode step" : "the module path (" + why + ")") << "\n";
  Ids single;
  for (const auto& p : ref_["prompts"].get<Ids>()) single.push_back(generate::generate_batch(m, {p}, opts_, gen_)[0].ids);
  EXPECT_EQ(single, ref_["lora_only_single"].get<Ids>());
  EXPECT_NE(single, ref_["base_batched"].get<Ids>());
}

TEST_F(GenerateAdapter, CommandLineWithAdapterEqualsPeft) {
  alpaca::testing::TempDir tmp("generate_adapter");
  {
    std::ofstream p(tmp.path() / "p.jsonl");
    for (const auto& t : ref_["texts"]) p << json{{"instruction", t}}.dump() << "\n";
  }
  const fs::path out = tmp.path() / "o.jsonl";
  const std::string cmd = alpaca::testing::train_bin() + " generate --model_name_or_path " + (dir_ / "model").string() +
                          " --adapter " + (dir_ / "adapter").string() + " --prompts " + (tmp.path() / "p.jsonl").string() +
                          " --raw_prompt --output " + out.string() + " --max_new_tokens " +
                          std::to_string(opts_.max_new_tokens) + " --batch_size 3 --device cpu";
  std::string log;
  ASSERT_EQ(run_command(cmd, &log), 0) << log;
  EXPECT_NE(log.find("LoRA on 8 linears (unmerged"), std::string::npos) << log;
  std::ifstream f(out);
  Ids got;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) got.push_back(json::parse(line)["generation_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(got, ref_["text_batched"].get<Ids>());
}

TEST_F(GenerateAdapter, AdapterOfAnotherBaseFailsNamingTheModule) {
  struct Case {
    std::string adapter, message;
  };
  for (const Case& c : std::vector<Case>{
           {"missing_module", "adapts model.layers.1.self_attn.qq_proj, which the base model"},
           {"wrong_shape", "LoRA model.layers.0.mlp.down_proj: A [4, 128] and B [128, 4]"}}) {
    try {
      load(c.adapter);
      ADD_FAILURE() << c.adapter << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
    alpaca::testing::TempDir tmp("generate_adapter_bad");
    std::ofstream(tmp.path() / "p.jsonl") << R"({"instruction": "hi"})" << "\n";
    const fs::path out = tmp.path() / "o.jsonl";
    std::string log;
    const int rc = run_command(alpaca::testing::train_bin() + " generate --model_name_or_path " + (dir_ / "model").string() +
                                   " --adapter " + (dir_ / c.adapter).string() + " --prompts " +
                                   (tmp.path() / "p.jsonl").string() + " --output " + out.string() + " --device cpu",
                               &log);
    EXPECT_EQ(rc, 1) << log;
    EXPECT_NE(log.find(c.message), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(out));
  }
}

// peft's save_embedding_layers ("auto" when lm_head is a target) also stores
// lm_head.base_layer.weight: attach and merge read it as the base weight. A whole table saved for a
// tied base without ensure_weight_tying is refused: peft applies it to one side and unties.
TEST_F(GenerateAdapter, LmHeadBaseLayerWeightIsReadAndOneSidedTiedTablesAreRefused) {
  alpaca::testing::TempDir tmp("adapter_base_layer");
  const at::Tensor w = io::SafetensorsFile::open((dir_ / "model" / "model.safetensors").string())->tensor("lm_head.weight");
  at::manual_seed(3);
  const at::Tensor a = at::randn({2, w.size(1)}) * 0.1, b = at::randn({w.size(0), 2}) * 0.1;
  const fs::path d = tmp.path() / "adapter";
  fs::create_directories(d);
  std::ofstream(d / "adapter_config.json")
      << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["lm_head"]})";
  {
    io::SafetensorsWriter st((d / "adapter_model.safetensors").string());
    st.add("base_model.model.lm_head.lora_A.weight", a);
    st.add("base_model.model.lm_head.lora_B.weight", b);
    st.add("base_model.model.lm_head.base_layer.weight", w * 2);
    st.finish();
  }
  model::LlamaForCausalLM m = load("");
  io::attach_lora_adapter(*m, io::read_lora_adapter(d.string()), (dir_ / "model").string());
  EXPECT_TRUE(at::equal(m->lm_head->weight, w * 2));
  std::string log;
  ASSERT_EQ(run_command(alpaca::testing::train_bin() + " merge --model_name_or_path " + (dir_ / "model").string() +
                            " --adapter " + d.string() + " --output_dir " + (tmp.path() / "merged").string(), &log), 0)
      << log;
  const at::Tensor merged =
      io::SafetensorsFile::open((tmp.path() / "merged" / "model.safetensors").string())->tensor("lm_head.weight");
  EXPECT_TRUE(at::allclose(merged, w * 2 + at::matmul(b, a) * 2.0, 1e-6, 1e-6));

  const fs::path tied = tmp.path() / "tied";
  fs::create_directories(tied);
  {
    io::SafetensorsWriter st((tied / "adapter_model.safetensors").string());
    st.add("base_model.model.model.embed_tokens.weight", at::zeros({4, 2}));
    st.finish();
  }
  for (const bool ensure : {false, true}) {
    std::ofstream(tied / "adapter_config.json") << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "ensure_weight_tying": )"
                                                << (ensure ? "true" : "false") << "}";
    const io::LoraAdapter la = io::read_lora_adapter(tied.string());
    EXPECT_NO_THROW(io::check_tied_tables(la, /*base_tied=*/false));
    if (ensure) {
      EXPECT_NO_THROW(io::check_tied_tables(la, true));
    } else {
      try {
        io::check_tied_tables(la, true);
        ADD_FAILURE() << "a one-sided table on a tied base was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("without ensure_weight_tying"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace

}  // namespace test_generate_adapter
