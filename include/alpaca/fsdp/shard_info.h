// Offset arithmetic of a flat parameter split across ranks, in one pure place (llm.c's ShardInfo).
// A flat buffer of `numel` elements is padded to a multiple of the world size and cut into equal
// contiguous shards; rank r owns [r * shard_numel, (r + 1) * shard_numel) of the padded buffer.
// Every caller (flattening, loading, optimizer masks, state export) uses these functions.
#pragma once

#include <cstdint>
#include <optional>

namespace alpaca::fsdp {

struct ShardInfo {
  int64_t numel = 0;         // unpadded elements of the flat buffer
  int64_t padded_numel = 0;  // world * shard_numel >= numel
  int64_t shard_numel = 0;   // elements every rank holds (padding included)
  int64_t shard_begin = 0;   // first element of this rank's shard in the padded flat buffer
  int64_t valid_numel = 0;   // elements of this rank's shard that are not padding
  int world = 1;
  int rank = 0;
};

// The shard of `rank` among `world` for a flat buffer of `numel` elements. Throws on
// world < 1, rank outside [0, world) or numel < 0.
ShardInfo shard_info(int64_t numel, int world, int rank);

// The part of one original parameter (occupying [param_offset, param_offset + param_numel) of the
// flat buffer) that falls inside a shard: `param_begin`/`param_end` index the parameter's own
// flattened elements, `shard_offset` is where they start inside the shard.
struct ParamShardSlice {
  int64_t param_begin = 0;
  int64_t param_end = 0;  // exclusive
  int64_t shard_offset = 0;
  int64_t numel() const { return param_end - param_begin; }
};

// std::nullopt when the parameter has no element in this shard.
std::optional<ParamShardSlice> param_shard_slice(int64_t param_offset, int64_t param_numel,
                                                 const ShardInfo& shard);

}  // namespace alpaca::fsdp
