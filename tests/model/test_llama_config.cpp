// LlamaConfig: LLaMA 1/2/3, Mistral and Qwen2 configs load; bad configs fail naming the file and field; to_json
// round-trips through our parser.
#include <gtest/gtest.h>

#include "alpaca/model/config.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_llama_config {

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
  EXPECT_EQ(c.embedding_padding_idx, 31999);  // but transformers' nn.Embedding counts it from the end
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{1});
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(LlamaConfig, AbsentKeysTakeTransformersDefaults) {
  const std::string shape = R"("vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2)";
  for (const std::string type : {"llama", "mistral"}) {
    LlamaConfig c = LlamaConfig::from_json_string(R"({"model_type":")" + type + R"(",)" + shape + "}", "c.json");
    EXPECT_EQ(c.bos_token_id, 1) << type;  // LlamaConfig / MistralConfig defaults
    EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{2}) << type;
    EXPECT_EQ(c.embedding_padding_idx, -1);
  }
  LlamaConfig q = LlamaConfig::from_json_string(R"({"model_type":"qwen2",)" + shape + "}", "c.json");
  EXPECT_FALSE(q.bos_token_id.has_value());  // Qwen2Config: none
  EXPECT_TRUE(q.eos_token_id.empty());
  // null is none; a pad token is the embedding's padding row.
  LlamaConfig n = LlamaConfig::from_json_string(
      R"({"model_type":"llama","bos_token_id":null,"eos_token_id":null,"pad_token_id":0,)" + shape + "}", "c.json");
  EXPECT_FALSE(n.bos_token_id.has_value());
  EXPECT_TRUE(n.eos_token_id.empty());
  EXPECT_EQ(n.embedding_padding_idx, 0);
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
  for (const char* name : {"llama31_8b.json", "tiny_gqa_tied.json", "tiny_dynamic_rope.json", "tiny_linear_rope.json",
                           "tiny_yarn_rope.json", "tiny_qwen2_yarn.json", "tiny_longrope.json", "tiny_longrope_short.json"}) {
    LlamaConfig a = LlamaConfig::from_json_file(configs_dir() + "/" + name);
    LlamaConfig b = LlamaConfig::from_json_string(a.to_json(), "to_json");
    EXPECT_EQ(b.to_json(), a.to_json()) << name;
    EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    const std::string arch = a.model_type == "qwen2" ? "Qwen2ForCausalLM" : a.model_type == "mistral" ? "MistralForCausalLM"
                                                                                                  : "LlamaForCausalLM";
    EXPECT_NE(a.to_json().find("\"" + arch + "\""), std::string::npos);
    EXPECT_DOUBLE_EQ(b.rope_scaling.factor, a.rope_scaling.factor);
    EXPECT_EQ(b.rope_scaling.original_max_position_embeddings, a.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(b.rope_scaling.attention_factor, a.rope_scaling.attention_factor);
    EXPECT_EQ(b.rope_scaling.long_factor, a.rope_scaling.long_factor);
    EXPECT_EQ(b.rope_scaling.short_factor, a.rope_scaling.short_factor);
    EXPECT_EQ(b.rope_scaling.beta_fast, a.rope_scaling.beta_fast);
    EXPECT_EQ(b.rope_scaling.mscale, a.rope_scaling.mscale);
    EXPECT_EQ(b.rope_scaling.truncate, a.rope_scaling.truncate);
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

// A transformers-4 era Qwen2.5-0.5B-style config.json: sliding_window set but use_sliding_window false.
const char* kQwen2Config = R"({"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,
  "eos_token_id":151645,"hidden_act":"silu","hidden_size":896,"initializer_range":0.02,"intermediate_size":4864,
  "max_position_embeddings":32768,"max_window_layers":21,"model_type":"qwen2","num_attention_heads":14,
  "num_hidden_layers":24,"num_key_value_heads":2,"rms_norm_eps":1e-06,"rope_theta":1000000.0,
  "sliding_window":32768,"tie_word_embeddings":true,"torch_dtype":"bfloat16","use_cache":true,
  "use_sliding_window":false,"vocab_size":151936})";

