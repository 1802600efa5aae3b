// LlamaConfig <-> HF config.json. Accepts both the transformers 4 layout (rope_theta +
// rope_scaling) and the transformers 5 one (rope_parameters), and writes both so either loads it.
#include "alpaca/model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::model {
namespace {

using nlohmann::json;

// Typed field access whose errors say which file and which field is wrong.
class Fields {
 public:
  Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t require_int(const char* key) const {
    ALPACA_USER_CHECK(has(key), source_ << ": required field \"" << key
                                   << "\" is missing; add it to the model config");
    return get_int(key, 0);
  }
  int64_t get_int(const char* key, int64_t fallback) const {
    return get<int64_t>(key, fallback, &json::is_number_integer, "an integer");
  }
  double get_double(const char* key, double fallback) const {
    return get<double>(key, fallback, &json::is_number, "a number");
  }
  bool get_bool(const char* key, bool fallback) const {
    return get<bool>(key, fallback, &json::is_boolean, "true or false");
  }
  std::string get_string(const char* key, const std::string& fallback) const {
    return get<std::string>(key, fallback, &json::is_string, "a string");
  }

 private:
  // The field as a T, `fallback` when absent or null; a value of another JSON type (`is` false)
  // is an error saying what it `must_be`.
  template <class T>
  T get(const char* key, const T& fallback, bool (json::*is)() const noexcept, const char* must_be) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    ALPACA_USER_CHECK((v.*is)(), source_ << ": field \"" << key << "\" must be " << must_be << ", got " << v.dump());
    return v.get<T>();
  }

 private:
  const json& j_;
  std::string source_;
};

// A list of numbers (longrope's short_factor / long_factor), `n` of them.
std::vector<double> number_list(const json& r, const std::string& where, const char* key, int64_t n) {
  ALPACA_USER_CHECK(r.contains(key) && !r.at(key).is_null(), where << ": \"" << key << "\" is required for rope type longrope");
  const json& v = r.at(key);
  ALPACA_USER_CHECK(v.is_array(), where << ": \"" << key << "\" must be a list of numbers, got " << v.dump());
  std::vector<double> out;
  for (const json& e : v) {
    ALPACA_USER_CHECK(e.is_number(), where << ": \"" << key << "\" must hold numbers, got " << e.dump());
    out.push_back(e.get<double>());
  }
  ALPACA_USER_CHECK(static_cast<int64_t>(out.size()) == n,
               where << ": \"" << key << "\" must have head_dim / 2 = " << n << " entries, got " << out.size());
  return out;
}

// `top` is the whole config (a top-level original_max_position_embeddings wins over the rope
// dict's, as transformers' standardize_rope_params has it); `c` carries the shapes already read.
RopeScaling parse_rope(const json& r, const Fields& top, const LlamaConfig& c, const std::string& source,
                       const char* field) {
  RopeScaling rs;
  ALPACA_USER_CHECK(r.is_object(), source << ": field \"" << field << "\" must be an object, got " << r.dump());
  std::string where = source + " field \"" + field + "\"";
  Fields f(r, where);
  std::string type = f.get_string("rope_type", f.get_string("type", "default"));
  if (type == "default") type = "";
  ALPACA_USER_CHECK(type.empty() || type == "linear" || type == "dynamic" || type == "llama3" || type == "yarn" ||
                   type == "longrope",
               where << ": rope type \"" << type
                     << "\" is not supported (supported: default, linear, dynamic, llama3, yarn, longrope)");
  rs.type = type;
  if (type.empty()) return rs;
  const bool scaled_context = type == "llama3" || type == "yarn" || type == "longrope";
  if (scaled_context) {
    rs.original_max_position_embeddings =
        top.get_int("original_max_position_embeddings",
                    f.get_int("original_max_position_embeddings", c.max_position_embeddings));
    ALPACA_USER_CHECK(rs.original_max_position_embeddings > 0,
                 where << ": \"original_max_position_embeddings\" must be positive, got "
                       << rs.original_max_position_embeddings);
  }
  if (type == "longrope" && !f.has("factor")) {
    // transformers (Phi-3's convention): the ratio of the two context lengths.
    rs.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(rs.original_max_position_embeddings);
  } else {
    ALPACA_USER_CHECK(f.has("factor"), where << ": \"factor\" is required for rope type " << type);
    rs.factor = f.get_double("factor", 1.0);
    ALPACA_USER_CHECK(rs.factor >= 1.0, where << ": \"factor\" must be >= 1, got " << rs.factor);
  }
  if (type == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor"})
      ALPACA_USER_CHECK(f.has(k), where << ": \"" << k << "\" is required for rope type llama3");
    rs.low_freq_factor = f.get_double("low_freq_factor", 1.0);
    rs.high_freq_factor = f.get_double("high_freq_factor", 4.0);
    ALPACA_USER_CHECK(rs.high_freq_factor > rs.low_freq_factor,
                 where << ": high_freq_factor must exceed low_freq_factor");
  }
  if (type == "yarn" || type == "longrope") {
    const double partial = f.get_double("partial_rotary_factor", top.get_double("partial_rotary_factor", 1.0));
    ALPACA_USER_CHECK(partial == 1.0, where << ": partial_rotary_factor " << partial
                                       << " is not supported (LLaMA rotates the whole head; remove it or set 1.0)");
    if (f.has("attention_factor")) {
      rs.attention_factor = f.get_double("attention_factor", 1.0);
      ALPACA_USER_CHECK(*rs.attention_factor > 0,
                   where << ": \"attention_factor\" must be positive, got " << *rs.attention_factor);
    }
  }
  if (type == "yarn") {
    // transformers reads `get("beta_fast") or 32` and tests `if mscale and mscale_all_dim`: 0 is unset.
    rs.beta_fast = f.get_double("beta_fast", 0.0);
    if (rs.beta_fast == 0.0) rs.beta_fast = 32.0;
    rs.beta_slow = f.get_double("beta_slow", 0.0);
    if (rs.beta_slow == 0.0) rs.beta_slow = 1.0;
    rs.mscale = f.get_double("mscale", 0.0);
    rs.mscale_all_dim = f.get_double("mscale_all_dim", 0.0);
    rs.truncate = f.get_bool("truncate", true);
  }
  if (type == "longrope") {
    rs.short_factor = number_list(r, where, "short_factor", c.head_dim / 2);
    rs.long_factor = number_list(r, where, "long_factor", c.head_dim / 2);
  }
  return rs;
}

