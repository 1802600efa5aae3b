// The memory planner; see include/alpaca/plan/memory_plan.h. Every figure below names the
// allocation it stands for; "per token" figures are bytes per token of the micro-batch.
#include "alpaca/plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/fsdp/quant_layout.h"
#include "alpaca/fsdp/unit_plan.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/model/quant4.h"
#include "alpaca/util/error.h"

namespace alpaca::plan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
// GPU: what the device needs beyond allocated tensors. The CUDA context, cuBLAS workspaces and
// NCCL's buffers (measured 0.5-0.8 GiB on A100/H100 with LibTorch), and the caching allocator's
// rounding and fragmentation (reserved exceeds allocated by 5-15% in long runs).
constexpr int64_t kCudaContextBytes = 640 * kMiB;
constexpr double kAllocatorMargin = 0.10;
// Host: the process itself (LibTorch, MPI/NCCL, the tokenized data); CPU ranks need less.
constexpr int64_t kHostBaselineGpu = 2 * kGiB;
constexpr int64_t kHostBaselineCpu = 384 * kMiB;

int64_t bytes_of(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Which linears of a decoder layer carry LoRA adapters (what apply_lora attached).
struct LoraTargets {
  bool q = false, k = false, v = false, o = false, gate = false, up = false, down = false;
};

std::string leaf_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The model's shape (activations) and its FSDP units: plan_units on the model the trainer builds.
struct Shape {
  int64_t d = 0, f = 0, v = 0, layers = 0, heads = 0, hq = 0, hkv = 0, dh = 0;
  bool tied = false;
  LoraTargets lora;
  bool embed_trains = true, lm_head_trains = true;
  fsdp::UnitPlan units;  // seen from rank 0 (every rank's shard has the same size)
  // Per unit: the frozen shard as stored (a layer's 4-bit blob shard under QLoRA, else param_dtype).
  std::vector<int64_t> frozen_bytes;
  int64_t layer_blob = 0;  // QLoRA: the largest layer's gathered 4-bit blob (all shards, padded)
  int64_t total_params = 0, largest_param = 0;
};

// The model training would wrap: built on the meta device (no storage) from the config, with the
// LoRA adapters apply_lora attaches for --use_peft (train/trainer_setup.cpp builds it the same way).
model::LlamaForCausalLM planned_model(const MemoryPlanInputs& in, model::LoraPlan* lora_plan) {
  model::LlamaConfig cfg = in.config;
  if (cfg.num_key_value_heads <= 0) cfg.num_key_value_heads = cfg.num_attention_heads;
  if (cfg.head_dim <= 0) cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  model::LlamaForCausalLM m(cfg, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  if (in.lora_rank <= 0) return m;
  for (const auto& name : in.lora_modules_to_save) {
    const std::string l = leaf_of(name);
    ALPACA_CHECK(l == "embed_tokens" || l == "lm_head",
                 "estimate-memory: LoRA module to save '" << name << "' is not modelled; the planner models "
                 "modules_to_save embed_tokens and lm_head");
  }
  model::LoraOptions lo;
  lo.r = in.lora_rank;
  lo.dropout = in.lora_dropout;
  lo.use_dora = in.lora_use_dora;
  lo.target_modules = in.lora_target_modules;
  lo.modules_to_save = in.lora_modules_to_save;
  for (int64_t i = cfg.vocab_size - in.lora_token_rows; i < cfg.vocab_size; ++i) lo.trainable_token_indices.push_back(i);
  *lora_plan = model::apply_lora(*m, lo, /*seed=*/0);
  return m;
}

// The adapted linears of the first decoder layer (every layer has the same), by leaf name.
LoraTargets lora_targets_of(const model::LoraPlan& plan) {
  LoraTargets t;
  for (const auto& name : plan.lora_modules) {
    ALPACA_CHECK(name.find(".layers.") != std::string::npos,
                 "estimate-memory: LoRA target module " << name << " is not a linear of a decoder layer; the "
                 "planner models q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or all-linear)");
    if (name.find(".layers.0.") == std::string::npos) continue;
    const std::string l = leaf_of(name);
    bool* slot = l == "q_proj" ? &t.q : l == "k_proj" ? &t.k : l == "v_proj" ? &t.v : l == "o_proj" ? &t.o
               : l == "gate_proj" ? &t.gate : l == "up_proj" ? &t.up : l == "down_proj" ? &t.down : nullptr;
    ALPACA_CHECK(slot, "estimate-memory: LoRA target module " << name << " is not modelled; the planner models "
                       "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or all-linear)");
    *slot = true;
  }
  return t;
}

// The frozen shard each unit stores: under QLoRA a decoder layer's 4-bit blob shard, laid out by
// the engine's own function (fsdp::quant_layout), otherwise its param_dtype shard.
void frozen_store_of(const MemoryPlanInputs& in, Shape& s) {
  model::Quant4Options q;
  if (!in.quant4_type.empty()) {
    q.type = model::parse_quant4_type(in.quant4_type);
    q.nested = in.quant4_nested;
  }
  for (size_t u = 0; u < s.units.units.size(); ++u) {
    const fsdp::PlannedUnit& unit = s.units.units[u];
    if (in.quant4_type.empty() || !fsdp::unit_holds_4bit(s.units, static_cast<int>(u))) {
      s.frozen_bytes.push_back(unit.frozen_shard_bytes(in.param_dtype));
      continue;
    }
    const fsdp::QuantLayout l = fsdp::quant_layout(unit.frozen.entries, q, bytes_of(in.param_dtype), s.units.shard_world);
    s.frozen_bytes.push_back(l.shard_bytes);
    s.layer_blob = std::max(s.layer_blob, l.padded_bytes);
  }
}

Shape shape_of(const MemoryPlanInputs& in, int shard_world) {
  const auto& c = in.config;
  Shape s;
  s.d = c.hidden_size;
  s.f = c.intermediate_size;
  s.v = c.vocab_size;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.dh = c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1);
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  s.hq = s.heads * s.dh;
  s.hkv = kv * s.dh;
  s.tied = c.tie_word_embeddings;
  model::LoraPlan lora_plan;
  model::LlamaForCausalLM m = planned_model(in, &lora_plan);
  if (in.lora_rank > 0) s.lora = lora_targets_of(lora_plan);
  fsdp::FsdpPolicy policy;
  policy.strategy = in.strategy;
  policy.auto_wrap = in.auto_wrap;
  const fsdp::ModelParams params = fsdp::describe_parameters(fsdp::fsdp_parts(*m));
  s.units = fsdp::plan_units(params.specs, static_cast<int>(s.layers), policy, shard_world, 0);
  frozen_store_of(in, s);
  for (const auto& p : params.specs) {
    s.total_params += p.numel();
    s.largest_param = std::max(s.largest_param, p.numel());
    if (p.name == "model.embed_tokens.weight") s.embed_trains = p.trainable;
    if (p.name == (s.tied ? "model.embed_tokens.weight" : "lm_head.weight")) s.lm_head_trains = p.trainable;
  }
  return s;
}

// Bytes of one FlatParameter's pieces on this rank.
struct Unit {
  int64_t numel = 0, padded = 0, shard = 0;
};
Unit unit_of(const fsdp::PlannedFlat& f) { return {f.shard.numel, f.shard.padded_numel, f.shard.shard_numel}; }

void add(std::vector<MemoryItem>& items, const std::string& name, int64_t device, int64_t host = 0) {
  if (device == 0 && host == 0) return;
  items.push_back({name, device, host});
}

int64_t sum_device(const std::vector<MemoryItem>& items) {
  int64_t n = 0;
  for (const auto& i : items) n += i.device_bytes;
  return n;
}

std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(b) / static_cast<double>(kMiB));
  return buf;
}
std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(b) / static_cast<double>(kGiB));
  return buf;
}

