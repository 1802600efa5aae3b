// Mirrors transformers/generation/logits_process.py (5.x) op for op on fp32 scores.
#include "alpaca/generate/logits_process.h"

#include <cmath>
#include <limits>

#include "alpaca/util/error.h"

namespace alpaca::generate {

void validate(const SamplingParams& p) {
  ALPACA_CHECK(std::isfinite(p.temperature) && p.temperature > 0,
               "--temperature must be a positive number, got " << p.temperature
                                                               << " (for greedy decoding leave --do_sample off)");
  ALPACA_CHECK(p.top_k >= 0, "--top_k must be >= 0 (0 = off), got " << p.top_k);
  ALPACA_CHECK(p.top_p > 0 && p.top_p <= 1, "--top_p must be in (0, 1] (1 = off), got " << p.top_p);
  ALPACA_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
               "--repetition_penalty must be a positive number (1 = off), got " << p.repetition_penalty);
}

at::Tensor apply_repetition_penalty(const at::Tensor& scores_bv, const at::Tensor& seen_bv, double penalty) {
  at::Tensor penalised = at::where(scores_bv < 0, scores_bv * penalty, scores_bv / penalty);
  return at::where(seen_bv, penalised, scores_bv);
}

at::Tensor apply_temperature(const at::Tensor& scores_bv, double temperature) { return scores_bv / temperature; }

at::Tensor apply_top_k(const at::Tensor& scores_bv, int64_t top_k) {
  const int64_t k = std::min<int64_t>(top_k, scores_bv.size(-1));
  at::Tensor kth_b1 = std::get<0>(at::topk(scores_bv, k)).narrow(-1, k - 1, 1);
  return scores_bv.masked_fill(scores_bv < kth_b1, -std::numeric_limits<float>::infinity());
}

at::Tensor apply_top_p(const at::Tensor& scores_bv, double top_p) {
  auto [sorted, indices] = at::sort(scores_bv, /*dim=*/-1, /*descending=*/false);
  at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
  at::Tensor remove_sorted = cumulative <= (1 - top_p);
  remove_sorted.narrow(-1, remove_sorted.size(-1) - 1, 1).fill_(false);  // min_tokens_to_keep = 1
  at::Tensor remove = remove_sorted.scatter(1, indices, remove_sorted);
  return scores_bv.masked_fill(remove, -std::numeric_limits<float>::infinity());
}

at::Tensor process_logits(const at::Tensor& scores_bv, const at::Tensor& seen_bv, const SamplingParams& p) {
  at::Tensor s = scores_bv;
  if (p.repetition_penalty != 1.0) {
    ALPACA_CHECK(seen_bv.defined(), "process_logits: the repetition penalty needs the tokens seen so far");
    s = apply_repetition_penalty(s, seen_bv, p.repetition_penalty);
  }
  if (!p.do_sample) return s;  // transformers applies the warpers only when sampling
  if (p.temperature != 1.0) s = apply_temperature(s, p.temperature);
  if (p.top_k != 0) s = apply_top_k(s, p.top_k);
  if (p.top_p < 1.0) s = apply_top_p(s, p.top_p);
  return s;
}

at::Tensor select_next_tokens(const at::Tensor& scores_bv, const SamplingParams& p, at::Generator& gen) {
  if (!p.do_sample) return scores_bv.argmax(-1).cpu();
  at::Tensor probs = scores_bv.softmax(-1).cpu();
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(1);
}

}  // namespace alpaca::generate
