// The FSDP engine's collective path and its speed defaults, under real mpirun (CPU, MPI backend):
// - force_collectives: a world of one normally skips every collective (a one-rank gather is a
//   copy); forced, it runs the all-gather / reduce-scatter / all-reduce path a sharded job runs
//   (the one-GPU NCCL checks rely on it). The numbers must be bitwise those of the normal run, and
//   a counting communicator proves the collectives were really issued.
// - prefetch defaults (backward_pre + forward_prefetch with the two-unit limit) give bitwise the
//   numbers of HF's explicit no_prefetch and of backward_post, and keep at most two units resident.
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "alpaca/dist/runtime.h"
#include "alpaca/fsdp/engine.h"
#include "alpaca/optim/grad_clip.h"
#include "fsdp_test_env.h"
#include "tiny_lm.h"

namespace alpaca::testing::test_fsdp_collective_path {
namespace {

const auto* g_env = register_job_comm(fsdp_job_options());

using fsdp::FsdpEngine;
using fsdp::FsdpPolicy;
using fsdp::ShardingStrategy;

struct Counts {
  std::atomic<int> all_gather{0}, reduce_scatter{0}, all_reduce{0}, broadcast{0}, barrier{0};
};

// Forwards to the job's communicator and counts what the engine issues (sub-communicators too).
class CountingComm final : public dist::Communicator {
 public:
  CountingComm(std::shared_ptr<dist::Communicator> inner, std::shared_ptr<Counts> counts)
      : inner_(std::move(inner)), counts_(std::move(counts)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  at::Device device() const override { return inner_->device(); }
  std::string backend() const override { return inner_->backend(); }
  dist::WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) override {
    ++counts_->all_gather;
    return inner_->all_gather_into(out, in);
  }
  dist::WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, dist::ReduceOp op) override {
    ++counts_->reduce_scatter;
    return inner_->reduce_scatter(out, in, op);
  }
  dist::WorkHandle all_reduce(at::Tensor t, dist::ReduceOp op) override {
    ++counts_->all_reduce;
    return inner_->all_reduce(t, op);
  }
  dist::WorkHandle broadcast(at::Tensor t, int root) override {
    ++counts_->broadcast;
    return inner_->broadcast(t, root);
  }
  dist::WorkHandle barrier() override {
    ++counts_->barrier;
    return inner_->barrier();
  }
  std::shared_ptr<dist::Communicator> split(int color, int key) override {
    auto sub = inner_->split(color, key);
    return sub ? std::make_shared<CountingComm>(sub, counts_) : nullptr;
  }

 private:
  std::shared_ptr<dist::Communicator> inner_;
  std::shared_ptr<Counts> counts_;
};

constexpr int64_t kGlobal = 8, kSeqLen = 6;

struct TrainRun {
  std::map<std::string, at::Tensor> params;
  std::vector<double> losses;
  int peak_units = 0;
};

// `steps` AdamW steps with clipping, 2 micro-batches per step; the engine talks through `comm`.
TrainRun train(std::shared_ptr<dist::Communicator> comm, const FsdpPolicy& policy, int steps = 3) {
  const int world = comm->world_size(), rank = comm->rank();
  TinyConfig cfg;
  cfg.tie = true;
  torch::manual_seed(0);
  TinyLM m(cfg);
  FsdpEngine engine({m.get(), m->layer_modules()}, comm, policy);
  run_layers_through(m, engine);
  optim::ShardedAdamW opt(engine.optim_shards(), optim::AdamWOptions{0.9, 0.999, 1e-8, 0.1});
  GlobalBatch b = make_global_batch(cfg.vocab, kGlobal, kSeqLen, 11);
  TrainRun r;
  for (int s = 0; s < steps; ++s) {
    r.losses.push_back(backward_micro_batches(engine, m, b, world, rank, /*accum=*/2));
    optim::clip_grad_norm(engine.grad_shards(), 0.5, engine.norm_comm());
    opt.step(1e-2);
    engine.zero_grad();
  }
  r.peak_units = engine.memory_account().peak_unsharded_units;
  engine.export_full_state([&](const std::string& n, const at::Tensor& t) { r.params[n] = t; }, true);
  m->runner = nullptr;
  return r;
}

void expect_bitwise(const TrainRun& got, const TrainRun& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [n, w] : want.params) {
    auto it = got.params.find(n);
    ASSERT_NE(it, got.params.end()) << what << ": missing " << n;
    EXPECT_TRUE(at::equal(it->second, w)) << what << ": " << n << " differs by "
                                          << (it->second - w).abs().max().item<double>();
  }
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << what << " step " << i;
}

struct Case {
  ShardingStrategy strategy;
  bool ckpt, offload;
};

