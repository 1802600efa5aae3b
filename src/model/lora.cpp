// LoRA attachment; see include/alpaca/model/lora.h.
#include "alpaca/model/lora.h"

#include "alpaca/model/llama.h"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cmath>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::model {
namespace {

bool name_matches(const std::string& full, const std::string& target) {
  return full == target || (full.size() > target.size() && full.ends_with(target) &&
                            full[full.size() - target.size() - 1] == '.');
}

std::string leaf(const std::string& full) {
  const auto dot = full.rfind('.');
  return dot == std::string::npos ? full : full.substr(dot + 1);
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

double LoraOptions::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

bool is_target_regex(const std::string& target) { return target.find_first_of("*+?()[]|^$\\{}") != std::string::npos; }

std::vector<std::string> split_module_list(const std::string& text) {
  // peft's string form: the whole text is one regular expression (commas included: "{1,2}").
  const size_t first = text.find_first_not_of(" \t"), last = text.find_last_not_of(" \t");
  if (first != std::string::npos && is_target_regex(text)) return {text.substr(first, last - first + 1)};
  std::vector<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (c == ' ' || c == ',' || c == '\t') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  return out;
}

bool is_lora_param(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") ||
         name.ends_with(".lora_magnitude_vector") || name.ends_with(".token_adapter.trainable_tokens_delta");
}

const std::vector<std::string>& default_lora_target_modules() {
  static const std::vector<std::string> kTargets{"q_proj", "v_proj"};  // peft's mapping["llama"] (and mistral, qwen2)
  return kTargets;
}

namespace {

using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>;

// Every module by full name, the linears among them, and their distinct leaf names (for errors).
struct ModuleIndex {
  NamedModules modules;
  std::vector<std::string> linear_leaves, all_leaves;

  explicit ModuleIndex(LlamaForCausalLMImpl& m) {
    for (const auto& item : m.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value());
    for (const auto& [name, mod] : modules) {
      const std::string l = leaf(name);
      if (std::find(all_leaves.begin(), all_leaves.end(), l) == all_leaves.end() && !std::isdigit(l[0]) &&
          l != "layers")
        all_leaves.push_back(l);
      if (dynamic_cast<LinearImpl*>(mod.get()) &&
          std::find(linear_leaves.begin(), linear_leaves.end(), l) == linear_leaves.end())
        linear_leaves.push_back(l);
    }
  }
};

// The target leaf names: the options', else peft's defaults; all-linear expanded.
std::vector<std::string> resolve_targets(const LoraOptions& opt, const ModuleIndex& idx) {
  std::vector<std::string> targets = opt.target_modules;
  if (targets.empty()) targets = default_lora_target_modules();
  const bool all_linear = targets.size() == 1 && targets[0] == "all-linear";
  ALPACA_USER_CHECK(all_linear || std::find(targets.begin(), targets.end(), "all-linear") == targets.end(),
               "LoRA target 'all-linear' cannot be combined with module names; give one or the other");
  if (all_linear) {
    // peft's _maybe_include_all_linear_layers: every linear but the output layer, as leaf names.
    targets.clear();
    for (const auto& l : idx.linear_leaves)
      if (l != "lm_head") targets.push_back(l);
  }
  return targets;
}

// The linears the targets match, each once, in module order (not target order): the order peft
// (and our generator) visits them.
std::vector<std::pair<std::string, LinearImpl*>> chosen_linears(const std::vector<std::string>& targets,
                                                                const ModuleIndex& idx) {
  std::set<LinearImpl*> chosen;
  for (const auto& t : targets) {
    bool matched = false;
    // peft's _check_target_module_exists: a list entry matches a name or a name's dotted tail; a
    // string is re.fullmatch'ed against the whole name (std::regex's ECMAScript grammar shares
    // Python's for classes, groups, alternation, repetition and escapes; (?P<...>) is refused).
    std::optional<std::regex> re;
    if (is_target_regex(t)) {
      try {
        re.emplace(t, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        ALPACA_USER_FAIL("LoRA target modules '" << t << "' is not a regular expression alpaca-train can read (" << e.what()
                         << "); a target with any of * + ? ( ) [ ] | ^ $ \\ { } is one pattern matched against whole "
                            "module names such as model.layers.0.self_attn.q_proj, as peft matches a string");
      }
    }
    for (const auto& [name, mod] : idx.modules) {
      if (re ? !std::regex_match(name, *re) : !name_matches(name, t)) continue;
      matched = true;
      auto* lin = dynamic_cast<LinearImpl*>(mod.get());
      ALPACA_USER_CHECK(lin, "LoRA target '" << t << "' matches " << name << ", which is not a linear layer; LoRA here "
                        "adapts linear layers: " << join(idx.linear_leaves));
      chosen.insert(lin);
    }
    ALPACA_USER_CHECK(matched, "LoRA target module '" << t << "' matches no module of the model"
                          << (re ? " (a regular expression: it must match a whole name such as "
                                   "model.layers.0.self_attn.q_proj)" : "")
                          << "; its linear layers are " << join(idx.linear_leaves) << " (or use all-linear)");
  }
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& [name, mod] : idx.modules) {
    auto* lin = dynamic_cast<LinearImpl*>(mod.get());
    if (lin != nullptr && chosen.erase(lin)) out.emplace_back(name, lin);  // each once
  }
  return out;
}

// The modules to save (trained in full), with their names appended to plan.saved_modules.
std::vector<torch::nn::Module*> saved_modules(const LoraOptions& opt, const ModuleIndex& idx, LoraPlan& plan) {
  std::vector<torch::nn::Module*> saved;
  for (const auto& t : opt.modules_to_save) {
    bool matched = false;
    // peft's _set_trainable: any module whose name ends with the text, not only at a dot
    // ("norm" is every input_layernorm, post_attention_layernorm and the final norm).
    for (const auto& [name, mod] : idx.modules) {
      if (name.empty() || !name.ends_with(t)) continue;
      matched = true;
      if (std::find(saved.begin(), saved.end(), mod.get()) != saved.end()) continue;
      saved.push_back(mod.get());
      plan.saved_modules.push_back(name);
    }
    ALPACA_USER_CHECK(matched, "LoRA module to save '" << t << "' matches no module of the model; its modules are "
                          << join(idx.all_leaves));
  }
  return saved;
}

// peft's LoraLayer.update_layer: A kaiming-uniform from `gen`, B zeros, both trainable.
void attach_branch(LinearImpl& lin, const std::string& name, const LoraOptions& opt, at::Generator& gen) {
  ALPACA_CHECK(!lin.lora_A, "LoRA is already attached to " << name);
  const int64_t in = lin.weight.size(1), out = lin.weight.size(0);
  auto a = std::make_shared<LinearImpl>(in, opt.r, false, at::kFloat, ParamInit::kUninitialized);
  auto b = std::make_shared<LinearImpl>(opt.r, out, false, at::kFloat);  // zeros
  // torch.nn.init.kaiming_uniform_(a=sqrt(5)), fan_in = in: bound = sqrt(3) * gain / sqrt(fan_in).
  const double neg = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + neg * neg));
  const double bound = std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(in)));
  a->weight.uniform_(-bound, bound, gen);
  lin.lora_A = lin.register_module("lora_A", a);
  lin.lora_B = lin.register_module("lora_B", b);
  lin.lora_scaling = opt.scaling();
  lin.lora_dropout = opt.dropout;
  a->weight.requires_grad_(true);
  b->weight.requires_grad_(true);
  if (opt.use_dora) {
    // peft's name: the parameter is saved as "<module>.lora_magnitude_vector".
    lin.lora_magnitude = lin.register_parameter("lora_magnitude_vector", at::zeros({out}, at::kFloat));
    if (!lin.weight.is_meta()) lin.lora_magnitude.copy_(dora_weight_norm(lin.weight, at::Tensor(), lin.lora_scaling));
  }
}

