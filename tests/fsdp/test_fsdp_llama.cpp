// FsdpLlama (the engine on the project's LlamaForCausalLM) under real mpirun: 3 optimizer steps
// with the real model equal a plain single-process LibTorch loop on the full global batch; the
// exported state has exactly the HF names; loading by byte ranges / from rank 0 and optimizer
// state by name round-trip.
#include <gtest/gtest.h>

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>

#include "alpaca/dist/runtime.h"
#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/fsdp/load_checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "test_util.h"
#include "alpaca/optim/grad_clip.h"
#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"
#include "fsdp_test_env.h"
#include "llama_reference.h"
#include "model_test_util.h"

namespace alpaca::testing::test_fsdp_llama {
namespace {

const auto* g_env = register_job_comm(fsdp_job_options());

model::LlamaConfig tiny(bool tied) {
  model::LlamaConfig c = llama_config({37, 16, 22, 3, 4, 2, 4, 32});
  c.tie_word_embeddings = tied;
  // MLP biases exercise the no-decay mask inside one flat buffer. (Not k_proj.bias: softmax makes
  // its gradient exactly zero, so Adam turns rounding noise into sign(noise) * lr updates.)
  c.mlp_bias = true;
  return c;
}

model::LlamaForCausalLM make(bool tied) {
  model::LlamaForCausalLM m(tiny(tied));
  model::init_weights(m, 11);
  return m;
}

ParamMap reference(bool tied, int steps) {
  model::LlamaForCausalLM m = make(tied);
  std::vector<at::Tensor> decay, no_decay, all;
  for (const auto& p : m->named_parameters()) {
    all.push_back(p.value());
    (fsdp::hf_no_weight_decay(p.key()) ? no_decay : decay).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(kWd)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(kLr).weight_decay(0)));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(kLr));
  return run_llama_reference(m, opt, all, make_global_batch(37, kGlobal, kSeqLen, 5), steps, kMaxNorm);
}

struct TrainRun {
  std::unique_ptr<fsdp::FsdpLlama> fsdp;
  std::unique_ptr<optim::ShardedAdamW> opt;
};

void train_steps(TrainRun& r, int accum, int steps, dist::Communicator& comm);

TrainRun train(bool tied, const FsdpPolicy& policy, int accum, int steps) {
  TrainRun r;
  r.fsdp = fsdp::apply_fsdp(make(tied), job_comm(), policy);
  r.opt = std::make_unique<optim::ShardedAdamW>(r.fsdp->engine().optim_shards(), optim::AdamWOptions{0.9, 0.999, 1e-8, kWd});
  train_steps(r, accum, steps, *job_comm());
  return r;
}

void train_steps(TrainRun& r, int accum, int steps, dist::Communicator& comm) {
  train_fsdp_steps(*r.fsdp, *r.opt, make_global_batch(37, kGlobal, kSeqLen, 5), accum, steps, kLr, kMaxNorm, comm);
}

ParamMap exported(fsdp::FsdpEngine& eng) {
  ParamMap out;
  eng.export_full_state([&](const std::string& n, const at::Tensor& t) { out[n] = t; }, /*all_ranks=*/true);
  return out;
}

void expect_close(const ParamMap& got, const ParamMap& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (const auto& [n, w] : want) {
    ASSERT_TRUE(got.count(n)) << what << " missing " << n;
    const double scale = w.abs().max().item<double>();
    const double e = (got.at(n) - w).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
    worst = std::max(worst, e);
    EXPECT_LE(e, tol) << what << " " << n;
  }
  if (job_comm()->rank() == 0) std::cout << "[llama " << what << "] world " << job_comm()->world_size() << " worst " << worst << "\n";
}

TEST(FsdpLlama, MatchesUnshardedTraining) {
  const int world = job_comm()->world_size();
  for (bool tied : {false, true}) {
    ParamMap ref = reference(tied, 3);
    for (const StrategyCase& c : strategy_cases(world)) {
      TrainRun r = train(tied, policy_of(c), c.accum, 3);
      ParamMap got = exported(r.fsdp->engine());
      expect_close(got, ref, 1e-5, std::string(fsdp::to_string(c.strategy)) + (tied ? " tied" : " untied"));
      if (c.strategy == ShardingStrategy::kFullShard) {
        EXPECT_LE(r.fsdp->engine().memory_account().peak_unsharded_units, 2);
      }
    }
  }
}

