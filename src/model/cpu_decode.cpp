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

#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/error.h"
#include "cpu_kernels.h"

namespace alpaca::model {
namespace {

using c10::BFloat16;
using decode::kMaxHeadDim;
using decode::round_to;
constexpr int64_t kRowGrain = 32;  // weight rows per thread at least

// Sums of m rows of x against rows [n0, n1) of w, fp32 out.
inline void rows(const float* x, int64_t ldx, int m, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  gemv::f32_rows(x, ldx, m, w, k, n0, n1, y, ldy);
}
inline void rows(const BFloat16* x, int64_t ldx, int m, const BFloat16* w, int64_t k, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  gemv::bf16_rows(x, ldx, m, w, k, n0, n1, y, ldy);
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
    const float delta = round_to<T>(round_to<T>(decode::dot(ax.data() + i * r, b + j * r, r)) * scaling);
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
      if (L->lora_magnitude.defined()) return "a DoRA adapter (merge it for the fused step: alpaca-train merge)";
      if (L->lora_dropout > 0 && L->is_training()) return "LoRA dropout in training mode (call eval())";
    }
  if (m.lm_head && m.lm_head->lora_A) return "a LoRA branch on lm_head";
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

// One step in compute dtype T, in named stages over the decoder's scratch: embed, per layer the
// attention block (norm, q/k/v, RoPE and the cache append, the heads, o) and the MLP block (norm,
// gate/up with SiLU, down), then the final norm and the head.
template <typename T>
class CpuDecoder::Run {
 public:
  Run(CpuDecoder& dec, KvCache& cache, const at::Tensor& mask_bk, const at::Tensor& pos_b)
      : dec_(dec), cache_(cache), b_(static_cast<int>(dec.batch_)) {
    const LlamaConfig& c = dec.cfg_;
    d_ = c.hidden_size, nh_ = c.num_attention_heads, nkv_ = c.num_key_value_heads, dh_ = c.head_dim;
    nq_ = nh_ * dh_, nk_ = nkv_ * dh_, nqkv_ = nq_ + 2 * nk_, f_ = c.intermediate_size;
    pos_ = cache.length(), cap_ = cache.capacity();
    // Per-step inputs: cos/sin of each row's position (rope_cos_sin: transformers' bits), the mask.
    const auto [cos_t, sin_t] = rope_cos_sin(c, pos_b.reshape({b_, 1}).to(at::kLong), dec.dtype_);
    cos_ = cos_t.contiguous(), sin_ = sin_t.contiguous();  // (b, 1, dh)
    allow_ = mask_bk.defined() ? mask_bk.to(at::kCPU).to(at::kBool).contiguous() : at::Tensor();
    if (!dec.scores_.defined() || dec.scores_.size(1) < cap_) dec.scores_ = at::empty({b_ * nh_, cap_}, at::kFloat);
    h_ = dec.h_.mutable_data_ptr<T>();
    xn_ = dec.xn_.mutable_data_ptr<T>();
    qkv_ = dec.qkv_.mutable_data_ptr<T>();
    sums_ = dec.sums_.mutable_data_ptr<float>();
    lds_ = dec.sums_.size(1);
  }

  at::Tensor step(const at::Tensor& ids_b) {
    embed(ids_b.reshape({b_}).contiguous());
    for (size_t li = 0; li < dec_.layers_.size(); ++li) {
      const Layer& L = dec_.layers_[li];
      T* kc = cache_.key_buffer(static_cast<int64_t>(li)).mutable_data_ptr<T>();
      T* vc = cache_.value_buffer(static_cast<int64_t>(li)).mutable_data_ptr<T>();
      norm_rows(L.ln1, L.eps1);
      project_qkv(L);
      rope_and_append(kc, vc);
      attend_heads(kc, vc);
      add_product(dec_.attn_.template const_data_ptr<T>(), nq_, L.o);
      norm_rows(L.ln2, L.eps2);
      gate_up(L);
      add_product(dec_.act_.template const_data_ptr<T>(), f_, L.down);
    }
    cache_.advance(1);
    norm_rows(dec_.norm_, dec_.norm_eps_);
    return head();
  }