int shard_world_of(const MemoryPlanInputs& in) {
  fsdp::FsdpPolicy policy;
  policy.strategy = in.strategy;
  policy.hybrid_shard_size = in.hybrid_shard_size;
  return fsdp::shard_world_of(policy, in.num_ranks, in.ranks_per_node);
}

// Every figure of one plan, in bytes on one rank.
struct Figures {
  bool lora = false, quant = false, f32route = false, reshard_fwd = true, split = false;
  int64_t bp = 4, br = 4, b = 4, n_tok = 0;
  int shard_world = 1;
  // Model states, gathered units and full gradients (from the unit plan).
  int64_t train_shard = 0, frozen_store = 0, master = 0, grads = 0, moments = 0, shard_cast = 0;
  int64_t layer_full = 0, layer_grad = 0;
  int64_t embed_full = 0, embed_grad = 0, head_full = 0, head_grad = 0, root_full = 0;
  Unit lt, et;  // a layer's and the embedding unit's trainable flat buffers
  int64_t largest_unit = 0;
  // Activations, the fused loss, backward temporaries.
  int64_t act_layer = 0, ckpt_layer = 0, saved_layers = 0, context = 0;
  int64_t chunk = 0, grad_h = 0, grad_w32 = 0, grad_w_saved = 0, loss_fwd_extra = 0;
  int64_t final_norm_fwd = 0, final_norm_bwd = 0, layer_bwd_tmp = 0, gathered_bwd = 0, gathered_fwd_layers = 0;
  int64_t prefetch_blob = 0;
};

// Model states and units: what plan_units laid out (the engine allocates exactly these).
void unit_figures(const MemoryPlanInputs& in, const Shape& s, Figures& g) {
  const fsdp::UnitPlan& up = s.units;
  for (const auto& u : up.units) {
    g.train_shard += u.train.shard.shard_numel;
    g.largest_unit = std::max(g.largest_unit, u.numel());
  }
  for (int64_t b : s.frozen_bytes) g.frozen_store += b;
  // Frozen (LoRA base) weights are stored in param_dtype only (QLoRA: the layers' 4-bit blob
  // shards): no master, gradient or moments.
  g.master = 4 * g.train_shard + g.frozen_store;
  g.grads = 4 * g.train_shard;
  const int moments = in.lion ? 1 : 2;
  g.moments = 4 * moments * g.train_shard;
  if (in.adamw_8bit) {  // what ShardedAdamW allocates per parameter part (padding holds none)
    g.moments = 0;
    for (const auto& u : up.units)
      for (const auto& e : u.train.entries) {
        const auto slice = fsdp::param_shard_slice(e.offset, e.numel, u.train.shard);
        if (!slice) continue;
        g.moments += optim::bnb8_segment_state_bytes({slice->shard_offset, slice->numel(), true, slice->param_begin,
                                                      e.numel, optim::bnb_embedding_weight(e.name, e.aliases)},
                                                     moments);
      }
  }
  if (in.adafactor) {  // every rank holds every trainable parameter's statistics whole
    g.moments = 0;
    for (const auto& u : up.units)
      for (const auto& e : u.train.entries) g.moments += 4 * (e.shape.size() == 2 ? e.shape[0] + e.shape[1] : e.numel);
  }
  // CPU ranks with a 16-bit param_dtype keep the trainable shards cast once a step (the gathers' input).
  g.shard_cast = !in.gpu && bytes_of(in.param_dtype) != 4 ? bytes_of(in.param_dtype) * g.train_shard : 0;
  // Gathered units in param_dtype, full gradients in reduce_dtype.
  if (up.num_layers > 0) {
    g.layer_full = up.units[0].full_bytes(in.param_dtype);
    g.layer_grad = up.units[0].full_grad_bytes(in.reduce_dtype);
    g.lt = unit_of(up.units[0].train);
  }
  const auto& embed = up.units[static_cast<size_t>(up.embed_unit)];
  const auto& head = up.units[static_cast<size_t>(up.head_unit)];
  g.split = up.split_root();
  g.embed_full = embed.full_bytes(in.param_dtype);
  g.embed_grad = embed.full_grad_bytes(in.reduce_dtype);
  g.head_full = head.full_bytes(in.param_dtype);
  g.head_grad = head.full_grad_bytes(in.reduce_dtype);
  g.root_full = g.split ? g.embed_full + g.head_full : g.head_full;
  g.et = unit_of(embed.train);
}

