// 4-bit NF4 / FP4 quantization; see include/alpaca/model/quant4.h. Every rounding step is the one
// bitsandbytes 0.50 takes on the CPU (backends/default/ops.py for the 4-bit quantizer, the native
// csrc/cpu_ops.cpp kernels for the 8-bit nested statistics and the dequantizers), which is why this
// file is built with -ffp-contract=off (a fused multiply-add would round once where they round
// twice) and uses std::fma exactly where their compiled kernel does.
#include "alpaca/model/quant4.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* (as in gemv.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"

namespace alpaca::model {
namespace {

constexpr float kAbsmaxFloor = 1e-38f;  // default/ops.py: absmax.clamp(min=1e-38), in fp32

constexpr std::array<float, 16> kNf4 = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

// get_4bit_type("fp4"): sign bit, 2 exponent bits, 1 mantissa bit, listed by bit pattern and
// divided in fp32 by the largest magnitude (12). Index 8 ("-0" in their Python list) is +0.0.
std::array<float, 16> make_fp4() {
  const float raw[16] = {0.0f, 0.0625f, 8.0f, 12.0f, 4.0f, 6.0f, 2.0f, 3.0f,
                         0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  std::array<float, 16> out{};
  for (int i = 0; i < 16; ++i) out[i] = raw[i] / 12.0f;
  return out;
}

// The quantizer's view of a code book: bitsandbytes sorts it (torch.argsort) and bucketizes on
// the midpoints of neighbours; `order` maps a sorted position back to the code. For FP4 the two
// zeros tie; torch's argsort puts code 0 (+0) before code 8, so values in (-0.0026, 0] take code 0
// and (0, 0.0026] code 8, both 0.0 when dequantized.
struct Quantizer {
  std::array<float, 15> bounds{};
  std::array<uint8_t, 16> order{};
  uint8_t encode(float scaled) const {
    // torch.bucketize(right=False): the number of bounds strictly below the value.
    const auto pos = std::lower_bound(bounds.begin(), bounds.end(), scaled) - bounds.begin();
    return order[static_cast<size_t>(pos)];
  }
};

Quantizer make_quantizer(Quant4Type type) {
  static constexpr std::array<uint8_t, 16> kFp4Order = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
  Quantizer q;
  for (uint8_t i = 0; i < 16; ++i) q.order[i] = type == Quant4Type::kNf4 ? i : kFp4Order[i];
  const auto& code = quant4_code(type);
  for (int i = 0; i < 15; ++i) q.bounds[i] = (code[q.order[i]] + code[q.order[i + 1]]) / 2.0f;
  return q;
}

const Quantizer& quantizer(Quant4Type type) {
  static const Quantizer kNf4Q = make_quantizer(Quant4Type::kNf4);
  static const Quantizer kFp4Q = make_quantizer(Quant4Type::kFp4);
  return type == Quant4Type::kNf4 ? kNf4Q : kFp4Q;
}

void check_blocksize(int64_t blocksize) {
  const bool pow2 = blocksize > 0 && (blocksize & (blocksize - 1)) == 0;
  ALPACA_CHECK(pow2 && blocksize >= 32 && blocksize <= 4096,
               "4-bit quantization: blocksize " << blocksize
                                                << " is not one of bitsandbytes' 32, 64, 128, ..., 4096");
}

// One block of default/ops.py's quantize_4bit. Full blocks multiply by the fp32 reciprocal of
// their absmax; the partial last block divides by its (clamped) absmax, which is also what it
// stores: the two roundings differ, so they are kept apart.
void quantize_block(const float* x, int64_t begin, int64_t len, bool partial, const Quantizer& q, uint8_t* packed,
                    float* absmax_out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[begin + i]));
  const float floored = std::max(amax, kAbsmaxFloor);
  *absmax_out = partial ? floored : amax;
  const float inv = 1.0f / floored;
  for (int64_t i = 0; i < len; ++i) {
    const float v = x[begin + i];
    const float scaled = std::clamp(partial ? v / floored : v * inv, -1.0f, 1.0f);
    const uint8_t c = q.encode(scaled);
    const int64_t e = begin + i;
    uint8_t& byte = packed[e >> 1];
    byte = (e & 1) ? static_cast<uint8_t>(byte | c) : static_cast<uint8_t>(c << 4);
  }
}

// bitsandbytes' native 8-bit quantizer maps a scaled value through a 65,536-entry table of
// nearest codes (build_quantize_lut / norm_to_lut_index in csrc/cpu_ops.cpp), not an exact search.
const std::array<uint8_t, 65536>& dynamic_lut() {
  static const std::array<uint8_t, 65536> kLut = [] {
    const auto& code = dynamic_map_8bit();
    std::array<float, 255> mid{};
    for (int i = 0; i < 255; ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
    std::array<uint8_t, 65536> lut{};
    int idx = 0;
    for (int i = 0; i < 65536; ++i) {
      const float val = -1.0f + (2.0f * static_cast<float>(i)) / 65535.0f;
      while (idx < 255 && mid[idx] < val) ++idx;
      lut[i] = static_cast<uint8_t>(idx);
    }
    return lut;
  }();
  return kLut;
}

// norm_to_lut_index as the 0.50 wheel compiled it: (v + 1) * 0.5 rounded, then one fused
// multiply-add by 65535 plus 0.5 (vfmadd213ss), truncated.
uint16_t lut_index(float scaled) {
  const float half = (std::clamp(scaled, -1.0f, 1.0f) + 1.0f) * 0.5f;
  return static_cast<uint16_t>(static_cast<int32_t>(std::fma(half, 65535.0f, 0.5f)));
}

at::Tensor cpu_float_flat(const at::Tensor& x) {
  return x.detach().to(at::kCPU).reshape({-1}).to(at::kFloat).contiguous();
}

#if defined(__x86_64__)
#define ALPACA_AVX512BW __attribute__((target("avx512f,avx512bw")))
// 16-bit outputs (bf16, fp16) of one block from its 16-entry table: 16 packed bytes -> 32 indices
// (high nibble first, as the scalar loop) -> one word permute. Returns the elements written (a
// multiple of 32); the scalar loop does the rest. The table is the scalar one, so the bits are too.
ALPACA_AVX512BW int64_t dequantize_16bit_avx512(const uint8_t* packed, const uint16_t* table16, int64_t len,
                                                uint16_t* out) {
  uint16_t t[32] = {};
  std::copy(table16, table16 + 16, t);
  const __m512i table = _mm512_loadu_si512(t);
  const __m512i low4 = _mm512_set1_epi32(15);
  int64_t e = 0;
  for (; e + 32 <= len; e += 32) {
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + e / 2)));
    const __m512i idx = _mm512_or_si512(_mm512_srli_epi32(w, 4), _mm512_slli_epi32(_mm512_and_si512(w, low4), 16));
    _mm512_storeu_si512(out + e, _mm512_permutexvar_epi16(idx, table));
  }
  return e;
}

