// CpuDecoder: the fused CPU generation step (see the header). The per-row ops are plain loops
// over at most 8 x hidden values in the calling thread; the weight products and the attention
// heads are split across the intra-op threads: five parallel regions per layer (q/k/v,
// attention, o, gate/up, down) and one for the head.
#include "alpaca/model/cpu_decode.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>  // defines: at::NoGradGuard
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/error.h"
#include "gemv_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (GCC bug 105593), as in gemv.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace alpaca::model {
namespace {

using c10::BFloat16;
constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kRowGrain = 32;  // weight rows per thread at least

// Rounding to the compute dtype where the module path produces a tensor of that dtype.
template <typename T>
inline float round_to(float v) {
  if constexpr (std::is_same_v<T, BFloat16>) return static_cast<float>(BFloat16(v));
  return v;
}

// Sums of m rows of x against rows [n0, n1) of w, fp32 out.
inline void rows(const float* x, int64_t ldx, int m, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  gemv::f32_rows(x, ldx, m, w, k, n0, n1, y, ldy);
}
inline void rows(const BFloat16* x, int64_t ldx, int m, const BFloat16* w, int64_t k, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  gemv::bf16_rows(x, ldx, m, w, k, n0, n1, y, ldy);
}

// --- attention inner loops: q . k and out += p v over head_dim values -------------------------
#if defined(__x86_64__)
#define ALPACA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
ALPACA_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
ALPACA_AVX512 inline __m512 load16(const BFloat16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __mmask16 lanes(int64_t left) { return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1U << left) - 1); }

template <typename T>
ALPACA_AVX512 float dot(const float* q, const T* k, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    acc = _mm512_fmadd_ps(load16(q + c, m), load16(k + c, m), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <typename T>
ALPACA_AVX512 void axpy(float a, const T* v, float* out, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    _mm512_mask_storeu_ps(out + c, m, _mm512_fmadd_ps(av, load16(v + c, m), load16(out + c, m)));
  }
}
#else
template <typename T>
float dot(const float* q, const T* k, int64_t n) {
  float s = 0;
  for (int64_t c = 0; c < n; ++c) s += q[c] * static_cast<float>(k[c]);
  return s;
}
template <typename T>
void axpy(float a, const T* v, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += a * static_cast<float>(v[c]);
}
#endif

// transformers' LlamaRMSNorm: fp32 mean of squares, x * rsqrt(var + eps) rounded to the dtype,
// times the weight (in the dtype). The mean is summed in double (ATen sums fp32 pairwise).
template <typename T>
void rms_norm(const T* x, const T* w, float eps, int64_t n, T* out) {
  double ss = 0;
  for (int64_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(x[c]);
    ss += static_cast<double>(v) * v;
  }
  const float var = static_cast<float>(ss / static_cast<double>(n));
  const float r = 1.0F / std::sqrt(var + eps);
  for (int64_t c = 0; c < n; ++c) {
    const float y = round_to<T>(static_cast<float>(x[c]) * r);
    out[c] = static_cast<T>(static_cast<float>(w[c]) * y);
  }
}

// apply_rope on one head in place: x * cos + rotate_half(x) * sin, each product and the sum
// rounded to the dtype as the three tensor ops of the module path are.
template <typename T>
void rope_head(T* x, const T* cos, const T* sin, int64_t dh) {
  float tmp[kMaxHeadDim];
  const int64_t half = dh / 2;
  for (int64_t d = 0; d < dh; ++d) {
    const float rot = d < half ? -static_cast<float>(x[d + half]) : static_cast<float>(x[d - half]);
    const float a = round_to<T>(static_cast<float>(x[d]) * static_cast<float>(cos[d]));
    const float b = round_to<T>(rot * static_cast<float>(sin[d]));
    tmp[d] = a + b;
  }
  for (int64_t d = 0; d < dh; ++d) x[d] = static_cast<T>(tmp[d]);
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

// peft's unmerged LoRA branch on one projection: A(x) for the m rows of x, rounded to the dtype
// as lora_A's output is, then per output j: B(A(x))_j rounded, times scaling rounded.
template <typename T>
struct LoraBranch {
  const T* b = nullptr;  // (out, r)
  int64_t r = 0;
  float scaling = 0;
  std::vector<float> ax;  // (m, r): A(x), already rounded to T

  bool active() const { return b != nullptr; }
  void start(const T* x, int m, int64_t k, const at::Tensor& a_w, const at::Tensor& b_w, float s) {
    if (!a_w.defined()) {
      b = nullptr;
      return;
    }
    r = a_w.size(0);
    b = b_w.const_data_ptr<T>();
    scaling = s;
    ax.resize(static_cast<size_t>(m * r));
    rows(x, k, m, a_w.const_data_ptr<T>(), k, 0, r, ax.data(), r);
    for (float& v : ax) v = round_to<T>(v);
  }
  // y_j (the base output, rounded) plus row i's branch at output j, rounded as `y + delta`.
  float add(int i, int64_t j, float y) const {
    const float delta = round_to<T>(round_to<T>(dot(ax.data() + i * r, b + j * r, r)) * scaling);
    return round_to<T>(y + delta);
  }
};

// One weight (n rows) at column offset `off` of the stacked output.
template <typename T>
struct Seg {
  const T* w;
  int64_t n, off;
};

// Sums y (m, ldy) of x (m, k) against the stacked rows of `segs`, row ranges split across the
// intra-op threads; finish(r0, r1) runs in the thread that computed stacked rows [r0, r1).
template <typename T, int N, typename Finish>
void stacked_products(const T* x, int m, int64_t k, const Seg<T> (&segs)[N], float* y, int64_t ldy, Finish&& finish) {
  const int64_t total = segs[N - 1].off + segs[N - 1].n;
  at::parallel_for(0, total, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (const Seg<T>& s : segs) {
      const int64_t lo = std::max(r0, s.off), hi = std::min(r1, s.off + s.n);
      if (lo < hi) rows(x, k, m, s.w, k, lo - s.off, hi - s.off, y + s.off, ldy);
    }
    finish(r0, r1);
  });
}

}  // namespace