std::vector<int64_t> parse_token_list(const json& j, const std::string& source, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return {};
  const json& v = j.at(key);
  if (v.is_number_integer()) return {v.get<int64_t>()};
  ALPACA_USER_CHECK(v.is_array(), source << ": field \"" << key << "\" must be an integer or a list of integers");
  std::vector<int64_t> out;
  for (const json& e : v) {
    ALPACA_USER_CHECK(e.is_number_integer(), source << ": field \"" << key << "\" must hold integers, got " << e.dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

json parse_config_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ALPACA_USER_FAIL(source << ": not valid JSON (" << e.what() << "); fix or regenerate the config");
  }
  ALPACA_USER_CHECK(j.is_object(), source << ": a model config must be a JSON object");
  return j;
}

// The model type, after refusing what our modules do not implement (other activations, attention
// dropout). Mistral's modules are LLaMA's; the sliding windows are read_sliding_window's.
std::string supported_model_type(Fields& f, const std::string& source) {
  ALPACA_USER_CHECK(f.has("model_type"),
               source << ": required field \"model_type\" is missing (supported: llama, mistral, qwen2)");
  std::string model_type = f.get_string("model_type", "");
  ALPACA_USER_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2",
               source << ": field \"model_type\" is \"" << model_type
                      << "\"; supported model types: llama (LLaMA 1, 2, 3, 3.1, 3.2), mistral, qwen2");
  // transformers' ACT2CLS maps "swish" to the same nn.SiLU.
  std::string act = f.get_string("hidden_act", "silu");
  ALPACA_USER_CHECK(act == "silu" || act == "swish",
               source << ": field \"hidden_act\" is \"" << act << "\"; only silu (swish) is supported");
  ALPACA_USER_CHECK(f.get_double("attention_dropout", 0.0) == 0.0,
               source << ": field \"attention_dropout\" must be 0 (attention dropout is unsupported)");
  return model_type;
}