bool has_avx512bw() {
  static const bool has = cpu::has(cpu::Feature::kAvx512f) && cpu::has(cpu::Feature::kAvx512bw);
  return has;
}
#endif

// The SIMD part of a block that starts at an even element (its bytes whole); 0 where none applies.
template <typename T>
int64_t dequantize_block_simd(const uint8_t* packed, const T* table, int64_t begin, int64_t len, T* out) {
#if defined(__x86_64__)
  if constexpr (sizeof(T) == 2) {
    if (begin % 2 == 0 && has_avx512bw())
      return dequantize_16bit_avx512(packed + begin / 2, reinterpret_cast<const uint16_t*>(table), len,
                                     reinterpret_cast<uint16_t*>(out + begin));
  }
#endif
  return 0;
}

template <typename T>
void dequantize_blocks(const uint8_t* packed, const float* absmax, int64_t numel, int64_t blocksize,
                       const std::array<float, 16>& code, T* out) {
  const int64_t num_blocks = (numel + blocksize - 1) / blocksize;
  at::parallel_for(0, num_blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      // code[q] * absmax in fp32 (one rounding), then one rounding to T: a per-block table of the
      // 16 products gives the same bits as multiplying each element.
      T table[16];
      for (int k = 0; k < 16; ++k) table[k] = static_cast<T>(code[k] * absmax[b]);
      const int64_t begin = b * blocksize, end = std::min(numel, begin + blocksize);
      int64_t e = begin + dequantize_block_simd(packed, table, begin, end - begin, out);
      for (; e + 1 < end; e += 2) {
        const uint8_t byte = packed[e >> 1];
        out[e] = table[byte >> 4];
        out[e + 1] = table[byte & 0x0F];
      }
      if (e < end) out[e] = table[packed[e >> 1] >> 4];
    }
  });
}

}  // namespace

std::string quant4_type_name(Quant4Type type) { return type == Quant4Type::kNf4 ? "nf4" : "fp4"; }