// Activations saved for backward, per token of one decoder layer (layers.cpp, sdpa). RMSNorm saves
// its fp32 input (the input itself in fp32, an upcast copy otherwise) and the normalised value
// before the weight; its output is saved by the linears that read it.
void activation_figures(const MemoryPlanInputs& in, const Shape& s, Figures& g) {
  const int64_t b = g.b;
  // bf16 on CPU takes the fused kernels (model/fused_ops.h): an RMSNorm saves its bf16 input and one
  // fp32 scale per token, SiLU*mul its two inputs (no silu(gate)).
  const bool fused = !in.gpu && in.param_dtype == at::kBFloat16;
  const int64_t fused_norm = 2 * s.d + 4;
  const int64_t norm_saved = fused ? fused_norm : (b == 4 ? 8 : 4 + 2 * b) * s.d;
  int64_t act_tok = 0, first_layer_less = 0;
  if (!g.lora) {
    act_tok += norm_saved + b * s.d;               // input_layernorm (+ its output, read by q/k/v)
    act_tok += b * (s.hq + 2 * s.hkv);             // q, k after RoPE and v, saved by attention
    act_tok += 2 * b * s.hq + 4 * s.heads;         // attention output (+ its contiguous copy for o_proj), logsumexp
    act_tok += norm_saved + b * s.d;               // post_attention_layernorm (+ output, read by gate/up)
    act_tok += (fused ? 3 : 4) * b * s.f;          // gate, silu(gate) (not fused), up, silu*up (down_proj input)
  } else {
    // Frozen norm weights keep no normalised value (only the fp32 input) and frozen linears no
    // input. An adapted linear keeps what its branch B(A(dropout(x))) needs: with dropout, its own
    // mask (the input dtype on CPU, bool on GPU: ATen's fused dropout) and masked input, saved by A;
    // without, the input itself, once for the linears that read it; and A's rank-r output, saved by B.
    const LoraTargets& t = s.lora;
    const bool drop = in.lora_dropout > 0;
    const int64_t mask_b = in.gpu ? 1 : b;
    const auto branch_inputs = [&](int64_t width, int adapted) -> int64_t {
      if (adapted == 0) return 0;
      return drop ? adapted * (mask_b + b) * width : b * width;
    };
    act_tok += fused ? fused_norm : 4 * s.d;       // input_layernorm's fp32 input
    act_tok += branch_inputs(s.d, t.q + t.k + t.v);  // its output, read by the q/k/v adapters
    act_tok += b * (s.hq + 2 * s.hkv);             // q, k after RoPE and v, saved by attention
    act_tok += b * s.hq + 4 * s.heads;             // attention output, logsumexp
    act_tok += branch_inputs(s.hq, t.o);           // its contiguous copy, read by the o_proj adapter
    act_tok += fused ? fused_norm : 4 * s.d;       // post_attention_layernorm's fp32 input
    act_tok += branch_inputs(s.d, t.gate + t.up);  // its output, read by the gate/up adapters
    act_tok += (fused ? 2 : 3) * b * s.f;          // gate, silu(gate) (not fused), up
    act_tok += branch_inputs(s.f, t.down);         // silu * up, read by the down_proj adapter
    act_tok += b * in.lora_rank * (t.q + t.k + t.v + t.o + t.gate + t.up + t.down);
    // A frozen embedding: the first layer's input needs no gradient, its input_layernorm saves nothing.
    if (!s.embed_trains) first_layer_less = fused ? fused_norm : 4 * s.d;
  }
  g.act_layer = act_tok * g.n_tok;
  g.ckpt_layer = b * s.d * g.n_tok;  // checkpointing keeps each layer's input only
  g.saved_layers = in.checkpointing ? s.layers * g.ckpt_layer : s.layers * g.act_layer - first_layer_less * g.n_tok;
  g.context = 2 * s.dh * b * g.n_tok + 8 * in.seq_len * s.dh;  // RoPE cos/sin (+ fp32 angles)
}

