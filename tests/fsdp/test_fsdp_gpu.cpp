// The engine on a GPU (NCCL backend, one rank per GPU; skipped without CUDA): fp32 training on
// cuda matches the CPU reference, and bf16 with offload (pinned host shards, CPU AdamW) and
// activation checkpointing follows the fp32 loss curve within 2%.
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include <iostream>

#include "alpaca/dist/runtime.h"
#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/optim/grad_clip.h"
#include "fsdp_test_env.h"

namespace alpaca::testing {
namespace {

model::LlamaConfig tiny() {
  model::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.mlp_bias = true;
  return c;
}

// Losses of `steps` AdamW steps on the global batch; comm == nullptr: plain CPU loop.
std::vector<double> losses(std::shared_ptr<dist::Communicator> comm, const fsdp::FsdpPolicy& policy, int steps) {
  model::LlamaForCausalLM m(tiny());
  model::init_weights(m, 3);
  GlobalBatch b = make_global_batch(64, 8, 16, 9);
  const int64_t tokens = (b.labels_bt.narrow(1, 1, 15) != -100).sum().item<int64_t>();
  std::vector<double> out;
  if (!comm) {
    std::vector<optim::OptimShard> shards;
    for (const auto& p : m->parameters()) {
      p.mutable_grad() = at::zeros_like(p);
      shards.push_back({p.detach().view({-1}), p.mutable_grad().view({-1}), {{0, p.numel(), true}}});
    }
    optim::ShardedAdamW opt(shards, optim::AdamWOptions{});
    for (int s = 0; s < steps; ++s) {
      auto ls = model::causal_lm_loss_sum(m->forward(b.ids_bt), b.labels_bt);
      at::Tensor loss = ls.sum / static_cast<double>(tokens);
      loss.backward();
      opt.step(1e-3);
      for (const auto& p : m->parameters()) p.mutable_grad().zero_();
      out.push_back(loss.item<double>());
    }
    return out;
  }
  auto f = fsdp::apply_fsdp(m, comm, policy);
  optim::ShardedAdamW opt(f->engine().optim_shards(), optim::AdamWOptions{});
  const int64_t mb = 8 / comm->world_size();
  for (int s = 0; s < steps; ++s) {
    at::Tensor ids = b.ids_bt.narrow(0, comm->rank() * mb, mb), labels = b.labels_bt.narrow(0, comm->rank() * mb, mb);
    auto ls = model::causal_lm_loss_sum(f->forward(ids), labels.to(comm->device()));
    at::Tensor loss = ls.sum / static_cast<double>(tokens);
    loss.backward();
    at::Tensor l = loss.detach().to(at::kDouble).reshape({1});
    comm->all_reduce(l, dist::ReduceOp::kSum)->wait();
    opt.step(1e-3);
    f->engine().zero_grad();
    out.push_back(l.cpu().item<double>());
  }
  return out;
}

TEST(FsdpGpu, CudaTrainingMatchesCpuReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  dist::init();
  dist::CommOptions opts;
  opts.cuda = true;
  auto comm = dist::make_communicator(opts);
  ASSERT_TRUE(comm->device().is_cuda());
  const std::vector<double> ref = losses(nullptr, {}, 10);
  fsdp::FsdpPolicy fp32;
  fp32.backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre;
  fp32.forward_prefetch = true;
  const std::vector<double> got = losses(comm, fp32, 10);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-4 * ref[i]) << "fp32 step " << i;
  fsdp::FsdpPolicy bf16 = fp32;
  bf16.param_dtype = bf16.reduce_dtype = at::kBFloat16;
  bf16.offload = true;
  bf16.activation_checkpointing = true;
  const std::vector<double> low = losses(comm, bf16, 10);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_LE(std::abs(low[i] - ref[i]) / ref[i], 0.02) << "bf16 step " << i;
  if (comm->rank() == 0)
    std::cout << "[gpu] loss " << ref.front() << " -> " << ref.back() << " (cpu fp32), " << got.back() << " (cuda fp32), "
              << low.back() << " (cuda bf16 offload ckpt)\n";
  comm.reset();
  dist::finalize();
}

}  // namespace
}  // namespace alpaca::testing