// Sizes, norms, init and biases (each family's rule for which projections have one).
void read_shapes(Fields& f, const std::string& source, LlamaConfig& c) {
  c.vocab_size = f.require_int("vocab_size");
  c.hidden_size = f.require_int("hidden_size");
  c.intermediate_size = f.require_int("intermediate_size");
  c.num_hidden_layers = f.require_int("num_hidden_layers");
  c.num_attention_heads = f.require_int("num_attention_heads");
  c.num_key_value_heads = f.get_int("num_key_value_heads", c.num_attention_heads);
  ALPACA_USER_CHECK(c.num_attention_heads > 0, source << ": field \"num_attention_heads\" must be positive");
  c.head_dim = f.get_int("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 2048);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  c.initializer_range = f.get_double("initializer_range", 0.02);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  c.attention_bias = f.get_bool("attention_bias", false);
  c.mlp_bias = f.get_bool("mlp_bias", false);
  c.o_proj_bias = c.attention_bias;  // LlamaConfig.attention_bias covers q, k, v and o
  if (c.model_type == "mistral") {
    c.attention_bias = c.o_proj_bias = c.mlp_bias = false;  // MistralConfig has none
  }
  if (c.model_type == "qwen2") {  // Qwen2Attention: q/k/v with bias, o_proj without; Qwen2MLP without
    c.attention_bias = true;
    c.o_proj_bias = c.mlp_bias = false;
  }
}

// Sliding windows (LlamaConfig::sliding_window): MistralConfig's sliding_window (4096 when absent),
// Qwen2Config's use_sliding_window / sliding_window / max_window_layers / layer_types as its
// __post_init__ resolves them; LlamaConfig has none.
void read_sliding_window(const json& j, Fields& f, const std::string& source, LlamaConfig& c) {
  auto window = [&](int64_t fallback) -> std::optional<int64_t> {
    if (!j.contains("sliding_window")) return fallback;
    if (j.at("sliding_window").is_null()) return std::nullopt;
    const int64_t w = f.get_int("sliding_window", 0);
    ALPACA_USER_CHECK(w > 0, source << ": field \"sliding_window\" must be positive or null, got " << w);
    return w;
  };
  const auto n = static_cast<size_t>(c.num_hidden_layers);
  if (c.model_type == "mistral") {
    c.sliding_window = window(4096);
    c.sliding_layers.assign(n, c.sliding_window.has_value());
    return;
  }
  if (c.model_type != "qwen2") return;
  c.use_sliding_window = f.get_bool("use_sliding_window", false);
  c.max_window_layers = f.get_int("max_window_layers", 28);
  const std::optional<int64_t> w = window(4096);
  if (c.use_sliding_window) c.sliding_window = w;  // transformers: None unless use_sliding_window
  c.sliding_layers.assign(n, false);
  if (f.has("layer_types")) {
    const json& lt = j.at("layer_types");
    ALPACA_USER_CHECK(lt.is_array() && lt.size() == n, source << ": field \"layer_types\" must be a list of "
                                                             << n << " layer types (num_hidden_layers), got " << lt.dump());
    for (size_t i = 0; i < n; ++i) {
      ALPACA_USER_CHECK(lt[i] == "full_attention" || lt[i] == "sliding_attention",
                        source << ": field \"layer_types\" holds " << lt[i].dump()
                               << "; Qwen2 layers are \"full_attention\" or \"sliding_attention\"");
      c.sliding_layers[i] = lt[i] == "sliding_attention";
    }
    const bool any = std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) != c.sliding_layers.end();
    ALPACA_USER_CHECK(!any || c.sliding_window,
                      source << ": field \"layer_types\" names sliding_attention layers but there is no window ("
                             << (c.use_sliding_window ? "sliding_window is null" : "use_sliding_window is false")
                             << "); set use_sliding_window true with a sliding_window, or make every layer full_attention");
  } else if (c.sliding_window) {
    for (size_t i = 0; i < n; ++i) c.sliding_layers[i] = static_cast<int64_t>(i) >= c.max_window_layers;
  }
}

// transformers 5 keeps rope_theta inside rope_parameters; 4.x keeps it at top level.
void read_rope(const json& j, Fields& f, const std::string& source, LlamaConfig& c) {
  c.rope_theta = f.get_double("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!f.has(key)) continue;
    c.rope_scaling = parse_rope(j.at(key), f, c, source, key);
    Fields rf(j.at(key), source + " field \"" + key + "\"");
    c.rope_theta = rf.get_double("rope_theta", c.rope_theta);
    break;
  }
}

// An absent key takes transformers' default (LlamaConfig, MistralConfig: bos 1, eos 2;
// Qwen2Config: none); null is none.
void read_special_tokens(const json& j, const std::string& source, LlamaConfig& c) {
  const bool default_tokens = c.model_type != "qwen2";
  auto bos = parse_token_list(j, source, "bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  else if (default_tokens && !j.contains("bos_token_id")) c.bos_token_id = 1;
  c.eos_token_id = parse_token_list(j, source, "eos_token_id");
  if (default_tokens && !j.contains("eos_token_id")) c.eos_token_id = {2};
  auto pad = parse_token_list(j, source, "pad_token_id");
  // Old LLaMA-1 conversions write pad_token_id = -1 for "none" (no pad token) ...
  if (!pad.empty() && pad.front() >= 0) c.pad_token_id = pad.front();
  // ... but transformers still builds nn.Embedding(vocab, hidden, padding_idx=pad_token_id), which
  // counts a negative index from the end: that row never gets a gradient.
  if (!pad.empty() && pad.front() < c.vocab_size && pad.front() >= -c.vocab_size)
    c.embedding_padding_idx = pad.front() >= 0 ? pad.front() : c.vocab_size + pad.front();
}

}  // namespace

