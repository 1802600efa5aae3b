// LoRA runs (--use_peft): attaching the adapters with TRL's flags, what a resume must match, and
// the peft output (its format: io/peft_adapter.h): adapter_config.json + adapter_model.safetensors
// with peft's key names, gathered one FSDP unit at a time from the
// trainable shards only, so saving an adapter never gathers the frozen base. Rows that train.py
// added to the vocabulary ([PAD]) are trained as peft trainable tokens (trainable_token_indices:
// one (rows, D) trainable delta per table, tied tables share one) unless the whole table is in
// modules_to_save.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/io/peft_adapter.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/model/layers.h"
#include "alpaca/model/lora.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"
#include "alpaca/util/tensor_memory.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {
namespace {

std::string join_words(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& w : v) s += (s.empty() ? "" : " ") + w;
  return s;
}

// The size of the base model's weight files and the hash of its config: a different base with
// the same shapes (another fine-tune of the same architecture) is caught without hashing weights.
ckpt::Fingerprint base_fingerprint(const fs::path& base) {
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(base)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && (n.ends_with(".safetensors") || n.ends_with(".bin"))) bytes += static_cast<int64_t>(e.file_size());
  }
  return {{"base config.json sha256", ckpt::sha256_file((base / "config.json").string())},
          {"base weight bytes", std::to_string(bytes)}};
}

}  // namespace

ckpt::Fingerprint Trainer::Impl::lora_fingerprint() const {
  const model::LoraOptions& o = *opt.lora;
  std::ostringstream alpha;
  alpha << o.alpha;
  ckpt::Fingerprint f = base_fingerprint(opt.model_name_or_path);
  f["lora_r"] = std::to_string(o.r);
  f["lora_alpha"] = alpha.str();
  f["use_rslora"] = o.use_rslora ? "true" : "false";
  if (o.use_dora) f["use_dora"] = "true";  // absent = false: checkpoints from before DoRA still resume
  f["lora_target_modules"] = join_words(o.target_modules.empty() ? model::default_lora_target_modules() : o.target_modules);
  f["lora_modules_to_save"] = join_words(o.modules_to_save);
  return f;
}

void Trainer::Impl::check_lora_resume(const ckpt::Fingerprint& saved_model) const {
  // A checkpoint of a full fine-tune has none of these keys; a LoRA checkpoint has all of them.
  const bool saved_lora = saved_model.count("lora_r") > 0;
  ALPACA_USER_CHECK(saved_lora, "cannot resume from " << resume_dir->string() << ": it is a checkpoint of a full fine-tune, "
                           "this run trains a LoRA adapter (--use_peft); resume without --use_peft or start a new run");
  ckpt::Fingerprint saved, now = lora_fingerprint();
  for (const auto& [k, v] : now) {
    auto it = saved_model.find(k);
    if (it != saved_model.end()) saved[k] = it->second;
  }
  if (saved_model.count("use_dora")) saved["use_dora"] = saved_model.at("use_dora");  // a DoRA checkpoint, a LoRA run
  for (const char* k : {"base config.json sha256", "base weight bytes"}) {
    ALPACA_USER_CHECK(saved[k] == now[k], "cannot resume from " << resume_dir->string() << ": its adapter was trained on another "
                 "base model (" << k << " is " << saved[k] << " there, " << now[k] << " for --model_name_or_path "
                 << opt.model_name_or_path.string() << "); resume with the base model the adapter was trained on");
  }
  const std::string why = ckpt::fingerprint_mismatch("LoRA adapter", saved, now);
  ALPACA_USER_CHECK(why.empty(), "cannot resume from " << resume_dir->string() << ": " << why
                            << "; resume with the LoRA flags (--lora_r, --lora_alpha, --lora_target_modules, ...) it was "
                               "trained with");
}

void Trainer::Impl::setup_lora(int64_t base_vocab_size) {
  for (int64_t id = base_vocab_size; id < tokenizer->vocab_size(); ++id) added_token_ids.push_back(id);
  model::LoraOptions lo = *opt.lora;
  lo.trainable_token_indices = added_token_ids;
  lora_plan = model::apply_lora(*model, lo, static_cast<uint64_t>(opt.seed));
  int64_t adapter = 0;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) adapter += p.numel();
  ALPACA_INFO((opt.lora->use_dora ? "DoRA" : "LoRA") << " r=" << opt.lora->r << " alpha=" << opt.lora->alpha
              << " dropout=" << opt.lora->dropout << (opt.lora->use_rslora ? " (rsLoRA)" : "") << " on " << lora_plan.lora_modules.size() << " modules ("
              << join_words(lora_plan.target_modules) << "): " << adapter << " trainable parameters of "
              << model::num_parameters(model));
}

void Trainer::Impl::init_trainable_token_rows() {
  if (added_token_ids.empty()) return;
  // peft's TrainableTokensLayer starts from weight[indices]: the rows just loaded (train.py's mean
  // rows). The ids train.py adds are contiguous: [base vocab, len(tokenizer)).
  const int64_t lo = added_token_ids.front(), hi = added_token_ids.back() + 1;
  ALPACA_CHECK(hi - lo == static_cast<int64_t>(added_token_ids.size()), "added token ids are not contiguous");
  for (const auto& [key, module] : lora_plan.token_tables) {
    const at::Tensor rows = engine->gather_rows(module + ".weight", lo, hi).reshape({-1});  // collective
    const std::string delta = module + ".token_adapter.trainable_tokens_delta";
    engine->load_parameters(
        [&](const std::string&, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
          out.copy_(rows.narrow(0, begin, end - begin));
        },
        /*rank0_only=*/false, [&](const std::string& n) { return n == delta; });
  }
}