Quant4Type parse_quant4_type(const std::string& name) {
  if (name == "nf4") return Quant4Type::kNf4;
  if (name == "fp4") return Quant4Type::kFp4;
  ALPACA_CHECK(false, "unknown 4-bit quant type '" << name << "': bitsandbytes' types are nf4 and fp4");
  return Quant4Type::kNf4;
}

const std::array<float, 16>& quant4_code(Quant4Type type) {
  static const std::array<float, 16> kFp4 = make_fp4();
  return type == Quant4Type::kNf4 ? kNf4 : kFp4;
}

int64_t Quant4State::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t Quant4State::num_blocks() const { return (numel() + blocksize - 1) / blocksize; }

std::pair<at::Tensor, at::Tensor> quantize_blockwise_8bit(const at::Tensor& x, int64_t blocksize) {
  ALPACA_CHECK(blocksize > 0, "8-bit blockwise quantization: blocksize must be positive, got " << blocksize);
  const at::Tensor flat = cpu_float_flat(x);
  const int64_t n = flat.numel(), num_blocks = (n + blocksize - 1) / blocksize;
  at::Tensor codes = at::empty({n}, at::kByte), absmax = at::empty({num_blocks}, at::kFloat);
  const float* xp = flat.data_ptr<float>();
  uint8_t* cp = codes.data_ptr<uint8_t>();
  float* ap = absmax.data_ptr<float>();
  const auto& lut = dynamic_lut();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(xp[i]));
    ap[b] = amax;
    const float inv = 1.0f / amax;
    for (int64_t i = begin; i < end; ++i) cp[i] = amax == 0.0f ? 0 : lut[lut_index(xp[i] * inv)];
  }
  return {codes.view(x.sizes()), absmax};
}

at::Tensor dequantize_blockwise_8bit(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize) {
  const at::Tensor q = codes.to(at::kCPU).reshape({-1}).contiguous();
  const at::Tensor a = absmax.to(at::kCPU).to(at::kFloat).contiguous();
  ALPACA_CHECK(q.scalar_type() == at::kByte, "8-bit dequantization: codes must be uint8, got " << q.scalar_type());
  ALPACA_CHECK(a.numel() == (q.numel() + blocksize - 1) / blocksize,
               "8-bit dequantization: " << a.numel() << " absmax values for " << q.numel() << " codes in blocks of "
                                        << blocksize);
  at::Tensor out = at::empty({q.numel()}, at::kFloat);
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const float* ap = a.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const auto& code = dynamic_map_8bit();
  for (int64_t i = 0; i < q.numel(); ++i) op[i] = code[qp[i]] * ap[i / blocksize];
  return out.view(codes.sizes());
}

Quant4Tensor quantize_4bit(const at::Tensor& x, const Quant4Options& options) {
  check_blocksize(options.blocksize);
  const auto dt = x.scalar_type();
  ALPACA_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
               "4-bit quantization takes fp32 / bf16 / fp16 tensors, got " << dt);
  const at::Tensor flat = cpu_float_flat(x);
  const int64_t n = flat.numel(), bs = options.blocksize, num_blocks = (n + bs - 1) / bs;
  Quant4Tensor out;
  out.packed = at::zeros({(n + 1) / 2, 1}, at::kByte);
  at::Tensor absmax = at::empty({num_blocks}, at::kFloat);
  const float* xp = flat.data_ptr<float>();
  uint8_t* pp = out.packed.data_ptr<uint8_t>();
  float* ap = absmax.data_ptr<float>();
  const Quantizer& q = quantizer(options.type);
  at::parallel_for(0, num_blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t len = std::min(bs, n - b * bs);
      quantize_block(xp, b * bs, len, len < bs, q, pp, ap + b);
    }
  });
  if (n % 2) pp[n / 2] = static_cast<uint8_t>(pp[n / 2] | q.encode(0.0f));  // the pad value 0.0
  Quant4State& st = out.state;
  st.type = options.type;
  st.blocksize = bs;
  st.shape = x.sizes().vec();
  st.nested = options.nested;
  if (!options.nested) {
    st.absmax = absmax;
    return out;
  }
  // offset = absmax.mean(): LibTorch's own reduction, forced onto its serial path so the sum's
  // order (and so its rounding) does not depend on the number of threads.
  {
    c10::ParallelGuard serial(true);
    st.offset = absmax.mean().item<float>();
  }
  auto [codes, nested_absmax] = quantize_blockwise_8bit(absmax - st.offset, kQuant4NestedBlocksize);
  st.absmax = codes;
  st.nested_absmax = nested_absmax;
  return out;
}