TEST(LlamaConfig, Qwen2LoadsWithQkvBiasAndNoOBias) {
  LlamaConfig c = LlamaConfig::from_json_string(kQwen2Config, "qwen2/config.json");
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  // An "attention_bias" key (not a Qwen2Config field) does not change Qwen2's fixed biases.
  std::string with_key = kQwen2Config;
  with_key.insert(1, R"("attention_bias":false,)");
  LlamaConfig d = LlamaConfig::from_json_string(with_key, "qwen2/config.json");
  EXPECT_TRUE(d.attention_bias);
  EXPECT_FALSE(d.o_proj_bias);
  // Written back as Qwen2ForCausalLM, sliding window off, and parsed to the same config.
  const std::string out = c.to_json();
  EXPECT_NE(out.find("\"Qwen2ForCausalLM\""), std::string::npos);
  EXPECT_NE(out.find("\"model_type\": \"qwen2\""), std::string::npos);
  EXPECT_NE(out.find("\"use_sliding_window\": false"), std::string::npos);
  EXPECT_EQ(out.find("LlamaForCausalLM"), std::string::npos);
  LlamaConfig e = LlamaConfig::from_json_string(out, "to_json");
  EXPECT_EQ(e.to_json(), out);
  EXPECT_TRUE(e.attention_bias);
  EXPECT_FALSE(e.o_proj_bias);
  // LLaMA's attention_bias covers o_proj too.
  LlamaConfig l = LlamaConfig::from_json_string(
      R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
          "num_attention_heads":2,"attention_bias":true})",
      "llama.json");
  EXPECT_TRUE(l.attention_bias);
  EXPECT_TRUE(l.o_proj_bias);
}

// Qwen2Config's windows as its __post_init__ resolves them: only with use_sliding_window, on the
// layers from max_window_layers on (or those layer_types names), written back as read.
TEST(LlamaConfig, Qwen2SlidingWindowLayers) {
  const LlamaConfig off = LlamaConfig::from_json_string(kQwen2Config, "qwen2.json");
  EXPECT_FALSE(off.sliding_window.has_value()) << "transformers nulls the window without use_sliding_window";
  EXPECT_FALSE(off.any_layer_slides());
  EXPECT_EQ(off.max_window_layers, 21);
  std::string on = kQwen2Config;
  on.replace(on.find("\"use_sliding_window\":false"), 26, "\"use_sliding_window\":true");
  const LlamaConfig c = LlamaConfig::from_json_string(on, "qwen2.json");
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 32768);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(c.layer_slides(i), i >= 21) << i;
  const std::string out = c.to_json();
  EXPECT_NE(out.find("\"max_window_layers\": 21"), std::string::npos) << out;
  EXPECT_NE(out.find("\"use_sliding_window\": true"), std::string::npos) << out;
  const LlamaConfig back = LlamaConfig::from_json_string(out, "back.json");
  EXPECT_EQ(back.sliding_layers, c.sliding_layers);
  EXPECT_EQ(back.to_json(), out);
  // layer_types wins over max_window_layers.
  std::string types = on;
  std::string list = "\"layer_types\":[";
  for (int i = 0; i < 24; ++i) list += std::string(i ? "," : "") + (i % 2 ? "\"sliding_attention\"" : "\"full_attention\"");
  types.insert(1, list + "],");
  const LlamaConfig t = LlamaConfig::from_json_string(types, "qwen2.json");
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(t.layer_slides(i), i % 2 == 1) << i;
  std::string no_window = kQwen2Config;
  no_window.insert(1, list + "],");
  expect_error(no_window, {"bad/config.json", "layer_types", "sliding_attention", "use_sliding_window is false"});
  std::string short_list = kQwen2Config;
  short_list.insert(1, R"("layer_types":["full_attention","full_attention"],)");
  expect_error(short_list, {"bad/config.json", "layer_types", "24 layer types"});
  std::string bad = on;
  bad.insert(1, R"("layer_types":["chunked_attention"],)");
  expect_error(bad, {"bad/config.json", "layer_types"});
}