// The fused head loss (loss.cpp): logits of `chunk` rows at a time, no (B, T, V) tensor; the final
// norm; a layer's backward temporaries; what stays gathered.
void loss_and_backward_figures(const MemoryPlanInputs& in, const Shape& s, Figures& g) {
  const int64_t b = g.b, bp = g.bp, n_tok = g.n_tok;
  g.chunk = std::min(std::max<int64_t>(1, (int64_t{1} << 23) / s.v), n_tok);
  g.grad_h = n_tok * s.d * b;
  g.grad_w32 = s.lm_head_trains ? s.v * s.d * 4 : 0;
  g.grad_w_saved = s.lm_head_trains ? s.v * s.d * bp : 0;
  if (b == 4) {
    g.loss_fwd_extra = 4 * g.chunk * s.v + 8 * g.chunk * s.d;
  } else if (g.f32route) {
    g.loss_fwd_extra = 4 * s.v * s.d /* fp32 copy of lm_head */ + 4 * g.chunk * s.v + 10 * g.chunk * s.d;
  } else if (!in.gpu && in.cpu_bf16_head_grad_in_gemm) {
    // bf16 logits whose gradient the fused rows write over them; the lm_head gradient summed in fp32
    // inside our GEMM from operands packed in small blocks (model/loss.h): no product, no copy of it.
    g.loss_fwd_extra = std::max(2 * g.chunk * s.v, s.lm_head_trains ? 2 * s.v * s.d : int64_t{0});  // grad_w cast
  } else {
    // bf16 logits, on a GPU also their fp32 copy and the bf16 gradient (on the CPU the fused rows,
    // model/loss_rows.h, write the gradient over the logits), and the lm_head gradient product; a
    // CPU (oneDNN) GEMM also copies its transposed bf16 operand (the logits gradient) contiguous.
    const int64_t per_logit = in.gpu ? 6 : 2;
    g.loss_fwd_extra = std::max(per_logit * g.chunk * s.v + (s.lm_head_trains ? 2 * s.v * s.d : 0) +
                                    (in.gpu || !s.lm_head_trains ? 0 : 2 * g.chunk * s.v),
                                s.lm_head_trains ? 2 * s.v * s.d : int64_t{0});  // grad_w cast at the end
  }
  // A frozen norm weight (LoRA) keeps no normalised value.
  // bf16 on CPU: the fused RMSNorm saves its input, output and one fp32 scale per token.
  const bool fused = !in.gpu && in.param_dtype == at::kBFloat16;
  g.final_norm_fwd = fused ? (2 * b * s.d + 4) * n_tok
                           : ((b == 4 ? 12 : 10) - (g.lora ? b : 0)) * s.d * n_tok;  // input, fp32 view, normalised, output
  g.final_norm_bwd = fused ? (2 * s.d + 4) * n_tok : ((b == 4 ? 8 : 6) - (g.lora ? b : 0)) * s.d * n_tok;
  // Backward temporaries inside one layer: MLP gradients (three (B,T,F) at once), the gradient of
  // the hidden state flowing down (two (B,T,D)), one weight gradient before it is moved into the
  // unit's flat gradient; on the CPU fp32 GEMM route the fp32 copies of the largest linear's
  // operands and results.
  g.layer_bwd_tmp = 3 * b * s.f * n_tok + 2 * b * s.d * n_tok + (g.lora ? 0 : s.d * s.f * bp);
  if (g.f32route) g.layer_bwd_tmp += 8 * s.f * n_tok + (g.lora ? 4 : 8) * s.d * s.f;
  // Gathered units during a layer's backward: the layer, plus a prefetched one (at most two under
  // limit_all_gathers); unsharded strategies keep every layer and the root until its backward.
  // A unit with frozen weights (LoRA) stays gathered until backward reaches the unit before it.
  const bool bwd_prefetch = in.backward_prefetch != fsdp::BackwardPrefetch::kNone;
  g.gathered_bwd = g.reshard_fwd ? g.layer_full * (((bwd_prefetch || g.lora) && s.layers > 1) ? 2 : 1)
                                 : g.layer_full * s.layers + g.root_full;
  g.gathered_fwd_layers = g.reshard_fwd ? 0 : g.layer_full * s.layers;
  // QLoRA: a prefetched layer's gathered 4-bit bytes live until its pre-backward dequantizes them
  // (with offload on a GPU, also the shard's copy on the device, the all-gather's input).
  if (g.quant && g.reshard_fwd && bwd_prefetch && s.layers > 1)
    g.prefetch_blob = s.layer_blob + (in.offload && in.gpu ? s.layer_blob / g.shard_world : 0);
}

Figures figures_of(const MemoryPlanInputs& in, const Shape& s) {
  Figures g;
  g.lora = in.lora_rank > 0;
  g.quant = !in.quant4_type.empty();
  g.bp = bytes_of(in.param_dtype);
  g.br = bytes_of(in.reduce_dtype);
  g.b = g.bp;  // activations are in the compute (param) dtype
  g.f32route = !in.gpu && in.param_dtype == at::kBFloat16 && in.cpu_bf16_via_fp32;
  g.n_tok = in.micro_batch * in.seq_len;
  g.shard_world = s.units.shard_world;
  g.reshard_fwd =
      in.strategy == fsdp::ShardingStrategy::kFullShard || in.strategy == fsdp::ShardingStrategy::kHybridShard;
  unit_figures(in, s, g);
  activation_figures(in, s, g);
  loss_and_backward_figures(in, s, g);
  return g;
}

