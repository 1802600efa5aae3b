// Reading a whole file, for the loaders whose "cannot open" error names their own fix
// (--data_path, the checkpoint, the tokenizer directory).
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

namespace alpaca::util {

// The bytes of the file at `path`, none when it cannot be opened.
inline std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace alpaca::util
