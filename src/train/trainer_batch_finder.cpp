// --auto_find_batch_size: the largest per_device_train_batch_size (from the flag's value down)
// whose worst micro-batch fits on every rank, found before the first step without changing what
// is trained. Each attempt runs one forward/backward of the worst micro-batch this data can form
// (the `micro` longest examples, padded as the collator pads; under batch_rebalance, whose
// micro-batches hold a variable number of rows, the one of this rank's micro-batches over the whole
// run at that split that pads to the most tokens) with the FSDP engine in memory-probe mode: every
// gather, gradient and reduce-scatter buffer is allocated as in training, but nothing is
// communicated, so a rank that runs out of memory leaves no peer waiting in a collective. Then one
// all-reduce (max of "ran out") tells every rank the verdict; on "ran out" all ranks divide
// the micro-batch (halving when it is even) and multiply gradient_accumulation_steps by the same
// factor, so the global batch, the sampler's order and the loss normalisation (global label
// tokens) are unchanged: the run trains exactly what it would have trained at the smaller
// micro-batch. The choice is logged, written to training_args.json, and kept by a resume (the
// checkpoint's trainer_state.json train_batch_size is where the search starts).
#include <c10/util/Exception.h>  // defines: c10::OutOfMemoryError

#include <algorithm>
#include <numeric>

#include "alpaca/data/collate.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {
namespace {

// The largest divisor of n below n (1 for a prime), preferring n / 2.
int64_t next_smaller_micro(int64_t n) {
  for (int64_t d = n / 2; d >= 1; --d)
    if (n % d == 0) return d;
  return 1;
}

}  // namespace

std::vector<int64_t> Trainer::Impl::heaviest_micro_batch(int64_t micro) const {
  const auto len = [&](int64_t i) { return static_cast<int64_t>(train_examples[static_cast<size_t>(i)].input_ids.size()); };
  if (opt.batch_rebalance) {
    // The split the search would train with (micro x accumulation fixed), every step of the run.
    data::SamplerOptions so = sampler_options();
    so.grad_accum = so.per_device_batch * so.grad_accum / micro;
    so.per_device_batch = micro;
    const data::DistributedBatchSampler s(static_cast<int64_t>(train_examples.size()), so);
    std::vector<int64_t> worst;
    int64_t worst_tokens = -1, worst_len = -1;
    for (int64_t g = 0; g < length.max_steps; ++g)
      for (auto& mb : s.micro_batches(g / s.steps_per_epoch(), g % s.steps_per_epoch())) {
        int64_t longest = 0;
        for (int64_t i : mb) longest = std::max(longest, len(i));
        longest = data::round_up_to_multiple(longest, opt.pad_to_multiple_of);
        const int64_t tokens = longest * static_cast<int64_t>(mb.size());
        if (tokens > worst_tokens || (tokens == worst_tokens && longest > worst_len)) {
          worst_tokens = tokens;
          worst_len = longest;
          worst = std::move(mb);
        }
      }
    return worst;
  }
  // The `micro` longest examples: the micro-batch that pads to the most tokens.
  std::vector<int64_t> order(train_examples.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const size_t take = std::min(order.size(), static_cast<size_t>(micro));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(),
                    [&](int64_t a, int64_t b) { return len(a) > len(b); });
  std::vector<int64_t> worst;
  for (size_t i = 0; i < static_cast<size_t>(micro); ++i) worst.push_back(order[i % take]);  // few examples: repeat
  return worst;
}

