// HF directories <-> LlamaForCausalLM: weight loading one tensor at a time and the streaming,
// transformers-compatible exporter.
#include "alpaca/io/hf_model.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/io/bnb4bit.h"
#include "alpaca/io/checkpoint.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/text.h"

namespace alpaca::io {
namespace fs = std::filesystem;
using nlohmann::json;

at::ScalarType parse_dtype_name(const std::string& name, const std::string& flag) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  ALPACA_FAIL(flag << ": unknown dtype \"" << name << "\"; use float32, bfloat16 or float16");
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: ALPACA_FAIL("dtype " << dtype << " has no Hugging Face torch_dtype name");
  }
}

void load_hf_weights(model::LlamaForCausalLM& m, const std::string& dir, const LoadOptions& opts) {
  CheckpointReader ckpt = CheckpointReader::open(dir);
  at::NoGradGuard no_grad;
  size_t used = 0;
  for (auto& item : m->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    ALPACA_CHECK(ckpt.contains(name), dir << " (" << ckpt.format() << "): tensor \"" << name
                                          << "\" is missing; the checkpoint does not match config.json");
    if (!bnb4bit_state_key(ckpt, name).empty()) {  // a bitsandbytes 4-bit weight: its dequantize_4bit values
      const model::Quant4Tensor q = read_bnb4bit(ckpt, name, p.sizes().vec());
      const at::ScalarType dt = p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf ? p.scalar_type() : at::kFloat;
      p.copy_(model::dequantize_4bit(q.packed, q.state, dt));
      ++used;
      continue;
    }
    TensorInfo ti = ckpt.info(name);
    ALPACA_CHECK(at::IntArrayRef(ti.shape) == p.sizes(),
                 ti.file << ": tensor \"" << name << "\" has shape " << at::IntArrayRef(ti.shape)
                         << " but the model built from config.json expects " << p.sizes());
    at::Tensor src = ckpt.read(name);  // a view of the mapping for safetensors
    if (opts.zero_copy && ckpt.format().starts_with("safetensors") && p.device().is_cpu() &&
        src.scalar_type() == p.scalar_type()) {
      p.set_data(src);  // the parameter now lives in the (copy-on-write) mapping
    } else {
      p.copy_(src);  // converts dtype/device on the fly; no second full copy
      ckpt.release(name);
    }
    ++used;
  }
  for (const auto& name : ckpt.names()) {
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // old checkpoints saved this buffer
    if (is_bnb4bit_side_tensor(name)) continue;            // a 4-bit weight's statistics, read with it
    if (name == "lm_head.weight" && m->config().tie_word_embeddings) continue;
    if (!m->named_parameters(true).contains(name))
      ALPACA_WARN(dir << ": ignoring tensor \"" << name << "\" that the LLaMA model does not use");
  }
  ALPACA_DEBUG("loaded " << used << " tensors from " << dir);
}

model::LlamaForCausalLM load_hf_model(const std::string& dir, const at::TensorOptions& options,
                                      const LoadOptions& opts) {
  model::LlamaConfig cfg = model::LlamaConfig::from_json_file((fs::path(dir) / "config.json").string());
  // No fill pass: every parameter is overwritten, and untouched pages cost no memory.
  model::LlamaForCausalLM m(cfg, options, model::ParamInit::kUninitialized);
  load_hf_weights(m, dir, opts);
  return m;
}

int64_t parse_shard_size(const std::string& text) {
  const text::ByteSize size = text::parse_byte_size(text);
  ALPACA_CHECK(size.error.empty(), "--save_max_shard_size '" << text << "' " << size.error);
  return size.bytes;
}

// ------------------------------------------------------------------------------- export

namespace {
void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  ALPACA_CHECK(out.good(), path.string() << ": write failed; check free disk space and permissions");
}
}  // namespace

struct HfExportWriter::Shard {
  std::string tmp_path;
  std::unique_ptr<SafetensorsWriter> writer;
  std::vector<std::string> names;
  int64_t bytes = 0;
};

HfExportWriter::HfExportWriter(std::string dir, int64_t max_shard_bytes, std::optional<at::ScalarType> dtype)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes), dtype_(dtype) {
  ALPACA_CHECK(max_shard_bytes_ > 0, "export to " << dir_ << ": max shard size must be positive");
  // Build the export in a hidden sibling so a crash never leaves a half-written directory.
  fs::path d = fs::absolute(dir_).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();  // "out/" -> "out"
  dir_ = d.string();
  // Inside the directory when it exists: it may be a mount point (a volume as output_dir), and a
  // rename from its parent's filesystem into it fails with EXDEV.
  tmp_dir_ = fs::is_directory(d) ? (d / ".export-tmp").string()
                                 : (d.parent_path() / ("." + d.filename().string() + ".export-tmp")).string();
  fs::remove_all(tmp_dir_);
  fs::create_directories(tmp_dir_);
}

HfExportWriter::~HfExportWriter() {
  if (finished_) return;
  open_.reset();
  closed_.clear();
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
}