TEST(FsdpLlama, ExportHasHfNamesAndLoadRoundTrips) {
  FsdpPolicy p;
  TrainRun r = train(/*tied=*/true, p, 1, 1);
  fsdp::FsdpEngine& eng = r.fsdp->engine();
  ParamMap state = exported(eng);
  EXPECT_TRUE(state.count("model.embed_tokens.weight"));
  EXPECT_FALSE(state.count("lm_head.weight"));  // tied: stored once, under the embedding's name
  EXPECT_TRUE(state.count("model.layers.2.mlp.up_proj.bias"));
  EXPECT_EQ(static_cast<int64_t>(state.size()), 2 + 3 * 12);
  auto reader = [&](const std::string& n, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
    out.copy_(state.at(n).reshape({-1}).narrow(0, begin, end - begin));
  };
  for (bool rank0_only : {false, true}) {
    TrainRun fresh;
    fresh.fsdp = fsdp::apply_fsdp(make(true), job_comm(), p);
    fresh.fsdp->engine().load_parameters(reader, rank0_only);
    ParamMap again = exported(fresh.fsdp->engine());
    for (const auto& [n, t] : state) EXPECT_TRUE(at::equal(again.at(n), t)) << n << " rank0_only=" << rank0_only;
  }
  // Optimizer moments by name into a fresh engine, then gathered again.
  std::map<std::string, ParamMap> moments;
  eng.gather_optimizer_state_by_name(*r.opt, [&](const std::string& n, const std::string& k, const at::Tensor& t) {
    moments[k][n] = t;
  }, true);
  ASSERT_EQ(moments["exp_avg"].size(), state.size());
  auto fresh = fsdp::apply_fsdp(make(true), job_comm(), p);
  optim::ShardedAdamW opt2(fresh->engine().optim_shards(), optim::AdamWOptions{});
  fresh->engine().load_optimizer_state_by_name(opt2, [&](const std::string& n, const std::string& k) {
    return moments.at(k).at(n);
  });
  std::map<std::string, ParamMap> again;
  fresh->engine().gather_optimizer_state_by_name(opt2, [&](const std::string& n, const std::string& k, const at::Tensor& t) {
    again[k][n] = t;
  }, true);
  for (const auto& [k, m] : moments)
    for (const auto& [n, t] : m) EXPECT_TRUE(at::equal(again[k][n], t)) << k << " " << n;
}

// Resume on another world size: state gathered by name at world W (parameters + AdamW moments +
// step) is loaded into a world-1 engine (a split communicator of one rank); one more step there
// equals one more step at world W.
TEST(FsdpLlama, ResumesOnAnotherWorldSize) {
  FsdpPolicy p;
  p.backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre;
  TrainRun r = train(/*tied=*/false, p, 1, 2);
  ParamMap params = exported(r.fsdp->engine());
  std::map<std::string, ParamMap> moments;
  r.fsdp->engine().gather_optimizer_state_by_name(*r.opt, [&](const std::string& n, const std::string& k,
                                                              const at::Tensor& t) { moments[k][n] = t; }, true);
  const int64_t step = r.opt->step_count();
  train_steps(r, 1, 1, *job_comm());
  ParamMap continued = exported(r.fsdp->engine());

  std::shared_ptr<dist::Communicator> solo = job_comm()->split(job_comm()->rank(), 0);
  ASSERT_EQ(solo->world_size(), 1);
  TrainRun resumed;
  resumed.fsdp = fsdp::apply_fsdp(make(false), solo, p);
  resumed.fsdp->engine().load_parameters(
      [&](const std::string& n, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
        out.copy_(params.at(n).reshape({-1}).narrow(0, begin, end - begin));
      }, false);
  resumed.opt = std::make_unique<optim::ShardedAdamW>(resumed.fsdp->engine().optim_shards(),
                                                      optim::AdamWOptions{0.9, 0.999, 1e-8, kWd});
  resumed.fsdp->engine().load_optimizer_state_by_name(
      *resumed.opt, [&](const std::string& n, const std::string& k) { return moments.at(k).at(n); });
  resumed.opt->set_step_count(step);
  train_steps(resumed, 1, 1, *solo);
  ParamMap after = exported(resumed.fsdp->engine());
  expect_close(after, continued, 1e-5, "resume world->1");
}

