// QLoRA under the FSDP engine (policy.quant4_type, --load_in_4bit), under real mpirun (worlds 1,
// 2, 4): the decoder layers' frozen linear weights are held as bitsandbytes' 4-bit bytes + scales,
// sharded as bytes, and dequantized into param_dtype whenever a unit is unsharded. Training matches
// a plain single-process LibTorch loop whose frozen linears hold dequantize(quantize(W)) (the
// quantizer is byte-exact with bitsandbytes: tests/model/test_quant4.cpp) for every strategy, with
// offload and checkpointing; the export gives those dequantized weights bitwise; the per-rank frozen
// bytes are the 4-bit formula over N (about 4.13 bits a weight with nested quantization).
#include <gtest/gtest.h>

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <iostream>
#include <map>

#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/model/quant4.h"
#include "alpaca/optim/grad_clip.h"
#include "fsdp_test_env.h"
#include "llama_reference.h"
#include "model_test_util.h"

namespace alpaca::testing::test_fsdp_qlora {
namespace {

const auto* g_env = register_job_comm(fsdp_job_options());

constexpr int64_t kVocab = 37;

// 32 x 44 = 22 blocks of 64: rows and blocks do not line up.
model::LlamaConfig tiny() { return llama_config({kVocab, 32, 44, 3, 4, 2, 8, 32}); }

bool quantized(const std::string& name, const at::Tensor& p) {
  return !p.requires_grad() && name.find("layers.") != std::string::npos && p.dim() == 2 && name.ends_with("proj.weight");
}

model::LlamaForCausalLM make(bool dequantized_base, bool nested) {
  model::LlamaForCausalLM m(tiny());
  model::init_weights(m, 11);
  model::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.dropout = 0.0;
  o.target_modules = {"q_proj", "v_proj", "down_proj"};
  model::apply_lora(*m, o, 5);
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(9);
  for (auto& item : m->named_parameters(true)) {
    if (item.key().ends_with("lora_B.weight")) item.value().normal_(0.0, 0.1, gen);  // A trains from step 1
    if (dequantized_base && quantized(item.key(), item.value())) {
      const auto q = model::quantize_4bit(item.value(), {model::Quant4Type::kNf4, 64, nested});
      item.value().copy_(model::dequantize_4bit(q.packed, q.state, at::kFloat));
    }
  }
  return m;
}

// Plain LibTorch on the dequantized base: the whole global batch, torch AdamW on the adapters.
ParamMap reference(int steps, bool nested) {
  model::LlamaForCausalLM m = make(/*dequantized_base=*/true, nested);
  std::vector<at::Tensor> trainable = trainable_parameters(m);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
  return run_llama_reference(m, opt, trainable, make_global_batch(kVocab, kGlobal, kSeqLen, 5), steps, kMaxNorm);
}

std::unique_ptr<fsdp::FsdpLlama> train(const FsdpPolicy& policy, int accum, int steps) {
  auto f = fsdp::apply_fsdp(make(/*dequantized_base=*/false, policy.quant4_nested), job_comm(), policy);
  fsdp::FsdpEngine& eng = f->engine();
  optim::ShardedAdamW opt(eng.optim_shards(), optim::AdamWOptions{0.9, 0.999, 1e-8, kWd});
  dist::Communicator& comm = *job_comm();
  const int world = comm.world_size(), rank = comm.rank();
  GlobalBatch b = make_global_batch(kVocab, kGlobal, kSeqLen, 5);
  const int64_t tokens = (b.labels_bt.narrow(1, 1, kSeqLen - 1) != -100).sum().item<int64_t>();
  const int64_t mb = kGlobal / (world * accum);
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < accum; ++k) {
      const int64_t start = (static_cast<int64_t>(k) * world + rank) * mb;
      auto ls = model::causal_lm_loss_sum(f->forward(b.ids_bt.narrow(0, start, mb)), b.labels_bt.narrow(0, start, mb));
      (ls.sum / static_cast<double>(tokens)).backward();
    }
    optim::clip_grad_norm(eng.grad_shards(), kMaxNorm, eng.norm_comm());
    opt.step(kLr);
    eng.zero_grad();
  }
  return f;
}

}  // namespace

