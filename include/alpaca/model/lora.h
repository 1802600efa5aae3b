// LoRA adapters on the project's LLaMA, with peft's math and names (peft.tuners.lora, v0.21):
// A (r, in) kaiming-uniform with a = sqrt(5), B (out, r) zeros, scaling alpha / r (alpha / sqrt(r)
// with rsLoRA), dropout only on the branch input: y = W x + s * B(A(dropout(x))). Target modules
// are matched by name as peft matches a list (`name == t` or `name` ends with "." + t), or, for a
// regular expression (is_target_regex), as peft matches a string (the whole name);
// "all-linear" is every linear layer except the output head. The base weights are frozen
// (requires_grad false); the adapters and `modules_to_save` are trainable.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace alpaca::model {

class LlamaForCausalLMImpl;  // alpaca/model/llama.h (this header stays light: train/options.h includes it)

struct LoraOptions {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0.05;
  bool use_rslora = false;
  // DoRA (peft use_dora): each adapted linear also trains a magnitude vector (LinearImpl::lora_magnitude),
  // initialised to the row norms of its base weight (zeros while the weight is on the meta device:
  // the trainer sets them once the base is loaded).
  bool use_dora = false;
  std::vector<std::string> target_modules;   // names, or {"all-linear"}; empty = peft's LLaMA default q_proj v_proj
  std::vector<std::string> modules_to_save;  // modules trained in full (peft modules_to_save), e.g. lm_head
  // Vocabulary rows trained on their own (peft trainable_token_indices: train.py's added [PAD]) in
  // embed_tokens and, untied, lm_head; a table in modules_to_save is trained in full instead.
  std::vector<int64_t> trainable_token_indices;
  double scaling() const;                    // alpha / r, or alpha / sqrt(r) with use_rslora
};

struct LoraPlan {
  std::vector<std::string> lora_modules;     // full names of the adapted linears, in module order
  std::vector<std::string> target_modules;   // the resolved target list (what adapter_config.json says)
  std::vector<std::string> saved_modules;    // full names of the modules_to_save modules
  // Tables with trainable token rows: {peft's trainable_token_indices key, full module name}, e.g.
  // {"embed_tokens", "model.embed_tokens"}, {"lm_head", "lm_head"} (tied: the embedding only).
  std::vector<std::pair<std::string, std::string>> token_tables;
};

// peft's default targets for LLaMA-family models (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING),
// used when LoraOptions::target_modules is empty: q_proj v_proj. The one place they are written.
const std::vector<std::string>& default_lora_target_modules();

// Splits a flag value "q_proj,v_proj" or "q_proj v_proj" into names; a value with any regular
// expression character (is_target_regex) stays whole: one pattern, peft's string form.
std::vector<std::string> split_module_list(const std::string& text);
// Whether a target is a regular expression (any of * + ? ( ) [ ] | ^ $ \ { }): peft's
// target_modules given as a string, re.fullmatch'ed against whole module names
// ("model.layers.0.self_attn.q_proj"); plain names match as a list's entries do.
bool is_target_regex(const std::string& target);

// Attaches LoRA to the matching linears of `m` (whose base parameters may be on the meta device)
// and sets requires_grad: false for every base parameter, true for the adapters and for the
// parameters of modules_to_save. A is drawn on the CPU from one generator seeded with `seed`, in
// module order (bitwise what torch.nn.init.kaiming_uniform_(A, a=sqrt(5), generator=g) draws from
// torch.Generator().manual_seed(seed) in the same order). Adapter tensors are fp32 on the CPU.
// Trainable token rows (opt.trainable_token_indices) get a TrainableTokens module named
// "token_adapter" on each table (peft's key: "<table>.token_adapter.trainable_tokens_delta"),
// initialised from the table's rows, or zeros while the table is on the meta device (the caller
// then copies the loaded rows in, as peft's TrainableTokensLayer starts from weight[indices]).
// Throws alpaca::Error when r <= 0, when a target or a module to save matches no module (naming the
// modules that exist), or when a target is not a linear layer.
LoraPlan apply_lora(LlamaForCausalLMImpl& m, const LoraOptions& opt, uint64_t seed);

// True for the name of a parameter LoRA adds, which the base checkpoint does not have
// ("...lora_A.weight" / "...lora_B.weight" / "...lora_magnitude_vector" /
// "...token_adapter.trainable_tokens_delta").
bool is_lora_param(const std::string& name);

}  // namespace alpaca::model
