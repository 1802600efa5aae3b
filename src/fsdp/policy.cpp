// --fsdp words and --fsdp_config keys -> FsdpPolicy; see include/alpaca/fsdp/policy.h.
// Key names and defaults follow transformers.TrainingArguments.__post_init__ and accelerate's
// FSDP plugin; keys may carry HF's optional "fsdp_" prefix.
#include "alpaca/fsdp/policy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <sstream>

#include "alpaca/util/error.h"
#include "alpaca/util/text.h"

namespace alpaca::fsdp {
namespace {

using nlohmann::json;

using text::lower;

// HF configs write booleans as JSON bools or as "true"/"false" strings.
bool as_bool(const json& v, const std::string& key, const std::string& origin) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) {
    const std::string s = lower(v.get<std::string>());
    if (s == "true") return true;
    if (s == "false") return false;
  }
  ALPACA_FAIL(origin << ": key '" << key << "' must be true or false, got " << v.dump());
}

std::vector<std::string> as_string_list(const json& v, const std::string& key, const std::string& origin) {
  std::vector<std::string> out;
  if (v.is_string()) {
    // accelerate joins several classes with commas.
    std::stringstream ss(v.get<std::string>());
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) out.push_back(item);
    return out;
  }
  ALPACA_CHECK(v.is_array(), origin << ": key '" << key << "' must be a string or a list of strings");
  for (const auto& e : v) {
    ALPACA_CHECK(e.is_string(), origin << ": key '" << key << "' must list strings, got " << e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

at::ScalarType dtype_word(const std::string& w, const std::string& what) {
  const std::string s = lower(w);
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  ALPACA_FAIL(what << " '" << w << "' is not a dtype; use fp32, bf16 or fp16");
}

const std::vector<std::string>& strategy_words() {
  static const std::vector<std::string> w = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"};
  return w;
}

bool is_strategy(const std::string& w) {
  const auto& s = strategy_words();
  return std::find(s.begin(), s.end(), w) != s.end();
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// A strategy's word (lower case), as --fsdp, sharding_strategy and FSDP1's reshard_after_forward name it.
std::optional<ShardingStrategy> strategy_of_word(const std::string& w) {
  if (w == "full_shard") return ShardingStrategy::kFullShard;
  if (w == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (w == "no_shard") return ShardingStrategy::kNoShard;
  if (w == "hybrid_shard") return ShardingStrategy::kHybridShard;
  return std::nullopt;
}

// The words of --fsdp as the builder reads them; `text` is the original flag value for messages.
void apply_words(const std::string& text, const std::vector<std::string>& words, FsdpPolicy& p) {
  if (words.empty()) {
    // No --fsdp: every rank keeps the whole model and gradients are all-reduced (HF's DDP), with
    // one unit per decoder layer so the reduction overlaps the backward.
    p.strategy = ShardingStrategy::kNoShard;
    p.auto_wrap = true;
    return;
  }
  std::vector<std::string> strategies;
  for (const auto& w : words)
    if (is_strategy(w)) strategies.push_back(w);
  const bool offload = std::count(words.begin(), words.end(), "offload") > 0;
  if (strategies.size() > 1)
    ALPACA_FAIL("--fsdp \"" << text << "\" names " << join(strategies, " and ") << "; choose one sharding strategy");
  if (strategies.empty() && offload)
    ALPACA_FAIL("--fsdp offload can't work on its own; add it to a strategy, e.g. --fsdp \"full_shard auto_wrap offload\"");
  const std::string strategy = strategies.empty() ? "full_shard" : strategies.front();  // auto_wrap alone: full_shard, as accelerate
  if (strategy == "no_shard" && offload)
    ALPACA_FAIL("--fsdp \"no_shard offload\" is not supported (nothing is sharded to offload); use "
                "\"full_shard auto_wrap offload\"");
  p.strategy = *strategy_of_word(strategy);  // is_strategy() chose it
  p.offload = offload;
  // Without auto_wrap HF wraps the whole model as one unit.
  p.auto_wrap = std::count(words.begin(), words.end(), "auto_wrap") > 0;
}

// `strategy_word`: --fsdp named a sharding strategy itself (else auto_wrap alone gave full_shard).
void apply_config(const json& cfg, const std::string& origin, FsdpPolicy& p, bool& wrap_cls_given, bool strategy_word) {
  ALPACA_CHECK(cfg.is_object(), origin << " must be a JSON object of fsdp_config keys");
  std::set<std::string> keys;
  // sharding_strategy (FSDP1) and reshard_after_forward (FSDP2) both name the strategy.
  std::optional<ShardingStrategy> config_strategy;
  auto config_names = [&](ShardingStrategy s) {
    ALPACA_CHECK(!config_strategy || *config_strategy == s,
                 origin << ": sharding_strategy and reshard_after_forward name different strategies (" << to_string(*config_strategy)
                        << ", " << to_string(s) << "); keep one");
    config_strategy = s;
  };
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    std::string key = it.key();
    if (key.rfind("fsdp_", 0) == 0) key = key.substr(5);  // HF strips the optional prefix
    ALPACA_CHECK(keys.insert(key).second, origin << ": key '" << key << "' given twice (with and without fsdp_)");
    const json& v = it.value();
    if (key == "version") {
      // transformers 5 defaults to 2 (FSDP2: per-parameter sharding) and still takes 1 (flat
      // parameters, what this engine is). The training is the same; the version decides only how
      // reshard_after_forward is spelled (below).
      ALPACA_CHECK(v.is_number_integer() && (v.get<int>() == 1 || v.get<int>() == 2),
                   origin << ": version " << v.dump() << " is not supported; use 2 (transformers' default) or 1");
    } else if (key == "reshard_after_forward") {
      // FSDP2 (version 2): true = full_shard, false = shard_grad_op; FSDP1: a strategy name.
      ShardingStrategy s = p.strategy;
      if (v.is_boolean()) {
        s = v.get<bool>() ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
      } else if (v.is_string()) {
        const std::string w = lower(v.get<std::string>());
        if (w == "true" || w == "false") s = w == "true" ? ShardingStrategy::kFullShard : ShardingStrategy::kShardGradOp;
        else if (const auto named = strategy_of_word(w)) s = *named;
        else ALPACA_FAIL(origin << ": reshard_after_forward '" << w << "' unknown; use true (full_shard) or false (shard_grad_op)");
      } else {
        ALPACA_FAIL(origin << ": reshard_after_forward must be true or false");
      }
      ALPACA_CHECK(!strategy_word || s == p.strategy,
                   origin << ": reshard_after_forward " << v.dump() << " (" << to_string(s) << ") contradicts --fsdp, which names "
                          << to_string(p.strategy) << "; name the strategy in one place");
      config_names(s);
      p.strategy = s;
    } else if (key == "cpu_offload") {  // transformers 5's spelling of --fsdp offload
      p.offload = as_bool(v, key, origin) || p.offload;
    } else if (key == "auto_wrap_policy") {
      ALPACA_CHECK(v.is_string(), origin << ": auto_wrap_policy must be a string");
      const std::string w = v.get<std::string>();
      if (w == "TRANSFORMER_BASED_WRAP") p.auto_wrap = true;
      else if (w == "NO_WRAP") p.auto_wrap = false;
      else if (w == "SIZE_BASED_WRAP") ALPACA_FAIL(origin << ": auto_wrap_policy SIZE_BASED_WRAP (size-based wrapping) is not "
                                                         "supported; use TRANSFORMER_BASED_WRAP (one unit per decoder layer)");
      else ALPACA_FAIL(origin << ": auto_wrap_policy '" << w << "' unknown; use TRANSFORMER_BASED_WRAP or NO_WRAP");
    } else if (key == "xla" || key == "xla_fsdp_v2" || key == "xla_fsdp_grad_ckpt") {
      ALPACA_CHECK(!as_bool(v, key, origin), origin << ": " << key << " is for PyTorch/XLA (TPU); alpaca-train runs CUDA and CPU, "
                                                   "set it to false or drop it");
    } else if (key == "min_num_params") {
      ALPACA_CHECK(v.is_number_integer() && v.get<int64_t>() == 0,
                   origin << ": min_num_params (size-based wrapping) is not supported; wrap by "
                             "transformer_layer_cls_to_wrap");
    } else if (key == "transformer_layer_cls_to_wrap") {
      p.wrap_classes = as_string_list(v, key, origin);
      wrap_cls_given = true;
    } else if (key == "backward_prefetch") {
      ALPACA_CHECK(v.is_string(), origin << ": backward_prefetch must be a string");
      const std::string s = lower(v.get<std::string>());
      if (s == "backward_pre") p.backward_prefetch = BackwardPrefetch::kBackwardPre;
      else if (s == "backward_post") p.backward_prefetch = BackwardPrefetch::kBackwardPost;
      else if (s == "no_prefetch") p.backward_prefetch = BackwardPrefetch::kNone;
      else ALPACA_FAIL(origin << ": backward_prefetch '" << s << "' unknown; use backward_pre, backward_post or no_prefetch");
    } else if (key == "forward_prefetch") {
      p.forward_prefetch = as_bool(v, key, origin);
    } else if (key == "limit_all_gathers") {
      p.limit_all_gathers = as_bool(v, key, origin);
    } else if (key == "use_orig_params") {
      ALPACA_CHECK(as_bool(v, key, origin), origin << ": use_orig_params=false is not supported; "
                   "alpaca-train always keeps the original parameters as views of the flat buffer");
    } else if (key == "sync_module_states") {
      p.sync_module_states = as_bool(v, key, origin);
    } else if (key == "cpu_ram_efficient_loading") {
      p.cpu_ram_efficient_loading = as_bool(v, key, origin);
    } else if (key == "activation_checkpointing") {
      p.activation_checkpointing = as_bool(v, key, origin) || p.activation_checkpointing;
    } else if (key == "offload_params") {
      p.offload = as_bool(v, key, origin) || p.offload;
    } else if (key == "sharding_strategy") {
      ALPACA_CHECK(v.is_string(), origin << ": sharding_strategy must be a string");
      const ShardingStrategy from_words = p.strategy;
      const std::string s = lower(v.get<std::string>());
      // torch's ShardingStrategy enum values 1-4 are accepted as HF accepts them.
      static const char* const kByNumber[] = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"};
      const bool number = s.size() == 1 && s[0] >= '1' && s[0] <= '4';
      const auto named = strategy_of_word(number ? kByNumber[s[0] - '1'] : s);
      ALPACA_CHECK(named, origin << ": sharding_strategy '" << s << "' unsupported");
      p.strategy = *named;
      // Two places naming two strategies is the contradiction --fsdp "full_shard shard_grad_op" is.
      ALPACA_CHECK(!strategy_word || p.strategy == from_words,
                   origin << ": sharding_strategy " << v.get<std::string>() << " contradicts --fsdp, which names "
                          << to_string(from_words) << "; name the strategy in one place");
      config_names(p.strategy);
    } else if (key == "state_dict_type") {
      // Checkpoints are always written sharded (each rank its ranges, torch DCP's HF layout: what
      // SHARDED_STATE_DICT asks for) and the final output_dir as one HF directory (FULL_STATE_DICT's
      // final save); `alpaca-train consolidate` makes a checkpoint one. So both values mean this.
      ALPACA_CHECK(v.is_string() && (v.get<std::string>() == "FULL_STATE_DICT" || v.get<std::string>() == "SHARDED_STATE_DICT"),
                   origin << ": state_dict_type " << v.dump() << " is not supported; use SHARDED_STATE_DICT or "
                             "FULL_STATE_DICT (checkpoints are sharded by rank, `alpaca-train consolidate` turns one into "
                             "an HF directory, and the final output_dir is one)");
    } else if (key == "reduce_dtype") {  // alpaca-train extension: HF reduces in param_dtype
      ALPACA_CHECK(v.is_string(), origin << ": reduce_dtype must be a string");
      p.reduce_dtype = dtype_word(v.get<std::string>(), origin + ": reduce_dtype");
    } else if (key == "hybrid_shard_size") {  // alpaca-train extension
      ALPACA_CHECK(v.is_number_integer() && v.get<int>() > 0, origin << ": hybrid_shard_size must be a positive integer");
      p.hybrid_shard_size = v.get<int>();
    } else if (key == "force_collectives") {  // alpaca-train extension: test/debug knob (policy.h)
      p.force_collectives = as_bool(v, key, origin);
    } else {
      ALPACA_FAIL(origin << ": key '" << it.key() << "' is not supported by alpaca-train (accepted: "
                  "version, min_num_params=0, transformer_layer_cls_to_wrap, auto_wrap_policy, reshard_after_forward, cpu_offload, "
                  "backward_prefetch, forward_prefetch, "
                  "limit_all_gathers, use_orig_params, sync_module_states, cpu_ram_efficient_loading, "
                  "activation_checkpointing, offload_params, sharding_strategy, state_dict_type, reduce_dtype, "
                  "hybrid_shard_size, force_collectives)");
    }
  }
}

}  // namespace

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

const char* to_string(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kBackwardPre: return "BACKWARD_PRE";
    case BackwardPrefetch::kBackwardPost: return "BACKWARD_POST";
    case BackwardPrefetch::kNone: return "NO_PREFETCH";
  }
  return "?";
}

std::vector<std::string> fsdp_words(const std::string& fsdp) {
  // HF: --fsdp True (or bare --fsdp) means full_shard, --fsdp False none.
  std::string trimmed = fsdp;
  trimmed.erase(0, trimmed.find_first_not_of(" \t,"));
  trimmed.erase(trimmed.find_last_not_of(" \t,") + 1);
  if (auto b = text::parse_bool_text(trimmed)) return *b ? std::vector<std::string>{"full_shard"} : std::vector<std::string>{};
  static const std::vector<std::string> kKnown = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard",
                                                  "hybrid_shard_zero2", "offload", "auto_wrap"};
  std::set<std::string> seen;
  std::string word;
  for (char c : fsdp + " ") {
    if (c != ' ' && c != '\t' && c != ',' && c != '\n') {
      word += c;
      continue;
    }
    if (word.empty()) continue;
    const std::string w = lower(word);
    if (std::find(kKnown.begin(), kKnown.end(), w) == kKnown.end()) {
      const std::string guess = text::closest_name(w, kKnown);
      ALPACA_FAIL("--fsdp word '" << word << "' is not one of " << join(kKnown, ", ")
                                  << (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
    }
    if (w == "hybrid_shard_zero2")
      ALPACA_FAIL("--fsdp hybrid_shard_zero2 is not implemented by the FSDP engine; use one of "
                  << join(strategy_words(), ", "));
    seen.insert(w);
    word.clear();
  }
  // Canonical order: the strategies, then auto_wrap, then offload.
  std::vector<std::string> out;
  for (const auto& w : strategy_words())
    if (seen.count(w)) out.push_back(w);
  for (const char* w : {"auto_wrap", "offload"})
    if (seen.count(w)) out.push_back(w);
  return out;
}

FsdpPolicy build_fsdp_policy(const FsdpPolicyInputs& in) {
  FsdpPolicy p;
  const std::vector<std::string> words = fsdp_words(in.fsdp);
  apply_words(in.fsdp, words, p);
  const std::string mp = lower(in.mixed_precision);
  if (mp == "bf16") p.param_dtype = at::kBFloat16;
  else if (mp == "fp16") p.param_dtype = at::kHalf;
  else ALPACA_CHECK(mp == "no" || mp.empty(), "mixed precision '" << in.mixed_precision << "' unknown; use no, bf16 or fp16");
  p.reduce_dtype = p.param_dtype;  // accelerate: reduce_dtype = param_dtype
  bool wrap_cls_given = false;
  std::vector<std::string> config_classes;
  if (in.fsdp_config.find_first_not_of(" \t\n\r") != std::string::npos) {
    json cfg;
    try {
      cfg = json::parse(in.fsdp_config, nullptr, true, /*ignore_comments=*/true);
    } catch (const json::exception& e) {
      ALPACA_FAIL(in.fsdp_config_origin << " is not valid JSON: " << e.what());
    }
    ALPACA_CHECK(words.size() > 0 || (cfg.is_object() && cfg.empty()),
                 in.fsdp_config_origin << " has no effect without --fsdp; add --fsdp \"full_shard auto_wrap\" or drop it");
    apply_config(cfg, in.fsdp_config_origin, p, wrap_cls_given,
                 std::any_of(words.begin(), words.end(), [](const std::string& w) { return is_strategy(w); }));
    config_classes = p.wrap_classes;
  }
  if (!in.transformer_layer_cls_to_wrap.empty()) {
    ALPACA_CHECK(std::count(words.begin(), words.end(), "auto_wrap") > 0,
                 "--fsdp_transformer_layer_cls_to_wrap only acts with --fsdp auto_wrap; add auto_wrap, e.g. "
                 "--fsdp \"full_shard auto_wrap\"");
    ALPACA_CHECK(!wrap_cls_given || config_classes == in.transformer_layer_cls_to_wrap,
                 "--fsdp_transformer_layer_cls_to_wrap " << join(in.transformer_layer_cls_to_wrap, ",")
                 << " contradicts " << in.fsdp_config_origin << " transformer_layer_cls_to_wrap "
                 << join(config_classes, ",") << "; give it once");
    p.wrap_classes = in.transformer_layer_cls_to_wrap;
  }
  // Alpaca issue #58: the pre-release class name silently wrapped nothing in PyTorch FSDP. Which of
  // the known classes matches the model is checked once config.json is read (check_wrap_classes).
  for (const auto& c : p.wrap_classes)
    ALPACA_CHECK(c == "LlamaDecoderLayer" || c == "MistralDecoderLayer" || c == "Qwen2DecoderLayer",
                 "FSDP layer class '" << c << "' does not exist in this trainer, which trains LLaMA-family models: use "
                 "LlamaDecoderLayer (LLaMADecoderLayer was the pre-release spelling), MistralDecoderLayer or "
                 "Qwen2DecoderLayer, the class of the model's model_type");
  if (in.gradient_checkpointing) p.activation_checkpointing = true;
  ALPACA_CHECK(!p.cpu_ram_efficient_loading || p.sync_module_states,
               "fsdp_config: cpu_ram_efficient_loading=true requires sync_module_states=true (as in HF)");
  if (p.strategy == ShardingStrategy::kHybridShard && p.hybrid_shard_size == 0)
    p.hybrid_shard_size = std::max(1, in.local_world_size);
  return p;
}

std::string decoder_layer_class(const std::string& model_type) {
  if (model_type == "llama") return "LlamaDecoderLayer";
  if (model_type == "mistral") return "MistralDecoderLayer";
  if (model_type == "qwen2") return "Qwen2DecoderLayer";
  return "";
}

void check_wrap_classes(const FsdpPolicy& p, const std::string& model_type, const std::string& source) {
  const std::string want = decoder_layer_class(model_type);
  for (const auto& c : p.wrap_classes)
    ALPACA_CHECK(c == want, "FSDP layer class '" << c << "' (--fsdp_transformer_layer_cls_to_wrap or fsdp_config "
                 "transformer_layer_cls_to_wrap) is not in the model: " << source << " has model_type " << model_type
                 << ", whose decoder layer is " << want << "; wrap " << want << " (or leave the class out)");
}

}  // namespace alpaca::fsdp
