// --fsdp words and --fsdp_config keys -> FsdpPolicy; see include/alpaca/fsdp/policy.h.
// Key names and defaults follow transformers.TrainingArguments.__post_init__ and accelerate's
// FSDP plugin; keys may carry HF's optional "fsdp_" prefix.
#include "alpaca/fsdp/policy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "alpaca/util/error.h"

namespace alpaca::fsdp {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

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

void apply_words(const std::string& words, FsdpPolicy& p) {
  std::stringstream ss(words);
  std::string w;
  std::set<std::string> seen;
  while (ss >> w) seen.insert(lower(w));
  if (seen.empty()) {
    // No --fsdp: every rank keeps the whole model and gradients are all-reduced (HF's DDP).
    p.strategy = ShardingStrategy::kNoShard;
    return;
  }
  if (seen.count("true")) {  // HF: --fsdp True means full_shard
    seen.erase("true");
    seen.insert("full_shard");
  }
  int strategies = 0;
  for (const auto& word : seen) {
    if (word == "full_shard") {
      p.strategy = ShardingStrategy::kFullShard;
      ++strategies;
    } else if (word == "shard_grad_op") {
      p.strategy = ShardingStrategy::kShardGradOp;
      ++strategies;
    } else if (word == "no_shard") {
      p.strategy = ShardingStrategy::kNoShard;
      ++strategies;
    } else if (word == "hybrid_shard") {
      p.strategy = ShardingStrategy::kHybridShard;
      ++strategies;
    } else if (word == "offload") {
      p.offload = true;
    } else if (word == "auto_wrap") {
      p.auto_wrap = true;
    } else if (word == "hybrid_shard_zero2") {
      ALPACA_FAIL("--fsdp word 'hybrid_shard_zero2' is not supported; use hybrid_shard or shard_grad_op");
    } else {
      ALPACA_FAIL("--fsdp word '" << word << "' is unknown; use full_shard, shard_grad_op, no_shard, "
                  "hybrid_shard, auto_wrap, offload");
    }
  }
  ALPACA_CHECK(strategies <= 1, "--fsdp '" << words << "' names more than one sharding strategy; pick one "
               "of full_shard, shard_grad_op, no_shard, hybrid_shard");
  ALPACA_CHECK(strategies == 1 || !p.offload,
               "--fsdp 'offload' needs a sharding strategy too, e.g. --fsdp \"full_shard offload auto_wrap\"");
  if (strategies == 0) p.strategy = ShardingStrategy::kFullShard;
  // Without auto_wrap HF wraps the whole model as one unit.
  if (!seen.count("auto_wrap")) p.auto_wrap = false;
}

void apply_config(const json& cfg, const std::string& origin, FsdpPolicy& p, bool& wrap_cls_given) {
  ALPACA_CHECK(cfg.is_object(), origin << " must be a JSON object of fsdp_config keys");
  std::set<std::string> keys;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    std::string key = it.key();
    if (key.rfind("fsdp_", 0) == 0) key = key.substr(5);  // HF strips the optional prefix
    ALPACA_CHECK(keys.insert(key).second, origin << ": key '" << key << "' given twice (with and without fsdp_)");
    const json& v = it.value();
    if (key == "version") {
      ALPACA_CHECK(v.is_number_integer() && v.get<int>() == 1,
                   origin << ": fsdp_version " << v.dump() << " is not supported; alpaca-train implements FSDP1 semantics (1)");
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
      const std::string s = lower(v.get<std::string>());
      if (s == "full_shard" || s == "1") p.strategy = ShardingStrategy::kFullShard;
      else if (s == "shard_grad_op" || s == "2") p.strategy = ShardingStrategy::kShardGradOp;
      else if (s == "no_shard" || s == "3") p.strategy = ShardingStrategy::kNoShard;
      else if (s == "hybrid_shard" || s == "4") p.strategy = ShardingStrategy::kHybridShard;
      else ALPACA_FAIL(origin << ": sharding_strategy '" << s << "' unsupported");
    } else if (key == "state_dict_type") {
      ALPACA_CHECK(v.is_string() && v.get<std::string>() == "FULL_STATE_DICT",
                   origin << ": state_dict_type " << v.dump() << " is not supported; checkpoints are "
                             "written as full HF directories (FULL_STATE_DICT)");
    } else if (key == "reduce_dtype") {  // alpaca-train extension: HF reduces in param_dtype
      ALPACA_CHECK(v.is_string(), origin << ": reduce_dtype must be a string");
      p.reduce_dtype = dtype_word(v.get<std::string>(), origin + ": reduce_dtype");
    } else if (key == "hybrid_shard_size") {  // alpaca-train extension
      ALPACA_CHECK(v.is_number_integer() && v.get<int>() > 0, origin << ": hybrid_shard_size must be a positive integer");
      p.hybrid_shard_size = v.get<int>();
    } else {
      ALPACA_FAIL(origin << ": key '" << it.key() << "' is not supported by alpaca-train (accepted: "
                  "version, min_num_params=0, transformer_layer_cls_to_wrap, backward_prefetch, forward_prefetch, "
                  "limit_all_gathers, use_orig_params, sync_module_states, cpu_ram_efficient_loading, "
                  "activation_checkpointing, offload_params, sharding_strategy, state_dict_type, reduce_dtype, "
                  "hybrid_shard_size)");
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

FsdpPolicy build_fsdp_policy(const FsdpPolicyInputs& in) {
  FsdpPolicy p;
  apply_words(in.fsdp, p);
  if (in.fsdp.find_first_not_of(" \t") == std::string::npos) p.auto_wrap = true;  // DDP-like: per-layer units
  const std::string mp = lower(in.mixed_precision);
  if (mp == "bf16") p.param_dtype = at::kBFloat16;
  else if (mp == "fp16") p.param_dtype = at::kHalf;
  else ALPACA_CHECK(mp == "no" || mp.empty(), "mixed precision '" << in.mixed_precision << "' unknown; use no, bf16 or fp16");
  p.reduce_dtype = p.param_dtype;  // accelerate: reduce_dtype = param_dtype
  bool wrap_cls_given = false;
  if (in.fsdp_config.find_first_not_of(" \t\n\r") != std::string::npos) {
    json cfg;
    try {
      cfg = json::parse(in.fsdp_config);
    } catch (const json::exception& e) {
      ALPACA_FAIL(in.fsdp_config_origin << " is not valid JSON: " << e.what());
    }
    apply_config(cfg, in.fsdp_config_origin, p, wrap_cls_given);
  }
  if (!in.transformer_layer_cls_to_wrap.empty()) {
    ALPACA_CHECK(!wrap_cls_given, "--fsdp_transformer_layer_cls_to_wrap and fsdp_config's "
                 "transformer_layer_cls_to_wrap are both given; keep one");
    p.wrap_classes = in.transformer_layer_cls_to_wrap;
  }
  for (const auto& c : p.wrap_classes)
    ALPACA_CHECK(c == "LlamaDecoderLayer", "transformer_layer_cls_to_wrap '" << c
                 << "' is not a class alpaca-train can wrap; use LlamaDecoderLayer");
  if (in.gradient_checkpointing) p.activation_checkpointing = true;
  ALPACA_CHECK(!p.cpu_ram_efficient_loading || p.sync_module_states,
               "fsdp_config: cpu_ram_efficient_loading=true requires sync_module_states=true (as in HF)");
  if (p.strategy == ShardingStrategy::kHybridShard && p.hybrid_shard_size == 0)
    p.hybrid_shard_size = std::max(1, in.local_world_size);
  return p;
}

}  // namespace alpaca::fsdp
