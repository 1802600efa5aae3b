// Right-padding collator (train.py's DataCollatorForSupervisedDataset, TRL's for its rows), plus packed ids.
#include "alpaca/data/collate.h"

#include <algorithm>

#include "alpaca/util/error.h"

namespace alpaca::data {

int64_t count_label_tokens(const Example& ex) {
  int64_t n = 0;
  for (size_t t = 1; t < ex.labels.size(); ++t) n += ex.labels[t] != kIgnoreIndex;
  return n;
}

int64_t round_up_to_multiple(int64_t n, int64_t m) {
  ALPACA_CHECK(m >= 1, "round_up_to_multiple: the multiple must be positive, got " << m);
  return (n + m - 1) / m * m;
}

Batch collate(const std::vector<const Example*>& examples, int64_t pad_id, AttentionMask rule,
              int64_t pad_to_multiple_of) {
  ALPACA_CHECK(!examples.empty(), "collate: empty micro-batch");
  const int64_t b = static_cast<int64_t>(examples.size());
  int64_t t_max = 0;
  const bool packed = !examples[0] || !examples[0]->position_ids.empty();
  for (int64_t i = 0; i < b; ++i) {
    const Example* ex = examples[i];
    ALPACA_CHECK(ex, "collate: example " << i << " of the micro-batch is null");
    ALPACA_CHECK(!ex->input_ids.empty(), "collate: example " << i << " has no tokens");
    ALPACA_CHECK(ex->labels.size() == ex->input_ids.size(),
                 "collate: example " << i << " has " << ex->input_ids.size() << " ids but "
                                     << ex->labels.size() << " labels");
    ALPACA_CHECK(packed == !ex->position_ids.empty(),
                 "collate: packed and unpacked examples mixed in one micro-batch");
    if (packed)
      ALPACA_CHECK(ex->position_ids.size() == ex->input_ids.size() &&
                       ex->segment_ids.size() == ex->input_ids.size(),
                   "collate: packed example " << i << " has mismatched position/segment ids");
    t_max = std::max<int64_t>(t_max, ex->input_ids.size());
  }
  t_max = round_up_to_multiple(t_max, pad_to_multiple_of);
  auto opts = at::TensorOptions().dtype(at::kLong);
  Batch batch;
  batch.input_ids_bt = at::full({b, t_max}, pad_id, opts);
  batch.labels_bt = at::full({b, t_max}, kIgnoreIndex, opts);
  batch.attention_mask_bt = at::zeros({b, t_max}, at::TensorOptions().dtype(at::kBool));
  if (packed) {
    batch.position_ids_bt = at::zeros({b, t_max}, opts);
    batch.segment_ids_bt = at::full({b, t_max}, -1, opts);
  }
  auto ids = batch.input_ids_bt.accessor<int64_t, 2>();
  auto labels = batch.labels_bt.accessor<int64_t, 2>();
  auto mask = batch.attention_mask_bt.accessor<bool, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const Example& ex = *examples[i];
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      ids[i][t] = ex.input_ids[t];
      labels[i][t] = ex.labels[t];
      // train.py: attention_mask = input_ids.ne(pad_token_id), so even a "[PAD]" string
      // inside the text is masked; kept for parity. TRL: every token of the example.
      mask[i][t] = rule == AttentionMask::kExampleTokens || ex.input_ids[t] != pad_id;
    }
    batch.num_label_tokens += count_label_tokens(ex);
    if (packed) {
      auto pos = batch.position_ids_bt.accessor<int64_t, 2>();
      auto seg = batch.segment_ids_bt.accessor<int64_t, 2>();
      for (size_t t = 0; t < ex.input_ids.size(); ++t) {
        pos[i][t] = ex.position_ids[t];
        seg[i][t] = ex.segment_ids[t];
      }
    }
  }
  return batch;
}

TokenCounts token_counts(const Batch& batch, int64_t pad_id, int64_t pad_to_multiple_of, bool padding_free) {
  TokenCounts c;
  c.masked = batch.attention_mask_bt.sum().item<int64_t>();
  if (!padding_free || !batch.segment_ids_bt.defined()) {
    c.attended = c.non_padding = c.masked;
    c.elements = batch.input_ids_bt.numel();
    return c;
  }
  // The padding-free row: every example token (segment >= 0), then padding to the multiple.
  const at::Tensor real = batch.segment_ids_bt.ge(0);
  c.attended = c.elements = round_up_to_multiple(real.sum().item<int64_t>(), pad_to_multiple_of);
  c.non_padding = real.logical_and(batch.input_ids_bt.ne(pad_id)).sum().item<int64_t>();
  return c;
}

}  // namespace alpaca::data
