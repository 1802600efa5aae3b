// QuantStore; see quant_store.h.
#include "quant_store.h"

#include <algorithm>

#include "alpaca/util/error.h"

namespace alpaca::fsdp {
namespace {

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

at::Tensor code_tensor(const float* values, int64_t n, const at::Device& device) {
  return at::from_blob(const_cast<float*>(values), {n}, at::kFloat).to(device);
}

}  // namespace

bool QuantStore::quantizes(const std::string& name, int64_t dim) {
  return dim == 2 && ends_with(name, "proj.weight");
}

QuantStore::QuantStore(const FlatParameter& frozen, const model::Quant4Options& options, int shard_world,
                       int shard_rank, at::Device master_device)
    : options_(options), param_dtype_(frozen.options().param_dtype) {
  int64_t at_byte = 0;
  for (const auto& e : frozen.entries()) {
    Segment s;
    s.numel = e.numel;
    s.shape = e.shape;
    s.quantized = quantizes(e.name, static_cast<int64_t>(e.shape.size()));
    if (s.quantized) {
      s.blocks = (e.numel + options.blocksize - 1) / options.blocksize;
      s.nested_blocks = (s.blocks + model::kQuant4NestedBlocksize - 1) / model::kQuant4NestedBlocksize;
      s.packed = at_byte;
      s.absmax = align4(s.packed + (e.numel + 1) / 2);
      at_byte = options.nested ? s.absmax + s.blocks : s.absmax + 4 * s.blocks;
      if (options.nested) {
        s.nested = align4(at_byte);
        at_byte = s.nested + 4 * s.nested_blocks;
      }
      quantized_numel_ += e.numel;
    } else {
      s.raw = align4(at_byte);
      at_byte = s.raw + e.numel * static_cast<int64_t>(c10::elementSize(param_dtype_));
    }
    at_byte = align4(at_byte);
    segs_.push_back(std::move(s));
  }
  offsets_.assign(segs_.size(), 0.0f);
  const int64_t quantum = 4 * static_cast<int64_t>(shard_world);
  padded_ = (at_byte + quantum - 1) / quantum * quantum;
  const int64_t shard_bytes = padded_ / shard_world;
  shard_begin_ = shard_bytes * shard_rank;
  shard_ = at::zeros({shard_bytes}, at::TensorOptions().dtype(at::kByte).device(master_device));
}

void QuantStore::write(int64_t begin, const at::Tensor& bytes) {
  const int64_t lo = std::max(begin, shard_begin_);
  const int64_t hi = std::min(begin + bytes.numel(), shard_begin_ + shard_.numel());
  if (lo >= hi) return;
  shard_.narrow(0, lo - shard_begin_, hi - lo).copy_(bytes.narrow(0, lo - begin, hi - lo));
}

void QuantStore::load_entry(size_t e, const at::Tensor& values) {
  const Segment& s = segs_.at(e);
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
  ALPACA_CHECK(blob.scalar_type() == at::kByte && blob.numel() == padded_ && blob.is_contiguous(),
               "4-bit base: unpack needs the whole gathered blob of " << padded_ << " bytes");
  at::Tensor full = frozen.full();
  const auto& code = model::quant4_code(options_.type);
  for (size_t e = 0; e < segs_.size(); ++e) {
    const Segment& s = segs_[e];
    const auto& entry = frozen.entries()[e];
    at::Tensor out = full.narrow(0, entry.offset, entry.numel);
    if (!s.quantized) {
      out.copy_(blob.narrow(0, s.raw, s.numel * out.element_size()).view(param_dtype_));
      continue;
    }
    const at::Tensor absmax = absmax_of(s, e, blob).contiguous();
    const at::Tensor packed = blob.narrow(0, s.packed, (s.numel + 1) / 2);
    if (blob.is_cpu()) {
      model::dequantize_4bit_into(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), s.numel,
                                  options_.blocksize, options_.type, out);
      continue;
    }
    // Any device: code[q] * absmax[block] in fp32, rounded once to param_dtype (the same bits).
    const at::Tensor q = at::stack({packed.bitwise_right_shift(4), packed.bitwise_and(15)}, 1)
                             .reshape({-1}).narrow(0, 0, s.numel).to(at::kLong);
    const at::Tensor scale = absmax.repeat_interleave(options_.blocksize).narrow(0, 0, s.numel);
    out.copy_(code_tensor(code.data(), 16, blob.device()).index_select(0, q).mul_(scale));
  }
}

}  // namespace alpaca::fsdp
