// Pure shard arithmetic; see include/alpaca/fsdp/shard_info.h.
#include "alpaca/fsdp/shard_info.h"

#include <algorithm>

#include "alpaca/util/error.h"

namespace alpaca::fsdp {

ShardInfo shard_info(int64_t numel, int world, int rank) {
  ALPACA_CHECK(world >= 1, "shard_info: world size must be >= 1, got " << world);
  ALPACA_CHECK(rank >= 0 && rank < world, "shard_info: rank " << rank << " outside [0, " << world << ")");
  ALPACA_CHECK(numel >= 0, "shard_info: negative numel " << numel);
  ShardInfo s;
  s.numel = numel;
  s.world = world;
  s.rank = rank;
  s.shard_numel = (numel + world - 1) / world;
  s.padded_numel = s.shard_numel * world;
  s.shard_begin = s.shard_numel * rank;
  s.valid_numel = std::clamp<int64_t>(numel - s.shard_begin, 0, s.shard_numel);
  return s;
}

std::optional<ParamShardSlice> param_shard_slice(int64_t param_offset, int64_t param_numel,
                                                 const ShardInfo& shard) {
  const int64_t shard_end = shard.shard_begin + shard.shard_numel;
  const int64_t begin = std::max(param_offset, shard.shard_begin);
  const int64_t end = std::min(param_offset + param_numel, shard_end);
  if (begin >= end) return std::nullopt;
  ParamShardSlice s;
  s.param_begin = begin - param_offset;
  s.param_end = end - param_offset;
  s.shard_offset = begin - shard.shard_begin;
  return s;
}

}  // namespace alpaca::fsdp
