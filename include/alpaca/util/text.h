// Small text helpers shared by the flag parser (cli/) and the option builders below it
// (fsdp/policy.cpp), so a word is read by the same rule wherever it is parsed.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace alpaca::text {

// ASCII lower case.
std::string lower(std::string s);
// HF's string_to_bool spellings, case-insensitive: true/1/yes/y/t and false/0/no/n/f.
std::optional<bool> parse_bool_text(const std::string& text);
// The entry of `known` closest to `unknown` (edit distance), or "" when none is close enough to
// be a plausible typo; for "did you mean" hints.
std::string closest_name(const std::string& unknown, const std::vector<std::string>& known);
// The whole of `text` as a long (std::stol's syntax), or none when it is empty, holds anything
// after the number or is out of range; callers check the range they accept.
std::optional<long> parse_whole_long(const std::string& text);
// A byte size as transformers' convert_file_size_to_int reads it (--save_max_shard_size and the
// subcommands' shard sizes): KB/MB/GB powers of 1000, KiB/MiB/GiB powers of 1024, units in any case,
// and a lower-case b after K, M or G means bits ("8Gb" is 1 GB, "8GiB"/"8gib" are bytes). Beyond
// transformers: a plain byte count ("1000", "1000B") and a decimal number ("1.5GB"). Surrounding
// whitespace is ignored. `error` is empty on success, else says what is wrong with the text (the
// caller names the flag).
struct ByteSize {
  long long bytes = 0;
  std::string error;
};
ByteSize parse_byte_size(const std::string& text);

}  // namespace alpaca::text
