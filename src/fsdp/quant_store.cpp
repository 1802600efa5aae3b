// QuantStore; see quant_store.h.
#include "quant_store.h"

#include <algorithm>

#include "alpaca/util/error.h"

namespace alpaca::fsdp {
namespace {

at::Tensor code_tensor(const float* values, int64_t n, const at::Device& device) {
  return at::from_blob(const_cast<float*>(values), {n}, at::kFloat).to(device);
}

// The frozen entries as the layout sees them (name, shape, numel in flat order).
std::vector<PlannedEntry> layout_entries(const FlatParameter& frozen) {
  std::vector<PlannedEntry> out;
  for (const auto& e : frozen.entries()) {
    PlannedEntry p;
    p.name = e.name;
    p.shape = e.shape;
    p.offset = e.offset;
    p.numel = e.numel;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

QuantStore::QuantStore(const FlatParameter& frozen, const model::Quant4Options& options, int shard_world,
                       int shard_rank, at::Device master_device)
    : options_(options),
      param_dtype_(frozen.options().param_dtype),
      layout_(quant_layout(layout_entries(frozen), options, static_cast<int64_t>(c10::elementSize(param_dtype_)),
                           shard_world)) {
  offsets_.assign(layout_.segments.size(), 0.0f);
  shard_begin_ = layout_.shard_bytes * shard_rank;
  shard_ = at::zeros({layout_.shard_bytes}, at::TensorOptions().dtype(at::kByte).device(master_device));
}

void QuantStore::write(int64_t begin, const at::Tensor& bytes) {
  const int64_t lo = std::max(begin, shard_begin_);
  const int64_t hi = std::min(begin + bytes.numel(), shard_begin_ + shard_.numel());
  if (lo >= hi) return;
  shard_.narrow(0, lo - shard_begin_, hi - lo).copy_(bytes.narrow(0, lo - begin, hi - lo));
}

void QuantStore::load_entry(size_t e, const at::Tensor& values) {
  const Segment& s = layout_.segments.at(e);
  ALPACA_CHECK(values.numel() == s.numel, "4-bit base: " << values.numel() << " values for a tensor of " << s.numel);
  const at::Tensor v = values.detach().to(at::kCPU).to(param_dtype_).reshape({-1}).contiguous();
  if (!s.quantized) {
    write(s.raw, v.view(at::kByte));
    return;
  }
  const model::Quant4Tensor q = model::quantize_4bit(v.view(s.shape), options_);
  write(s.packed, q.packed.reshape({-1}));
  write(s.absmax, options_.nested ? q.state.absmax : q.state.absmax.view(at::kByte));
  if (options_.nested) {
    write(s.nested, q.state.nested_absmax.view(at::kByte));
    offsets_[e] = q.state.offset;
  }
}

void QuantStore::load_quantized(size_t e, const model::Quant4Tensor& q) {
  const Segment& s = layout_.segments.at(e);
  const model::Quant4State& st = q.state;
  ALPACA_CHECK(s.quantized, "4-bit base: frozen entry " << e << " is not held 4-bit");
  ALPACA_CHECK(st.type == options_.type && st.blocksize == options_.blocksize && st.nested == options_.nested,
               "4-bit base: a tensor quantized as " << model::quant4_type_name(st.type) << ", blocksize " << st.blocksize
               << (st.nested ? ", nested" : "") << " for a store of " << model::quant4_type_name(options_.type)
               << ", blocksize " << options_.blocksize << (options_.nested ? ", nested" : ""));
  ALPACA_CHECK(st.shape == s.shape, "4-bit base: a quant_state of shape " << at::IntArrayRef(st.shape)
               << " for a tensor of shape " << at::IntArrayRef(s.shape));
  const bool sizes = q.packed.scalar_type() == at::kByte && q.packed.numel() == (s.numel + 1) / 2 &&
                     st.absmax.numel() == s.blocks && st.absmax.scalar_type() == (st.nested ? at::kByte : at::kFloat) &&
                     (!st.nested || (st.nested_absmax.numel() == s.nested_blocks && st.nested_absmax.scalar_type() == at::kFloat));
  ALPACA_CHECK(sizes, "4-bit base: stored sizes (" << q.packed.numel() << " packed bytes, " << st.absmax.numel()
               << " absmax) are not those of " << s.numel << " values in blocks of " << s.blocks);
  write(s.packed, q.packed.reshape({-1}));
  write(s.absmax, st.absmax.contiguous().view(at::kByte));
  if (st.nested) {
    write(s.nested, st.nested_absmax.contiguous().view(at::kByte));
    offsets_[e] = st.offset;
  }
}

// bitsandbytes' dequantize_blockwise + offset (two roundings), in ATen so it runs on any device.
at::Tensor QuantStore::absmax_of(const Segment& s, size_t e, const at::Tensor& blob) const {
  if (!options_.nested) return blob.narrow(0, s.absmax, 4 * s.blocks).view(at::kFloat);
  const auto& map = model::dynamic_map_8bit();
  const at::Tensor code8 = code_tensor(map.data(), 256, blob.device());
  const at::Tensor codes = blob.narrow(0, s.absmax, s.blocks).to(at::kLong);
  const at::Tensor scale = blob.narrow(0, s.nested, 4 * s.nested_blocks).view(at::kFloat)
                               .repeat_interleave(model::kQuant4NestedBlocksize).narrow(0, 0, s.blocks);
  return (code8.index_select(0, codes) * scale).add_(offsets_.at(e));
}

void QuantStore::unpack(const at::Tensor& blob, FlatParameter& frozen) const {
  ALPACA_CHECK(blob.scalar_type() == at::kByte && blob.numel() == layout_.padded_bytes && blob.is_contiguous(),
               "4-bit base: unpack needs the whole gathered blob of " << layout_.padded_bytes << " bytes");
  at::Tensor full = frozen.full();
  for (size_t e = 0; e < layout_.segments.size(); ++e) {
    const Segment& s = layout_.segments[e];
    const auto& entry = frozen.entries()[e];
    at::Tensor out = full.narrow(0, entry.offset, entry.numel);
    if (!s.quantized) {
      out.copy_(blob.narrow(0, s.raw, s.numel * out.element_size()).view(param_dtype_));
      continue;
    }
    const at::Tensor absmax = absmax_of(s, e, blob).contiguous();
    const at::Tensor packed = blob.narrow(0, s.packed, (s.numel + 1) / 2);
    if (blob.is_cpu()) {  // the native kernel
      model::dequantize_4bit_into(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), s.numel,
                                  options_.blocksize, options_.type, out);
      continue;
    }
    // Any device: the same bits from ATen ops, a chunk at a time.
    model::dequantize_4bit_aten(packed, absmax, s.numel, options_.blocksize, options_.type, out);
  }
}

}  // namespace alpaca::fsdp
