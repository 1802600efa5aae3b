// The decode loop of transformers' GenerationMixin._sample (5.x), on our KV cache.
#include "alpaca/generate/generator.h"

#include <algorithm>
#include <atomic>
#include <optional>

#include "alpaca/model/cpu_decode.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/user_error.h"

namespace alpaca::generate {

namespace {

// Host-side inputs of the prefill: ids padded with pad_token_id, mask, positions (transformers'
// cumsum - 1, padding at 0), each row's last real index.
struct PromptBatch {
  int64_t b = 0, t = 0;  // rows, padded length
  bool padded = false;   // some row is shorter than t
  at::Tensor ids_bt, mask_bt, pos_bt, last_b, next_pos_b1;
};

PromptBatch pad_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& opts,
                        int64_t vocab_size) {
  PromptBatch in;
  in.b = static_cast<int64_t>(prompts.size());
  for (const auto& p : prompts) {
    ALPACA_CHECK(!p.empty(), "generate: an empty prompt (no tokens)");
    for (int64_t id : p)
      ALPACA_CHECK(id >= 0 && id < vocab_size,
                   "generate: token id " << id << " is outside the model's vocabulary [0, " << vocab_size << ")");
    in.t = std::max<int64_t>(in.t, static_cast<int64_t>(p.size()));
  }
  const bool left = opts.padding_side == PaddingSide::kLeft;
  in.ids_bt = at::full({in.b, in.t}, opts.pad_token_id, at::kLong);
  in.mask_bt = at::zeros({in.b, in.t}, at::kLong);
  in.last_b = at::empty({in.b}, at::kLong);
  for (int64_t r = 0; r < in.b; ++r) {
    const int64_t n = static_cast<int64_t>(prompts[r].size());
    const int64_t start = left ? in.t - n : 0;
    in.ids_bt[r].narrow(0, start, n).copy_(at::tensor(prompts[r], at::kLong));
    in.mask_bt[r].narrow(0, start, n).fill_(1);
    in.last_b[r] = start + n - 1;
    in.padded = in.padded || n < in.t;
  }
  in.pos_bt = (in.mask_bt.cumsum(-1) - 1).masked_fill(in.mask_bt == 0, 0);
  in.next_pos_b1 = in.mask_bt.sum(-1, /*keepdim=*/true);  // = last position + 1
  return in;
}

// The tokens each row has seen (for the repetition penalty), on the device; undefined without one.
at::Tensor seen_tokens(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& opts, int64_t vocab,
                       const at::Device& device) {
  if (opts.sampling.repetition_penalty == 1.0) return {};
  const int64_t b = static_cast<int64_t>(prompts.size());
  at::Tensor seen_bv = at::zeros({b, vocab}, at::TensorOptions().dtype(at::kBool).device(device));
  for (int64_t r = 0; r < b; ++r)
    seen_bv[r].index_fill_(0, at::tensor(prompts[r], at::kLong).clamp_max(vocab - 1).to(device), true);
  return seen_bv;
}

// Appends each unfinished row's next token to its generation (a finished row's becomes the pad
// token); returns the number of rows that stopped at an EOS token in this step.
int64_t take_tokens(at::Tensor& next_b, const GenerateOptions& opts, std::vector<Generation>& out,
                    std::vector<bool>& done, const TokenCallback& on_token) {
  auto acc = next_b.accessor<int64_t, 1>();
  int64_t stopped = 0;
  for (int64_t r = 0; r < next_b.size(0); ++r) {
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
      ++stopped;
    }
  }
  return stopped;
}

// transformers' MaxLengthCriteria: once per process, when a sequence still generating has passed
// config.json's max_position_embeddings (RoPE goes on past it; the model may degrade, or not).
void warn_past_max_positions(int64_t cur_len, int64_t max_positions) {
  static std::atomic<bool> warned{false};
  if (max_positions <= 0 || cur_len <= max_positions || warned.exchange(true)) return;
  ALPACA_WARN("the sequence being generated has passed the model's max_position_embeddings (" << max_positions
              << ", config.json): depending on the model, expect degraded output, or nothing at all "
                 "(transformers warns alike); a shorter prompt or --max_new_tokens stays within it");
}

}  // namespace

std::vector<Generation> generate_batch(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerateOptions& opts, at::Generator& gen, const TokenCallback& on_token) {
  ALPACA_CHECK(!prompts.empty(), "generate: no prompts");
  ALPACA_CHECK(opts.max_new_tokens > 0, "--max_new_tokens must be positive, got " << opts.max_new_tokens);
  validate(opts.sampling);
  at::NoGradGuard no_grad;
  const at::Tensor w = m->lm_head_weight();
  const at::Device device = w.device();
  const PromptBatch in = pad_prompts(prompts, opts, m->config().vocab_size);
  const int64_t b = in.b, t = in.t;
  const bool left = opts.padding_side == PaddingSide::kLeft;

  if (opts.max_length)
    ALPACA_USER_CHECK(*opts.max_length > t, "a prompt of " << t << " tokens leaves no room under max_length "
                      << *opts.max_length << " (generation_config.json, which counts the prompt, as transformers "
                      "does); pass --max_new_tokens N to generate N tokens after it");
  const int64_t max_new_tokens = opts.max_length ? *opts.max_length - t : opts.max_new_tokens;
  const int64_t capacity = t + max_new_tokens;
  model::KvCache cache(m->config(), b, capacity, w.options());
  // The growing attention mask, on the device; only needed when some row is padded.
  at::Tensor mask_full;
  if (in.padded) {
    mask_full = at::ones({b, capacity}, at::TensorOptions().dtype(at::kLong).device(device));
    mask_full.narrow(1, 0, t).copy_(in.mask_bt);
  }
  at::Tensor seen_bv = seen_tokens(prompts, opts, w.size(0), device);

  at::Tensor logits_bv = m->forward_cached(in.ids_bt.to(device), cache,
                                           in.padded ? mask_full.narrow(1, 0, t) : at::Tensor(), in.pos_bt.to(device),
                                           left ? at::Tensor() : in.last_b.to(device));
  std::optional<model::CpuDecoder> fused;
  if (opts.fused_cpu_decode && model::CpuDecoder::unsupported(*m, b).empty()) fused.emplace(*m, b);
  std::vector<Generation> out(b);
  std::vector<bool> done(b, false);
  int64_t num_done = 0;
  at::Tensor next_pos_dev = in.next_pos_b1.to(device);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    at::Tensor scores = process_logits(logits_bv.to(at::kFloat), seen_bv, opts.sampling);
    at::Tensor next_b = select_next_tokens(scores, opts.sampling, gen);  // CPU int64
    num_done += take_tokens(next_b, opts, out, done, on_token);
    if (num_done == b || step + 1 == max_new_tokens) break;
    warn_past_max_positions(t + step + 1, m->config().max_position_embeddings);
    at::Tensor next_dev = next_b.to(device).view({b, 1});
    if (seen_bv.defined()) seen_bv.scatter_(1, next_dev, true);
    const int64_t len = cache.length();
    const at::Tensor mask_bk = in.padded ? mask_full.narrow(1, 0, len + 1) : at::Tensor();
    // The fused step has no sliding window: past it, the module path (same cache) masks it.
    logits_bv = fused && !m->window_cuts(len + 1) ? fused->step(next_dev, cache, mask_bk, next_pos_dev)
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
