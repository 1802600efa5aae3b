// The decode loop of transformers' GenerationMixin._sample (5.x), on our KV cache.
#include "alpaca/generate/generator.h"

#include <algorithm>
#include <optional>

#include "alpaca/model/cpu_decode.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/util/error.h"

namespace alpaca::generate {

std::vector<Generation> generate_batch(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerateOptions& opts, at::Generator& gen, const TokenCallback& on_token) {
  ALPACA_CHECK(!prompts.empty(), "generate: no prompts");
  ALPACA_CHECK(opts.max_new_tokens > 0, "--max_new_tokens must be positive, got " << opts.max_new_tokens);
  validate(opts.sampling);
  at::NoGradGuard no_grad;
  const at::Tensor w = m->lm_head_weight();
  const at::Device device = w.device();
  const int64_t b = static_cast<int64_t>(prompts.size());
  const int64_t vocab = w.size(0);
  int64_t t = 0;
  for (const auto& p : prompts) {
    ALPACA_CHECK(!p.empty(), "generate: an empty prompt (no tokens)");
    for (int64_t id : p)
      ALPACA_CHECK(id >= 0 && id < m->config().vocab_size,
                   "generate: token id " << id << " is outside the model's vocabulary [0, " << m->config().vocab_size << ")");
    t = std::max<int64_t>(t, static_cast<int64_t>(p.size()));
  }
  const bool left = opts.padding_side == PaddingSide::kLeft;

  // Host-side inputs: ids padded with pad_token_id, mask, positions (transformers' cumsum - 1,
  // padding at 0), each row's last real index.
  at::Tensor ids_bt = at::full({b, t}, opts.pad_token_id, at::kLong);
  at::Tensor mask_bt = at::zeros({b, t}, at::kLong);
  at::Tensor last_b = at::empty({b}, at::kLong);
  bool padded = false;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t n = static_cast<int64_t>(prompts[r].size());
    const int64_t start = left ? t - n : 0;
    ids_bt[r].narrow(0, start, n).copy_(at::tensor(prompts[r], at::kLong));
    mask_bt[r].narrow(0, start, n).fill_(1);
    last_b[r] = start + n - 1;
    padded = padded || n < t;
  }
  at::Tensor pos_bt = (mask_bt.cumsum(-1) - 1).masked_fill(mask_bt == 0, 0);
  at::Tensor next_pos_b1 = mask_bt.sum(-1, /*keepdim=*/true);  // = last position + 1

  const int64_t capacity = t + opts.max_new_tokens;
  model::KvCache cache(m->config(), b, capacity, w.options());
  // The growing attention mask, on the device; only needed when some row is padded.
  at::Tensor mask_full;
  if (padded) {
    mask_full = at::ones({b, capacity}, at::TensorOptions().dtype(at::kLong).device(device));
    mask_full.narrow(1, 0, t).copy_(mask_bt);
  }
  at::Tensor seen_bv;
  if (opts.sampling.repetition_penalty != 1.0) {
    seen_bv = at::zeros({b, vocab}, at::TensorOptions().dtype(at::kBool).device(device));
    for (int64_t r = 0; r < b; ++r)
      seen_bv[r].index_fill_(0, at::tensor(prompts[r], at::kLong).clamp_max(vocab - 1).to(device), true);
  }

  at::Tensor logits_bv = m->forward_cached(ids_bt.to(device), cache, padded ? mask_full.narrow(1, 0, t) : at::Tensor(),
                                           pos_bt.to(device), left ? at::Tensor() : last_b.to(device));
  std::optional<model::CpuDecoder> fused;
  if (opts.fused_cpu_decode && model::CpuDecoder::unsupported(*m, b).empty()) fused.emplace(*m, b);
  std::vector<Generation> out(b);
  std::vector<bool> done(b, false);
  int64_t num_done = 0;
  at::Tensor next_pos_dev = next_pos_b1.to(device);
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    at::Tensor scores = process_logits(logits_bv.to(at::kFloat), seen_bv, opts.sampling);
    at::Tensor next_b = select_next_tokens(scores, opts.sampling, gen);  // CPU int64
    auto acc = next_b.accessor<int64_t, 1>();
    for (int64_t r = 0; r < b; ++r) {
      if (done[r]) {
        acc[r] = opts.pad_token_id;
        continue;
      }
      const int64_t tok = acc[r];
      out[r].ids.push_back(tok);
      if (on_token) on_token(r, tok);
      if (std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(), tok) != opts.eos_token_ids.end()) {
        out[r].stopped_at_eos = true;
        done[r] = true;
        ++num_done;
      }
    }
    if (num_done == b || step + 1 == opts.max_new_tokens) break;
    at::Tensor next_dev = next_b.to(device).view({b, 1});
    if (seen_bv.defined()) seen_bv.scatter_(1, next_dev, true);
    const int64_t len = cache.length();
    const at::Tensor mask_bk = padded ? mask_full.narrow(1, 0, len + 1) : at::Tensor();
    logits_bv = fused ? fused->step(next_dev, cache, mask_bk, next_pos_dev)
                      : m->forward_cached(next_dev, cache, mask_bk, next_pos_dev);
    next_pos_dev = next_pos_dev + 1;
  }
  return out;
}

std::vector<Generation> generate_all(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerateOptions& opts, int64_t batch_size, at::Generator& gen) {
  ALPACA_CHECK(batch_size > 0, "--batch_size must be positive, got " << batch_size);
  std::vector<Generation> all;
  all.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); i += static_cast<size_t>(batch_size)) {
    const size_t end = std::min(prompts.size(), i + static_cast<size_t>(batch_size));
    std::vector<std::vector<int64_t>> batch(prompts.begin() + i, prompts.begin() + end);
    for (auto& g : generate_batch(m, batch, opts, gen)) all.push_back(std::move(g));
  }
  return all;
}

}  // namespace alpaca::generate