struct Moment {
  std::string name;
  std::vector<MemoryItem> items;
};

// Reduce-scatter staging of a 16-bit gradient over MPI (fp32 send copy + fp32 receive), CPU ranks.
// Then the reduced shard is added into the fp32 gradient (an fp32 copy first when 16-bit).
int64_t rs_staging(const MemoryPlanInputs& in, const Figures& g, const Unit& u) {
  const int64_t to_fp32 = g.br == 4 ? 0 : 4 * u.shard;
  if (g.shard_world == 1) return to_fp32;  // the full gradient is the shard: no output buffer
  if (in.gpu || g.br == 4) return u.shard * g.br + to_fp32;
  return 4 * (u.padded + u.shard) + to_fp32;
}

// The moments of one micro-step where live memory is highest (see memory_plan.h). With a split
// root the head's full gradient is reduced right after the head's backward (it is the reduction in
// flight while the last layer's backward runs) and the embedding's is allocated only at the end;
// one root unit keeps its full gradient from the head to the end of backward.
const char* master_item_name(const Figures& g) {
  if (g.quant) return "master shards (fp32 adapters, 4-bit frozen layers, param_dtype root)";
  return g.lora ? "master shards (fp32 adapters, param_dtype frozen base)" : "fp32 master shards";
}

// The peak items' name for the optimizer state: AdamW's moments (fp32 or bitsandbytes' 8-bit codes)
// or Adafactor's statistics.
std::string optimizer_state_item(const MemoryPlanInputs& in) {
  return in.adafactor ? "Adafactor statistics (row and column means, whole on every rank)"
         : in.lion    ? "Lion momentum shards (exp_avg)"
                      : "AdamW moment shards (exp_avg, exp_avg_sq)";
}

std::vector<Moment> moments_of(const MemoryPlanInputs& in, const Shape& s, const Figures& g) {
  // Offload: states on the host (pinned) on GPU ranks; CPU ranks have one memory.
  const bool states_on_device = !in.offload || !in.gpu;
  auto states_items = [&](std::vector<MemoryItem>& it) {
    if (!states_on_device) return;
    add(it, master_item_name(g), g.master);
    add(it, "fp32 gradient shards", g.grads);
    add(it, optimizer_state_item(in), g.moments);
    add(it, "param_dtype copy of the trainable shards (gather input)", g.shard_cast);
  };
  // Alive from the end of forward until backward leaves the head: model states, the gathered head
  // (and, unsharded strategies, the embedding and every layer), saved activations, RoPE tables.
  const int64_t root_gathered = g.reshard_fwd ? g.head_full : g.root_full;
  auto forward_state_items = [&](std::vector<MemoryItem>& items) {
    states_items(items);
    add(items, g.split ? "gathered root units in param_dtype" : "gathered root unit (embeddings, norm, lm_head) in param_dtype",
        root_gathered);
    add(items, "gathered decoder layers kept after forward (no reshard)", g.gathered_fwd_layers);
    add(items, in.checkpointing ? "checkpointed layer inputs" : "saved activations, all layers", g.saved_layers);
    add(items, "RoPE tables", g.context);
  };
  const char* root_grad_name = g.split ? "head unit full gradient (reduce_dtype)" : "root full gradient (reduce_dtype)";
  std::vector<Moment> out(4);
  out[0].name = "forward at the loss";
  forward_state_items(out[0].items);
  add(out[0].items, "final norm (input, fp32, output)", g.final_norm_fwd);
  add(out[0].items, "fused loss: hidden gradient", g.grad_h);
  add(out[0].items, "fused loss: fp32 lm_head gradient", g.grad_w32);
  add(out[0].items, "fused loss: logits chunk and temporaries", g.loss_fwd_extra);
  out[1].name = "backward at the head";
  forward_state_items(out[1].items);
  add(out[1].items, "final norm (saved)", g.final_norm_bwd);
  add(out[1].items, "fused loss: hidden gradient", g.grad_h);
  add(out[1].items, "fused loss: lm_head gradient", g.grad_w_saved);
  add(out[1].items, root_grad_name, g.head_grad);
  out[2].name = "backward in a decoder layer";
  auto& layer = out[2].items;
  states_items(layer);
  if (!g.split) add(layer, root_grad_name, g.head_grad);
  add(layer, "gathered units during backward (layer + prefetch; unsharded strategies: all)", g.gathered_bwd);
  add(layer, "4-bit bytes of the prefetched layer (until dequantized)", g.prefetch_blob);
  if (in.checkpointing) {
    add(layer, "checkpointed layer inputs", g.saved_layers);
    add(layer, "one recomputed layer's activations", g.act_layer);
  } else {
    add(layer, "saved activations, remaining layers", g.saved_layers);
  }
  add(layer, "RoPE tables", g.context);
  const int64_t in_flight = std::max(s.layers > 1 ? g.layer_grad : 0, g.split ? g.head_grad : 0);
  add(layer, "layer full gradients (this + one reduce-scatter in flight)",
      g.layer_grad + in_flight + rs_staging(in, g, g.lt));
  add(layer, "layer backward temporaries", g.layer_bwd_tmp);
  out[3].name = g.split ? "end of backward (embedding reduce-scatter)" : "end of backward (root reduce-scatter)";
  states_items(out[3].items);
  add(out[3].items, g.split ? "embedding unit full gradient (reduce_dtype)" : root_grad_name, g.embed_grad);
  add(out[3].items, g.split ? "embedding gradient / embedding reduce-scatter staging"
                            : "embedding gradient / root reduce-scatter staging",
      std::max(s.embed_trains ? s.v * s.d * g.b + g.b * s.d * g.n_tok : 0, rs_staging(in, g, g.et)));
  return out;
}