// peft's TrainableTokensLayer on the embedding and the head (each unless saved in full).
void attach_trainable_tokens(LlamaForCausalLMImpl& m, const std::vector<int64_t>& ids, LoraPlan& plan) {
  const int64_t vocab = m.config().vocab_size;
  for (int64_t id : ids)
    ALPACA_USER_CHECK(id >= 0 && id < vocab, "trainable token id " << id << " is outside the vocabulary [0, " << vocab << ")");
  auto in_full = [&](const std::string& name) {
    return std::find(plan.saved_modules.begin(), plan.saved_modules.end(), name) != plan.saved_modules.end();
  };
  auto attach = [&](const std::string& key, const std::string& name, const at::Tensor& w,
                    std::shared_ptr<TrainableTokensImpl>& slot, torch::nn::Module& owner) {
    ALPACA_CHECK(!slot, "trainable tokens are already attached to " << name);
    auto t = std::make_shared<TrainableTokensImpl>(ids, w.size(1));
    if (!w.is_meta()) t->trainable_tokens_delta.copy_(w.index_select(0, t->index(w.device())));
    t->trainable_tokens_delta.requires_grad_(true);
    slot = owner.register_module("token_adapter", t);
    plan.token_tables.emplace_back(key, name);
  };
  auto& emb = *m.model->embed_tokens;
  if (!in_full("model.embed_tokens")) attach("embed_tokens", "model.embed_tokens", emb.weight, emb.token_adapter, emb);
  if (m.lm_head && !in_full("lm_head")) attach("lm_head", "lm_head", m.lm_head->weight, m.lm_head->token_adapter, *m.lm_head);
}

}  // namespace

