// Batched autoregressive decoding over the model's KV cache, token for token what transformers'
// generate() does (greedy or sampling): prompts of different lengths are padded (left by default,
// as transformers requires for decoder-only models; right padding is also correct here because
// each row's logits are taken at its own last token and positions count real tokens only), each
// step feeds one token per row, and a row stops at the first of any EOS id (afterwards it is fed
// the pad id, as transformers does, until every row has stopped or max_new_tokens is reached).
// Runs wherever the model's parameters are (CPU or one GPU); no autograd.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Generator

#include "alpaca/generate/logits_process.h"
#include "alpaca/model/llama.h"

namespace alpaca::generate {

enum class PaddingSide { kLeft, kRight };

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  // transformers' max_length (counts the prompt), used when set: each batch gets max_length minus
  // its padded prompt length as new tokens, and a prompt that long or longer is an error.
  std::optional<int64_t> max_length;
  SamplingParams sampling;
  std::vector<int64_t> eos_token_ids;  // stop at any of them; empty = never stop early
  int64_t pad_token_id = 0;            // fills padding and rows that have stopped
  PaddingSide padding_side = PaddingSide::kLeft;
  // Decode steps of 1 to 8 rows on the CPU take the fused step (model::CpuDecoder) when it can run
  // the model; false: every step through the module graph (forward_cached), the reference path.
  bool fused_cpu_decode = true;
};

struct Generation {
  std::vector<int64_t> ids;  // the new tokens, ending with the EOS token when one was produced
  bool stopped_at_eos = false;
};

// Called once per new token of a row that has not stopped, in step order (row, token id).
using TokenCallback = std::function<void(int64_t row, int64_t token)>;

// Generates for one batch of `prompts` (token ids, each non-empty). `gen` is the CPU generator
// sampling draws from (unused when greedy); it advances, so successive calls continue one stream.
std::vector<Generation> generate_batch(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerateOptions& opts, at::Generator& gen,
                                       const TokenCallback& on_token = {});

// All `prompts`, `batch_size` at a time in order (results in prompt order).
std::vector<Generation> generate_all(model::LlamaForCausalLM& m, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerateOptions& opts, int64_t batch_size, at::Generator& gen);

}  // namespace alpaca::generate
