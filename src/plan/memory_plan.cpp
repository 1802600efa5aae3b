// The memory planner; see include/alpaca/plan/memory_plan.h. Every figure below names the
// allocation it stands for; "per token" figures are bytes per token of the micro-batch.
#include "alpaca/plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

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

// Which linears of a decoder layer carry LoRA adapters, and which root tables train in full.
struct LoraTargets {
  bool q = false, k = false, v = false, o = false, gate = false, up = false, down = false;
  bool embed = false, lm_head = false;  // modules_to_save
};

struct Shape {
  int64_t d = 0, f = 0, v = 0, layers = 0, heads = 0, hq = 0, hkv = 0, dh = 0;
  bool tied = false;
  int64_t layer_params = 0, root_params = 0, lora_layer_params = 0;
  LoraTargets lora;
};

std::string leaf_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The adapted linears and saved modules, by leaf name as peft (and model/lora.cpp) match them.
LoraTargets lora_targets_of(const MemoryPlanInputs& in) {
  LoraTargets t;
  std::vector<std::string> targets = in.lora_target_modules;
  if (targets.empty()) targets = {"q_proj", "v_proj"};
  if (targets.size() == 1 && targets[0] == "all-linear")
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  for (const auto& name : targets) {
    const std::string l = leaf_of(name);
    bool* slot = l == "q_proj" ? &t.q : l == "k_proj" ? &t.k : l == "v_proj" ? &t.v : l == "o_proj" ? &t.o
               : l == "gate_proj" ? &t.gate : l == "up_proj" ? &t.up : l == "down_proj" ? &t.down : nullptr;
    ALPACA_CHECK(slot, "estimate-memory: LoRA target module '" << name << "' is not a linear of a decoder layer; the "
                       "planner models q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or all-linear)");
    *slot = true;
  }
  for (const auto& name : in.lora_modules_to_save) {
    const std::string l = leaf_of(name);
    ALPACA_CHECK(l == "embed_tokens" || l == "lm_head",
                 "estimate-memory: LoRA module to save '" << name << "' is not modelled; the planner models "
                 "modules_to_save embed_tokens and lm_head");
    (l == "embed_tokens" ? t.embed : t.lm_head) = true;
  }
  if (in.config.tie_word_embeddings && (t.embed || t.lm_head)) t.embed = t.lm_head = true;  // one tensor
  return t;
}

Shape shape_of(const MemoryPlanInputs& in) {
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
  s.layer_params = s.d * s.hq + 2 * s.d * s.hkv + s.hq * s.d + 3 * s.d * s.f + 2 * s.d;
  if (c.attention_bias) s.layer_params += s.hq + 2 * s.hkv;
  if (c.o_proj_bias) s.layer_params += s.d;
  if (c.mlp_bias) s.layer_params += 2 * s.f + s.d;
  s.root_params = s.v * s.d * (s.tied ? 1 : 2) + s.d;
  // peft LoRA: A (r x in) and B (out x r) per adapted linear.
  if (in.lora_rank > 0) {
    s.lora = lora_targets_of(in);
    const LoraTargets& t = s.lora;
    const int64_t io = (t.q ? s.d + s.hq : 0) + (t.k ? s.d + s.hkv : 0) + (t.v ? s.d + s.hkv : 0) +
                       (t.o ? s.hq + s.d : 0) + (t.gate ? s.d + s.f : 0) + (t.up ? s.d + s.f : 0) +
                       (t.down ? s.f + s.d : 0);
    s.lora_layer_params = in.lora_rank * io;
  }
  return s;
}

// Bytes of one unit's FlatParameter pieces on this rank.
struct Unit {
  int64_t numel = 0, padded = 0, shard = 0;
};
Unit unit_of(int64_t numel, int shard_world) {
  Unit u;
  u.numel = numel;
  u.shard = ceil_div(numel, shard_world);
  u.padded = u.shard * shard_world;
  return u;
}

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

}  // namespace