TEST(FsdpCollectivePath, ForcedCollectivesAreBitwiseTheNormalRunAndReallyCommunicate) {
  const int world = job_comm()->world_size();
  for (const Case& c : {Case{ShardingStrategy::kFullShard, false, false}, Case{ShardingStrategy::kFullShard, true, true},
                        Case{ShardingStrategy::kShardGradOp, false, false}, Case{ShardingStrategy::kNoShard, false, false}}) {
    FsdpPolicy p;
    p.strategy = c.strategy;
    p.activation_checkpointing = c.ckpt;
    p.offload = c.offload;
    const std::string what = std::string(fsdp::to_string(c.strategy)) + " ckpt=" + std::to_string(c.ckpt) +
                             " offload=" + std::to_string(c.offload);
    SCOPED_TRACE(what);
    auto normal_counts = std::make_shared<Counts>();
    const TrainRun normal = train(std::make_shared<CountingComm>(job_comm(), normal_counts), p);
    FsdpPolicy forced = p;
    forced.force_collectives = true;
    auto forced_counts = std::make_shared<Counts>();
    const TrainRun got = train(std::make_shared<CountingComm>(job_comm(), forced_counts), forced);
    expect_bitwise(got, normal, what);
    const bool sharded = c.strategy != ShardingStrategy::kNoShard;
    // 3 steps x 2 micro-batches x (forward + backward) gathers of 4 units, at least.
    if (sharded) {
      EXPECT_GE(forced_counts->all_gather.load(), 3 * 2 * 4) << "forced all-gathers";
      EXPECT_GE(forced_counts->reduce_scatter.load(), 3 * 2 * 4) << "forced reduce-scatters";
    } else {
      EXPECT_GE(forced_counts->all_reduce.load(), 3 * 2 * 4) << "forced gradient all-reduces";
    }
    if (world == 1) {
      // Without the knob a world of one communicates nothing in the step (only export's gathers).
      EXPECT_EQ(normal_counts->reduce_scatter.load(), 0);
      EXPECT_EQ(normal_counts->all_reduce.load(), 0);
      EXPECT_EQ(normal_counts->all_gather.load(), 0);
    } else {
      // Sharded worlds communicate anyway: the knob changes nothing.
      EXPECT_EQ(normal_counts->all_gather.load(), forced_counts->all_gather.load());
      EXPECT_EQ(normal_counts->reduce_scatter.load(), forced_counts->reduce_scatter.load());
    }
  }
}

TEST(FsdpCollectivePath, PrefetchDefaultsAreOnAndChangeNoNumber) {
  const FsdpPolicy defaults;
  EXPECT_EQ(defaults.backward_prefetch, fsdp::BackwardPrefetch::kBackwardPre);
  EXPECT_TRUE(defaults.forward_prefetch);
  EXPECT_TRUE(defaults.limit_all_gathers);
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE("ckpt=" + std::to_string(ckpt));
    FsdpPolicy fast;
    fast.activation_checkpointing = ckpt;
    fast.force_collectives = true;  // the overlap machinery runs at world 1 too
    const TrainRun want = train(job_comm(), fast);
    EXPECT_LE(want.peak_units, 2) << "limit_all_gathers with prefetch on";
    FsdpPolicy none = fast;  // HF's explicit backward_prefetch=no_prefetch, forward_prefetch=false
    none.backward_prefetch = fsdp::BackwardPrefetch::kNone;
    none.forward_prefetch = false;
    expect_bitwise(train(job_comm(), none), want, "no_prefetch");
    FsdpPolicy post = fast;
    post.backward_prefetch = fsdp::BackwardPrefetch::kBackwardPost;
    expect_bitwise(train(job_comm(), post), want, "backward_post");
  }
}

// Offload to a GPU stages each trainable shard in param_dtype and re-casts it only when the
// shard's version counter moved: every writer of the shards must move it (AdamW's fused step,
// checkpoint loading). A writer that did not would leave the GPU training on stale weights.
TEST(FsdpCollectivePath, ShardWritersMoveTheVersionCounterTheOffloadStagingReads) {
  TinyConfig cfg;
  torch::manual_seed(0);
  TinyLM m(cfg);
  FsdpPolicy p;
  p.offload = true;
  FsdpEngine engine({m.get(), m->layer_modules()}, job_comm(), p);
  optim::ShardedAdamW opt(engine.optim_shards(), optim::AdamWOptions{0.9, 0.999, 1e-8, 0.1});
  std::vector<int64_t> before;
  for (int u = 0; u < engine.num_units(); ++u) before.push_back(engine.trainable_flat(u)->shard()._version());
  for (const auto& g : engine.grad_shards()) g.fill_(0.5);
  opt.step(1e-2);
  for (int u = 0; u < engine.num_units(); ++u)
    EXPECT_GT(engine.trainable_flat(u)->shard()._version(), before[u]) << "AdamW step, unit " << u;
  for (int u = 0; u < engine.num_units(); ++u) before[u] = engine.trainable_flat(u)->shard()._version();
  engine.load_parameters([](const std::string&, const std::vector<int64_t>&, int64_t, int64_t, at::Tensor out) {
    out.fill_(0.25);
  }, /*rank0_only=*/false);
  for (int u = 0; u < engine.num_units(); ++u)
    EXPECT_GT(engine.trainable_flat(u)->shard()._version(), before[u]) << "load_parameters, unit " << u;
}

}  // namespace
}  // namespace alpaca::testing::test_fsdp_collective_path