at::Tensor dequantize_absmax(const Quant4State& state) {
  if (!state.nested) return state.absmax.to(at::kCPU).to(at::kFloat).contiguous();
  // bitsandbytes: dequantize_blockwise (code8[q] * absmax2, rounded) then `absmax += offset`.
  at::Tensor a = dequantize_blockwise_8bit(state.absmax, state.nested_absmax, kQuant4NestedBlocksize);
  float* p = a.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = p[i] + state.offset;
  return a;
}

void dequantize_4bit_into(const uint8_t* packed, const float* absmax, int64_t numel, int64_t blocksize,
                          Quant4Type type, at::Tensor& out_flat) {
  ALPACA_CHECK(out_flat.is_cpu() && out_flat.is_contiguous() && out_flat.numel() >= numel,
               "4-bit dequantization needs a contiguous CPU output of at least " << numel << " values");
  const auto& code = quant4_code(type);
  switch (out_flat.scalar_type()) {
    case at::kFloat: dequantize_blocks(packed, absmax, numel, blocksize, code, out_flat.data_ptr<float>()); break;
    case at::kBFloat16:
      dequantize_blocks(packed, absmax, numel, blocksize, code, out_flat.data_ptr<c10::BFloat16>());
      break;
    case at::kHalf: dequantize_blocks(packed, absmax, numel, blocksize, code, out_flat.data_ptr<c10::Half>()); break;
    default: ALPACA_CHECK(false, "4-bit dequantization into " << out_flat.scalar_type() << ": use fp32, bf16 or fp16");
  }
}

at::Tensor dequantize_4bit(const at::Tensor& packed, const Quant4State& state, at::ScalarType dtype) {
  check_blocksize(state.blocksize);
  const int64_t n = state.numel();
  const at::Tensor bytes = packed.to(at::kCPU).contiguous().view(at::kByte).reshape({-1});
  ALPACA_CHECK(bytes.numel() == (n + 1) / 2, "4-bit dequantization: " << bytes.numel() << " packed bytes for a tensor of "
                                                                      << n << " values (expected " << (n + 1) / 2 << ")");
  const at::Tensor absmax = dequantize_absmax(state);
  ALPACA_CHECK(absmax.numel() == state.num_blocks(), "4-bit dequantization: " << absmax.numel() << " absmax values for "
                                                                               << state.num_blocks() << " blocks");
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(dtype));
  dequantize_4bit_into(bytes.data_ptr<uint8_t>(), absmax.data_ptr<float>(), n, state.blocksize, state.type, out);
  return out.view(state.shape);
}

void dequantize_4bit_aten(const at::Tensor& packed, const at::Tensor& absmax, int64_t numel, int64_t blocksize,
                          Quant4Type type, at::Tensor out_flat, int64_t chunk) {
  ALPACA_CHECK(chunk > 0 && chunk % blocksize == 0 && chunk % 2 == 0,
               "4-bit dequantization: a chunk of " << chunk << " values must be a multiple of the blocksize " << blocksize);
  const auto& book = quant4_code(type);
  const at::Tensor code = at::from_blob(const_cast<float*>(book.data()), {16}, at::kFloat).to(packed.device());
  for (int64_t c0 = 0; c0 < numel; c0 += chunk) {
    const int64_t len = std::min(chunk, numel - c0), blocks = (len + blocksize - 1) / blocksize;
    const at::Tensor p = packed.narrow(0, c0 / 2, (len + 1) / 2);
    const at::Tensor q = at::stack({p.bitwise_right_shift(4), p.bitwise_and(15)}, 1)
                             .reshape({-1}).narrow(0, 0, len).to(at::kLong);
    const at::Tensor scale = absmax.narrow(0, c0 / blocksize, blocks).repeat_interleave(blocksize).narrow(0, 0, len);
    out_flat.narrow(0, c0, len).copy_(code.index_select(0, q).mul_(scale));
  }
}

int64_t quant4_bytes(int64_t numel, const Quant4Options& options) {
  const int64_t blocks = (numel + options.blocksize - 1) / options.blocksize;
  const int64_t packed = (numel + 1) / 2;
  if (!options.nested) return packed + 4 * blocks;
  const int64_t nested_blocks = (blocks + kQuant4NestedBlocksize - 1) / kQuant4NestedBlocksize;
  return packed + blocks + 4 * nested_blocks + 4;
}

}  // namespace alpaca::model
