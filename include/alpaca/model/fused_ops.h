// Fused bf16 CPU kernels for the elementwise blocks of a LLaMA layer in training: RMSNorm, RoPE and
// SiLU(gate) * up, each one pass forward and one backward (src/model/fused_ops.cpp) in place of the
// 4-10 ATen ops, temporaries and autograd nodes of the module path, with the same math:
// - rope_bf16 and silu_mul_bf16 round to bf16 where the module path's bf16 ops round (after every
//   product and sum), so RoPE is bit-identical forward and backward, and SiLU*mul differs from
//   ATen's only where its exp (Sleef) and ours differ in the last fp32 bit before the rounding;
// - rms_norm_bf16 normalises in fp32 and rounds once before the weight, as transformers; its sums
//   run in another order than ATen's mean, so the rare value on a rounding boundary differs by one
//   bf16 ulp. Backward saves x (bf16) and one fp32 scale per row, not the fp32 copies the module path
//   keeps, so a bf16 layer's saved activations shrink (docs/memory.md).
// Only bf16 CPU tensors take them (fp32 keeps the module path, bit for bit; fp32 training attention
// has its own GEMM route below, within fp32 rounding of SDPA); the row loops are
// compiled for AVX-512 (F+BW), AVX2 and baseline x86-64 from one source, chosen at run time.
// ALPACA_CPU_FUSED=0 (or set_fused_cpu_bf16(false)) turns them off: the module path everywhere,
// for comparisons; ALPACA_CPU_ATTN=0 turns off only the attention routes (below, bf16 and fp32, and matmul.h's).
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::model {

// The instruction set the row loops run with: the best this CPU has, unless set (tests run every
// variant this CPU can and compare them bit for bit). Ordered: a CPU that runs one runs those below.
enum class FusedCpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
FusedCpuIsa best_fused_cpu_isa();
FusedCpuIsa fused_cpu_isa();
void set_fused_cpu_isa(FusedCpuIsa isa);

// Whether a forward takes the training routes (the fused kernels below, the GEMM attention routes):
// where autograd records (GradMode), and inside a TrainingForwardScope: an activation-checkpointed
// layer's first forward runs without grad and must compute what its recompute in backward computes
// (the FSDP engine's checkpoint opens one), else its output came from SDPA and the module path while
// its gradients came from these.
bool training_forward();
class TrainingForwardScope {
 public:
  TrainingForwardScope();
  ~TrainingForwardScope();
  TrainingForwardScope(const TrainingForwardScope&) = delete;
  TrainingForwardScope& operator=(const TrainingForwardScope&) = delete;

 private:
  bool prev_;
};

// Whether `x` takes the fused kernels: bf16, on the CPU, and not turned off.
bool fused_cpu_bf16_applies(const at::Tensor& x);
// Whether the fused CPU paths are on (ALPACA_CPU_FUSED, set_fused_cpu_bf16), whatever the dtype.
bool fused_cpu_enabled();
void set_fused_cpu_bf16(bool on);

// RMSNorm of x (..., D) with weight (D), both bf16: w * bf16(x * rsqrt(mean(x^2) + eps)).
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps);

// RoPE of x (B, T, H, Dh) (any strides; the projections' output viewed per head) with cos/sin
// (B, T, Dh) bf16: x * cos + rotate_half(x) * sin, returned contiguous (B, T, H, Dh).
at::Tensor rope_bf16(const at::Tensor& x_bthd, const at::Tensor& cos_btd, const at::Tensor& sin_btd);

// SiLU(gate) * up, both (..., F) bf16 of one shape.
at::Tensor silu_mul_bf16(const at::Tensor& gate, const at::Tensor& up);

// dst += src for a contiguous CPU fp32 dst and a bf16 src of as many elements, in one pass: the same
// bits as dst.add_(src), without the full-size fp32 copy of src that ATen's add_ makes first on the CPU
// (the FSDP engine's gradient accumulation, fsdp::add_gradient).
void add_bf16_into_fp32(at::Tensor& dst, const at::Tensor& src);

// The folds of a reduce-scatter ring over bf16 blocks (dist's MPI backend), on raw rows of n values,
// serial (the caller is a communication thread), the row loops above: a's upcast plus b, in fp32 as
// ATen's copy_ then add_ (the same bits), into fp32 d; sum_round also divides by `div` (1: a sum, no
// division) and rounds to bf16 as finish_avg's div_ and copy_ do. sum_round's d may be a (in place); nothing else
// overlaps.
namespace ring_fold {
void sum(float* d, const at::BFloat16* a, const at::BFloat16* b, int64_t n);
void sum(float* d, const at::BFloat16* a, const float* b, int64_t n);
void sum_round(at::BFloat16* d, const at::BFloat16* a, const at::BFloat16* b, float div, int64_t n);
void sum_round(at::BFloat16* d, const at::BFloat16* a, const float* b, float div, int64_t n);
}  // namespace ring_fold