// The host side of the peak moment, what a GPU needs beyond allocated tensors, and whether it fits.
void add_host_and_margins(const MemoryPlanInputs& in, const Figures& g, MemoryPlan& plan) {
  if (in.offload && in.gpu) {
    add(plan.breakdown, g.lora ? "master shards and frozen base (offloaded, pinned)" : "fp32 master shards (offloaded, pinned)", 0,
        g.master);
    add(plan.breakdown, "fp32 gradient shards (offloaded, pinned)", 0, g.grads);
    add(plan.breakdown, optimizer_state_item(in) + ", offloaded (pageable: only the optimizer reads them)", 0, g.moments);
    // The engine stages the trainable shards in param_dtype (pinned) for their copies to the GPU.
    if (g.bp != 4) add(plan.breakdown, "param_dtype staging of the trainable shards (pinned)", 0, g.bp * g.train_shard);
  }
  if (in.gpu) {
    const int64_t margin = static_cast<int64_t>(kAllocatorMargin * static_cast<double>(plan.device_allocated_bytes));
    add(plan.breakdown, "caching allocator margin (10% of allocated)", margin);
    add(plan.breakdown, "CUDA context, cuBLAS workspace, NCCL buffers", kCudaContextBytes);
    plan.device_total_bytes = plan.device_allocated_bytes + margin + kCudaContextBytes;
  } else {
    plan.device_total_bytes = plan.device_allocated_bytes;
  }
  add(plan.breakdown, "checkpoint export staging (one unit in fp32)", 0, 4 * g.largest_unit);
  if (in.async_checkpoint) {  // the trainer's snapshot_shards: replicated shards are written in parts
    const int64_t replicas = std::max(1, in.num_ranks / std::max(1, g.shard_world));
    // 8-bit moments are written dequantized, with each element's block scale beside them; Adafactor's
    // statistics are copied whole (by rank 0, which writes them).
    if (in.adafactor)
      add(plan.breakdown, "--save_async staging copy (fp32 trainable shards + Adafactor statistics)", 0,
          4 * g.train_shard / replicas + g.moments);
    else
      add(plan.breakdown, in.lion ? "--save_async staging copy (fp32 trainable shards + Lion momentum)"
                                  : "--save_async staging copy (fp32 trainable shards + AdamW moments)", 0,
          (4 + 4 * (in.lion ? 1 : 2) * (in.adamw_8bit ? 2 : 1)) * g.train_shard / replicas);
  }
  add(plan.breakdown, "process baseline (LibTorch, communicator, tokenized data)", 0,
      in.gpu ? kHostBaselineGpu : kHostBaselineCpu);
  int64_t host = 0;
  for (const auto& i : plan.breakdown) host += i.host_bytes;
  plan.host_total_bytes = host + (in.gpu ? 0 : plan.device_allocated_bytes);
  const int per_node = std::max(1, std::min(in.ranks_per_node, in.num_ranks));
  plan.host_node_bytes = plan.host_total_bytes * per_node;
  plan.fits_device = !in.gpu || in.device_memory_bytes <= 0 || plan.device_total_bytes <= in.device_memory_bytes;
  plan.fits_host = in.host_memory_bytes <= 0 || plan.host_node_bytes <= in.host_memory_bytes;
}

// DeepSpeed's ZeRO-3 estimator (zero_init, additional_buffer_factor 1.5), for comparison.
DeepSpeedEstimate deepspeed_estimate(const MemoryPlanInputs& in, const Shape& s) {
  DeepSpeedEstimate ds;
  ds.total_params = s.total_params;
  ds.largest_layer_params = s.largest_param;
  const int gpus_per_node = std::max(1, std::min(in.ranks_per_node, in.num_ranks));
  const int nodes = static_cast<int>(ceil_div(in.num_ranks, gpus_per_node));
  const double largest = 4.0 * static_cast<double>(ds.largest_layer_params);
  const double total = static_cast<double>(ds.total_params);
  if (in.offload) {
    ds.gpu_bytes_per_gpu = static_cast<int64_t>(largest);
    ds.cpu_bytes_per_node = static_cast<int64_t>(total * 18.0 / nodes * 1.5);
  } else {
    ds.gpu_bytes_per_gpu = static_cast<int64_t>(largest + std::floor(18.0 * total / in.num_ranks));
    ds.cpu_bytes_per_node = static_cast<int64_t>(static_cast<double>(ds.largest_layer_params) * 4 * gpus_per_node * 1.5);
  }
  return ds;
}

void check_inputs(const MemoryPlanInputs& in) {
  const auto& c = in.config;
  ALPACA_CHECK(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.vocab_size > 0 && c.num_attention_heads > 0,
               "estimate-memory: the model config has no shape (hidden_size, num_hidden_layers, vocab_size, "
               "num_attention_heads must be positive)");
  ALPACA_CHECK(in.micro_batch > 0 && in.seq_len > 0 && in.num_ranks > 0,
               "estimate-memory: micro-batch, sequence length and ranks must be positive");
  ALPACA_CHECK(in.quant4_type.empty() || in.lora_rank > 0,
               "estimate-memory: a 4-bit base (--load_in_4bit) is frozen and trains only an adapter; add --use_peft True");
}

