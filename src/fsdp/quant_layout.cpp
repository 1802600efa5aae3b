// The 4-bit frozen base's byte layout; see include/alpaca/fsdp/quant_layout.h.
#include "alpaca/fsdp/quant_layout.h"

namespace alpaca::fsdp {
namespace {

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Places one 4-bit tensor at `at_byte`: packed bytes, absmax (codes + nested scales); returns the end.
int64_t place_quantized(QuantSegment& s, int64_t at_byte, const model::Quant4Options& options) {
  s.blocks = (s.numel + options.blocksize - 1) / options.blocksize;
  s.nested_blocks = (s.blocks + model::kQuant4NestedBlocksize - 1) / model::kQuant4NestedBlocksize;
  s.packed = at_byte;
  s.absmax = align4(s.packed + (s.numel + 1) / 2);
  if (!options.nested) return s.absmax + 4 * s.blocks;
  s.nested = align4(s.absmax + s.blocks);
  return s.nested + 4 * s.nested_blocks;
}

}  // namespace

bool quantizes_4bit(const std::string& name, int64_t dim) { return dim == 2 && ends_with(name, "proj.weight"); }

bool unit_holds_4bit(const UnitPlan& plan, int u) {
  return u >= 0 && u < plan.num_layers && plan.units.at(static_cast<size_t>(u)).has_frozen;
}

QuantLayout quant_layout(const std::vector<PlannedEntry>& entries, const model::Quant4Options& options,
                         int64_t param_elem_bytes, int shard_world) {
  QuantLayout out;
  int64_t at_byte = 0;
  for (const auto& e : entries) {
    QuantSegment s;
    s.numel = e.numel;
    s.shape = e.shape;
    s.quantized = quantizes_4bit(e.name, static_cast<int64_t>(e.shape.size()));
    if (s.quantized) {
      at_byte = place_quantized(s, at_byte, options);
      out.quantized_numel += e.numel;
    } else {
      s.raw = align4(at_byte);
      at_byte = s.raw + e.numel * param_elem_bytes;
    }
    at_byte = align4(at_byte);
    out.segments.push_back(std::move(s));
  }
  const int64_t quantum = 4 * static_cast<int64_t>(shard_world);
  out.padded_bytes = (at_byte + quantum - 1) / quantum * quantum;
  out.shard_bytes = out.padded_bytes / shard_world;
  return out;
}

}  // namespace alpaca::fsdp