LoraPlan apply_lora(LlamaForCausalLMImpl& m, const LoraOptions& opt, uint64_t seed) {
  ALPACA_USER_CHECK(opt.r > 0, "LoRA rank r must be > 0, got " << opt.r << " (--lora_r)");
  ALPACA_USER_CHECK(opt.dropout >= 0 && opt.dropout < 1, "LoRA dropout must be in [0, 1), got " << opt.dropout
                                                                                          << " (--lora_dropout)");
  const ModuleIndex idx(m);
  LoraPlan plan;
  plan.target_modules = resolve_targets(opt, idx);
  const auto chosen = chosen_linears(plan.target_modules, idx);
  const std::vector<torch::nn::Module*> saved = saved_modules(opt, idx, plan);
  for (const auto& [name, lin] : chosen) {
    // peft refuses both (NoMatchingPeftModuleError; TypeError for trainable tokens on a LoRA layer).
    ALPACA_USER_CHECK(std::find(saved.begin(), saved.end(), static_cast<torch::nn::Module*>(lin)) == saved.end(),
                 "LoRA target " << name << " is also a module to save; peft trains a module one way or the other: "
                 "drop it from --lora_target_modules or from --lora_modules_to_save");
    ALPACA_USER_CHECK(!opt.use_dora || !m.lm_head || lin != m.lm_head.get(),
                 "DoRA on lm_head is not supported (the fused loss takes one plain weight); leave lm_head out of "
                 "--lora_target_modules or train it with --lora_modules_to_save lm_head");
    ALPACA_USER_CHECK(!m.lm_head || lin != m.lm_head.get() || opt.trainable_token_indices.empty(),
                 "LoRA on lm_head cannot be combined with trainable token rows on it (the new tokens of this run's "
                 "tokenizer; peft raises TypeError on that adapter): leave lm_head out of --lora_target_modules");
  }

  at::NoGradGuard no_grad;
  for (auto& p : m.parameters(/*recurse=*/true)) p.requires_grad_(false);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, lin] : chosen) {
    attach_branch(*lin, name, opt, gen);
    plan.lora_modules.push_back(name);
  }
  for (torch::nn::Module* s : saved)
    for (auto& p : s->parameters(/*recurse=*/true)) p.requires_grad_(true);
  if (!opt.trainable_token_indices.empty()) attach_trainable_tokens(m, opt.trainable_token_indices, plan);
  return plan;
}

}  // namespace alpaca::model
