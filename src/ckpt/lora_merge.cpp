// LoRA merge; see include/alpaca/ckpt/lora_merge.h.
#include "alpaca/ckpt/lora_merge.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "alpaca/io/bnb4bit.h"
#include "alpaca/io/checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/io/peft_adapter.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/model/config.h"
#include "alpaca/model/layers.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/sys.h"

namespace fs = std::filesystem;

namespace alpaca::ckpt {
namespace {
constexpr const char* kPrefix = io::kPeftKeyPrefix;

// A base tensor in fp32 and the dtype it is written back in. A bitsandbytes 4-bit weight (a
// `*-bnb-4bit` base, io/bnb4bit.h) is dequantized (bitsandbytes' dequantize_4bit) and written in
// the dtype it was quantized from (its quant_state's, e.g. bf16): the merged directory is a plain
// HF one, what peft's merge_and_unload gives on the dequantized model.
at::Tensor read_base_fp32(const io::CheckpointReader& base, const std::string& name, at::ScalarType* stored) {
  if (io::bnb4bit_state_key(base, name).empty()) {
    *stored = base.info(name).dtype;
    return base.read(name, at::kFloat);
  }
  const model::Quant4Tensor q = io::read_bnb4bit(base, name, {});
  *stored = io::bnb4bit_dtype(base, name);
  return model::dequantize_4bit(q.packed, q.state, at::kFloat);
}

}  // namespace

MergeStats merge_lora_adapter(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir,
                              int64_t max_shard_bytes) {
  const io::LoraAdapter la = io::read_lora_adapter(adapter_dir);  // the one adapter reader (io/peft_adapter.h)
  const double scaling = la.scaling;
  const std::shared_ptr<io::SafetensorsFile>& adapter = la.file;
  std::set<std::string> unused;
  for (const auto& n : adapter->names()) unused.insert(n);
  auto take = [&](const std::string& key) {
    unused.erase(key);
    return adapter->tensor(key).to(at::kFloat);
  };

  model::LlamaConfig mcfg = model::LlamaConfig::from_json_file((fs::path(base_dir) / "config.json").string());
  io::check_tied_tables(la, mcfg.tie_word_embeddings);
  // New vocabulary rows from trainable tokens: the merged tables have max(index) + 1 rows.
  const std::map<std::string, std::vector<int64_t>>& token_rows = la.token_rows;
  const int64_t vocab = la.vocab_size(mcfg.vocab_size);

  const io::CheckpointReader base = io::CheckpointReader::open(base_dir);
  io::HfExportWriter writer(out_dir, max_shard_bytes, std::nullopt);
  MergeStats stats;
  const int64_t rss0 = sys::rss_bytes();
  int64_t peak = rss0;
  for (const auto& name : base.names()) {
    if (io::is_bnb4bit_side_tensor(name)) continue;  // read with its 4-bit weight
    at::ScalarType stored = at::kFloat;
    at::Tensor w = read_base_fp32(base, name, &stored);
    const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
    const std::string a_key = kPrefix + module + ".lora_A.weight", b_key = kPrefix + module + ".lora_B.weight";
    if (!module.empty() && adapter->contains(a_key)) {
      ALPACA_USER_CHECK(adapter->contains(b_key), adapter->path() << " has " << a_key << " but no " << b_key);
      // peft's save_embedding_layers ("auto" when lm_head is a target) stores the base weight too.
      if (adapter->contains(kPrefix + module + ".base_layer.weight")) {
        const at::Tensor base_w = take(kPrefix + module + ".base_layer.weight");
        ALPACA_USER_CHECK(base_w.sizes() == w.sizes(), adapter->path() << ": " << kPrefix << module << ".base_layer.weight has shape "
                     << base_w.sizes() << ", the base has " << w.sizes());
        w = base_w;
      }
      const at::Tensor a = take(a_key), b = take(b_key);  // (r, in), (out, r)
      ALPACA_USER_CHECK(a.dim() == 2 && b.dim() == 2 && b.size(0) == w.size(0) && a.size(1) == w.size(1) && a.size(0) == b.size(1),
                   "LoRA " << module << ": A " << a.sizes() << " and B " << b.sizes() << " do not fit the base weight "
                           << w.sizes() << " of " << base_dir);
      const at::Tensor delta = at::matmul(b, a) * scaling;  // peft get_delta_weight: (B @ A) * scaling
      if (la.use_dora) {
        // peft's DoraLinearVariant.merge: m / ||W + delta||_row * (W + delta), the norm of the unmerged base.
        const std::string m_key = kPrefix + module + ".lora_magnitude_vector";
        ALPACA_USER_CHECK(adapter->contains(m_key), adapter->path() << " has no " << m_key << " though its adapter_config.json "
                                                                  "says use_dora");
        const at::Tensor mag = take(m_key);
        ALPACA_USER_CHECK(mag.dim() == 1 && mag.size(0) == w.size(0), adapter->path() << ": " << m_key << " has shape "
                     << mag.sizes() << ", the base weight " << w.sizes());
        const at::Tensor norm = model::dora_weight_norm(w, delta, 1.0);
        w = (mag / norm).view({-1, 1}) * (w + delta);
      } else {
        w.add_(delta);
      }
      ++stats.num_merged;
    }
    if (adapter->contains(kPrefix + name)) {  // modules_to_save: the trained tensor replaces the base's
      at::Tensor saved = take(kPrefix + name);
      ALPACA_USER_CHECK(saved.dim() == w.dim(), adapter->path() << ": " << kPrefix << name << " has shape " << saved.sizes()
                                                          << ", the base has " << w.sizes());
      w = saved;
    }
    auto rows = token_rows.find(name);
    if (rows != token_rows.end()) {
      const std::string key = kPrefix + module + ".token_adapter.trainable_tokens_delta";
      ALPACA_USER_CHECK(adapter->contains(key), adapter->path() << " has no " << key << " for trainable_token_indices");
      const at::Tensor delta = take(key);  // (ids, D)
      if (w.size(0) < vocab) {
        at::Tensor grown = at::zeros({vocab, w.size(1)}, w.options());
        grown.narrow(0, 0, w.size(0)).copy_(w);
        w = grown;
      }
      for (size_t i = 0; i < rows->second.size(); ++i) w[rows->second[i]].copy_(delta[static_cast<int64_t>(i)]);
    } else if ((name == "model.embed_tokens.weight" || name == "lm_head.weight") && w.size(0) < vocab) {
      ALPACA_USER_FAIL("the adapter grows the vocabulary to " << vocab << " rows but stores no rows for " << name
                  << "; it was not written by alpaca-train --use_peft");
    }
    writer.add(name, w.to(stored));
    base.release(name);
    ++stats.num_tensors;
    peak = std::max(peak, sys::rss_bytes());
  }
  // A tied base: the shared table peft also stores under lm_head (ensure_weight_tying) was merged as embed_tokens.
  if (mcfg.tie_word_embeddings && !base.contains("lm_head.weight") && !unused.count(kPrefix + std::string("model.embed_tokens.weight")))
    unused.erase(kPrefix + std::string("lm_head.weight"));
  ALPACA_USER_CHECK(unused.empty(), adapter->path() << " has " << *unused.begin() << ", which matches no tensor of the base "
                               << base_dir << "; is it the base model the adapter was trained on?");
  // peft's merge_and_unload keeps the base model's generation config, which save_pretrained writes.
  const std::string generation_config = io::generation_config_text(base_dir, mcfg);
  mcfg.vocab_size = vocab;
  writer.finish(mcfg, generation_config);
  // The tokenizer (and chat template) the adapter was trained with: an --use_peft output_dir carries
  // one; a peft save_pretrained directory does not, and then the base's is the adapter's.
  const char* const tokenizer_files[] = {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                                         "added_tokens.json", "tokenizer.json", "chat_template.jinja", "chat_template.json"};
  const fs::path tokenizer_src = io::adapter_tokenizer_dir(adapter_dir, base_dir);
  for (const char* f : tokenizer_files) {
    const fs::path src = tokenizer_src / f;
    if (fs::is_regular_file(src)) fs::copy_file(src, fs::path(out_dir) / f, fs::copy_options::overwrite_existing);
  }
  stats.vocab_size = vocab;
  stats.peak_rss_growth = peak - rss0;
  return stats;
}

}  // namespace alpaca::ckpt
