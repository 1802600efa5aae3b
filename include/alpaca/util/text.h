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
// The factor of a byte-size unit, spelled upper case, as transformers' convert_file_size_to_int
// reads it: "" 1, KB/MB/GB powers of 1000, KIB/MIB/GIB powers of 1024; 0 for another unit.
double byte_unit_scale(const std::string& upper_unit);

}  // namespace alpaca::text
