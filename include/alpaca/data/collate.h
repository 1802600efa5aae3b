// The collator: a micro-batch of examples -> padded tensors (train.py's
// DataCollatorForSupervisedDataset): right padding to the longest example, ids padded with the
// pad id, labels with -100, attention_mask = real tokens. Packed examples also carry position
// and segment ids.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <vector>

#include "alpaca/data/alpaca_example.h"

namespace alpaca::data {

struct Batch {
  at::Tensor input_ids_bt;       // (B, T) int64, padded with pad_id
  at::Tensor labels_bt;          // (B, T) int64, -100 on prompt and padding
  at::Tensor attention_mask_bt;  // (B, T) bool, input_ids != pad_id (as train.py)
  at::Tensor position_ids_bt;    // (B, T) int64, packing only (undefined otherwise); 0 on padding
  at::Tensor segment_ids_bt;     // (B, T) int64, packing only (undefined otherwise); -1 on padding
  // Tokens that contribute to the causal-LM loss: labels[:, 1:] != -100 (after the shift).
  int64_t num_label_tokens = 0;
};

// Throws on an empty micro-batch, a null example, an empty example, or mixed packed/unpacked.
Batch collate(const std::vector<const Example*>& examples, int64_t pad_id);

// Label tokens of one example after the causal shift (labels[1:] != -100).
int64_t count_label_tokens(const Example& example);

}  // namespace alpaca::data