LlamaConfig LlamaConfig::from_json_string(const std::string& text, const std::string& source) {
  const json j = parse_config_json(text, source);
  Fields f(j, source);
  LlamaConfig c;
  c.model_type = supported_model_type(f, source);
  read_shapes(f, source, c);
  read_sliding_window(j, f, source, c);
  read_rope(j, f, source, c);
  read_special_tokens(j, source, c);
  c.torch_dtype = f.get_string("torch_dtype", f.get_string("dtype", ""));
  c.validate(source);
  return c;
}

LlamaConfig LlamaConfig::from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ALPACA_USER_CHECK(in.good(), path << ": cannot open the model config; check --model_name_or_path / --config");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_string(ss.str(), path);
}

bool LlamaConfig::any_layer_slides() const {
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    if (layer_slides(i)) return true;
  return false;
}

void LlamaConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* name) {
    ALPACA_USER_CHECK(v > 0, source << ": field \"" << name << "\" must be positive, got " << v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  ALPACA_USER_CHECK(num_attention_heads % num_key_value_heads == 0,
               source << ": field \"num_key_value_heads\" (" << num_key_value_heads
                      << ") must divide num_attention_heads (" << num_attention_heads << ")");
  ALPACA_USER_CHECK(head_dim % 2 == 0, source << ": field \"head_dim\" must be even for RoPE, got " << head_dim);
  ALPACA_USER_CHECK(rms_norm_eps > 0, source << ": field \"rms_norm_eps\" must be positive");
  ALPACA_USER_CHECK(rope_theta > 0, source << ": field \"rope_theta\" must be positive");
  ALPACA_USER_CHECK(torch_dtype.empty() || torch_dtype == "float32" || torch_dtype == "bfloat16" ||
                   torch_dtype == "float16",
               source << ": field \"torch_dtype\" is \"" << torch_dtype
                      << "\"; expected float32, bfloat16 or float16");
}

std::string LlamaConfig::to_json() const {
  json j;
  const bool mistral = model_type == "mistral";
  const bool qwen2 = model_type == "qwen2";
  j["architectures"] = json::array({mistral ? "MistralForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = mistral ? "mistral" : qwen2 ? "qwen2" : "llama";
  if (mistral || qwen2) j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  if (qwen2) {
    j["use_sliding_window"] = use_sliding_window;
    j["max_window_layers"] = max_window_layers;
    j["layer_types"] = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i)
      j["layer_types"].push_back(layer_slides(i) ? "sliding_attention" : "full_attention");
  } else {
    j["attention_bias"] = attention_bias;  // Qwen2Config has no such field (its bias is fixed)
  }
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (eos_token_id.empty()) j["eos_token_id"] = nullptr;
  else if (eos_token_id.size() == 1) j["eos_token_id"] = eos_token_id.front();
  else j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = initializer_range;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["mlp_bias"] = mlp_bias;
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  j["pretraining_tp"] = 1;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  json rope;
  rope["rope_type"] = rope_scaling.type.empty() ? "default" : rope_scaling.type;
  rope["rope_theta"] = rope_theta;
  if (!rope_scaling.type.empty()) rope["factor"] = rope_scaling.factor;
  const RopeScaling& rs = rope_scaling;
  if (rs.type == "llama3") {
    rope["low_freq_factor"] = rs.low_freq_factor;
    rope["high_freq_factor"] = rs.high_freq_factor;
  }
  if (rs.type == "llama3" || rs.type == "yarn" || rs.type == "longrope")
    rope["original_max_position_embeddings"] = rs.original_max_position_embeddings;
  if (rs.attention_factor) rope["attention_factor"] = *rs.attention_factor;
  if (rs.type == "yarn") {
    rope["beta_fast"] = rs.beta_fast;
    rope["beta_slow"] = rs.beta_slow;
    if (rs.mscale != 0.0) rope["mscale"] = rs.mscale;
    if (rs.mscale_all_dim != 0.0) rope["mscale_all_dim"] = rs.mscale_all_dim;
    rope["truncate"] = rs.truncate;
  }
  if (rs.type == "longrope") {
    rope["short_factor"] = rs.short_factor;
    rope["long_factor"] = rs.long_factor;
  }
  j["rope_parameters"] = rope;
  if (rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    json legacy = rope;
    legacy.erase("rope_theta");
    legacy["type"] = rope_scaling.type;  // transformers < 4.45 reads "type"
    j["rope_scaling"] = legacy;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  std::string dtype = torch_dtype.empty() ? "float32" : torch_dtype;
  j["torch_dtype"] = dtype;
  j["dtype"] = dtype;
  j["use_cache"] = true;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

}  // namespace alpaca::model