// Causal attention through GEMMs (src/model/attention_cpu.cpp), in place of ATen's flash-attention
// CPU kernel for bf16 training. Per (batch, head) and block of kAttnBlock query rows, skipping the
// key blocks wholly above the diagonal: S = Q K^T (bf16 GEMM, fp32 sums: our AVX512-BF16 kernel, or
// oneDNN's brgemm (AMX tiles), or ATen's cpublas GEMM; src/model/bf16_gemm.h), a masked softmax in fp32
// (row loops compiled for AVX-512 / AVX2 / baseline like the kernels above), O = P V with P rounded
// to bf16. Forward keeps O and each row's logsumexp (fp32), nothing T x T; backward recomputes P
// from Q, K and the logsumexp (flash attention's recompute) and takes dV = P^T dO, dP = dO V^T,
// dS = P * (dP - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale as GEMMs (fp32 sums, dK
// and dV summed in fp32 over the query blocks and, with GQA, the heads sharing a KV head).
// q (B, H, T, Dh), k and v (B, Hkv, T, Dh), H a multiple of Hkv (GQA), all bf16 on the CPU;
// allow_b1tt: undefined (pure causal) or a bool (B or 1, 1, T, T) mask, true = attend, which must
// lie within the causal triangle (LlamaForCausalLM::make_context's masks do): keys after the query
// are never attended. Returns (B, H, T, Dh) as a transposed view of a contiguous (B, T, H, Dh).
constexpr int64_t kAttnBlock = 64;
at::Tensor causal_attention_bf16(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                                 double scale, const at::Tensor& allow_b1tt = {});
// Whether `allow_b1tt` (as above) lets no query see a later key; true when undefined (pure causal).
bool mask_within_causal(const at::Tensor& allow_b1tt);
// The same for fp32 training (issue 32): q (B, H, T, Dh), k and v (B, Hkv, T, Dh) fp32 on the CPU (any
// Dh), the same blocks and skipped key blocks, the products through ATen's cpublas fp32 GEMM (MKL's
// sgemm), P and dS kept in fp32, dK and dV summed in fp32 in place: ATen's fp32 flash kernel's math
// (within fp32 rounding of it and of a float64 reference). Returns (B, H, T, Dh) as causal_attention_bf16.
// bf16 q, k, v (all three) are computed in fp32 the same way, output and gradients rounded to bf16 once:
// bf16 training on a CPU without native bf16 products (matmul.h's kFp32 mode, AVX2-only CPUs), in place
// of ATen's fp32 flash kernel on upcasts (attention_via_fp32).
at::Tensor causal_attention_fp32(const at::Tensor& q_bhtd, const at::Tensor& k_bhtd, const at::Tensor& v_bhtd,
                                 double scale, const at::Tensor& allow_b1tt = {});
// Whether fp32 (or bf16 via fp32) training attention takes it: fp32 or bf16 CPU q, LibTorch's BLAS, the fused CPU
// paths on (ALPACA_CPU_FUSED) and the routes not turned off (ALPACA_CPU_ATTN=0); else SDPA.
bool gemm_attention_fp32_applies(const at::Tensor& q);
// Whether bf16 training attention takes it: fused_cpu_bf16_applies(q), fast products (bf16gemm::fast():
// our AVX512-BF16 kernel, or oneDNN's on AMX; on the cpublas fallback it is no faster than SDPA), and not
// turned off with ALPACA_CPU_ATTN=0 (or set_gemm_attention(false)); else ATen's
// scaled_dot_product_attention, as before. causal_attention_bf16 itself runs on any CPU.
bool gemm_attention_applies(const at::Tensor& q);
void set_gemm_attention(bool on);
// Whether our bf16 CPU attention routes are on (this one, and matmul.h's fp32 route on CPUs without
// native bf16): ALPACA_CPU_ATTN=0 or set_gemm_attention(false) leaves every attention to ATen's SDPA
// in the compute dtype, as before either existed (for comparisons in one binary).
bool cpu_attention_routes_on();
// The product under the GEMM attention and the lm_head gradient on this CPU (src/model/bf16_gemm.h):
// "own" (our AVX512-BF16 kernel), "onednn" (oneDNN's brgemm ukernel: AMX tiles) or "cpublas" (ATen's
// GEMM, where SDPA and ATen's product keep those), for the training log's CPU line.
const char* cpu_bf16_gemm_backend();

}  // namespace alpaca::model
