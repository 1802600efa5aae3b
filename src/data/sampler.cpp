// DistributedBatchSampler: world-size-independent global batches (see the header).
#include "alpaca/data/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::data {

std::vector<int64_t> length_grouped_order(const std::vector<int64_t>& perm,
                                          const std::vector<int64_t>& lengths,
                                          int64_t batch_size) {
  const int64_t n = static_cast<int64_t>(perm.size());
  int64_t mult = std::min<int64_t>(n / (batch_size * 4), 50);
  if (mult == 0) mult = 1;
  const int64_t mega = mult * batch_size;
  std::vector<std::vector<int64_t>> megabatches;
  for (int64_t i = 0; i < n; i += mega) {
    std::vector<int64_t> m(perm.begin() + i, perm.begin() + std::min(n, i + mega));
    // Python's sorted(reverse=True) is stable: equal lengths keep their order.
    std::stable_sort(m.begin(), m.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    megabatches.push_back(std::move(m));
  }
  // torch.argmax returns the first maximum.
  size_t max_idx = 0;
  for (size_t k = 1; k < megabatches.size(); ++k)
    if (lengths[megabatches[k][0]] > lengths[megabatches[max_idx][0]]) max_idx = k;
  std::swap(megabatches[0][0], megabatches[max_idx][0]);
  std::vector<int64_t> out;
  out.reserve(n);
  for (const auto& m : megabatches) out.insert(out.end(), m.begin(), m.end());
  return out;
}

std::vector<int64_t> eval_order(int64_t num_examples, int64_t batch, bool group_by_length,
                                const std::vector<int64_t>& lengths, uint64_t seed) {
  ALPACA_CHECK(num_examples > 0 && batch > 0, "eval_order: needs examples and a positive batch, got "
                                                  << num_examples << " and " << batch);
  std::vector<int64_t> order(static_cast<size_t>(num_examples));
  if (!group_by_length) {
    for (int64_t i = 0; i < num_examples; ++i) order[static_cast<size_t>(i)] = i;
    return order;
  }
  ALPACA_CHECK(static_cast<int64_t>(lengths.size()) == num_examples,
               "eval_order: group_by_length needs one length per example (" << lengths.size() << " for "
                                                                            << num_examples << ")");
  // get_length_grouped_indices: torch.randperm(n, generator=torch.Generator().manual_seed(seed)).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor perm = at::randperm(num_examples, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t* p = perm.data_ptr<int64_t>();
  order.assign(p, p + num_examples);
  return length_grouped_order(order, lengths, batch);
}

std::vector<EvalBatch> eval_batches(const std::vector<int64_t>& order, int64_t batch, int64_t world, int64_t rank) {
  const int64_t n = static_cast<int64_t>(order.size());
  ALPACA_CHECK(n > 0 && batch > 0 && world > 0 && rank >= 0 && rank < world,
               "eval_batches: bad sizes (n " << n << ", batch " << batch << ", rank " << rank << " of " << world << ")");
  const int64_t per_round = batch * world;
  const int64_t rounds = (n + per_round - 1) / per_round;
  const int64_t remainder = n % per_round;  // gather_for_metrics' truncation of the last round (0: none)
  // accelerate's initial_data: the first `world` batches' indices, doubled until world x batch long.
  std::vector<int64_t> initial(order.begin(), order.begin() + std::min(n, per_round));
  while (static_cast<int64_t>(initial.size()) < per_round) {
    const std::vector<int64_t> copy = initial;
    initial.insert(initial.end(), copy.begin(), copy.end());
  }
  std::vector<EvalBatch> out;
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t base = r * per_round;
    EvalBatch eb;
    const int64_t begin = std::min(n, base + rank * batch), end = std::min(n, base + (rank + 1) * batch);
    eb.indices.assign(order.begin() + begin, order.begin() + end);
    const bool last = r + 1 == rounds;
    if (!last || remainder == 0) {
      eb.loss_weight = batch;
      eb.metrics_counted = true;
    } else {
      if (world > 1) {
        // The fillers before this rank's: the short batch's and the empty ranks' before it, in order.
        int64_t cycle = 0;
        for (int64_t k = 0; k < rank; ++k)
          cycle += batch - (std::min(n, base + (k + 1) * batch) - std::min(n, base + k * batch));
        const int64_t need = batch - static_cast<int64_t>(eb.indices.size());
        eb.indices.insert(eb.indices.end(), initial.begin() + cycle, initial.begin() + cycle + need);
      }
      eb.loss_weight = std::clamp<int64_t>(remainder - rank * batch, 0, batch);
      eb.metrics_counted = rank < std::min(remainder, world);
    }
    out.push_back(std::move(eb));
  }
  return out;
}