void Trainer::Impl::init_dora_magnitudes() {
  if (!opt.lora->use_dora) return;
  const std::string kSuffix = ".lora_magnitude_vector";
  std::set<std::string> bases;  // "<module>.weight" of every adapted linear
  for (const auto& m : lora_plan.lora_modules) bases.insert(m + ".weight");
  std::map<std::string, at::Tensor> norms;
  const at::ScalarType dtype = opt.fsdp_policy.param_dtype;
  const double scaling = opt.lora->scaling();
  // Every unit gathered in turn on every rank (one unit in full at a time): a row's norm needs the
  // whole row, which FSDP's flat shards split anywhere. Once, before the first step.
  engine->export_full_state(
      [&](const std::string& name, const at::Tensor& value) {
        if (bases.count(name)) norms[name] = model::dora_weight_norm(value.to(dtype), at::Tensor(), scaling).to(at::kFloat);
      },
      /*all_ranks=*/true);
  engine->load_parameters(
      [&](const std::string& name, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
        const std::string weight = name.substr(0, name.size() - kSuffix.size()) + ".weight";
        ALPACA_CHECK(norms.count(weight), "DoRA: no base weight " << weight << " for " << name);
        out.copy_(norms.at(weight).narrow(0, begin, end - begin));
      },
      /*rank0_only=*/false, [&](const std::string& n) { return n.ends_with(kSuffix); });
  ALPACA_INFO("DoRA: " << norms.size() << " magnitude vectors set to their base weights' row norms");
}

bool Trainer::Impl::is_adapter_param(const std::string& name) const {
  if (model::is_lora_param(name)) return true;
  for (const auto& m : lora_plan.saved_modules)
    if (name.rfind(m + ".", 0) == 0) return true;
  return false;
}

void Trainer::Impl::export_adapter(const fs::path& dir) {
  std::unique_ptr<io::SafetensorsWriter> writer;
  if (rank == 0) writer = std::make_unique<io::SafetensorsWriter>((dir / io::kAdapterWeightsFile).string());
  const int64_t rss_before = sys::rss_bytes();
  int64_t rss_peak = rss_before;
  // CPU tensor bytes (the counting allocator, util/tensor_memory.h): what gathering and writing
  // the adapter holds at its worst, which must stay about the adapter's size, never the base's.
  const int64_t tensors_before = util::begin_cpu_tensor_watch();
  // A tied model trains one table for the embedding and the output layer: peft keeps them one with
  // ensure_weight_tying=True, and its adapter holds the table under lm_head as well.
  const bool tied_table = fsdp_model->model()->config().tie_word_embeddings &&
                          std::find(lora_plan.saved_modules.begin(), lora_plan.saved_modules.end(), "model.embed_tokens") !=
                              lora_plan.saved_modules.end();
  engine->export_trainable_state([&](const std::string& name, const at::Tensor& value) {
    writer->add(io::peft_key(name), value);
    if (tied_table && name == "model.embed_tokens.weight") writer->add(io::peft_key("lm_head.weight"), value);
    rss_peak = std::max(rss_peak, sys::rss_bytes());
  });
  if (rank != 0) return;
  writer->finish({{"format", "pt"}});
  const model::LoraOptions& o = *opt.lora;
  io::PeftLoraConfig cfg;
  cfg.base_model_name_or_path = fs::absolute(opt.model_name_or_path).lexically_normal().string();
  cfg.r = o.r;
  cfg.alpha = o.alpha;
  cfg.dropout = o.dropout;
  cfg.use_rslora = o.use_rslora;
  cfg.use_dora = o.use_dora;
  cfg.target_modules = lora_plan.target_modules;
  cfg.modules_to_save = o.modules_to_save;
  cfg.ensure_weight_tying = tied_table;
  // Added vocabulary rows: their trained deltas were exported above with the adapters (peft's
  // key "<table>.token_adapter.trainable_tokens_delta"); the config names their ids per table.
  for (const auto& [key, module] : lora_plan.token_tables) cfg.trainable_token_indices[key] = added_token_ids;
  ckpt::write_file_durable(dir / io::kAdapterConfigFile, io::peft_adapter_config_json(cfg));
  const bool counted = util::counting_cpu_allocator_installed();
  ALPACA_INFO("saved the LoRA adapter to " << dir.string() << " (" << writer->data_bytes() << " bytes; rank 0 CPU tensor "
              "peak grew by " << (counted ? std::to_string(util::cpu_tensor_watch_peak_bytes() - tensors_before) : "?")
              << " bytes and RSS by " << (rss_peak - rss_before) / (1 << 20)
              << " MiB while gathering it; the base was not gathered)");
}

void Trainer::Impl::load_adapter(const fs::path& dir) {
  const fs::path file = dir / io::kAdapterWeightsFile;
  ALPACA_USER_CHECK(fs::is_regular_file(file), dir.string() << " has no " << io::kAdapterWeightsFile << "; it is not a checkpoint of a "
                                          "LoRA run (--use_peft)");
  auto st = io::SafetensorsFile::open(file.string());
  engine->load_parameters(
      [&](const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end, at::Tensor out) {
        const std::string key = io::peft_key(name);
        ALPACA_CHECK(st->contains(key), file.string() << " has no tensor " << key << "; the checkpoint's adapter does not "
                                        "match this run's LoRA targets");
        const auto& info = st->info(key);
        ALPACA_CHECK(info.shape == shape, key << " in " << file.string() << " has shape " << at::IntArrayRef(info.shape)
                                              << ", this run's adapter expects " << at::IntArrayRef(shape)
                                              << "; resume with the --lora_r the checkpoint was trained with");
        out.copy_(st->tensor_range(key, begin, end - begin));
      },
      /*rank0_only=*/false, [this](const std::string& name) { return is_adapter_param(name); });
}

}  // namespace alpaca::train
