// The peft LoRA adapter format: its config written, an adapter read and applied unmerged; see
// include/alpaca/io/peft_adapter.h.
#include "alpaca/io/peft_adapter.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace fs = std::filesystem;

namespace alpaca::io {

std::string peft_adapter_config_json(const PeftLoraConfig& c) {
  nlohmann::json tokens = nullptr;
  if (!c.trainable_token_indices.empty()) tokens = c.trainable_token_indices;
  const nlohmann::json cfg = {
      {"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"peft_version", "0.21.2"},
      {"base_model_name_or_path", c.base_model_name_or_path},
      {"r", c.r}, {"lora_alpha", c.alpha}, {"lora_dropout", c.dropout}, {"use_rslora", c.use_rslora},
      // peft's string form for a regular expression (a list entry would be matched as a name).
      {"target_modules", c.target_modules.size() == 1 && model::is_target_regex(c.target_modules[0])
                             ? nlohmann::json(c.target_modules[0]) : nlohmann::json(c.target_modules)},
      {"modules_to_save", c.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.modules_to_save)},
      {"trainable_token_indices", tokens}, {"ensure_weight_tying", c.ensure_weight_tying},
      {"bias", "none"}, {"fan_in_fan_out", false}, {"init_lora_weights", true}, {"inference_mode", true},
      {"use_dora", c.use_dora}, {"lora_bias", false}, {"layers_to_transform", nullptr}, {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()}, {"alpha_pattern", nlohmann::json::object()},
      {"exclude_modules", nullptr}, {"revision", nullptr}, {"target_parameters", nullptr}};
  return cfg.dump(2) + "\n";
}

int64_t LoraAdapter::vocab_size(int64_t base_vocab) const {
  int64_t v = base_vocab;
  for (const auto& [name, ids] : token_rows)
    for (int64_t id : ids) v = std::max(v, id + 1);
  // Tables saved in full (modules_to_save embed_tokens / lm_head) hold the run's vocabulary.
  for (const char* table : {"model.embed_tokens.weight", "lm_head.weight"}) {
    const std::string key = std::string(kPeftKeyPrefix) + table;
    if (file && file->contains(key) && !file->info(key).shape.empty()) v = std::max(v, file->info(key).shape[0]);
  }
  return v;
}

std::vector<std::string> LoraAdapter::lora_modules() const {
  std::vector<std::string> out;
  const std::string prefix = kPeftKeyPrefix, suffix = ".lora_A.weight";
  for (const auto& n : file->names())
    if (n.starts_with(prefix) && n.ends_with(suffix))
      out.push_back(n.substr(prefix.size(), n.size() - prefix.size() - suffix.size()));
  return out;
}

LoraAdapter read_lora_adapter(const std::string& adapter_dir) {
  const fs::path cfg_path = fs::path(adapter_dir) / kAdapterConfigFile;
  ALPACA_USER_CHECK(fs::is_regular_file(cfg_path), "--adapter " << adapter_dir << " has no adapter_config.json; give the "
                                              "output_dir (or a checkpoint) of an alpaca-train --use_peft run");
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(std::ifstream(cfg_path));
  } catch (const std::exception& e) {
    ALPACA_USER_FAIL(cfg_path.string() << " is not valid JSON: " << e.what());
  }
  ALPACA_USER_CHECK(cfg.value("peft_type", "") == "LORA", cfg_path.string() << ": peft_type is " << cfg.value("peft_type", "?")
                                                     << "; only LORA adapters are supported");
  ALPACA_USER_CHECK(cfg.value("bias", "none") == "none" && !cfg.value("fan_in_fan_out", false),
               cfg_path.string() << ": LoRA biases and fan_in_fan_out are not supported");
  ALPACA_USER_CHECK(!cfg.value("lora_bias", false), cfg_path.string() << ": lora_bias (a bias on lora_B) is not supported");
  ALPACA_USER_CHECK(cfg.value("rank_pattern", nlohmann::json::object()).empty() &&
                   cfg.value("alpha_pattern", nlohmann::json::object()).empty(),
               cfg_path.string() << ": rank_pattern / alpha_pattern are not supported");
  LoraAdapter a;
  a.dir = adapter_dir;
  double r = 0, alpha = 0;
  try {
    r = cfg.at("r").get<double>();
    alpha = cfg.at("lora_alpha").get<double>();
  } catch (const std::exception& e) {
    ALPACA_USER_FAIL(cfg_path.string() << ": r and lora_alpha must be numbers (" << e.what() << ")");
  }
  ALPACA_USER_CHECK(r > 0, cfg_path.string() << ": r must be positive, got " << r);
  a.r = static_cast<int64_t>(r);
  a.scaling = cfg.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
  if (cfg.contains("trainable_token_indices") && !cfg["trainable_token_indices"].is_null()) {
    const auto& t = cfg["trainable_token_indices"];
    ALPACA_USER_CHECK(t.is_object(), cfg_path.string() << ": trainable_token_indices must be {module: [ids]}");
    for (const auto& [module, ids] : t.items()) {
      const std::string name = module == "embed_tokens" ? "model.embed_tokens.weight" : module + ".weight";
      a.token_rows[name] = ids.get<std::vector<int64_t>>();
    }
  }
  a.ensure_weight_tying = cfg.value("ensure_weight_tying", false);
  a.use_dora = cfg.value("use_dora", false);
  a.file = SafetensorsFile::open((fs::path(adapter_dir) / kAdapterWeightsFile).string());
  for (const auto& n : a.file->names())
    ALPACA_USER_CHECK(n.find(".lora_embedding_A") == std::string::npos && n.find(".lora_embedding_B") == std::string::npos,
                 a.file->path() << " has " << n << ": LoRA on an embedding layer (target_modules embed_tokens) is not "
                                   "supported; merge it with peft's merge_and_unload");
  return a;
}