TEST(FsdpQlora, TrainingMatchesTheDequantizedBaseForEveryStrategy) {
  const int world = job_comm()->world_size();
  struct C { ShardingStrategy s; int accum; bool ckpt, offload, nested; };
  std::vector<C> cases = {{ShardingStrategy::kFullShard, 1, true, false, true},
                          {ShardingStrategy::kFullShard, 2, false, true, false},
                          {ShardingStrategy::kShardGradOp, 2, true, true, true},
                          {ShardingStrategy::kNoShard, 1, false, false, true}};
  if (world == 4) cases.push_back({ShardingStrategy::kHybridShard, 2, true, false, true});
  const ParamMap ref_nested = reference(3, true), ref_plain = reference(3, false);
  for (const C& c : cases) {
    FsdpPolicy p;
    p.strategy = c.s;
    p.activation_checkpointing = c.ckpt;
    p.offload = c.offload;
    p.hybrid_shard_size = 2;
    p.quant4_type = "nf4";
    p.quant4_nested = c.nested;
    const std::string what = std::string(fsdp::to_string(c.s)) + (c.ckpt ? " ckpt" : "") + (c.offload ? " offload" : "") +
                             (c.nested ? " nested" : "");
    auto f = train(p, c.accum, 3);
    ParamMap got;
    f->engine().export_full_state([&](const std::string& n, const at::Tensor& t) { got[n] = t; }, /*all_ranks=*/true);
    const ParamMap& ref = c.nested ? ref_nested : ref_plain;
    const ParamMap init = [&] {
      ParamMap m;
      for (const auto& q : make(true, c.nested)->named_parameters()) m[q.key()] = q.value().detach().clone();
      return m;
    }();
    ASSERT_EQ(got.size(), ref.size()) << what;
    double worst = 0;
    int n_quantized = 0;
    for (const auto& [n, w] : ref) {
      if (!model::is_lora_param(n)) {  // frozen: bitwise the dequantized 4-bit base (norms: as loaded)
        EXPECT_TRUE(at::equal(got.at(n), init.at(n))) << what << " frozen " << n;
        n_quantized += n.find("layers.") != std::string::npos && n.ends_with("proj.weight");
        continue;
      }
      EXPECT_FALSE(at::equal(w, init.at(n))) << n << " did not train in the reference";
      const double e = (got.at(n) - w).abs().max().item<double>() / w.abs().max().item<double>();
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << what << " " << n;
    }
    EXPECT_EQ(n_quantized, 3 * 7);
    const fsdp::MemoryAccount acc = f->engine().memory_account();
    EXPECT_EQ(acc.quant4_params, 3 * (2 * 32 * 32 + 2 * 16 * 32 + 3 * 32 * 44)) << what;  // q o, k v, mlp
    if (job_comm()->rank() == 0) std::cout << "[qlora] world " << world << " " << what << ": worst " << worst << "\n";
  }
}

TEST(FsdpQlora, PerRankFrozenBytesAreTheFourBitFormulaOverN) {
  // A ~100M-parameter LLaMA on the meta device (the counters are what is tested), bf16 compute,
  // LoRA r = 16 on every linear but lm_head, nested NF4.
  const int world = job_comm()->world_size();
  const model::LlamaConfig c = llama_100m();
  for (bool nested : {true, false}) {
    model::LlamaForCausalLM m(c, at::TensorOptions().device(at::kMeta));
    model::LoraOptions o;
    o.r = 16;
    o.target_modules = {"all-linear"};
    model::apply_lora(*m, o, 1);
    int64_t formula = 0, raw = 0, quant_params = 0, root_frozen = 0;
    for (const auto& p : m->named_parameters()) {
      if (p.value().requires_grad()) continue;
      if (quantized(p.key(), p.value())) {
        formula += model::quant4_bytes(p.value().numel(), {model::Quant4Type::kNf4, 64, nested});
        quant_params += p.value().numel();
      } else if (p.key().find("layers.") != std::string::npos) {
        raw += 2 * p.value().numel();  // norms, bf16
      } else {
        root_frozen += p.value().numel();
      }
    }
    FsdpPolicy p;
    p.param_dtype = at::kBFloat16;
    p.reduce_dtype = at::kBFloat16;
    p.sync_module_states = false;
    p.quant4_type = "nf4";
    p.quant4_nested = nested;
    auto f = fsdp::apply_fsdp(std::move(m), job_comm(), p);
    const fsdp::MemoryAccount acc = f->engine().memory_account();
    EXPECT_EQ(acc.quant4_params, quant_params);
    // The root's frozen tables stay bf16, sharded as before; the layers' blob is the formula, plus
    // 4-byte alignment of each region (the nested offset floats are metadata) and the padding to
    // 4 x world bytes, over N.
    const int64_t root_bytes = (root_frozen + world - 1) / world * 2;
    const int64_t layers = acc.frozen_bytes - root_bytes, all_ranks = layers * world;
    const int64_t offsets = nested ? 8 * 7 * 4 : 0;          // formula's offset floats: metadata here
    const int64_t slack = 8 * (7 * 3 * 3 + 2 * 3 + 4 * world);  // alignment + padding, per unit
    EXPECT_GE(all_ranks, formula + raw - offsets) << "nested " << nested;
    EXPECT_LE(all_ranks, formula + raw - offsets + slack) << "nested " << nested;
    const double expected = static_cast<double>(formula + raw) / world;
    const double bits = 8.0 * static_cast<double>(all_ranks - raw) / static_cast<double>(quant_params);
    EXPECT_NEAR(bits, nested ? 4.127 : 4.5, 0.01);
    if (job_comm()->rank() == 0)
      std::cout << "[qlora] world " << world << (nested ? " nested" : " plain") << ": " << bits
                << " bits a 4-bit weight; frozen layer bytes a rank " << layers << " (formula " << expected << ")\n";
  }
}

}  // namespace alpaca::testing::test_fsdp_qlora
