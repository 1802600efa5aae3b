// Loading an HF checkpoint directory straight into FSDP shards: by default every rank reads only
// the element ranges of its own shards from the memory-mapped safetensors files (no rank ever
// materialises the whole model); with rank0_only (HF sync_module_states / cpu_ram_efficient_loading)
// rank 0 reads one unit at a time and broadcasts it.
#pragma once

#include "alpaca/fsdp/engine.h"
#include "alpaca/io/checkpoint.h"

namespace alpaca::fsdp {

// A ParamRangeReader over `ckpt` that checks each tensor's shape against the model's and
// releases the mapped pages once a range has been copied.
ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt);

// Collective. Throws alpaca::Error naming the tensor and file when a parameter is missing or has
// another shape (e.g. the vocabulary was resized after the checkpoint was written).
void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only);

}  // namespace alpaca::fsdp