std::string CpuDecoder::unsupported(LlamaForCausalLMImpl& m, int64_t batch) {
  if (batch < 1 || batch > gemv::kMaxRows)
    return "batch of " + std::to_string(batch) + " rows (the fused step takes 1 to " +
           std::to_string(gemv::kMaxRows) + "; larger batches are GEMMs, which the module path runs)";
  if (m.has_layer_runner()) return "a layer runner is set (the sharded engine owns the layers)";
  const at::Tensor emb = m.model->embed_tokens->weight;
  const at::ScalarType dtype = emb.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return std::string("parameters in ") + c10::toString(dtype);
  for (const auto& item : m.named_parameters()) {
    const at::Tensor& p = item.value();
    if (!p.device().is_cpu()) return "parameters on " + p.device().str();
    // Trainable-token rows are fp32 in any model (peft's); they are cast once, as the module path does.
    if (p.scalar_type() != dtype && !item.key().ends_with("trainable_tokens_delta")) return "parameters in more than one dtype";
    if (!p.is_contiguous()) return "a non-contiguous parameter";
  }
  if (dtype == at::kFloat && !gemv::have_avx512f()) return "fp32 on a CPU without AVX-512F";
  if (dtype == at::kBFloat16 && (!gemv::have_avx512_bf16() || cpu_bf16_gemm() != CpuBf16Gemm::kNative))
    return "bf16 without native bf16 dot products (AVX512-BF16) on this CPU";
  for (auto& l : m.layers())
    for (const auto* lin : {&l->self_attn->q_proj, &l->self_attn->k_proj, &l->self_attn->v_proj,
                            &l->self_attn->o_proj, &l->mlp->gate_proj, &l->mlp->up_proj, &l->mlp->down_proj}) {
      const auto& L = *lin;
      if (!L->lora_A) continue;
      if (L->lora_A->bias.defined() || L->lora_B->bias.defined()) return "a LoRA branch with a bias";
      if (L->lora_dropout > 0 && L->is_training()) return "LoRA dropout in training mode (call eval())";
    }
  const LlamaConfig& c = m.config();
  if (c.head_dim % 2 != 0 || c.head_dim > kMaxHeadDim) return "head_dim " + std::to_string(c.head_dim);
  return "";
}