void HfExportWriter::close_shard(std::unique_ptr<Shard>& shard) {
  shard->writer->finish({{"format", "pt"}});
  shard->writer.reset();
  closed_.push_back(std::move(shard));
}

void HfExportWriter::add(const std::string& name, const at::Tensor& t) {
  ALPACA_CHECK(!finished_, "export to " << dir_ << ": add(\"" << name << "\") after finish()");
  at::Tensor c = dtype_ ? t.detach().to(*dtype_) : t.detach();
  seen_dtype_ = c.scalar_type();
  const int64_t bytes = static_cast<int64_t>(c.numel() * c.element_size());
  auto new_shard = [&]() {
    auto s = std::make_unique<Shard>();
    s->tmp_path = (fs::path(tmp_dir_) / ("shard-" + std::to_string(next_tmp_id_++) + ".safetensors")).string();
    s->writer = std::make_unique<SafetensorsWriter>(s->tmp_path);
    return s;
  };
  std::unique_ptr<Shard> own;
  Shard* target = nullptr;
  if (bytes > max_shard_bytes_) {
    own = new_shard();  // huggingface_hub: an oversized tensor gets a shard of its own
    target = own.get();
  } else {
    if (open_ && open_->bytes + bytes > max_shard_bytes_) close_shard(open_);
    if (!open_) open_ = new_shard();
    target = open_.get();
  }
  target->writer->add(name, c);
  target->names.push_back(name);
  target->bytes += bytes;
  total_bytes_ += bytes;
  total_params_ += c.numel();
  if (own) close_shard(own);
}

std::string generation_config_from_model_config(const model::LlamaConfig& cfg) {
  json gen = {{"_from_model_config", true}, {"transformers_version", "5.23.0"}};
  if (cfg.bos_token_id) gen["bos_token_id"] = *cfg.bos_token_id;
  if (cfg.eos_token_id.size() == 1) gen["eos_token_id"] = cfg.eos_token_id.front();
  else if (!cfg.eos_token_id.empty()) gen["eos_token_id"] = cfg.eos_token_id;
  if (cfg.pad_token_id) gen["pad_token_id"] = *cfg.pad_token_id;
  return gen.dump(2) + "\n";
}

std::string generation_config_text(const std::string& model_dir, const model::LlamaConfig& cfg) {
  const fs::path p = fs::path(model_dir) / "generation_config.json";
  if (!fs::is_regular_file(p)) return generation_config_from_model_config(cfg);
  std::ifstream in(p, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ALPACA_CHECK(in.good() || in.eof(), "cannot read " << p.string());
  return text;
}

void HfExportWriter::finish(const model::LlamaConfig& cfg_in, const std::string& generation_config_json) {
  ALPACA_CHECK(!finished_, "export to " << dir_ << ": finish() called twice");
  if (open_) close_shard(open_);
  ALPACA_CHECK(!closed_.empty(), "export to " << dir_ << ": no tensors were added");
  const fs::path tmp(tmp_dir_);
  const size_t n = closed_.size();
  json weight_map = json::object();
  if (n == 1) {
    fs::rename(closed_[0]->tmp_path, tmp / "model.safetensors");
  } else {
    for (size_t i = 0; i < n; ++i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
      fs::rename(closed_[i]->tmp_path, tmp / buf);
      for (const auto& name : closed_[i]->names) weight_map[name] = buf;
    }
    json index = {{"metadata", {{"total_parameters", total_params_}, {"total_size", total_bytes_}}},
                  {"weight_map", weight_map}};
    write_text(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  model::LlamaConfig cfg = cfg_in;
  cfg.torch_dtype = dtype_name(dtype_ ? *dtype_ : seen_dtype_);
  write_text(tmp / "config.json", cfg.to_json());
  write_text(tmp / "generation_config.json",
             generation_config_json.empty() ? generation_config_from_model_config(cfg) : generation_config_json);

  const fs::path dir(dir_);
  if (!fs::exists(dir)) {
    fs::create_directories(fs::absolute(dir).parent_path());
    fs::rename(tmp, dir);
  } else {
    // The directory holds other files (tokenizer, trainer state): replace only the weights.
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if ((f.starts_with("model") && f.ends_with(".safetensors")) || f == "model.safetensors.index.json" ||
          f.starts_with("pytorch_model"))
        fs::remove(e.path());
    }
    for (const auto& e : fs::directory_iterator(tmp)) fs::rename(e.path(), dir / e.path().filename());
    fs::remove_all(tmp);
  }
  finished_ = true;
}

void save_hf_directory(model::LlamaForCausalLM& m, const std::string& dir, std::optional<at::ScalarType> dtype,
                       int64_t max_shard_bytes) {
  HfExportWriter w(dir, max_shard_bytes, dtype);
  for (const auto& item : m->named_parameters(/*recurse=*/true)) w.add(item.key(), item.value());
  w.finish(m->config());
}

}  // namespace alpaca::io