MemoryPlan plan_memory(const MemoryPlanInputs& in) {
  const auto& c = in.config;
  ALPACA_CHECK(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.vocab_size > 0 && c.num_attention_heads > 0,
               "estimate-memory: the model config has no shape (hidden_size, num_hidden_layers, vocab_size, "
               "num_attention_heads must be positive)");
  ALPACA_CHECK(in.micro_batch > 0 && in.seq_len > 0 && in.num_ranks > 0,
               "estimate-memory: micro-batch, sequence length and ranks must be positive");
  const Shape s = shape_of(in);
  const bool lora = in.lora_rank > 0;
  const int64_t bp = bytes_of(in.param_dtype), br = bytes_of(in.reduce_dtype);
  const int64_t b = bp;  // activations are in the compute (param) dtype
  const bool f32route = !in.gpu && in.param_dtype == at::kBFloat16 && in.cpu_bf16_via_fp32;
  const int64_t n_tok = in.micro_batch * in.seq_len;

  int shard_world = in.num_ranks;
  if (in.strategy == fsdp::ShardingStrategy::kNoShard) shard_world = 1;
  if (in.strategy == fsdp::ShardingStrategy::kHybridShard)
    shard_world = in.hybrid_shard_size > 0 ? in.hybrid_shard_size : std::max(1, in.ranks_per_node);
  const bool reshard_fwd =
      in.strategy == fsdp::ShardingStrategy::kFullShard || in.strategy == fsdp::ShardingStrategy::kHybridShard;
  const bool wrapped = in.auto_wrap;

  // ---- Units: decoder layers and the root (everything, when not auto-wrapped).
  const int64_t layer_train = lora ? s.lora_layer_params : s.layer_params;
  const int64_t layer_frozen = lora ? s.layer_params : 0;
  // LoRA: the root trains only the tables in modules_to_save (a tied table is one tensor).
  const bool embed_trains = !lora || s.lora.embed, lm_head_trains = !lora || s.lora.lm_head;
  const int64_t table = s.v * s.d;
  const int64_t root_tables_train =
      !lora ? s.root_params : (s.tied ? (embed_trains ? table : 0) : (embed_trains ? table : 0) + (lm_head_trains ? table : 0));
  // The added rows of each frozen table train as a trainable-token delta (one shared when tied).
  const int64_t token_deltas = !lora ? 0 : (s.tied ? (embed_trains ? 0 : 1) : (embed_trains ? 0 : 1) + (lm_head_trains ? 0 : 1));
  const int64_t root_own_train = root_tables_train + token_deltas * in.lora_token_rows * s.d;
  const int64_t root_train = root_own_train + (wrapped ? 0 : s.layers * layer_train);
  const int64_t root_frozen = (s.root_params - root_tables_train) + (wrapped ? 0 : s.layers * layer_frozen);
  const int64_t n_layer_units = wrapped ? s.layers : 0;
  const Unit lt = unit_of(layer_train, shard_world), lf = unit_of(layer_frozen, shard_world);
  const Unit rt = unit_of(root_train, shard_world), rf = unit_of(root_frozen, shard_world);

  // Model states (fp32 master of every parameter, fp32 gradient and AdamW moments of trainable ones).
  const int64_t train_shard = n_layer_units * lt.shard + rt.shard;
  const int64_t frozen_shard = n_layer_units * lf.shard + rf.shard;
  // Frozen (LoRA base) weights are stored in param_dtype only: no master, gradient or moments.
  const int64_t master = 4 * train_shard + bp * frozen_shard, grads = 4 * train_shard, moments = 8 * train_shard;
  // Gathered units in param_dtype, full gradients in reduce_dtype.
  const int64_t layer_full = (lt.padded + lf.padded) * bp, layer_grad = lt.padded * br;
  const int64_t root_full = (rt.padded + rf.padded) * bp, root_grad = rt.padded * br;

  // ---- Activations saved for backward, per token of one decoder layer (layers.cpp, sdpa).
  // RMSNorm saves its fp32 input (the input itself in fp32, an upcast copy otherwise) and the
  // normalised value before the weight; its output is saved by the linears that read it.
  // bf16 on CPU takes the fused kernels (model/fused_ops.h): an RMSNorm saves its bf16 input and one
  // fp32 scale per token, SiLU*mul its two inputs (no silu(gate)).
  const bool fused = !in.gpu && in.param_dtype == at::kBFloat16;
  const int64_t fused_norm = 2 * s.d + 4;
  const int64_t norm_saved = fused ? fused_norm : (b == 4 ? 8 : 4 + 2 * b) * s.d;
  int64_t act_tok = 0, first_layer_less = 0;
  if (!lora) {
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
    if (!embed_trains) first_layer_less = fused ? fused_norm : 4 * s.d;
  }
  const int64_t act_layer = act_tok * n_tok;
  const int64_t ckpt_layer = b * s.d * n_tok;  // checkpointing keeps each layer's input only
  const int64_t saved_layers =
      in.checkpointing ? s.layers * ckpt_layer : s.layers * act_layer - first_layer_less * n_tok;
  const int64_t context = 2 * s.dh * b * n_tok + 8 * in.seq_len * s.dh;  // RoPE cos/sin (+ fp32 angles)

  // ---- Fused head loss (loss.cpp): logits of `chunk` rows at a time, no (B, T, V) tensor.
  const int64_t chunk = std::min(std::max<int64_t>(1, (int64_t{1} << 23) / s.v), n_tok);
  const int64_t grad_h = n_tok * s.d * b;
  const int64_t grad_w32 = lm_head_trains ? s.v * s.d * 4 : 0;
  const int64_t grad_w_saved = lm_head_trains ? s.v * s.d * bp : 0;
  int64_t loss_fwd_extra = 0;  // transient buffers of the loss forward, at their largest
  if (b == 4) {
    loss_fwd_extra = 4 * chunk * s.v + 8 * chunk * s.d;
  } else if (f32route) {
    loss_fwd_extra = 4 * s.v * s.d /* fp32 copy of lm_head */ + 4 * chunk * s.v + 10 * chunk * s.d;
  } else {
    // bf16 logits, their fp32 copy, the bf16 gradient and the lm_head gradient product; a CPU
    // (oneDNN) GEMM also copies its transposed bf16 operand (the logits gradient) contiguous.
    loss_fwd_extra = std::max(6 * chunk * s.v + (lm_head_trains ? 2 * s.v * s.d : 0) +
                                  (in.gpu || !lm_head_trains ? 0 : 2 * chunk * s.v),
                              lm_head_trains ? 2 * s.v * s.d : int64_t{0});  // grad_w cast at the end
  }
  // A frozen norm weight (LoRA) keeps no normalised value.
  const int64_t final_norm_fwd = fused ? (2 * b * s.d + 4) * n_tok  // input, output, scale
                                       : ((b == 4 ? 12 : 10) - (lora ? b : 0)) * s.d * n_tok;  // input, fp32 view, normalised, output
  const int64_t final_norm_bwd = fused ? fused_norm * n_tok : ((b == 4 ? 8 : 6) - (lora ? b : 0)) * s.d * n_tok;

  // ---- Backward temporaries inside one layer: MLP gradients (three (B,T,F) at once), the
  // gradient of the hidden state flowing down (two (B,T,D)), one weight gradient before it is
  // moved into the unit's flat gradient; on the CPU fp32 GEMM route the fp32 copies of the largest
  // linear's operands and results.
  int64_t layer_bwd_tmp = 3 * b * s.f * n_tok + 2 * b * s.d * n_tok + (lora ? 0 : s.d * s.f * bp);
  if (f32route) layer_bwd_tmp += 8 * s.f * n_tok + (lora ? 4 : 8) * s.d * s.f;

  // Gathered units during a layer's backward: the layer, plus a prefetched one (at most two under
  // limit_all_gathers); unsharded strategies keep every layer and the root until its backward.
  const bool bwd_prefetch = in.backward_prefetch != fsdp::BackwardPrefetch::kNone;
  // A unit with frozen weights (LoRA) stays gathered until backward reaches the unit before it.
  const int64_t gathered_bwd =
      reshard_fwd ? layer_full * (((bwd_prefetch || lora) && s.layers > 1) ? 2 : 1) : layer_full * s.layers + root_full;
  const int64_t gathered_fwd_layers = reshard_fwd ? 0 : layer_full * s.layers;
  // Reduce-scatter staging of a 16-bit gradient over MPI (fp32 send copy + fp32 receive), CPU ranks.
  // Then the reduced shard is added into the fp32 gradient (an fp32 copy first when 16-bit).
  const auto rs_staging = [&](const Unit& u) -> int64_t {
    const int64_t to_fp32 = br == 4 ? 0 : 4 * u.shard;
    if (shard_world == 1) return to_fp32;  // the full gradient is the shard: no output buffer
    if (in.gpu || br == 4) return u.shard * br + to_fp32;
    return 4 * (u.padded + u.shard) + to_fp32;
  };

  // ---- Where the states live. Offload: host (pinned) on GPU ranks; CPU ranks have one memory.
  const bool states_on_device = !in.offload || !in.gpu;

  struct Moment {
    std::string name;
    std::vector<MemoryItem> items;
  };
  auto states_items = [&](std::vector<MemoryItem>& it) {
    if (states_on_device) {
      add(it, lora ? "master shards (fp32 adapters, param_dtype frozen base)" : "fp32 master shards", master);
      add(it, "fp32 gradient shards", grads);
      add(it, "AdamW moment shards (exp_avg, exp_avg_sq)", moments);
    }
  };
  // What is alive from the end of forward until backward leaves the head: model states, the
  // gathered root and kept layers, saved activations (or checkpointed inputs), RoPE tables.
  auto forward_state_items = [&](std::vector<MemoryItem>& items) {
    states_items(items);
    add(items, "gathered root unit (embeddings, norm, lm_head) in param_dtype", root_full);
    add(items, "gathered decoder layers kept after forward (no reshard)", gathered_fwd_layers);
    add(items, in.checkpointing ? "checkpointed layer inputs" : "saved activations, all layers", saved_layers);
    add(items, "RoPE tables", context);
  };
  std::vector<Moment> moments_list;
  {
    Moment m{"forward at the loss", {}};
    forward_state_items(m.items);
    add(m.items, "final norm (input, fp32, output)", final_norm_fwd);
    add(m.items, "fused loss: hidden gradient", grad_h);
    add(m.items, "fused loss: fp32 lm_head gradient", grad_w32);
    add(m.items, "fused loss: logits chunk and temporaries", loss_fwd_extra);
    moments_list.push_back(std::move(m));
  }
  {
    Moment m{"backward at the head", {}};
    forward_state_items(m.items);
    add(m.items, "final norm (saved)", final_norm_bwd);
    add(m.items, "fused loss: hidden gradient", grad_h);
    add(m.items, "fused loss: lm_head gradient", grad_w_saved);
    add(m.items, "root full gradient (reduce_dtype)", root_grad);
    moments_list.push_back(std::move(m));
  }
  {
    Moment m{"backward in a decoder layer", {}};
    states_items(m.items);
    add(m.items, "root full gradient (reduce_dtype)", root_grad);
    add(m.items, "gathered units during backward (layer + prefetch; unsharded strategies: all)", gathered_bwd);
    if (in.checkpointing) {
      add(m.items, "checkpointed layer inputs", saved_layers);
      add(m.items, "one recomputed layer's activations", act_layer);
    } else {
      add(m.items, "saved activations, remaining layers", saved_layers);
    }
    add(m.items, "RoPE tables", context);
    add(m.items, "layer full gradients (this + one reduce-scatter in flight)",
        layer_grad * (s.layers > 1 ? 2 : 1) + rs_staging(lt));
    add(m.items, "layer backward temporaries", layer_bwd_tmp);
    moments_list.push_back(std::move(m));
  }
  {
    Moment m{"end of backward (root reduce-scatter)", {}};
    states_items(m.items);
    add(m.items, "root full gradient (reduce_dtype)", root_grad);
    add(m.items, "embedding gradient / root reduce-scatter staging",
        std::max(embed_trains ? s.v * s.d * b + b * s.d * n_tok : 0, rs_staging(rt)));
    moments_list.push_back(std::move(m));
  }
  size_t peak = 0;
  for (size_t i = 1; i < moments_list.size(); ++i)
    if (sum_device(moments_list[i].items) > sum_device(moments_list[peak].items)) peak = i;

  MemoryPlan plan;
  for (const auto& m : moments_list) plan.moments.push_back({m.name, sum_device(m.items), 0});
  plan.peak_moment = moments_list[peak].name;
  plan.breakdown = moments_list[peak].items;
  plan.device_allocated_bytes = sum_device(plan.breakdown);
  plan.activations_per_layer_bytes = act_layer;
  plan.checkpointed_per_layer_bytes = ckpt_layer;
  plan.loss_chunk_bytes = 4 * chunk * s.v;

  // Host side of the same moment, and what a GPU needs beyond allocated tensors.
  if (!states_on_device) {
    add(plan.breakdown, lora ? "master shards (offloaded, pinned)" : "fp32 master shards (offloaded, pinned)", 0, master);
    add(plan.breakdown, "fp32 gradient shards (offloaded, pinned)", 0, grads);
    add(plan.breakdown, "AdamW moment shards (offloaded, pinned)", 0, moments);
    // The engine stages the trainable shards in param_dtype (pinned) for their copies to the GPU.
    if (in.gpu && bp != 4) add(plan.breakdown, "param_dtype staging of the trainable shards (pinned)", 0, bp * train_shard);
  }
  if (in.gpu) {
    const int64_t margin = static_cast<int64_t>(kAllocatorMargin * static_cast<double>(plan.device_allocated_bytes));
    add(plan.breakdown, "caching allocator margin (10% of allocated)", margin);
    add(plan.breakdown, "CUDA context, cuBLAS workspace, NCCL buffers", kCudaContextBytes);
    plan.device_total_bytes = plan.device_allocated_bytes + margin + kCudaContextBytes;
  } else {
    plan.device_total_bytes = plan.device_allocated_bytes;
  }
  const int64_t largest_unit = std::max(rt.numel + rf.numel, lt.numel + lf.numel);
  add(plan.breakdown, "checkpoint export staging (one unit in fp32)", 0, 4 * largest_unit);
  add(plan.breakdown, "process baseline (LibTorch, communicator, tokenized data)", 0,
      in.gpu ? kHostBaselineGpu : kHostBaselineCpu);
  int64_t host = 0;
  for (const auto& i : plan.breakdown) host += i.host_bytes;
  plan.host_total_bytes = host + (in.gpu ? 0 : plan.device_allocated_bytes);
  const int per_node = std::max(1, std::min(in.ranks_per_node, in.num_ranks));
  plan.host_node_bytes = plan.host_total_bytes * per_node;
  plan.fits_device = !in.gpu || in.device_memory_bytes <= 0 || plan.device_total_bytes <= in.device_memory_bytes;
  plan.fits_host = in.host_memory_bytes <= 0 || plan.host_node_bytes <= in.host_memory_bytes;

  // ---- DeepSpeed's ZeRO-3 estimator (zero_init, additional_buffer_factor 1.5), for comparison.
  DeepSpeedEstimate& ds = plan.deepspeed;
  ds.total_params = s.root_params + s.layers * (s.layer_params + s.lora_layer_params);
  ds.largest_layer_params = std::max({s.v * s.d, s.d * s.f, s.d * s.hq});
  const int gpus_per_node = per_node;
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
  return plan;
}