// Issue 32: CPU ranks training in bf16 cast each trainable fp32 shard once per change and keep the
// copy (the gathers' input). After an optimizer step, and after load_parameters wrote the shards'
// bytes without moving their version counters, the logits equal those of a fresh engine that holds
// the same fp32 values (bit for bit: the same casts).
TEST(FsdpLlama, Bf16ShardCopyFollowsTheShards) {
  FsdpPolicy p;
  p.param_dtype = at::kBFloat16;
  const at::Tensor ids = make_global_batch(37, 2, kSeqLen, 9).ids_bt;
  auto logits_of_fresh = [&](const ParamMap& state) {
    auto fresh = fsdp::apply_fsdp(make(false), job_comm(), p);
    fresh->engine().load_parameters([&](const std::string& n, const std::vector<int64_t>&, int64_t begin, int64_t end,
                                        at::Tensor out) { out.copy_(state.at(n).reshape({-1}).narrow(0, begin, end - begin)); },
                                    false);
    at::NoGradGuard no_grad;
    return fresh->forward(ids);
  };
  TrainRun r = train(/*tied=*/false, p, 1, 1);  // the forward before the step made the copies
  const ParamMap stepped = exported(r.fsdp->engine());
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(r.fsdp->forward(ids), logits_of_fresh(stepped))) << "after an optimizer step";
  }
  ParamMap halved;
  for (const auto& [n, t] : stepped) halved[n] = (t * 0.5).contiguous();
  r.fsdp->engine().load_parameters(  // raw bytes into the fp32 shards: no version counter moves
      [&](const std::string& n, const std::vector<int64_t>&, int64_t begin, int64_t end, at::Tensor out) {
        ASSERT_TRUE(out.is_contiguous() && out.scalar_type() == at::kFloat);
        std::memcpy(out.data_ptr(), halved.at(n).reshape({-1}).narrow(0, begin, end - begin).data_ptr(),
                    static_cast<size_t>(end - begin) * sizeof(float));
      },
      false);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(r.fsdp->forward(ids), logits_of_fresh(halved))) << "after load_parameters";
}

// The real loading path: an HF directory (rank 0 writes it) read into shards by byte ranges, or by
// rank 0 and broadcast; a shape mismatch is an error naming the tensor.
TEST(FsdpLlama, LoadsHfCheckpointIntoShards) {
  TempDir dir("fsdp_load");
  const std::string path = (dir.path() / "ckpt").string();
  // Rank 0 writes (small shards, so the sharded-index layout is exercised); TempDir names differ
  // per process, so everybody reads the path rank 0 broadcasts.
  model::LlamaForCausalLM src = make(false);
  model::init_weights(src, 99);
  std::string shared_path = path;
  if (job_comm()->rank() == 0) io::save_hf_directory(src, shared_path, std::nullopt, /*max_shard_bytes=*/4000);
  at::Tensor buf = at::zeros({512}, at::kByte);
  if (job_comm()->rank() == 0) std::memcpy(buf.data_ptr(), shared_path.data(), shared_path.size());
  job_comm()->broadcast(buf, 0)->wait();
  shared_path = std::string(static_cast<const char*>(buf.data_ptr()));
  job_comm()->barrier()->wait();
  ParamMap want;
  for (const auto& p : src->named_parameters()) want[p.key()] = p.value().detach().clone();
  for (bool rank0_only : {false, true}) {
    auto f = fsdp::apply_fsdp(make(false), job_comm(), FsdpPolicy{});
    fsdp::load_checkpoint(f->engine(), shared_path, rank0_only);
    ParamMap got = exported(f->engine());
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [n, t] : want) EXPECT_TRUE(at::equal(got.at(n), t)) << n << " rank0_only=" << rank0_only;
  }
  // The low-memory path: a model built on the meta device gets its values only from the checkpoint.
  for (bool rank0_only : {false, true}) {
    auto f = fsdp::apply_fsdp(model::LlamaForCausalLM(tiny(false), at::TensorOptions().device(at::kMeta)), job_comm(),
                              FsdpPolicy{});
    fsdp::load_checkpoint(f->engine(), shared_path, rank0_only);
    ParamMap got = exported(f->engine());
    for (const auto& [n, t] : want) EXPECT_TRUE(at::equal(got.at(n), t)) << "meta " << n;
    // and it trains
    GlobalBatch b = make_global_batch(37, 2, kSeqLen, 5);
    auto ls = model::causal_lm_loss_sum(f->forward(b.ids_bt), b.labels_bt);
    EXPECT_TRUE(std::isfinite(ls.sum.item<double>()));
    ls.sum.backward();
    EXPECT_GT(optim::global_grad_norm(f->engine().grad_shards(), f->engine().norm_comm()), 0.0);
    for (const auto& p : f->model()->parameters()) EXPECT_FALSE(p.is_meta());
  }
  // Alpaca's [PAD]: a meta model with 3 more rows loads the stored rows and mean-initialises the
  // new ones exactly as resize_token_embeddings does after a full load; train.py's fill of its last
  // rows from stored ones (a checkpoint that already has len(tokenizer) rows, or one row short of it)
  // exactly as fill_rows_with_mean.
  {
    const int64_t stored = tiny(false).vocab_size;
    for (const auto& [vocab, mean_from] : std::vector<std::pair<int64_t, int64_t>>{
             {40, stored}, {stored, stored - 1}, {40, stored - 2}}) {
      model::LlamaForCausalLM full = io::load_hf_model(shared_path);
      full->resize_token_embeddings(vocab);
      full->fill_rows_with_mean(mean_from);
      model::LlamaConfig grown = tiny(false);
      grown.vocab_size = vocab;
      for (bool rank0_only : {false, true}) {
        auto f = fsdp::apply_fsdp(model::LlamaForCausalLM(grown, at::TensorOptions().device(at::kMeta)), job_comm(), FsdpPolicy{});
        fsdp::load_checkpoint(f->engine(), shared_path, rank0_only, mean_from);
        ParamMap got = exported(f->engine());
        for (const auto& p : full->named_parameters())
          EXPECT_TRUE(at::equal(got.at(p.key()), p.value()))
              << p.key() << " vocab " << vocab << " mean_from " << mean_from << " rank0_only=" << rank0_only;
      }
      // The filled rows are the mean of the rows before them, and differ from what was stored there.
      const at::Tensor w = full->model->embed_tokens->weight;
      EXPECT_TRUE(at::allclose(w[vocab - 1], w.narrow(0, 0, mean_from).mean(0), 1e-6, 1e-7));
    }
  }
  // A model whose vocabulary differs from the checkpoint's.
  model::LlamaConfig other = tiny(false);
  other.vocab_size = 38;
  model::LlamaForCausalLM m2(other);
  auto f2 = fsdp::apply_fsdp(m2, job_comm(), FsdpPolicy{});
  EXPECT_THROW(fsdp::load_checkpoint(f2->engine(), shared_path, false), Error);
  job_comm()->barrier()->wait();  // rank 0's TempDir outlives every reader
}

