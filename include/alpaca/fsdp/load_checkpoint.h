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
// releases the mapped pages once a range has been copied. With grow_vocab, an embedding or
// lm_head whose model shape has more rows than the checkpoint's (Stanford Alpaca adds [PAD])
// reads the stored rows and fills the new ones with the fp32 mean of the stored rows, exactly
// as model::LlamaForCausalLM::resize_token_embeddings (the mean costs one full read of that tensor).
ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt, bool grow_vocab = false);

// Collective. Throws alpaca::Error naming the tensor and file when a parameter is missing or has
// another shape (other than vocabulary growth when grow_vocab). The low-memory way to start: build
// the model on the meta device with the final vocabulary, apply_fsdp, then load_checkpoint.
// `include` (empty = all) picks the parameters read from `dir` (LoRA: the base tensors only).
void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only, bool grow_vocab = false,
                     const std::function<bool(const std::string&)>& include = {});

}  // namespace alpaca::fsdp
