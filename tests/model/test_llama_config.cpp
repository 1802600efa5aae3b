// LlamaConfig: LLaMA 1/2/3 configs load; bad configs fail naming the file and field; to_json
// round-trips through our parser.
#include <gtest/gtest.h>

#include "alpaca/model/config.h"
#include "alpaca/util/error.h"
#include "test_util.h"

using alpaca::model::LlamaConfig;

namespace {

std::string configs_dir() { return (alpaca::testing::source_dir() / "tests" / "fixtures" / "configs").string(); }

// Expects from_json_string(text) to throw an alpaca::Error whose message contains every needle.
void expect_error(const std::string& text, std::initializer_list<std::string> needles) {
  try {
    LlamaConfig::from_json_string(text, "bad/config.json");
    FAIL() << "no error for: " << text;
  } catch (const alpaca::Error& e) {
    for (const auto& n : needles) EXPECT_NE(e.message().find(n), std::string::npos) << e.message();
  }
}

TEST(LlamaConfig, Llama1Loads) {
  LlamaConfig c = LlamaConfig::from_json_file(configs_dir() + "/llama1_7b.json");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_key_value_heads, 32);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.pad_token_id.has_value());  // -1 means none
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(LlamaConfig, Llama2Loads) {
  LlamaConfig c = LlamaConfig::from_json_file(configs_dir() + "/llama2_7b.json");
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{2});
}

TEST(LlamaConfig, Llama31LoadsWithLlama3RopeAndEosList) {
  LlamaConfig c = LlamaConfig::from_json_file(configs_dir() + "/llama31_8b.json");
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
}

TEST(LlamaConfig, ToJsonRoundTrips) {
  for (const char* name : {"llama31_8b.json", "tiny_gqa_tied.json", "tiny_dynamic_rope.json", "tiny_linear_rope.json"}) {
    LlamaConfig a = LlamaConfig::from_json_file(configs_dir() + "/" + name);
    LlamaConfig b = LlamaConfig::from_json_string(a.to_json(), "to_json");
    EXPECT_EQ(b.to_json(), a.to_json()) << name;
    EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_NE(a.to_json().find("\"LlamaForCausalLM\""), std::string::npos);
  }
}

TEST(LlamaConfig, TransformersFiveRopeParametersLayout) {
  LlamaConfig c = LlamaConfig::from_json_string(
      R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
          "num_attention_heads":2,"rope_parameters":{"rope_type":"linear","factor":4.0,"rope_theta":123.0}})",
      "tf5.json");
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 123.0);
}

TEST(LlamaConfig, BadConfigsNameFileAndField) {
  const std::string ok_tail = R"("vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1)";
  expect_error("{not json", {"bad/config.json", "not valid JSON"});
  expect_error(R"({"model_type":"gpt2",)" + ok_tail + R"(,"num_attention_heads":2})",
               {"bad/config.json", "model_type", "gpt2", "supported model types: llama", "mistral"});
  // Mistral: the same modules as LLaMA; sliding-window attention is refused.
  expect_error(R"({"model_type":"mistral",)" + ok_tail + R"(,"num_attention_heads":2,"sliding_window":4096})",
               {"bad/config.json", "sliding_window", "4096", "not supported"});
  expect_error(R"({)" + ok_tail + R"(,"num_attention_heads":2})", {"bad/config.json", "model_type"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + "}", {"bad/config.json", "num_attention_heads", "missing"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":"two"})",
               {"bad/config.json", "num_attention_heads", "integer"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"num_key_value_heads":3})",
               {"bad/config.json", "num_key_value_heads"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"rope_scaling":{"type":"yarn","factor":2}})",
               {"bad/config.json", "rope_scaling", "yarn"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"rope_scaling":{"rope_type":"llama3","factor":8}})",
               {"bad/config.json", "low_freq_factor"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"hidden_act":"gelu"})",
               {"bad/config.json", "hidden_act"});
  try {
    LlamaConfig::from_json_file("/nonexistent/config.json");
    FAIL();
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("/nonexistent/config.json"), std::string::npos);
  }
}

}  // namespace
