// The single-process reference the FSDP LLaMA tests compare with (test_fsdp_llama, test_fsdp_lora,
// test_fsdp_qlora): plain LibTorch on the whole global batch, the loss over its label tokens after
// the causal shift, clip at max_norm, then the caller's torch optimizer. Also the sharding cases
// those tests train the engine with.
#pragma once

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/loss.h"
#include "alpaca/optim/adamw.h"
#include "alpaca/optim/grad_clip.h"
#include "fsdp_test_env.h"

namespace alpaca::testing {

using ParamMap = std::map<std::string, at::Tensor>;
using fsdp::FsdpPolicy;
using fsdp::ShardingStrategy;

// The training setup the three tests share: a global batch of kGlobal sequences of kSeqLen
// tokens, AdamW's learning rate and weight decay, and the clip norm.
constexpr int64_t kGlobal = 8, kSeqLen = 7;
constexpr double kLr = 5e-3, kWd = 0.05, kMaxNorm = 1.0;

// Runs `steps` optimizer steps on `m` and returns every parameter by name. `clip` are the tensors
// whose global norm is clipped (the trainable ones).
inline ParamMap run_llama_reference(model::LlamaForCausalLM& m, torch::optim::Optimizer& opt,
                                    const std::vector<at::Tensor>& clip, const GlobalBatch& b, int steps,
                                    double max_norm) {
  const int64_t seq_len = b.labels_bt.size(1);
  const int64_t tokens = (b.labels_bt.narrow(1, 1, seq_len - 1) != -100).sum().item<int64_t>();
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto ls = model::causal_lm_loss_sum(m->forward(b.ids_bt), b.labels_bt);
    (ls.sum / static_cast<double>(tokens)).backward();
    torch::nn::utils::clip_grad_norm_(clip, max_norm);
    opt.step();
  }
  ParamMap out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// The trainable parameters of `m` (what LoRA's reference optimizes and clips).
inline std::vector<at::Tensor> trainable_parameters(model::LlamaForCausalLM& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// The same steps on the sharded engine: each rank takes its micro-batches of the same global batch
// (micro-batch k * world + rank in accumulation step k), the loss over the global label-token
// count, the clip across the shards at max_norm, then the sharded AdamW at lr.
inline void train_fsdp_steps(fsdp::FsdpLlama& sharded, optim::ShardedAdamW& opt, const GlobalBatch& b, int accum,
                             int steps, double lr, double max_norm, dist::Communicator& comm) {
  fsdp::FsdpEngine& eng = sharded.engine();
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t seq_len = b.labels_bt.size(1);
  const int64_t tokens = (b.labels_bt.narrow(1, 1, seq_len - 1) != -100).sum().item<int64_t>();
  const int64_t mb = b.ids_bt.size(0) / (world * accum);
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < accum; ++k) {
      const int64_t start = (static_cast<int64_t>(k) * world + rank) * mb;
      auto ls = model::causal_lm_loss_sum(sharded.forward(b.ids_bt.narrow(0, start, mb)), b.labels_bt.narrow(0, start, mb));
      (ls.sum / static_cast<double>(tokens)).backward();
    }
    optim::clip_grad_norm(eng.grad_shards(), max_norm, eng.norm_comm());
    opt.step(lr);
    eng.zero_grad();
  }
}

// One engine configuration the FSDP LLaMA tests compare with the reference: a strategy, the
// gradient accumulation it trains with, activation checkpointing and CPU offload.
struct StrategyCase {
  fsdp::ShardingStrategy strategy;
  int accum;
  bool ckpt, offload;
  std::string name() const {
    return std::string(fsdp::to_string(strategy)) + (ckpt ? " ckpt" : "") + (offload ? " offload" : "");
  }
};

// Every strategy once, with accumulation, checkpointing and offload each on somewhere; hybrid
// shards (groups of 2) at world 4 only.
inline std::vector<StrategyCase> strategy_cases(int world) {
  std::vector<StrategyCase> cases = {{ShardingStrategy::kFullShard, 1, true, false},
                                     {ShardingStrategy::kFullShard, 2, false, true},
                                     {ShardingStrategy::kShardGradOp, 2, true, true},
                                     {ShardingStrategy::kNoShard, 1, false, false}};
  if (world == 4) cases.push_back({ShardingStrategy::kHybridShard, 2, true, false});
  return cases;
}

inline fsdp::FsdpPolicy policy_of(const StrategyCase& c) {
  fsdp::FsdpPolicy p;
  p.strategy = c.strategy;
  p.activation_checkpointing = c.ckpt;
  p.offload = c.offload;
  p.hybrid_shard_size = 2;
  p.backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre;
  return p;
}

}  // namespace alpaca::testing
