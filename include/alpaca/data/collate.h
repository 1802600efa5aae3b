// The collator: a micro-batch of examples -> padded tensors (train.py's
// DataCollatorForSupervisedDataset, or TRL's DataCollatorForLanguageModeling): right padding to the
// longest example, ids padded with the pad id, labels with -100, an attention mask by the rule of
// the recipe (AttentionMask). Packed examples also carry position and segment ids.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <vector>

#include "alpaca/data/alpaca_example.h"

namespace alpaca::data {

struct Batch {
  at::Tensor input_ids_bt;       // (B, T) int64, padded with pad_id
  at::Tensor labels_bt;          // (B, T) int64, -100 on prompt and padding
  at::Tensor attention_mask_bt;  // (B, T) bool, by the AttentionMask rule
  at::Tensor position_ids_bt;    // (B, T) int64, packing only (undefined otherwise); 0 on padding
  at::Tensor segment_ids_bt;     // (B, T) int64, packing only (undefined otherwise); -1 on padding
  // Tokens that contribute to the causal-LM loss: labels[:, 1:] != -100 (after the shift).
  int64_t num_label_tokens = 0;
};

// Which positions the attention mask keeps. train.py (Alpaca records) builds it from the ids,
// `input_ids.ne(pad_token_id)`, so a pad id inside an example is masked too; TRL's collator keeps
// every token of an example and masks only the padding after it, which matters when the pad token
// is a token of the text (TRL pads with eos when the tokenizer has no pad: `<|im_end|>`, `</s>`).
enum class AttentionMask { kNotPadId, kExampleTokens };

// Throws on an empty micro-batch, a null example, an empty example, or mixed packed/unpacked.
// pad_to_multiple_of (TRL's DataCollatorForLanguageModeling): the batch length is the longest
// example's rounded up to a multiple of it; the extra positions are padding like any other (pad id,
// label -100, masked; packed: position 0, segment -1).
Batch collate(const std::vector<const Example*>& examples, int64_t pad_id, AttentionMask rule,
              int64_t pad_to_multiple_of = 1);

// n rounded up to a multiple of m (m >= 1).
int64_t round_up_to_multiple(int64_t n, int64_t m);

// The token counts Hugging Face's trainers log for a collated batch. `padding_free`: TRL's bfd
// packing, whose collator concatenates the micro-batch's rows into one (padded to pad_to_multiple_of)
// and passes no attention mask; otherwise the rows as collated.
struct TokenCounts {
  int64_t masked = 0;       // attention-mask tokens of the rows as collated (the tokens trained on)
  int64_t attended = 0;     // TRL's num_tokens: attention-mask tokens, or the padding-free row's length
  int64_t elements = 0;     // HF include_num_input_tokens_seen "all": input_ids' elements
  int64_t non_padding = 0;  // HF "non_padding": attention-mask tokens, or the padding-free row's ids != pad id
};
TokenCounts token_counts(const Batch& batch, int64_t pad_id, int64_t pad_to_multiple_of, bool padding_free);

// Label tokens of one example after the causal shift (labels[1:] != -100).
int64_t count_label_tokens(const Example& example);

}  // namespace alpaca::data