// The plan for a model whose shape and units are known (largest_fitting_micro_batch varies only
// the micro-batch: the model is built once).
MemoryPlan plan_for(const MemoryPlanInputs& in, const Shape& s) {
  const Figures g = figures_of(in, s);
  const std::vector<Moment> moments = moments_of(in, s, g);
  size_t peak = 0;
  for (size_t i = 1; i < moments.size(); ++i)
    if (sum_device(moments[i].items) > sum_device(moments[peak].items)) peak = i;
  MemoryPlan plan;
  for (const auto& m : moments) plan.moments.push_back({m.name, sum_device(m.items), 0});
  plan.peak_moment = moments[peak].name;
  plan.breakdown = moments[peak].items;
  plan.device_allocated_bytes = sum_device(plan.breakdown);
  plan.activations_per_layer_bytes = g.act_layer;
  plan.checkpointed_per_layer_bytes = g.ckpt_layer;
  plan.loss_chunk_bytes = 4 * g.chunk * s.v;
  for (size_t i = 0; i < s.units.units.size(); ++i) {
    const auto& u = s.units.units[i];
    plan.units.push_back({u.label, u.train_shard_bytes(), s.frozen_bytes[i], u.full_bytes(in.param_dtype),
                          u.full_grad_bytes(in.reduce_dtype)});
  }
  add_host_and_margins(in, g, plan);
  plan.deepspeed = deepspeed_estimate(in, s);
  return plan;
}

}  // namespace

MemoryPlan plan_memory(const MemoryPlanInputs& in) {
  check_inputs(in);
  return plan_for(in, shape_of(in, shard_world_of(in)));
}

