// Loading an HF checkpoint directory straight into FSDP shards: by default every rank reads only
// the element ranges of its own shards from the memory-mapped safetensors files (no rank ever
// materialises the whole model); with rank0_only (HF sync_module_states / cpu_ram_efficient_loading)
// rank 0 reads one unit at a time and broadcasts it.
//
// A pre-quantized bitsandbytes 4-bit checkpoint (`*-bnb-4bit`: quantization_config in config.json,
// packed uint8 linears with .absmax, .quant_map, .nested_absmax, .nested_quant_map and
// .quant_state.bitsandbytes__nf4|fp4) loads into a --load_in_4bit run's 4-bit store as bytes: every
// rank copies its own shard's bytes out of the mapping, nothing is dequantized or re-quantized. The
// run's --bnb_4bit_quant_type / --use_bnb_nested_quant must be the checkpoint's, and each
// quant_state must agree with the model's shape and the stored tensors (errors name the tensor).
#pragma once

#include "alpaca/fsdp/engine.h"
#include "alpaca/io/checkpoint.h"

namespace alpaca::fsdp {

// A ParamRangeReader over `ckpt` that checks each tensor's shape against the model's and
// releases the mapped pages once a range has been copied. With vocab_mean_from = F >= 1, an
// embedding or lm_head whose model shape has as many rows as the checkpoint's or more (Stanford
// Alpaca adds [PAD]) reads the stored rows 0..F-1 and makes rows F.. the fp32 mean of those, exactly
// as model::LlamaForCausalLM's resize_token_embeddings (F = the stored rows) and fill_rows_with_mean
// (the mean costs one full read of that tensor). -1: every tensor as stored.
ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt, int64_t vocab_mean_from = -1);

// Collective. Throws alpaca::Error naming the tensor and file when a parameter is missing or has
// another shape (other than vocabulary growth with vocab_mean_from). The low-memory way to start: build
// the model on the meta device with the final vocabulary, apply_fsdp, then load_checkpoint.
// `include` (empty = all) picks the parameters read from `dir` (LoRA: the base tensors only).
void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only, int64_t vocab_mean_from = -1,
                     const std::function<bool(const std::string&)>& include = {});

}  // namespace alpaca::fsdp