// Mistral-7B-v0.1's sliding_window is kept (every layer slides) and written back; "swish" is SiLU.
TEST(LlamaConfig, MistralSlidingWindowAndSwishAreKept) {
  const std::string tail = R"("vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2)";
  const LlamaConfig c = LlamaConfig::from_json_string(R"({"model_type":"mistral","sliding_window":4096,)" + tail + "}", "m.json");
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);
  EXPECT_EQ(LlamaConfig::from_json_string(c.to_json(), "back.json").sliding_window, c.sliding_window);
  EXPECT_FALSE(LlamaConfig::from_json_string(R"({"model_type":"mistral","sliding_window":null,)" + tail + "}", "m.json")
                   .sliding_window.has_value());
  // Absent: MistralConfig's default window.
  EXPECT_EQ(LlamaConfig::from_json_string(R"({"model_type":"mistral",)" + tail + "}", "m.json").sliding_window,
            std::optional<int64_t>(4096));
  EXPECT_TRUE(c.layer_slides(0));
  // A LLaMA config has no window whatever it says (LlamaConfig has no such field).
  EXPECT_FALSE(LlamaConfig::from_json_string(R"({"model_type":"llama","sliding_window":16,)" + tail + "}", "l.json")
                   .sliding_window.has_value());
  EXPECT_NO_THROW(LlamaConfig::from_json_string(R"({"model_type":"llama","hidden_act":"swish",)" + tail + "}", "s.json"));
}

TEST(LlamaConfig, BadConfigsNameFileAndField) {
  const std::string ok_tail = R"("vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1)";
  expect_error("{not json", {"bad/config.json", "not valid JSON"});
  expect_error(R"({"model_type":"gpt2",)" + ok_tail + R"(,"num_attention_heads":2})",
               {"bad/config.json", "model_type", "gpt2", "supported model types: llama", "mistral", "qwen2"});
  expect_error(R"({"model_type":"mistral",)" + ok_tail + R"(,"num_attention_heads":2,"sliding_window":0})",
               {"bad/config.json", "sliding_window", "positive"});
  expect_error(R"({)" + ok_tail + R"(,"num_attention_heads":2})", {"bad/config.json", "model_type"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + "}", {"bad/config.json", "num_attention_heads", "missing"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":"two"})",
               {"bad/config.json", "num_attention_heads", "integer"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"num_key_value_heads":3})",
               {"bad/config.json", "num_key_value_heads"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"rope_scaling":{"type":"proportional","factor":2}})",
               {"bad/config.json", "rope_scaling", "proportional", "yarn, longrope"});
  expect_error(R"({"model_type":"llama",)" + ok_tail + R"(,"num_attention_heads":2,"rope_scaling":{"type":"yarn"}})",
               {"bad/config.json", "rope_scaling", "\"factor\" is required for rope type yarn"});
  expect_error(R"({"model_type":"llama",)" + ok_tail +
                   R"(,"num_attention_heads":2,"rope_scaling":{"type":"yarn","factor":2,"partial_rotary_factor":0.5}})",
               {"bad/config.json", "partial_rotary_factor 0.5 is not supported"});
  expect_error(R"({"model_type":"llama",)" + ok_tail +
                   R"(,"num_attention_heads":2,"rope_scaling":{"type":"longrope","short_factor":[1,1]}})",
               {"bad/config.json", "\"long_factor\" is required for rope type longrope"});
  expect_error(R"({"model_type":"llama",)" + ok_tail +
                   R"(,"num_attention_heads":2,"rope_scaling":{"type":"longrope","short_factor":[1,1],"long_factor":[1,2,3]}})",
               {"bad/config.json", "\"long_factor\" must have head_dim / 2 = 2 entries, got 3"});
  expect_error(R"({"model_type":"llama",)" + ok_tail +
                   R"(,"num_attention_heads":2,"rope_scaling":{"type":"longrope","short_factor":[1,"a"],"long_factor":[1,2]}})",
               {"bad/config.json", "\"short_factor\" must hold numbers"});
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

}  // namespace test_llama_config