// Loading without waste, measured: ranks other than 0 (rank 0 wrote the checkpoint) load a
// ~21M-parameter model built on the meta device by byte ranges; their peak RSS growth must stay
// far below one full fp32 copy (expected: about 1/world of it plus one tensor range).
TEST(FsdpLlama, LoadingPeakMemoryIsAShardNotAModel) {
  const int world = job_comm()->world_size();
  if (world == 1) GTEST_SKIP() << "needs ranks that did not write the checkpoint";
  model::LlamaConfig c = llama_21m();
  c.max_position_embeddings = 32;
  TempDir dir("fsdp_mem");
  std::string path = (dir.path() / "ckpt").string();
  int64_t model_bytes = 0;
  if (job_comm()->rank() == 0) {
    model::LlamaForCausalLM src(c);
    model::init_weights(src, 1);
    io::save_hf_directory(src, path);
  }
  at::Tensor buf = at::zeros({512}, at::kByte);
  if (job_comm()->rank() == 0) std::memcpy(buf.data_ptr(), path.data(), path.size());
  job_comm()->broadcast(buf, 0)->wait();
  path = std::string(static_cast<const char*>(buf.data_ptr()));
  job_comm()->barrier()->wait();
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // resets VmHWM to the current RSS
  }
  const int64_t before = sys::rss_bytes();
  auto f = fsdp::apply_fsdp(model::LlamaForCausalLM(c, at::TensorOptions().device(at::kMeta)), job_comm(), FsdpPolicy{});
  fsdp::load_checkpoint(f->engine(), path, /*rank0_only=*/false);
  const int64_t growth = sys::peak_rss_bytes() - before;
  for (const auto& p : f->model()->parameters()) model_bytes += p.numel() * 4;
  const auto acc = f->engine().memory_account();
  if (job_comm()->rank() == 1)
    std::cout << "[load] world " << world << ": full model " << model_bytes << " B fp32; rank 1 peak RSS growth while "
              << "wrapping+loading " << growth << " B (" << 100.0 * growth / model_bytes << "% of the model); its "
              << "persistent shards+grads " << acc.param_bytes + acc.grad_bytes << " B\n";
  // Persistent shards and gradients, plus transients of about one tensor (the embedding, 16 MB)
  // and 8 MiB of allocator slack; a full copy would add 83 MB.
  const int64_t largest = c.vocab_size * c.hidden_size * 4;
  if (job_comm()->rank() != 0) {
    EXPECT_LT(growth, acc.param_bytes + acc.grad_bytes + largest + (8 << 20));
  }
  job_comm()->barrier()->wait();
}

}  // namespace
}  // namespace alpaca::testing::test_fsdp_llama