std::string adapter_tokenizer_dir(const std::string& adapter_dir, const std::string& base_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(fs::path(adapter_dir) / f)) return adapter_dir;
  return base_dir;
}

void check_tied_tables(const LoraAdapter& adapter, bool base_tied) {
  if (!base_tied || adapter.ensure_weight_tying) return;
  for (const char* table : {"model.embed_tokens.weight", "lm_head.weight"})
    ALPACA_USER_CHECK(!adapter.file->contains(kPeftKeyPrefix + std::string(table)),
                 adapter.file->path() << " saves " << table << " (modules_to_save) for a base with tied embeddings, "
                 "without ensure_weight_tying: peft applies that table to its side only and unties the embeddings, "
                 "which alpaca-train does not reproduce; merge it with peft's merge_and_unload, or save the adapter "
                 "with ensure_weight_tying=True (what alpaca-train --use_peft writes)");
}

namespace {

// The adapter's tensors as they are taken; what is never taken matches nothing of the base.
class AdapterTensors {
 public:
  explicit AdapterTensors(const SafetensorsFile& f) : f_(f) {
    for (const auto& n : f.names()) unused_.insert(n);
  }
  const SafetensorsFile& file() const { return f_; }
  bool contains(const std::string& name) const { return f_.contains(kPeftKeyPrefix + name); }
  at::Tensor take(const std::string& name) {
    const std::string key = kPeftKeyPrefix + name;
    unused_.erase(key);
    return f_.tensor(key);
  }
  void check_all_used(const std::string& base_dir) const {
    ALPACA_USER_CHECK(unused_.empty(), f_.path() << " has " << *unused_.begin() << ", which matches no tensor of the base "
                                  << base_dir << "; is it the base model the adapter was trained on?");
  }