 private:
  // h = the rows of the embedding; peft's TrainableTokensLayer: a trainable token's row is its
  // delta (cast to the dtype).
  void embed(const at::Tensor& ids) {
    const int64_t* idp = ids.const_data_ptr<int64_t>();
    const T* emb = dec_.embed_.template const_data_ptr<T>();
    const TokenRows& tok = dec_.embed_tokens_;
    for (int i = 0; i < b_; ++i) {
      ALPACA_CHECK(idp[i] >= 0 && idp[i] < dec_.embed_.size(0),
                   "token id " << idp[i] << " is outside the model's vocabulary [0, " << dec_.embed_.size(0) << ")");
      const T* row = emb + idp[i] * d_;
      for (size_t k = 0; k < tok.ids.size(); ++k)
        if (tok.ids[k] == idp[i]) row = tok.rows.template const_data_ptr<T>() + static_cast<int64_t>(k) * d_;
      std::copy_n(row, d_, h_ + i * d_);
    }
  }

  // xn = RMSNorm(h) row by row.
  void norm_rows(const at::Tensor& w, float eps) {
    for (int i = 0; i < b_; ++i) decode::rms_norm(h_ + i * d_, ptr<T>(w), eps, d_, xn_ + i * d_);
  }

  // Output j of a projection for row i from its fp32 sum: + bias, rounded once (a GEMM's
  // epilogue), then + its LoRA branch (peft: y + B(A(x)) * scaling).
  static float out_value(float sum, const T* bias, int64_t j, const LoraBranch<T>& br, int i) {
    float v = round_to<T>(sum + (bias != nullptr ? static_cast<float>(bias[j]) : 0.0F));
    return br.active() ? br.add(i, j, v) : v;
  }

  void start_lora(int slot, const T* x, int64_t k, const Proj& p) {
    lora_[slot].start(x, b_, k, p.lora_a, p.lora_b, p.scaling);
  }

  // qkv = [q(xn), k(xn), v(xn)], the three products stacked in one parallel region.
  void project_qkv(const Layer& L) {
    const Seg<T> segs[3] = {{ptr<T>(L.q.w), nq_, 0}, {ptr<T>(L.k.w), nk_, nq_}, {ptr<T>(L.v.w), nk_, nq_ + nk_}};
    const T* bias[3] = {ptr<T>(L.q.b), ptr<T>(L.k.b), ptr<T>(L.v.b)};
    const Proj* proj[3] = {&L.q, &L.k, &L.v};
    for (int s = 0; s < 3; ++s) start_lora(s, xn_, d_, *proj[s]);
    stacked_products(xn_, b_, d_, segs, sums_, lds_, [&](int64_t r0, int64_t r1) {
      for (int s = 0; s < 3; ++s) {
        const int64_t off = segs[s].off, lo = std::max(r0, off), hi = std::min(r1, off + segs[s].n);
        for (int i = 0; i < b_; ++i)
          for (int64_t j = lo; j < hi; ++j)
            qkv_[i * nqkv_ + j] = static_cast<T>(out_value(sums_[i * lds_ + j], bias[s], j - off, lora_[s], i));
      }
    });
  }

  // RoPE on every q and k head; k and v appended to the layer's cache at position pos.
  void rope_and_append(T* kc, T* vc) {
    const T* cosp = cos_.template const_data_ptr<T>();
    const T* sinp = sin_.template const_data_ptr<T>();
    for (int i = 0; i < b_; ++i) {
      T* row = qkv_ + i * nqkv_;
      for (int64_t hh = 0; hh < nh_; ++hh) decode::rope_head(row + hh * dh_, cosp + i * dh_, sinp + i * dh_, dh_);
      for (int64_t hh = 0; hh < nkv_; ++hh) {
        decode::rope_head(row + nq_ + hh * dh_, cosp + i * dh_, sinp + i * dh_, dh_);
        std::copy_n(row + nq_ + hh * dh_, dh_, kc + ((i * nkv_ + hh) * cap_ + pos_) * dh_);
        std::copy_n(row + nq_ + nk_ + hh * dh_, dh_, vc + ((i * nkv_ + hh) * cap_ + pos_) * dh_);
      }
    }
  }

