// Loading weights into LlamaForCausalLM from an HF directory, and writing HF directories
// (config.json, generation_config.json, safetensors sharded the way transformers shards).
// io/ is the boundary between Hugging Face's file format and our modules, so it sits above
// model/ in docs/architecture.md (model/ itself does no file I/O).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/io/safetensors.h"
#include "alpaca/model/llama.h"

namespace alpaca::io {

struct LoadOptions {
  // Parameters whose dtype matches the file become views of the (private, copy-on-write)
  // safetensors mapping instead of copies, as transformers does: near-zero load time, and clean
  // pages the kernel can drop. Keep the files in place while the model lives.
  bool zero_copy = false;
};

// Fills every parameter of `m` from the checkpoint in `dir`, one tensor at a time (converting
// dtype and device as needed, releasing each mapped tensor once copied, so the process never
// holds two copies of the weights). Errors name the tensor and file: missing tensor, wrong shape.
// A bitsandbytes 4-bit weight (a `*-bnb-4bit` directory, io/bnb4bit.h) is dequantized into the
// parameter's dtype, bitwise bitsandbytes' dequantize_4bit (the values its Linear4bit multiplies by).
void load_hf_weights(model::LlamaForCausalLM& m, const std::string& dir, const LoadOptions& opts = {});

// Reads `dir`/config.json, builds the model uninitialised with `options` (dtype, device) and
// loads its weights.
model::LlamaForCausalLM load_hf_model(const std::string& dir, const at::TensorOptions& options = at::kFloat,
                                      const LoadOptions& opts = {});

// "5GB" -> 5e9, "500MB", "2GiB", "1000" (bytes), as transformers' max_shard_size.
int64_t parse_shard_size(const std::string& text);

// Streams an HF directory: tensors are added one at a time (FSDP gathers one unit at a time,
// so no rank holds the whole model) and cut into shards like transformers / huggingface_hub
// (a new shard when the next tensor would exceed max_shard_bytes; a tensor larger than that gets
// a shard of its own). Files are written under a temporary name and moved into `dir` by finish().
class HfExportWriter {
 public:
  // dtype: convert every tensor to it (and record it in config.json); nullopt keeps each dtype.
  HfExportWriter(std::string dir, int64_t max_shard_bytes, std::optional<at::ScalarType> dtype = std::nullopt);
  ~HfExportWriter();  // an unfinished export is removed
  HfExportWriter(const HfExportWriter&) = delete;
  HfExportWriter& operator=(const HfExportWriter&) = delete;

  void add(const std::string& name, const at::Tensor& t);
  // Writes config.json (with architectures and dtype), generation_config.json and the index (when
  // sharded), then moves everything into `dir` (replacing any weights already there).
  // generation_config.json is `generation_config_json` when given (the source model's, which
  // transformers' save_pretrained writes back), else the one transformers derives from `cfg`.
  void finish(const model::LlamaConfig& cfg, const std::string& generation_config_json = "");

 private:
  struct Shard;
  void close_shard(std::unique_ptr<Shard>& shard);
  std::string dir_, tmp_dir_;
  int64_t max_shard_bytes_;
  std::optional<at::ScalarType> dtype_;
  std::unique_ptr<Shard> open_;
  std::vector<std::unique_ptr<Shard>> closed_;  // in transformers' shard order
  int next_tmp_id_ = 0;
  int64_t total_bytes_ = 0;
  int64_t total_params_ = 0;
  at::ScalarType seen_dtype_ = at::kFloat;
  bool finished_ = false;
};

// The generation_config.json text transformers saves with a model loaded from `model_dir`: that
// directory's file as it is, or, when it has none, GenerationConfig.from_model_config(cfg)'s
// ({"_from_model_config": true, bos/eos/pad from `cfg`}).
std::string generation_config_text(const std::string& model_dir, const model::LlamaConfig& cfg);
// The same from `cfg` alone (a model with no directory of its own: init-model).
std::string generation_config_from_model_config(const model::LlamaConfig& cfg);

// Writes `m` as an HF directory (tied lm_head omitted, as transformers does).
void save_hf_directory(model::LlamaForCausalLM& m, const std::string& dir,
                       std::optional<at::ScalarType> dtype = std::nullopt, int64_t max_shard_bytes = 5'000'000'000);

// "float32" / "bfloat16" / "float16" <-> dtype; throws naming `flag` otherwise.
at::ScalarType parse_dtype_name(const std::string& name, const std::string& flag);
std::string dtype_name(at::ScalarType dtype);

}  // namespace alpaca::io