int64_t largest_fitting_micro_batch(MemoryPlanInputs in, int64_t limit) {
  if (!(in.gpu && in.device_memory_bytes > 0) && in.host_memory_bytes <= 0) return -1;  // nothing to fit in
  auto fits = [&](int64_t mb) {
    in.micro_batch = mb;
    return plan_memory(in).fits();
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
  auto rung = [&](const std::string& name, bool offload, bool ckpt, int64_t lora_rank) {
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
    r.plan = plan_memory(r.inputs);
    r.max_micro_batch = largest_fitting_micro_batch(r.inputs);
    rungs.push_back(std::move(r));
  };
  rung("full_shard", false, false, 0);
  rung("full_shard + offload", true, false, 0);
  rung("full_shard + offload + gradient_checkpointing", true, true, 0);
  rung("LoRA r=16 (+ gradient_checkpointing)", false, true, 16);
  rung("LoRA r=16 + offload (+ gradient_checkpointing)", true, true, 16);
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
    for (const auto& t : in.lora_target_modules) targets += " " + t;
    for (const auto& t : in.lora_modules_to_save) saved += " " + t;
    os << "  LoRA r=" << in.lora_rank << " on" << (targets.empty() ? " q_proj v_proj" : targets) << ", dropout "
       << in.lora_dropout << (saved.empty() ? "" : ", modules_to_save" + saved) << "\n";
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
  os << "  (LoRA rungs: peft's defaults, r=16 on q_proj v_proj, dropout 0.05)\n";
  if (rungs.empty() || rungs.front().max_micro_batch < 0)
    os << "  (max batch needs a memory size: --gpu_memory_gb, or --host_memory_gb for CPU ranks)\n";
  return os.str();
}

}  // namespace alpaca::plan