bool Trainer::Impl::probe_micro_batch_fits(int64_t micro) {
  std::vector<const data::Example*> ptrs;
  for (int64_t i : heaviest_micro_batch(micro)) ptrs.push_back(&train_examples[static_cast<size_t>(i)]);

  bool ran_out = false;
  engine->set_memory_probe(true);
  try {
    const data::Batch b = data::collate(ptrs, *tokenizer->pad_id(), attention_rule, opt.pad_to_multiple_of);
    if (opt.batch_rebalance)
      ALPACA_INFO("auto_find_batch_size: per_device_train_batch_size " << micro << " under batch_rebalance: rank " << rank
                  << "'s heaviest micro-batch of the run is " << b.input_ids_bt.size(0) << " rows x "
                  << b.input_ids_bt.size(1) << " tokens");
    auto mv = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
    const bool no_padding = b.attention_mask_bt.defined() && b.attention_mask_bt.all().item<bool>();
    const at::Tensor ids = mv(b.input_ids_bt), labels = mv(b.labels_bt);
    const at::Tensor mask = no_padding ? at::Tensor() : mv(b.attention_mask_bt);
    const at::Tensor pos = mv(b.position_ids_bt), seg = mv(b.segment_ids_bt);
    at::Tensor sum = fsdp_model->forward_loss_sum(ids, labels, mask, pos, seg).sum;
    (sum / 1.0).backward();
  } catch (const c10::OutOfMemoryError& e) {
    ran_out = true;
    ALPACA_INFO("auto_find_batch_size: per_device_train_batch_size " << micro << " ran out of memory on rank " << rank
                << ": " << std::string(e.what()).substr(0, 200));
  }
  if (ran_out) engine->abandon_step();
  engine->set_memory_probe(false);
  engine->zero_grad();
  release_cached_memory(device);
  // One collective: every rank learns whether any rank ran out.
  at::Tensor flag = at::tensor({static_cast<int64_t>(ran_out)}, at::kLong).to(device);
  comm->all_reduce(flag, dist::ReduceOp::kMax)->wait();
  return flag.cpu().item<int64_t>() == 0;
}

void Trainer::Impl::find_micro_batch() {
  const int64_t start = opt.per_device_train_batch_size;
  const int64_t per_rank_batch = start * opt.gradient_accumulation_steps;  // fixed: micro x accumulation
  int64_t micro = start;
  if (resume_dir) {
    const auto saved = ckpt::TrainerState::load((*resume_dir / ckpt::kTrainerStateName).string());
    if (saved.train_batch_size && *saved.train_batch_size >= 1 && *saved.train_batch_size < micro &&
        per_rank_batch % *saved.train_batch_size == 0) {
      micro = *saved.train_batch_size;
      ALPACA_INFO("auto_find_batch_size: the checkpoint trained with per_device_train_batch_size " << micro
                  << "; starting there");
    }
  }
  while (!probe_micro_batch_fits(micro)) {
    ALPACA_CHECK(micro > 1, "auto_find_batch_size: even per_device_train_batch_size 1 runs out of memory on some rank; "
                            "`alpaca-train estimate-memory` with the same flags shows where it goes: try --fsdp "
                            "\"full_shard auto_wrap offload\", --gradient_checkpointing True or a smaller --model_max_length");
    const int64_t next = next_smaller_micro(micro);
    ALPACA_INFO("auto_find_batch_size: per_device_train_batch_size " << micro << " does not fit on every rank; trying "
                << next << " with gradient_accumulation_steps " << per_rank_batch / next);
    micro = next;
  }
  if (micro != opt.per_device_train_batch_size) {
    opt.per_device_train_batch_size = micro;
    opt.gradient_accumulation_steps = per_rank_batch / micro;
    const int64_t global_before = length.global_batch_size;
    build_sampler();
    ALPACA_CHECK(length.global_batch_size == global_before,
                 "auto_find_batch_size: the global batch changed from " << global_before << " to "
                                                                        << length.global_batch_size << " (a bug)");
    state.train_batch_size = micro;
    if (rank == 0 && opt.on_batch_size_found) opt.on_batch_size_found(micro, opt.gradient_accumulation_steps);
  }
  ALPACA_INFO("auto_find_batch_size: per_device_train_batch_size " << opt.per_device_train_batch_size
              << ", gradient_accumulation_steps " << opt.gradient_accumulation_steps << " (global batch "
              << length.global_batch_size << " unchanged" << (start != micro ? ", started at " + std::to_string(start) : "")
              << "); written to training_args.json");
}

}  // namespace alpaca::train
