// LLaMA blocks, op for op as transformers' modeling_llama.py (sdpa attention path).
#include "alpaca/model/layers.h"

#include <ATen/core/grad_mode.h>  // defines: at::GradMode

#include <cmath>
#include <tuple>

#include "alpaca/model/fused_ops.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/model/matmul.h"
#include "alpaca/model/rope.h"
#include "alpaca/util/error.h"
#include "alpaca/util/trace.h"

namespace alpaca::model {
namespace {
// The fused bf16 CPU kernels serve training (autograd on); inference keeps the module path that the
// decode step and the generation tests were checked against.
bool fused_training(const at::Tensor& x) { return training_forward() && fused_cpu_bf16_applies(x); }

at::Tensor make_param(at::IntArrayRef sizes, const at::TensorOptions& options, ParamInit init, double fill) {
  if (init == ParamInit::kUninitialized) return at::empty(sizes, options);
  return at::full(sizes, fill, options);
}
}  // namespace

TrainableTokensImpl::TrainableTokensImpl(std::vector<int64_t> indices, int64_t dim) : token_indices(std::move(indices)) {
  trainable_tokens_delta = register_parameter(
      "trainable_tokens_delta", at::zeros({static_cast<int64_t>(token_indices.size()), dim}, at::kFloat));
}

at::Tensor TrainableTokensImpl::index(const at::Device& device) const {
  return at::tensor(token_indices, at::kLong).to(device);
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias,
                       const at::TensorOptions& options, ParamInit init) {
  weight = register_parameter("weight", make_param({out_features, in_features}, options, init, 0.0));
  if (with_bias) bias = register_parameter("bias", make_param({out_features}, options, init, 0.0));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) const {
  at::Tensor y = model::linear(x, weight, bias);
  if (!lora_A) return y;
  if (lora_magnitude.defined()) return dora_forward(x, y);
  // peft lora.Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, in this order.
  const at::Tensor h = lora_dropout > 0 ? at::dropout(x, lora_dropout, is_training()) : x;
  return y + lora_B->forward(lora_A->forward(h)) * lora_scaling;
}

at::Tensor dora_weight_norm(const at::Tensor& weight, const at::Tensor& lora_weight, double scaling) {
  // peft's get_weight_norm: torch.linalg.norm(W + scaling * lora_weight, dim=1).to(W.dtype).
  const at::Tensor w = lora_weight.defined() ? weight + lora_weight * scaling : weight;
  return at::linalg_vector_norm(w, 2, at::IntArrayRef{1}).to(weight.scalar_type());
}

// peft's DoraLinearVariant.forward + DoraLinearLayer.forward, op for op.
at::Tensor LinearImpl::dora_forward(const at::Tensor& x, const at::Tensor& result) const {
  const at::Tensor w = weight.to(x.scalar_type());  // frozen: no gradient through it
  at::Tensor weight_norm;
  {
    at::NoGradGuard no_grad;  // the norm is a constant to autograd
    // peft: lora_B(lora_A(eye(in))).T in the adapter's dtype, then cast to x's.
    const at::Tensor lora_weight = at::matmul(lora_B->weight, lora_A->weight).to(x.scalar_type());
    weight_norm = dora_weight_norm(w, lora_weight, lora_scaling);
  }
  const at::Tensor mag_norm_scale = (lora_magnitude / weight_norm).view({1, -1});
  at::Tensor h = x, base;
  if (lora_dropout > 0 && is_training()) {
    h = at::dropout(x, lora_dropout, /*train=*/true);
    base = model::linear(h, w, at::Tensor());
  } else {
    base = bias.defined() ? result - bias : result;
  }
  const at::Tensor lora_result = lora_B->forward(lora_A->forward(h));
  return result + ((mag_norm_scale - 1) * base + mag_norm_scale * lora_result * lora_scaling);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options,
                             ParamInit init) {
  weight = register_parameter("weight", make_param({num_embeddings, dim}, options, init, 0.0));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) const {
  ALPACA_TRACE("cat:embedding");
  at::Tensor out = at::embedding(weight, ids, padding_idx);
  if (!token_adapter) return out;
  // The lookup of W.index_copy(0, indices, delta) without copying the table: positions whose id
  // is a trainable token take that token's delta row (so the gradient reaches only the delta).
  const at::Tensor idx = token_adapter->index(ids.device());
  const at::Tensor hit = ids.unsqueeze(-1).eq(idx);  // (..., k)
  const at::Tensor any = hit.any(-1, /*keepdim=*/true);
  const at::Tensor rows = at::embedding(token_adapter->trainable_tokens_delta.to(out.scalar_type()), hit.to(at::kLong).argmax(-1));
  return at::where(any, rows, out);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_in, const at::TensorOptions& options, ParamInit init)
    : eps(eps_in) {
  weight = register_parameter("weight", make_param({dim}, options, init, 1.0));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  ALPACA_TRACE("cat:rmsnorm");
  if (fused_training(x) && weight.scalar_type() == at::kBFloat16) return rms_norm_bf16(x, weight, eps);
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& cfg, const at::TensorOptions& options, ParamInit init)
    : num_heads_(cfg.num_attention_heads), num_kv_heads_(cfg.num_key_value_heads), head_dim_(cfg.head_dim) {
  const int64_t d = cfg.hidden_size;
  q_proj = register_module("q_proj", Linear(d, num_heads_ * head_dim_, cfg.attention_bias, options, init));
  k_proj = register_module("k_proj", Linear(d, num_kv_heads_ * head_dim_, cfg.attention_bias, options, init));
  v_proj = register_module("v_proj", Linear(d, num_kv_heads_ * head_dim_, cfg.attention_bias, options, init));
  o_proj = register_module("o_proj", Linear(num_heads_ * head_dim_, d, cfg.o_proj_bias, options, init));
}


at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x_btd, const LayerContext& ctx) const {
  const int64_t b = x_btd.size(0), t = x_btd.size(1);
  at::Tensor q_bthd = q_proj->forward(x_btd).view({b, t, -1, head_dim_});
  at::Tensor k_bthd = k_proj->forward(x_btd).view({b, t, -1, head_dim_});
  at::Tensor v_bhtd = v_proj->forward(x_btd).view({b, t, -1, head_dim_}).transpose(1, 2);
  at::Tensor q_bhtd, k_bhtd;
  {
    ALPACA_TRACE("cat:rope");
    if (fused_training(q_bthd) && ctx.cos.scalar_type() == at::kBFloat16) {
      q_bhtd = rope_bf16(q_bthd, ctx.cos, ctx.sin).transpose(1, 2);
      k_bhtd = rope_bf16(k_bthd, ctx.cos, ctx.sin).transpose(1, 2);
    } else {
      q_bhtd = apply_rope(q_bthd.transpose(1, 2), ctx.cos, ctx.sin);
      k_bhtd = apply_rope(k_bthd.transpose(1, 2), ctx.cos, ctx.sin);
    }
  }
  if (ctx.kv_cache != nullptr) std::tie(k_bhtd, v_bhtd) = ctx.kv_cache->update(ctx.layer_idx, k_bhtd, v_bhtd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  const int64_t n_rep = num_heads_ / num_kv_heads_;
  at::Tensor out_bhtd, out_btd;
  ALPACA_TRACE("cat:attention");
  if (fused_training(q_bhtd) && gemm_attention_applies(q_bhtd) && ctx.kv_cache == nullptr && k_bhtd.size(2) == t &&
      mask_within_causal(ctx.attn_mask)) {
    // bf16 CPU training: causal (and padding / packing) attention through GEMMs, GQA included. A mask
    // that lets a query see a later key (none of make_context's do) keeps SDPA below.
    out_bhtd = causal_attention_bf16(q_bhtd, k_bhtd, v_bhtd, scale, ctx.attn_mask);
  } else if ((q_bhtd.scalar_type() == at::kFloat || bf16_attention_via_fp32(q_bhtd)) && training_forward() &&
             gemm_attention_fp32_applies(q_bhtd) && ctx.kv_cache == nullptr && k_bhtd.size(2) == t &&
             mask_within_causal(ctx.attn_mask)) {
    // fp32 CPU training, and bf16 on a CPU without native bf16 products: the same through fp32 GEMMs.
    out_bhtd = causal_attention_fp32(q_bhtd, k_bhtd, v_bhtd, scale, ctx.attn_mask);
  } else if (bf16_attention_via_fp32(q_bhtd) && ctx.kv_cache == nullptr && (ctx.attn_mask.defined() || t > 1)) {
    // bf16 on a CPU without native bf16 products: ATen's flash kernel in fp32 (matmul.h).
    out_bhtd = attention_via_fp32(q_bhtd, k_bhtd, v_bhtd, ctx.attn_mask, /*is_causal=*/!ctx.attn_mask.defined(), scale);
  } else if (!ctx.attn_mask.defined()) {
    // Pure causal: the fused path handles GQA itself (what transformers does without a mask).
    // With a cache, make_cached_context gives a mask whenever T > 1 follows cached positions, so
    // no mask here means every query may see every key (one decode step) or plain causal.
    ALPACA_CHECK(t == 1 || k_bhtd.size(2) == t, "attention over " << k_bhtd.size(2) << " keys for " << t
                                                                   << " queries needs a mask");
    out_bhtd = at::scaled_dot_product_attention(q_bhtd, k_bhtd, v_bhtd, std::nullopt, 0.0,
                                                /*is_causal=*/t > 1, scale, /*enable_gqa=*/n_rep > 1);
  } else {
    out_bhtd = at::scaled_dot_product_attention(q_bhtd, repeat_kv(k_bhtd, n_rep), repeat_kv(v_bhtd, n_rep),
                                                ctx.attn_mask, 0.0, /*is_causal=*/false, scale);
  }
  out_btd = out_bhtd.transpose(1, 2).reshape({b, t, -1});
  return o_proj->forward(out_btd);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& cfg, const at::TensorOptions& options, ParamInit init) {
  const int64_t d = cfg.hidden_size, f = cfg.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(d, f, cfg.mlp_bias, options, init));
  up_proj = register_module("up_proj", Linear(d, f, cfg.mlp_bias, options, init));
  down_proj = register_module("down_proj", Linear(f, d, cfg.mlp_bias, options, init));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x_btd) const {
  const at::Tensor gate = gate_proj->forward(x_btd), up = up_proj->forward(x_btd);
  at::Tensor act;
  {
    ALPACA_TRACE("cat:silu_mul");
    act = fused_training(gate) ? silu_mul_bf16(gate, up) : at::silu(gate) * up;
  }
  return down_proj->forward(act);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& cfg, const at::TensorOptions& options,
                                             ParamInit init) {
  self_attn = register_module("self_attn", LlamaAttention(cfg, options, init));
  mlp = register_module("mlp", LlamaMLP(cfg, options, init));
  input_layernorm = register_module("input_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options, init));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options, init));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& hidden_btd, const LayerContext& ctx) {
  const at::Tensor attn = self_attn->forward(input_layernorm->forward(hidden_btd), ctx);
  at::Tensor h;
  {
    ALPACA_TRACE("cat:residual");
    h = hidden_btd + attn;
  }
  const at::Tensor mlp_out = mlp->forward(post_attention_layernorm->forward(h));
  ALPACA_TRACE("cat:residual");
  return h + mlp_out;
}

}  // namespace alpaca::model
