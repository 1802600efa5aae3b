// Shared pieces of the FSDP multi-rank tests: the communicator of the job (one per process,
// made by the gtest environment) and the deterministic global batch every rank can rebuild.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>

#include "alpaca/dist/communicator.h"
#include "dist_test_env.h"

namespace alpaca::testing {

// job_comm(): the process's communicator (dist_test_env.h). The FSDP tests register it with
//   const auto* g_env = register_job_comm(fsdp_job_options());
// a 120 s collective timeout: a multi-rank FSDP test on an oversubscribed 2-core machine can
// stall a collective for tens of seconds without anything being wrong.
inline dist::CommOptions fsdp_job_options() {
  dist::CommOptions opts;
  opts.timeout = std::chrono::seconds(120);
  return opts;
}

struct GlobalBatch {
  at::Tensor ids_bt, labels_bt;  // (G, T) int64; labels -100 where ignored
  int64_t num_tokens = 0;        // label tokens in the whole global batch
};

// The same on every rank: depends only on the seed.
inline GlobalBatch make_global_batch(int64_t vocab, int64_t g, int64_t t, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  GlobalBatch b;
  b.ids_bt = at::randint(vocab, {g, t}, gen, at::kLong);
  b.labels_bt = at::randint(vocab, {g, t}, gen, at::kLong);
  at::Tensor drop = at::rand({g, t}, gen) < 0.25;
  b.labels_bt.masked_fill_(drop, -100);
  b.num_tokens = (b.labels_bt != -100).sum().item<int64_t>();
  return b;
}

// sum of token cross-entropies (fp32) over labels != -100.
inline at::Tensor token_loss_sum(const at::Tensor& logits_btv, const at::Tensor& labels_bt) {
  return at::cross_entropy_loss(logits_btv.reshape({-1, logits_btv.size(-1)}).to(at::kFloat),
                                labels_bt.reshape({-1}), {}, at::Reduction::Sum, -100);
}

}  // namespace alpaca::testing