CpuDecoder::CpuDecoder(LlamaForCausalLMImpl& m, int64_t batch) : cfg_(m.config()), batch_(batch) {
  const std::string why = unsupported(m, batch);
  ALPACA_CHECK(why.empty(), "the fused CPU decode step cannot run this model: " << why);
  dtype_ = m.model->embed_tokens->weight.scalar_type();
  for (auto& l : m.layers()) {
    auto proj = [](const Linear& lin) {
      Proj p{lin->weight, lin->bias, {}, {}, 0.0F};
      if (lin->lora_A) {
        p.lora_a = lin->lora_A->weight;
        p.lora_b = lin->lora_B->weight;
        p.scaling = static_cast<float>(lin->lora_scaling);
      }
      return p;
    };
    Layer L{proj(l->self_attn->q_proj), proj(l->self_attn->k_proj), proj(l->self_attn->v_proj),
            proj(l->self_attn->o_proj), proj(l->mlp->gate_proj),    proj(l->mlp->up_proj),
            proj(l->mlp->down_proj),    l->input_layernorm->weight, l->post_attention_layernorm->weight,
            static_cast<float>(l->input_layernorm->eps), static_cast<float>(l->post_attention_layernorm->eps)};
    layers_.push_back(std::move(L));
  }
  embed_ = m.model->embed_tokens->weight;
  auto token_rows = [&](const TrainableTokensImpl* t, TokenRows& out) {
    if (t == nullptr) return;
    out.ids = t->token_indices;
    out.rows = t->trainable_tokens_delta.detach().to(dtype_).contiguous();
  };
  token_rows(m.model->embed_tokens->token_adapter.get(), embed_tokens_);
  token_rows(m.lm_head_token_adapter(), head_tokens_);
  norm_ = m.model->norm->weight;
  norm_eps_ = static_cast<float>(m.model->norm->eps);
  lm_head_ = m.lm_head_weight();
  const int64_t d = cfg_.hidden_size, nq = cfg_.num_attention_heads * cfg_.head_dim;
  const int64_t nqkv = nq + 2 * cfg_.num_key_value_heads * cfg_.head_dim, f = cfg_.intermediate_size;
  const auto opts = at::TensorOptions().dtype(dtype_);
  h_ = at::empty({batch, d}, opts);
  xn_ = at::empty({batch, d}, opts);
  qkv_ = at::empty({batch, nqkv}, opts);
  attn_ = at::empty({batch, nq}, opts);
  act_ = at::empty({batch, f}, opts);
  sums_ = at::empty({batch, std::max({nqkv, 2 * f, d})}, at::kFloat);
}

