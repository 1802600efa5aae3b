// Which examples each rank trains on at each optimizer step.
//
// Global-batch semantics (DESIGN.md): an epoch is a permutation of all example indices drawn
// from (seed, epoch) with torch's CPU randperm (the generator DistributedSampler seeds with
// seed + epoch). Global batch k is positions [k*G, (k+1)*G) of that order, G = world_size *
// per_device_batch * grad_accum. Position j of a global batch goes to micro-step j / (world*B),
// rank (j % (world*B)) / B, so the SET of examples in global batch k never depends on how G is
// split into ranks and accumulation steps.
//
// The last partial global batch (N % G != 0):
//  - drop_last = false (HF default): it is filled up to G with the first indices of the same
//    epoch order (DistributedSampler pads the same way), so every rank runs `grad_accum` full
//    micro-batches on every step and every example is seen each epoch.
//    steps_per_epoch = ceil(N / G). HF Trainer instead counts len(dataloader) // accum steps
//    per epoch and lets the leftover micro-batches leak into the next step; that count can be
//    one lower than ours (e.g. 406 vs 407 for 52,002 records at 4x4x8) and depends on the world
//    size, which our contract forbids.
//  - drop_last = true: the partial batch is dropped; steps_per_epoch = floor(N / G).
//
// group_by_length follows HF's get_length_grouped_indices with batch size G: the epoch order is
// cut into mega-batches of min(N / (4G), 50) * G indices, each sorted by length (longest first,
// stable), and the longest example overall is moved to the very first position.
//
// batch_rebalance follows transformers 5's BatchRebalanceSampler (train_sampling_strategy
// "batch_rebalance"): global batch k is still positions [k*G, (k+1)*G) of the epoch order, so the
// set of examples in a step is the same as above; the last partial batch keeps its N % G examples
// (filled from the start of the order only up to world x grad_accum when shorter). Each global
// batch is cut into world x grad_accum micro-batches of balanced padded cost (see
// rebalance_global_batch), so a micro-batch has a variable number of rows: many short ones or a
// few long ones. HF's Trainer builds this sampler without its seed: the order is torch's randperm
// seeded 42 + epoch whatever --seed says, and the caller sets `seed` to 42 to match.
//
// Resumption: micro_batches(epoch, step) is a pure function of its arguments, so the sampler
// position is just (epoch, step) and restoring it is calling it with the saved values.
#pragma once

#include <cstdint>
#include <vector>

namespace alpaca::data {

struct SamplerOptions {
  int64_t per_device_batch = 1;
  int64_t grad_accum = 1;
  int64_t world_size = 1;
  int64_t rank = 0;
  uint64_t seed = 42;
  bool shuffle = true;
  bool drop_last = false;
  bool group_by_length = false;
  bool batch_rebalance = false;
  std::vector<int64_t> lengths;  // one per example; required when group_by_length or batch_rebalance
};

// Position within training: the next optimizer step to run.
struct SamplerPosition {
  int64_t epoch = 0;
  int64_t step = 0;  // optimizer step within the epoch
};

// Hugging Face's evaluation batches. The order: the examples in order (transformers' eval sampler),
// or with group_by_length transformers 5's LengthGroupedSampler(per_device_eval_batch_size,
// generator seeded with data_seed): length_grouped_order of torch's randperm. It is cut into
// batches of `batch`, dealt round-robin to the ranks (accelerate's BatchSamplerShard); at world > 1
// with even_batches (accelerate's default) every rank gets `batch` rows in every round: the last
// round's short batch, and the ranks after it, are filled from the start of the order (the first
// `world` batches, repeated while shorter than world x batch). The evaluation loop repeats each
// batch's mean loss once per row and gather_for_metrics keeps the first n % (world x batch) values
// of the last round's gather (rank-major), and the first that many ranks' per-batch scalars (TRL's
// token metrics). At world 1 the last batch is short, not filled.
struct EvalBatch {
  std::vector<int64_t> indices;  // the rows this rank runs
  int64_t loss_weight = 0;       // how many of its loss repetitions evaluation_loop keeps (0: none)
  bool metrics_counted = false;  // whether TRL's per-batch entropy / accuracy sums include this rank
};
std::vector<int64_t> eval_order(int64_t num_examples, int64_t batch, bool group_by_length,
                                const std::vector<int64_t>& lengths, uint64_t seed);
// This rank's batches, one per round; every rank gets the same number of rounds.
std::vector<EvalBatch> eval_batches(const std::vector<int64_t>& order, int64_t batch, int64_t world,
                                    int64_t rank);

class DistributedBatchSampler {
 public:
  // Throws when sizes are not positive, rank is outside [0, world), the dataset is smaller than
  // one global batch with drop_last, or lengths are missing for group_by_length.
  DistributedBatchSampler(int64_t num_examples, SamplerOptions options);

  int64_t num_examples() const { return num_examples_; }
  int64_t global_batch_size() const;
  int64_t steps_per_epoch() const;  // optimizer steps per epoch

  // The epoch's order of all example indices (length num_examples). The sampler caches the
  // last epoch's order, so one instance must not be used from several threads at once.
  std::vector<int64_t> epoch_order(int64_t epoch) const { return order(epoch); }
  // All example indices of global batch `step` of `epoch` (every rank, every micro-step): G of
  // them, except the last partial batch under batch_rebalance (its own, at least world x accum).
  std::vector<int64_t> global_batch(int64_t epoch, int64_t step) const;
  // This rank's grad_accum micro-batches (per_device_batch indices each; under batch_rebalance
  // each at least one, their number set by the balancing) for optimizer step `step` of `epoch`.
  std::vector<std::vector<int64_t>> micro_batches(int64_t epoch, int64_t step) const;

  // The position after `pos`, rolling over to the next epoch.
  SamplerPosition next(SamplerPosition pos) const;

 private:
  const std::vector<int64_t>& order(int64_t epoch) const;

  int64_t num_examples_;
  SamplerOptions opt_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

// BatchRebalanceSampler._assign for one global batch `indices` (examples' lengths in `lengths`, by
// index): [rank][micro-step] the example indices, longest first. The batch is sorted by length
// (descending, stable) and cut into world x grad_accum contiguous groups whose sizes a hill climb
// adjusts until the costs bs * max_len + 0.001 * bs * max_len^2 are as even as it finds; the groups
// by cost (descending) are dealt `world` at a time, the costliest to every rank's first micro-step.
// `effective` is the configured global batch (it bounds the climb's iterations, as there).
std::vector<std::vector<std::vector<int64_t>>> rebalance_global_batch(const std::vector<int64_t>& indices,
                                                                      const std::vector<int64_t>& lengths,
                                                                      int64_t world, int64_t grad_accum,
                                                                      int64_t effective);

// HF get_length_grouped_indices for an already drawn random order `perm` (exposed for tests).
std::vector<int64_t> length_grouped_order(const std::vector<int64_t>& perm,
                                          const std::vector<int64_t>& lengths,
                                          int64_t batch_size);

}  // namespace alpaca::data
