// What the FSDP engine does, as one validated options struct, and the builder that maps
// Hugging Face's --fsdp words and --fsdp_config keys onto it (transformers' TrainingArguments and
// accelerate's FullyShardedDataParallelPlugin meanings). Only cli/ knows TrainArgs; it fills
// FsdpPolicyInputs from the flags, builds the policy once at validation and hands it down.
#pragma once

#include <c10/core/ScalarType.h>  // defines: at::ScalarType

#include <string>
#include <vector>

namespace alpaca::fsdp {

enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard };
enum class BackwardPrefetch { kBackwardPre, kBackwardPost, kNone };

struct FsdpPolicy {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // One unit per decoder layer (HF "auto_wrap" with transformer_layer_cls_to_wrap); false = the
  // whole model is the root unit.
  bool auto_wrap = true;
  // The class wrapped by auto_wrap; empty = the model's own decoder layer (HF: _no_split_modules).
  // Given classes must be that of the model's model_type (check_wrap_classes).
  std::vector<std::string> wrap_classes;
  at::ScalarType param_dtype = at::kFloat;   // compute dtype of unsharded parameters
  at::ScalarType reduce_dtype = at::kFloat;  // dtype gradients travel in
  bool offload = false;                      // fp32 shards, grads, optimizer state on the host
  bool activation_checkpointing = false;     // recompute each decoder layer in backward
  // Prefetch defaults chosen for speed (HF's are NO_PREFETCH and false): prefetching changes when
  // a gather is issued, never what is computed (tests/fsdp/test_fsdp_collective_path.cpp), and
  // limit_all_gathers bounds it to two resident units. fsdp_config backward_prefetch /
  // forward_prefetch, when given, are honoured as HF reads them.
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = true;
  bool limit_all_gathers = true;     // at most two units unsharded at once
  bool sync_module_states = true;    // HF default: rank 0's values are broadcast at wrap time
  bool cpu_ram_efficient_loading = false;  // only rank 0 reads the checkpoint (needs sync_module_states)
  int hybrid_shard_size = 0;         // ranks per shard group for HYBRID_SHARD (0 = caller's local world)
  // Test/debug knob (fsdp_config "force_collectives", an alpaca-train extension): communicate even
  // where a communicator has one rank, so a world of one runs the very all-gather / reduce-scatter /
  // all-reduce path (and its stream/event ordering) that a sharded job runs. The math is the same
  // (a one-rank collective is a copy); it only costs time. The one-GPU checks use it.
  bool force_collectives = false;
  // QLoRA (--load_in_4bit): the decoder layers' frozen linear weights are held 4-bit as
  // bitsandbytes holds them (blocks of 64) and dequantized into param_dtype when their unit is
  // unsharded (src/fsdp/quant_store.h). "" = off, else "nf4" or "fp4".
  std::string quant4_type;
  bool quant4_nested = false;  // bnb_4bit_use_double_quant

  bool operator==(const FsdpPolicy&) const = default;
};

// The decoder-layer class transformers names for a model_type: LlamaDecoderLayer (llama),
// MistralDecoderLayer (mistral), Qwen2DecoderLayer (qwen2); "" for any other.
std::string decoder_layer_class(const std::string& model_type);
// Throws alpaca::Error when a class of p.wrap_classes is not decoder_layer_class(model_type) (as
// accelerate fails on a class the model does not have), naming the class, the model type, the
// expected class and `source` (the config.json).
void check_wrap_classes(const FsdpPolicy& p, const std::string& model_type, const std::string& source);

const char* to_string(ShardingStrategy s);
const char* to_string(BackwardPrefetch p);

struct FsdpPolicyInputs {
  std::string fsdp;          // --fsdp, e.g. "full_shard auto_wrap offload"; "" = no sharding (DDP-like)
  std::string fsdp_config;   // JSON text of --fsdp_config ("" = none)
  std::string fsdp_config_origin = "--fsdp_config";  // file name for error messages
  std::vector<std::string> transformer_layer_cls_to_wrap;  // deprecated --fsdp_transformer_layer_cls_to_wrap
  std::string mixed_precision = "no";  // "no", "bf16" or "fp16" (--bf16 / --fp16)
  bool gradient_checkpointing = false; // --gradient_checkpointing
  int local_world_size = 1;            // ranks per node (hybrid shard group size)
};

// The one parser of --fsdp words (the CLI's validation and the trainer both go through it):
// words are separated by spaces, tabs or commas and read case-insensitively; a whole value that is
// a boolean (True/False, 1/0, yes/no) means full_shard / no FSDP, as HF's bare --fsdp. Returns the
// distinct words in canonical order (strategy, auto_wrap, offload). Throws alpaca::Error for an
// unknown word (with a "did you mean") or hybrid_shard_zero2 (not implemented).
std::vector<std::string> fsdp_words(const std::string& fsdp);

// Builds and validates the policy. Throws alpaca::Error naming the word/key and what is accepted
// for anything unknown, contradictory, or that alpaca-train does not act on: more than one
// strategy, offload without a strategy or with no_shard, --fsdp_config without --fsdp,
// transformer_layer_cls_to_wrap without auto_wrap or given twice with different classes, a layer
// class other than LlamaDecoderLayer. The CLI turns these into usage errors (exit 2) at parse time.
FsdpPolicy build_fsdp_policy(const FsdpPolicyInputs& in);

}  // namespace alpaca::fsdp