at::Tensor CpuDecoder::step(const at::Tensor& ids_b, KvCache& cache, const at::Tensor& attention_mask_bk,
                            const at::Tensor& position_ids_b) {
  ALPACA_CHECK(ids_b.numel() == batch_ && ids_b.scalar_type() == at::kLong && ids_b.device().is_cpu(),
               "CpuDecoder::step: ids must be " << batch_ << " int64 values on the CPU, got " << ids_b.sizes() << " "
                                                << ids_b.scalar_type() << " on " << ids_b.device());
  ALPACA_CHECK(position_ids_b.numel() == batch_, "CpuDecoder::step: position_ids must hold " << batch_ << " values, got "
                                                                                              << position_ids_b.sizes());
  ALPACA_CHECK(cache.batch() == batch_, "CpuDecoder::step: the KV cache holds " << cache.batch() << " rows, not "
                                                                                << batch_);
  ALPACA_CHECK(cache.length() < cache.capacity(), "KvCache is full: " << cache.length() << " + 1 positions exceed its capacity "
                                                                      << cache.capacity());
  ALPACA_CHECK(!attention_mask_bk.defined() || (attention_mask_bk.dim() == 2 && attention_mask_bk.size(0) == batch_ &&
                                                attention_mask_bk.size(1) == cache.length() + 1),
               "attention_mask must be (" << batch_ << ", " << cache.length() + 1
                                          << ") = (batch, cached + new positions), got " << attention_mask_bk.sizes());
  ALPACA_CHECK(cache.num_layers() == static_cast<int64_t>(layers_.size()),
               "CpuDecoder::step: the KV cache has " << cache.num_layers() << " layers, the model " << layers_.size());
  // Checked before anything is written, so a refused step leaves the cache as it was.
  for (int64_t li = 0; li < cache.num_layers(); ++li) {
    const at::Tensor& kbuf = cache.key_buffer(li);
    const at::Tensor& vbuf = cache.value_buffer(li);
    ALPACA_CHECK(kbuf.scalar_type() == dtype_ && vbuf.scalar_type() == dtype_ && kbuf.is_cpu() && vbuf.is_cpu() &&
                     kbuf.is_contiguous() && vbuf.is_contiguous() && kbuf.size(1) == cfg_.num_key_value_heads &&
                     kbuf.size(3) == cfg_.head_dim,
                 "CpuDecoder::step: the KV cache must hold contiguous CPU buffers (batch, "
                     << cfg_.num_key_value_heads << ", capacity, " << cfg_.head_dim << ") in " << c10::toString(dtype_)
                     << ", got " << kbuf.sizes() << " " << kbuf.scalar_type() << " on " << kbuf.device());
  }
  at::NoGradGuard no_grad;
  if (dtype_ == at::kFloat) return step_impl<float>(ids_b, cache, attention_mask_bk, position_ids_b);
  return step_impl<BFloat16>(ids_b, cache, attention_mask_bk, position_ids_b);
}