DistributedBatchSampler::DistributedBatchSampler(int64_t num_examples, SamplerOptions options)
    : num_examples_(num_examples), opt_(std::move(options)) {
  ALPACA_CHECK(num_examples_ > 0, "the sampler needs at least one example");
  ALPACA_CHECK(opt_.per_device_batch > 0,
               "--per_device_train_batch_size must be positive, got " << opt_.per_device_batch);
  ALPACA_CHECK(opt_.grad_accum > 0,
               "--gradient_accumulation_steps must be positive, got " << opt_.grad_accum);
  ALPACA_CHECK(opt_.world_size > 0, "world size must be positive, got " << opt_.world_size);
  ALPACA_CHECK(opt_.rank >= 0 && opt_.rank < opt_.world_size,
               "rank " << opt_.rank << " is outside [0, " << opt_.world_size << ")");
  ALPACA_USER_CHECK(!opt_.drop_last || num_examples_ >= global_batch_size(),
               "--dataloader_drop_last with " << num_examples_
                                              << " examples and a global batch of "
                                              << global_batch_size()
                                              << " leaves no step; use a smaller batch");
  ALPACA_CHECK(!(opt_.group_by_length && opt_.batch_rebalance),
               "group_by_length and batch_rebalance are two sampling strategies; choose one");
  if (opt_.group_by_length || opt_.batch_rebalance)
    ALPACA_CHECK(static_cast<int64_t>(opt_.lengths.size()) == num_examples_,
                 (opt_.group_by_length ? "--group_by_length" : "batch_rebalance")
                     << " needs one length per example (" << opt_.lengths.size() << " for " << num_examples_
                     << ")");
}

int64_t DistributedBatchSampler::global_batch_size() const {
  return opt_.world_size * opt_.per_device_batch * opt_.grad_accum;
}

int64_t DistributedBatchSampler::steps_per_epoch() const {
  const int64_t g = global_batch_size();
  return opt_.drop_last ? num_examples_ / g : (num_examples_ + g - 1) / g;
}

const std::vector<int64_t>& DistributedBatchSampler::order(int64_t epoch) const {
  ALPACA_CHECK(epoch >= 0, "epoch must be non-negative, got " << epoch);
  if (epoch == cached_epoch_) return cached_order_;
  std::vector<int64_t> order(num_examples_);
  if (opt_.shuffle) {
    // torch.Generator().manual_seed(seed + epoch); torch.randperm(n, generator=g)
    auto gen = at::make_generator<at::CPUGeneratorImpl>(opt_.seed + static_cast<uint64_t>(epoch));
    at::Tensor perm = at::randperm(num_examples_, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    order.assign(p, p + num_examples_);
  } else {
    for (int64_t i = 0; i < num_examples_; ++i) order[i] = i;
  }
  if (opt_.group_by_length) order = length_grouped_order(order, opt_.lengths, global_batch_size());
  cached_order_ = std::move(order);
  cached_epoch_ = epoch;
  return cached_order_;
}

std::vector<int64_t> DistributedBatchSampler::global_batch(int64_t epoch, int64_t step) const {
  ALPACA_CHECK(step >= 0 && step < steps_per_epoch(),
               "sampler step " << step << " is outside the epoch's " << steps_per_epoch()
                               << " steps");
  const auto& ord = order(epoch);
  const int64_t g = global_batch_size();
  if (opt_.batch_rebalance) {
    // BatchRebalanceSampler: the tail keeps its own examples, filled (from the start of the order,
    // wrapping) only up to one per micro-batch.
    const int64_t begin = step * g, end = std::min(num_examples_, begin + g);
    std::vector<int64_t> batch(ord.begin() + begin, ord.begin() + end);
    const int64_t groups = opt_.world_size * opt_.grad_accum;
    for (int64_t j = 0; static_cast<int64_t>(batch.size()) < groups; ++j) batch.push_back(ord[j % num_examples_]);
    return batch;
  }
  std::vector<int64_t> batch(g);
  // Wrapping past the end refills the last partial batch from the start of the same order.
  for (int64_t j = 0; j < g; ++j) batch[j] = ord[(step * g + j) % num_examples_];
  return batch;
}

std::vector<std::vector<int64_t>> DistributedBatchSampler::micro_batches(int64_t epoch,
                                                                         int64_t step) const {
  std::vector<int64_t> batch = global_batch(epoch, step);
  if (opt_.batch_rebalance)
    return rebalance_global_batch(batch, opt_.lengths, opt_.world_size, opt_.grad_accum,
                                  global_batch_size())[static_cast<size_t>(opt_.rank)];
  const int64_t b = opt_.per_device_batch;
  const int64_t per_micro = opt_.world_size * b;
  std::vector<std::vector<int64_t>> out(opt_.grad_accum);
  for (int64_t m = 0; m < opt_.grad_accum; ++m) {
    auto begin = batch.begin() + m * per_micro + opt_.rank * b;
    out[m].assign(begin, begin + b);
  }
  return out;
}

SamplerPosition DistributedBatchSampler::next(SamplerPosition pos) const {
  if (pos.step + 1 < steps_per_epoch()) return {pos.epoch, pos.step + 1};
  return {pos.epoch + 1, 0};
}

}  // namespace alpaca::data
