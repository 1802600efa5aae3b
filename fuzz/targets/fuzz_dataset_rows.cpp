// Dataset rows in every JSON format (messages, sharegpt, prompt_completion, alpaca, text, tokenized), detected from
// the first row as --data_path does: accepted, or an alpaca::Error naming the file and row.
#include "alpaca/data/conversation.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FUZZ_EXPECT_ALPACA_ERRORS({ (void)alpaca::data::parse_dataset_rows(fuzz::as_string(data, size), "chat.jsonl"); });
  return 0;
}