template <typename T>
at::Tensor CpuDecoder::step_impl(const at::Tensor& ids_b, KvCache& cache, const at::Tensor& mask_bk,
                                 const at::Tensor& pos_b) {
  const int b = static_cast<int>(batch_);
  const int64_t d = cfg_.hidden_size, nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const int64_t dh = cfg_.head_dim, nq = nh * dh, nk = nkv * dh, nqkv = nq + 2 * nk, f = cfg_.intermediate_size;
  const int64_t vocab = lm_head_.size(0), n_rep = nh / nkv;
  const int64_t pos = cache.length(), keys = pos + 1, cap = cache.capacity();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));

  // Per-step inputs: cos/sin of each row's position (rope_cos_sin: transformers' bits), the mask.
  const at::Tensor ids = ids_b.reshape({b}).contiguous();
  const auto [cos_t, sin_t] = rope_cos_sin(cfg_, pos_b.reshape({b, 1}).to(at::kLong), dtype_);
  const at::Tensor cos_c = cos_t.contiguous(), sin_c = sin_t.contiguous();  // (b, 1, dh)
  const at::Tensor allow = mask_bk.defined() ? mask_bk.to(at::kCPU).to(at::kBool).contiguous() : at::Tensor();
  if (!scores_.defined() || scores_.size(1) < cap) scores_ = at::empty({b * nh, cap}, at::kFloat);

  T* h = h_.mutable_data_ptr<T>();
  T* xn = xn_.mutable_data_ptr<T>();
  T* qkv = qkv_.mutable_data_ptr<T>();
  T* att = attn_.mutable_data_ptr<T>();
  T* act = act_.mutable_data_ptr<T>();
  float* sums = sums_.mutable_data_ptr<float>();
  float* scores = scores_.mutable_data_ptr<float>();
  const int64_t lds = sums_.size(1);
  const T* cosp = cos_c.const_data_ptr<T>();
  const T* sinp = sin_c.const_data_ptr<T>();
  const bool* allowp = allow.defined() ? allow.const_data_ptr<bool>() : nullptr;

  const int64_t* idp = ids.const_data_ptr<int64_t>();
  const T* emb = embed_.const_data_ptr<T>();
  for (int i = 0; i < b; ++i) {
    ALPACA_CHECK(idp[i] >= 0 && idp[i] < embed_.size(0),
                 "token id " << idp[i] << " is outside the model's vocabulary [0, " << embed_.size(0) << ")");
    // peft's TrainableTokensLayer: a trainable token's row is its delta (cast to the dtype).
    const T* row = emb + idp[i] * d;
    for (size_t k = 0; k < embed_tokens_.ids.size(); ++k)
      if (embed_tokens_.ids[k] == idp[i]) row = embed_tokens_.rows.const_data_ptr<T>() + static_cast<int64_t>(k) * d;
    std::copy_n(row, d, h + i * d);
  }

  // The LoRA branches of the projections in flight (q, k, v at once; then one or two at a time).
  std::vector<LoraBranch<T>> lora(3);
  // Output j of a projection for row i from its fp32 sum: + bias, rounded once (a GEMM's
  // epilogue), then + its LoRA branch (peft: y + B(A(x)) * scaling).
  auto out_value = [](float sum, const T* bias, int64_t j, const LoraBranch<T>& br, int i) {
    float v = round_to<T>(sum + (bias != nullptr ? static_cast<float>(bias[j]) : 0.0F));
    return br.active() ? br.add(i, j, v) : v;
  };
  // h += p(x) (o_proj, down_proj): the product and the residual add, rows split across threads.
  auto add_product = [&](const T* x, int64_t k, const Proj& p) {
    const Seg<T> seg[1] = {{ptr<T>(p.w), d, 0}};
    const T* bias = ptr<T>(p.b);
    lora[0].start(x, b, k, p.lora_a, p.lora_b, p.scaling);
    stacked_products(x, b, k, seg, sums, lds, [&](int64_t r0, int64_t r1) {
      for (int i = 0; i < b; ++i)
        for (int64_t j = r0; j < r1; ++j)
          h[i * d + j] = static_cast<T>(static_cast<float>(h[i * d + j]) + out_value(sums[i * lds + j], bias, j, lora[0], i));
    });
  };
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& L = layers_[li];
    T* kc = cache.key_buffer(static_cast<int64_t>(li)).mutable_data_ptr<T>();
    T* vc = cache.value_buffer(static_cast<int64_t>(li)).mutable_data_ptr<T>();

    // --- attention block ---
    for (int i = 0; i < b; ++i) rms_norm(h + i * d, ptr<T>(L.ln1), L.eps1, d, xn + i * d);
    const Seg<T> qkv_segs[3] = {{ptr<T>(L.q.w), nq, 0}, {ptr<T>(L.k.w), nk, nq}, {ptr<T>(L.v.w), nk, nq + nk}};
    const T* bias_qkv[3] = {ptr<T>(L.q.b), ptr<T>(L.k.b), ptr<T>(L.v.b)};
    const Proj* qkv_proj[3] = {&L.q, &L.k, &L.v};
    for (int s = 0; s < 3; ++s)
      lora[s].start(xn, b, d, qkv_proj[s]->lora_a, qkv_proj[s]->lora_b, qkv_proj[s]->scaling);
    stacked_products(xn, b, d, qkv_segs, sums, lds, [&](int64_t r0, int64_t r1) {
      for (int s = 0; s < 3; ++s) {
        const int64_t off = qkv_segs[s].off, lo = std::max(r0, off), hi = std::min(r1, off + qkv_segs[s].n);
        for (int i = 0; i < b; ++i)
          for (int64_t j = lo; j < hi; ++j) {
            qkv[i * nqkv + j] = static_cast<T>(out_value(sums[i * lds + j], bias_qkv[s], j - off, lora[s], i));
          }
      }
    });
    for (int i = 0; i < b; ++i) {
      T* row = qkv + i * nqkv;
      for (int64_t hh = 0; hh < nh; ++hh) rope_head(row + hh * dh, cosp + i * dh, sinp + i * dh, dh);
      for (int64_t hh = 0; hh < nkv; ++hh) {
        rope_head(row + nq + hh * dh, cosp + i * dh, sinp + i * dh, dh);
        std::copy_n(row + nq + hh * dh, dh, kc + ((i * nkv + hh) * cap + pos) * dh);
        std::copy_n(row + nq + nk + hh * dh, dh, vc + ((i * nkv + hh) * cap + pos) * dh);
      }
    }
    at::parallel_for(0, b * nh, 1, [&](int64_t p0, int64_t p1) {
      float qf[kMaxHeadDim], out[kMaxHeadDim];
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t i = p / nh, hh = p % nh, kvh = hh / n_rep;
        const T* q = qkv + i * nqkv + hh * dh;
        for (int64_t c = 0; c < dh; ++c) qf[c] = static_cast<float>(q[c]);
        const T* kr = kc + (i * nkv + kvh) * cap * dh;
        const T* vr = vc + (i * nkv + kvh) * cap * dh;
        float* sc = scores + p * cap;
        const bool* ok = allowp != nullptr ? allowp + i * keys : nullptr;
        bool any = false;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          if (ok != nullptr && !ok[j]) continue;
          any = true;
          sc[j] = dot(qf, kr + j * dh, dh) * scale;
          mx = std::max(mx, sc[j]);
        }
        // A query with no key to attend to sees itself (make_cached_context's rule).
        if (!any) {
          sc[pos] = dot(qf, kr + pos * dh, dh) * scale;
          mx = sc[pos];
        }
        std::fill_n(out, dh, 0.0F);
        float total = 0;
        for (int64_t j = 0; j < keys; ++j) {
          if (any ? (ok != nullptr && !ok[j]) : j != pos) continue;
          const float e = std::exp(sc[j] - mx);
          total += e;
          axpy(e, vr + j * dh, out, dh);
        }
        T* o = att + i * nq + hh * dh;
        for (int64_t c = 0; c < dh; ++c) o[c] = static_cast<T>(out[c] / total);
      }
    });
    add_product(att, nq, L.o);

    // --- MLP block: down(silu(gate(x)) * up(x)) ---
    for (int i = 0; i < b; ++i) rms_norm(h + i * d, ptr<T>(L.ln2), L.eps2, d, xn + i * d);
    const T* wg = ptr<T>(L.gate.w);
    const T* wu = ptr<T>(L.up.w);
    const T* bg = ptr<T>(L.gate.b);
    const T* bu = ptr<T>(L.up.b);
    lora[0].start(xn, b, d, L.gate.lora_a, L.gate.lora_b, L.gate.scaling);
    lora[1].start(xn, b, d, L.up.lora_a, L.up.lora_b, L.up.scaling);
    at::parallel_for(0, f, kRowGrain, [&](int64_t r0, int64_t r1) {
      rows(xn, d, b, wg, d, r0, r1, sums, lds);
      rows(xn, d, b, wu, d, r0, r1, sums + f, lds);
      for (int i = 0; i < b; ++i)
        for (int64_t j = r0; j < r1; ++j) {
          const float g = out_value(sums[i * lds + j], bg, j, lora[0], i);
          const float u = out_value(sums[i * lds + f + j], bu, j, lora[1], i);
          const float s = round_to<T>(g / (1.0F + std::exp(-g)));
          act[i * f + j] = static_cast<T>(s * u);
        }
    });
    add_product(act, f, L.down);
  }
  cache.advance(1);

  for (int i = 0; i < b; ++i) rms_norm(h + i * d, norm_.const_data_ptr<T>(), norm_eps_, d, xn + i * d);
  at::Tensor logits = at::empty({b, vocab}, at::kFloat);
  float* lp = logits.mutable_data_ptr<float>();
  const Seg<T> head_seg[1] = {{lm_head_.const_data_ptr<T>(), vocab, 0}};
  stacked_products(xn, b, d, head_seg, lp, vocab, [&](int64_t r0, int64_t r1) {
    for (int i = 0; i < b; ++i)
      for (int64_t j = r0; j < r1; ++j) lp[i * vocab + j] = round_to<T>(lp[i * vocab + j]);
  });
  // Trainable-token rows of the head (W.index_copy(0, indices, delta) in the module path).
  if (!head_tokens_.ids.empty()) {
    std::vector<float> xf(static_cast<size_t>(d));
    for (int i = 0; i < b; ++i) {
      for (int64_t c = 0; c < d; ++c) xf[c] = static_cast<float>(xn[i * d + c]);
      for (size_t k = 0; k < head_tokens_.ids.size(); ++k)
        lp[i * vocab + head_tokens_.ids[k]] =
            round_to<T>(dot(xf.data(), head_tokens_.rows.const_data_ptr<T>() + static_cast<int64_t>(k) * d, d));
    }
  }
  return logits;
}

}  // namespace alpaca::model