 private:
  const SafetensorsFile& f_;
  std::set<std::string> unused_;
};

// Vocabulary rows first: the adapter may grow the tables (train.py's [PAD]).
void grow_vocabulary(model::LlamaForCausalLMImpl& m, const LoraAdapter& adapter, const AdapterTensors& t) {
  const int64_t vocab = adapter.vocab_size(m.config().vocab_size);
  if (vocab <= m.config().vocab_size) return;
  for (const char* table : {"model.embed_tokens.weight", "lm_head.weight"})
    ALPACA_USER_CHECK(adapter.token_rows.count(table) || t.contains(table) || (!m.lm_head && table[0] == 'l'),
                 "the adapter " << adapter.dir << " grows the vocabulary to " << vocab << " rows but stores no rows for "
                 << table << "; it was not written by alpaca-train --use_peft");
  m.resize_token_embeddings(vocab);
}

// LoRA linears: attach the model's LoRA modules to exactly the adapted names.
void attach_branches(model::LlamaForCausalLMImpl& m, const LoraAdapter& adapter, const std::vector<std::string>& names,
                     const std::map<std::string, std::shared_ptr<torch::nn::Module>>& modules,
                     const std::string& base_dir) {
  for (const auto& name : names) {
    auto it = modules.find(name);
    ALPACA_USER_CHECK(it != modules.end(), "the adapter " << adapter.dir << " adapts " << name << ", which the base model "
                 << base_dir << " does not have; is it the base the adapter was trained on?");
    ALPACA_USER_CHECK(dynamic_cast<model::LinearImpl*>(it->second.get()),
                 "the adapter " << adapter.dir << " adapts " << name << ", which is not a linear layer of " << base_dir);
  }
  model::LoraOptions opt;
  opt.r = adapter.r;
  opt.alpha = adapter.scaling * static_cast<double>(adapter.r);  // scaling() = alpha / r reproduces it exactly enough
  opt.dropout = 0;
  opt.target_modules = names;
  opt.use_dora = adapter.use_dora;
  if (!names.empty()) model::apply_lora(m, opt, /*seed=*/0);
}

// A and B of one adapted linear, in the base's dtype and device, frozen.
void load_branch(model::LinearImpl& lin, const std::string& name, const LoraAdapter& adapter, AdapterTensors& t,
                 const std::string& base_dir) {
  const std::string a_key = name + ".lora_A.weight", b_key = name + ".lora_B.weight";
  ALPACA_USER_CHECK(t.contains(b_key), t.file().path() << " has " << kPeftKeyPrefix << a_key << " but no " << kPeftKeyPrefix
                                                   << b_key);
  const at::Tensor a = t.take(a_key), b = t.take(b_key);  // (r, in), (out, r)
  const at::Tensor& w = lin.weight;
  ALPACA_USER_CHECK(a.dim() == 2 && b.dim() == 2 && b.size(0) == w.size(0) && a.size(1) == w.size(1) && a.size(0) == b.size(1) &&
                   a.size(0) == adapter.r,
               "LoRA " << name << ": A " << a.sizes() << " and B " << b.sizes() << " (r " << adapter.r
                       << ") do not fit the base weight " << w.sizes() << " of " << base_dir
                       << "; the adapter was trained on another base");
  // peft's save_embedding_layers ("auto" when lm_head is a target) stores the base weight too.
  if (t.contains(name + ".base_layer.weight")) {
    const at::Tensor base_w = t.take(name + ".base_layer.weight");
    ALPACA_USER_CHECK(base_w.sizes() == w.sizes(), t.file().path() << ": " << kPeftKeyPrefix << name << ".base_layer.weight has shape "
                 << base_w.sizes() << ", the base " << base_dir << " has " << w.sizes());
    lin.weight.copy_(base_w);
  }
  lin.lora_A->weight.set_data(a.to(w.options()).contiguous());
  lin.lora_B->weight.set_data(b.to(w.options()).contiguous());
  lin.lora_scaling = adapter.scaling;  // exactly peft's, not recomputed through alpha
  if (adapter.use_dora) {
    const std::string m_key = name + ".lora_magnitude_vector";
    ALPACA_USER_CHECK(t.contains(m_key), t.file().path() << " has no " << kPeftKeyPrefix << m_key
                                                    << " though adapter_config.json says use_dora");
    const at::Tensor mag = t.take(m_key);
    ALPACA_USER_CHECK(mag.dim() == 1 && mag.size(0) == w.size(0),
                 t.file().path() << ": " << kPeftKeyPrefix << m_key << " has shape " << mag.sizes() << ", the base "
                                 << base_dir << " has " << w.size(0) << " output rows for " << name);
    lin.lora_magnitude.set_data(mag.to(w.options()).contiguous());
    lin.lora_magnitude.requires_grad_(false);
  }
  lin.lora_A->weight.requires_grad_(false);
  lin.lora_B->weight.requires_grad_(false);
}

// modules_to_save and trainable-token rows of one base parameter.
void load_saved_rows(const std::string& pname, at::Tensor& p, const LoraAdapter& adapter, AdapterTensors& t,
                     const std::string& base_dir) {
  const std::string& path = t.file().path();
  if (t.contains(pname)) {
    const at::Tensor saved = t.take(pname);
    ALPACA_USER_CHECK(saved.sizes() == p.sizes(), path << ": " << kPeftKeyPrefix << pname << " has shape " << saved.sizes()
                 << ", the base " << base_dir << " has " << p.sizes() << "; the adapter was trained on another base");
    p.copy_(saved);
  }
  auto rows = adapter.token_rows.find(pname);
  if (rows == adapter.token_rows.end()) return;
  const std::string module = pname.substr(0, pname.size() - 7);
  const std::string dname = module + ".token_adapter.trainable_tokens_delta";
  ALPACA_USER_CHECK(t.contains(dname), path << " has no " << kPeftKeyPrefix << dname << " for trainable_token_indices");
  const at::Tensor delta = t.take(dname);  // (ids, D)
  ALPACA_USER_CHECK(delta.dim() == 2 && delta.size(0) == static_cast<int64_t>(rows->second.size()) && delta.size(1) == p.size(1),
               path << ": " << kPeftKeyPrefix << dname << " has shape " << delta.sizes() << ", expected ("
                    << rows->second.size() << ", " << p.size(1) << ") for " << pname << " of " << base_dir);
  for (size_t i = 0; i < rows->second.size(); ++i) p[rows->second[i]].copy_(delta[static_cast<int64_t>(i)]);
}

}  // namespace

int64_t attach_lora_adapter(model::LlamaForCausalLMImpl& m, const LoraAdapter& adapter, const std::string& base_dir) {
  check_tied_tables(adapter, !m.lm_head);
  AdapterTensors t(*adapter.file);
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) modules[item.key()] = item.value();
  grow_vocabulary(m, adapter, t);
  const std::vector<std::string> names = adapter.lora_modules();
  attach_branches(m, adapter, names, modules, base_dir);
  at::NoGradGuard no_grad;
  for (const auto& name : names)
    load_branch(*dynamic_cast<model::LinearImpl*>(modules.at(name).get()), name, adapter, t, base_dir);
  for (auto& item : m.named_parameters(/*recurse=*/true))
    if (!model::is_lora_param(item.key())) load_saved_rows(item.key(), item.value(), adapter, t, base_dir);
  // A tied base with modules_to_save embed_tokens: peft (ensure_weight_tying) stores the shared
  // table under lm_head too; the embedding's copy above is the one both use.
  if (!m.lm_head && t.contains("lm_head.weight") && t.contains("model.embed_tokens.weight")) t.take("lm_head.weight");
  t.check_all_used(base_dir);
  return static_cast<int64_t>(names.size());
}

}  // namespace alpaca::io