  // attn = each query head over its KV head's cached keys (GQA), heads split across threads.
  void attend_heads(const T* kc, const T* vc) {
    const int64_t keys = pos_ + 1, n_rep = nh_ / nkv_;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh_)));
    const bool* allowp = allow_.defined() ? allow_.const_data_ptr<bool>() : nullptr;
    float* scores = dec_.scores_.mutable_data_ptr<float>();
    T* att = dec_.attn_.template mutable_data_ptr<T>();
    at::parallel_for(0, b_ * nh_, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t i = p / nh_, hh = p % nh_, kvh = hh / n_rep;
        const int64_t kv_off = (i * nkv_ + kvh) * cap_ * dh_;
        decode::attend(qkv_ + i * nqkv_ + hh * dh_, kc + kv_off, vc + kv_off, keys,
                       allowp != nullptr ? allowp + i * keys : nullptr, pos_, dh_, scale, scores + p * cap_,
                       att + i * nq_ + hh * dh_);
      }
    });
  }

  // act = silu(gate(xn)) * up(xn), the two products in one parallel region.
  void gate_up(const Layer& L) {
    const T* wg = ptr<T>(L.gate.w);
    const T* wu = ptr<T>(L.up.w);
    const T* bg = ptr<T>(L.gate.b);
    const T* bu = ptr<T>(L.up.b);
    T* act = dec_.act_.template mutable_data_ptr<T>();
    start_lora(0, xn_, d_, L.gate);
    start_lora(1, xn_, d_, L.up);
    at::parallel_for(0, f_, kRowGrain, [&](int64_t r0, int64_t r1) {
      rows(xn_, d_, b_, wg, d_, r0, r1, sums_, lds_);
      rows(xn_, d_, b_, wu, d_, r0, r1, sums_ + f_, lds_);
      for (int i = 0; i < b_; ++i)
        for (int64_t j = r0; j < r1; ++j) {
          const float g = out_value(sums_[i * lds_ + j], bg, j, lora_[0], i);
          const float u = out_value(sums_[i * lds_ + f_ + j], bu, j, lora_[1], i);
          act[i * f_ + j] = static_cast<T>(decode::silu_mul<T>(g, u));
        }
    });
  }

  // h += p(x) (o_proj, down_proj): the product and the residual add, rows split across threads.
  void add_product(const T* x, int64_t k, const Proj& p) {
    const Seg<T> seg[1] = {{ptr<T>(p.w), d_, 0}};
    const T* bias = ptr<T>(p.b);
    start_lora(0, x, k, p);
    stacked_products(x, b_, k, seg, sums_, lds_, [&](int64_t r0, int64_t r1) {
      for (int i = 0; i < b_; ++i)
        for (int64_t j = r0; j < r1; ++j)
          h_[i * d_ + j] =
              static_cast<T>(static_cast<float>(h_[i * d_ + j]) + out_value(sums_[i * lds_ + j], bias, j, lora_[0], i));
    });
  }

  // The logits of xn (fp32, rounded to T as the head's output is).
  at::Tensor head() {
    const int64_t vocab = dec_.lm_head_.size(0);
    at::Tensor logits = at::empty({b_, vocab}, at::kFloat);
    float* lp = logits.mutable_data_ptr<float>();
    const Seg<T> head_seg[1] = {{dec_.lm_head_.template const_data_ptr<T>(), vocab, 0}};
    stacked_products(xn_, b_, d_, head_seg, lp, vocab, [&](int64_t r0, int64_t r1) {
      for (int i = 0; i < b_; ++i)
        for (int64_t j = r0; j < r1; ++j) lp[i * vocab + j] = round_to<T>(lp[i * vocab + j]);
    });
    head_token_rows(lp, vocab);
    return logits;
  }

  // Trainable-token rows of the head (W.index_copy(0, indices, delta) in the module path).
  void head_token_rows(float* lp, int64_t vocab) {
    const TokenRows& tok = dec_.head_tokens_;
    if (tok.ids.empty()) return;
    std::vector<float> xf(static_cast<size_t>(d_));
    for (int i = 0; i < b_; ++i) {
      for (int64_t c = 0; c < d_; ++c) xf[c] = static_cast<float>(xn_[i * d_ + c]);
      for (size_t k = 0; k < tok.ids.size(); ++k)
        lp[i * vocab + tok.ids[k]] =
            round_to<T>(decode::dot(xf.data(), tok.rows.template const_data_ptr<T>() + static_cast<int64_t>(k) * d_, d_));
    }
  }

  CpuDecoder& dec_;
  KvCache& cache_;
  const int b_;
  int64_t d_, nh_, nkv_, dh_, nq_, nk_, nqkv_, f_, pos_, cap_, lds_;
  at::Tensor cos_, sin_, allow_;
  T *h_, *xn_, *qkv_;
  float* sums_;
  // The LoRA branches of the projections in flight (q, k, v at once; then one or two at a time).
  std::vector<LoraBranch<T>> lora_ = std::vector<LoraBranch<T>>(3);
};

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
  if (dtype_ == at::kFloat) return Run<float>(*this, cache, attention_mask_bk, position_ids_b).step(ids_b);
  return Run<BFloat16>(*this, cache, attention_mask_bk, position_ids_b).step(ids_b);
}

}  // namespace alpaca::model