int64_t largest_fitting_micro_batch(MemoryPlanInputs in, int64_t limit) {
  if (!(in.gpu && in.device_memory_bytes > 0) && in.host_memory_bytes <= 0) return -1;  // nothing to fit in
  check_inputs(in);
  const Shape s = shape_of(in, shard_world_of(in));
  auto fits = [&](int64_t mb) {
    in.micro_batch = mb;
    return plan_for(in, s).fits();
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 1;
  while (hi < limit && fits(std::min(hi * 2, limit))) hi = std::min(hi * 2, limit);
  if (hi >= limit) return limit;
  lo = hi;
  hi = std::min(hi * 2, limit);  // does not fit
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::vector<LadderRung> plan_ladder(const MemoryPlanInputs& base) {
  std::vector<LadderRung> rungs;
  auto rung = [&](const std::string& name, bool offload, bool ckpt, int64_t lora_rank, bool quant = false) {
    LadderRung r;
    r.name = name;
    r.inputs = base;
    r.inputs.strategy = fsdp::ShardingStrategy::kFullShard;
    r.inputs.offload = offload;
    r.inputs.checkpointing = ckpt;
    r.inputs.lora_rank = lora_rank;  // peft's defaults, whatever --lora_* the given run has
    r.inputs.lora_dropout = 0.05;
    r.inputs.lora_target_modules.clear();
    r.inputs.lora_modules_to_save.clear();
    r.inputs.quant4_type = quant ? "nf4" : "";  // QLoRA's recipe: NF4 with double quantization
    r.inputs.quant4_nested = quant;
    r.plan = plan_memory(r.inputs);
    r.max_micro_batch = largest_fitting_micro_batch(r.inputs);
    rungs.push_back(std::move(r));
  };
  rung("full_shard", false, false, 0);
  rung("full_shard + offload", true, false, 0);
  rung("full_shard + offload + gradient_checkpointing", true, true, 0);
  rung("LoRA r=16 (+ gradient_checkpointing)", false, true, 16);
  rung("LoRA r=16 + offload (+ gradient_checkpointing)", true, true, 16);
  rung("QLoRA r=16, nf4 nested (+ gradient_checkpointing)", false, true, 16, /*quant=*/true);
  return rungs;
}

namespace {

nlohmann::json plan_json(const MemoryPlan& p, const MemoryPlanInputs& in) {
  nlohmann::json j;
  j["device_total_bytes"] = p.device_total_bytes;
  j["device_allocated_bytes"] = p.device_allocated_bytes;
  j["host_total_bytes"] = p.host_total_bytes;
  j["host_node_bytes"] = p.host_node_bytes;
  j["fits"] = p.fits();
  j["fits_device"] = p.fits_device;
  j["fits_host"] = p.fits_host;
  j["peak_moment"] = p.peak_moment;
  j["per_device_train_batch_size"] = in.micro_batch;
  j["activations_per_layer_bytes"] = p.activations_per_layer_bytes;
  j["checkpointed_per_layer_bytes"] = p.checkpointed_per_layer_bytes;
  j["loss_chunk_bytes"] = p.loss_chunk_bytes;
  nlohmann::json items = nlohmann::json::array();
  for (const auto& i : p.breakdown) items.push_back({{"name", i.name}, {"device_bytes", i.device_bytes}, {"host_bytes", i.host_bytes}});
  j["breakdown"] = items;
  nlohmann::json ms = nlohmann::json::object();
  for (const auto& m : p.moments) ms[m.name] = m.device_bytes;
  j["moments_device_allocated_bytes"] = ms;
  j["deepspeed_zero3_estimate"] = {{"total_params", p.deepspeed.total_params},
                                   {"largest_layer_params", p.deepspeed.largest_layer_params},
                                   {"gpu_bytes_per_gpu", p.deepspeed.gpu_bytes_per_gpu},
                                   {"cpu_bytes_per_node", p.deepspeed.cpu_bytes_per_node}};
  return j;
}

}  // namespace

std::string plan_to_json(const MemoryPlan& plan, const MemoryPlanInputs& in) { return plan_json(plan, in).dump(2); }

std::string report_to_json(const MemoryPlanInputs& in, const MemoryPlan& plan, const std::vector<LadderRung>& rungs) {
  nlohmann::json j = plan_json(plan, in);
  j["num_ranks"] = in.num_ranks;
  j["ranks_per_node"] = in.ranks_per_node;
  j["device"] = in.gpu ? "gpu" : "cpu";
  j["device_memory_bytes"] = in.device_memory_bytes;
  j["host_memory_bytes"] = in.host_memory_bytes;
  j["max_per_device_train_batch_size"] = largest_fitting_micro_batch(in);
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : rungs) {
    nlohmann::json x = plan_json(r.plan, r.inputs);
    x["name"] = r.name;
    x["max_per_device_train_batch_size"] = r.max_micro_batch;
    rs.push_back(x);
  }
  j["rungs"] = rs;
  return j.dump(2);
}

std::string report_to_text(const MemoryPlanInputs& in, const MemoryPlan& plan, const std::vector<LadderRung>& rungs) {
  std::ostringstream os;
  os << "Memory estimate per rank: " << in.num_ranks << " rank(s), " << in.ranks_per_node << " per node, "
     << (in.gpu ? "GPU" : "CPU") << " ranks, micro-batch " << in.micro_batch << " x " << in.seq_len << " tokens\n";
  if (in.lora_rank > 0) {
    std::string targets, saved;
    for (const auto& t : in.lora_target_modules.empty() ? model::default_lora_target_modules() : in.lora_target_modules)
      targets += " " + t;
    for (const auto& t : in.lora_modules_to_save) saved += " " + t;
    os << "  LoRA r=" << in.lora_rank << " on" << targets << ", dropout "
       << in.lora_dropout << (saved.empty() ? "" : ", modules_to_save" + saved)
       << (in.quant4_type.empty() ? "" : ", 4-bit " + in.quant4_type + " base" + (in.quant4_nested ? " (nested)" : ""))
       << "\n";
  }
  os << "  peak at: " << plan.peak_moment << "\n\n";
  os << "  " << std::string(70, '-') << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-70s %11s %11s\n", "item", "device MiB", "host MiB");
  os << line;
  for (const auto& i : plan.breakdown) {
    std::snprintf(line, sizeof(line), "  %-70s %11s %11s\n", i.name.c_str(), i.device_bytes ? mib(i.device_bytes).c_str() : "",
                  i.host_bytes ? mib(i.host_bytes).c_str() : "");
    os << line;
  }
  std::snprintf(line, sizeof(line), "  %-70s %11s %11s\n", "total per rank", mib(plan.device_total_bytes).c_str(),
                mib(plan.host_total_bytes).c_str());
  os << line;
  os << "\n  activations per layer: " << mib(plan.activations_per_layer_bytes) << " MiB (checkpointed: "
     << mib(plan.checkpointed_per_layer_bytes) << " MiB); fused loss logits chunk: " << mib(plan.loss_chunk_bytes)
     << " MiB\n";
  os << "  device " << gib(plan.device_total_bytes) << " GiB"
     << (in.device_memory_bytes > 0 ? " of " + gib(in.device_memory_bytes) + " GiB" : std::string())
     << ", host " << gib(plan.host_node_bytes) << " GiB per node"
     << (in.host_memory_bytes > 0 ? " of " + gib(in.host_memory_bytes) + " GiB" : std::string()) << ": "
     << (plan.fits() ? "fits" : "does NOT fit") << "\n";
  os << "  DeepSpeed ZeRO-3 estimator (model states only): " << gib(plan.deepspeed.gpu_bytes_per_gpu)
     << " GiB per GPU, " << gib(plan.deepspeed.cpu_bytes_per_node) << " GiB CPU per node\n\n";
  std::snprintf(line, sizeof(line), "  %-50s %12s %12s %6s %10s %14s\n", "ladder rung", "device GiB", "host GiB/node",
                "fits", "max batch", "DeepSpeed GiB");
  os << line;
  for (const auto& r : rungs) {
    const std::string maxb = r.max_micro_batch < 0 ? "n/a" : std::to_string(r.max_micro_batch);
    std::snprintf(line, sizeof(line), "  %-50s %12s %12s %6s %10s %14s\n",
                  r.name.c_str(), gib(r.plan.device_total_bytes).c_str(),
                  gib(r.plan.host_node_bytes).c_str(), r.plan.fits() ? "yes" : "no", maxb.c_str(),
                  gib(r.plan.deepspeed.gpu_bytes_per_gpu).c_str());
    os << line;
  }
  std::string defaults;
  for (const auto& t : model::default_lora_target_modules()) defaults += " " + t;
  os << "  (LoRA rungs: peft's defaults, r=16 on" << defaults << ", dropout 0.05; QLoRA: the same on a 4-bit base)\n";
  if (rungs.empty() || rungs.front().max_micro_batch < 0)
    os << "  (max batch needs a memory size: --gpu_memory_gb, or --host_memory_gb for CPU ranks)\n";
  return os.str();
}

}  // namespace alpaca::plan
