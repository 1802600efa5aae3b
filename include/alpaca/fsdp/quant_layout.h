// The byte layout of one FSDP unit's frozen base held 4-bit (QLoRA, --load_in_4bit), in one pure
// place: the engine's QuantStore (src/fsdp/quant_store.h) fills and gathers exactly these bytes,
// and the memory planner (src/plan/memory_plan.cpp) counts them, so the two cannot drift apart.
//
// The unit's frozen tensors follow one another in a byte blob: each linear weight (a 2-D tensor
// whose name ends in "proj.weight") as bitsandbytes' packed 4-bit bytes, then its absmax values
// (fp32, or with nested quantization 8-bit codes followed by one fp32 scale per 256 of them), any
// other frozen tensor (the norms) as its raw param_dtype bytes. Each region starts on a 4-byte
// boundary. The blob is padded to a multiple of 4 x shard_world bytes; rank r keeps bytes
// [r*S, (r+1)*S). The nested offsets (one float a tensor) are metadata, not blob bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "alpaca/fsdp/unit_plan.h"
#include "alpaca/model/quant4.h"

namespace alpaca::fsdp {

struct QuantSegment {
  bool quantized = false;
  int64_t numel = 0, blocks = 0, nested_blocks = 0;
  int64_t packed = 0, absmax = 0, nested = 0;  // byte offsets in the blob (quantized)
  int64_t raw = 0;                             // byte offset of the raw param_dtype values
  std::vector<int64_t> shape;
};

struct QuantLayout {
  std::vector<QuantSegment> segments;  // one per frozen entry, in flat order
  int64_t padded_bytes = 0;            // the whole blob, padded to 4 x shard_world
  int64_t shard_bytes = 0;             // padded_bytes / shard_world: what one rank keeps
  int64_t quantized_numel = 0;         // values held 4-bit
};

// Whether a frozen tensor of this name and rank is held 4-bit (bitsandbytes replaces every
// nn.Linear but lm_head; embeddings and norms stay).
bool quantizes_4bit(const std::string& name, int64_t dim);

// Whether unit `u` of `plan` holds its frozen base 4-bit under --load_in_4bit: the decoder layers
// (units [0, num_layers)); embed_tokens, norm+lm_head and a single root stay in param_dtype.
bool unit_holds_4bit(const UnitPlan& plan, int u);

// The layout of a unit whose frozen flat buffer has `entries` (name, shape, numel in flat order),
// with param_dtype values of `param_elem_bytes` bytes, sharded over `shard_world` ranks.
QuantLayout quant_layout(const std::vector<PlannedEntry>& entries, const model::Quant4Options& options,
                         int64_t param_elem_bytes, int shard_world);

}  // namespace alpaca::fsdp
