// Shared by the tokenizer tests that compare with a Python fixture (hf_tokenizer, llama2_variants,
// slow_llama_428): the names they use, where a fixture's files lie, reading and writing them,
// and the check that the fixture has run.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "alpaca/data/alpaca_example.h"
#include "test_util.h"

namespace alpaca::tokenizer::test {

namespace fs = std::filesystem;
using namespace ::alpaca::testing;
using data::load_alpaca_records;
using data::tokenize_alpaca;
using nlohmann::json;

// build/fixtures/<name>: what the Python reference (ctest's fixture_<name>) wrote.
inline fs::path fixture_dir(const std::string& name) { return binary_dir() / "fixtures" / name; }

inline json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// `text` as the whole of `p`.
inline void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// Loads each directory of `dirs` (" dir1 dir2 ...", saved by our Tokenizer::save) with
// transformers' AutoTokenizer and expects what `ours` holds for it (keyed by the directory's
// name): len, pad, eos, bos and unk when `with_bos_unk`, and the ids of every text. The script
// is written to `tmp`.
inline void expect_auto_tokenizer_agrees(const fs::path& tmp, const std::string& dirs,
                                         const std::vector<std::string>& texts, const json& ours, bool with_bos_unk) {
  const fs::path script = tmp / "check.py";
  const std::string bos_unk = with_bos_unk ? "'bos': t.bos_token_id, 'unk': t.unk_token_id, " : "";
  write(script,
        "import sys, json\n"
        "from transformers import AutoTokenizer\n"
        "texts = json.loads(sys.argv[1])\n"
        "out = {}\n"
        "for d in sys.argv[2:]:\n"
        "    t = AutoTokenizer.from_pretrained(d)\n"
        "    out[d.rsplit('/', 1)[1]] = {'len': len(t), 'pad': t.pad_token_id, 'eos': t.eos_token_id,\n"
        "        " + bos_unk + "'ids': [t(s)['input_ids'] for s in texts]}\n"
        "print(json.dumps(out))\n");
  std::string out;
  const int rc =
      run_command(python() + " " + script.string() + " '" + json(texts).dump() + "'" + dirs + " 2>/dev/null", &out);
  ASSERT_EQ(rc, 0) << out;
  const json theirs = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(theirs, ours) << "transformers: " << theirs.dump() << "\nours: " << ours.dump();
}

}  // namespace alpaca::tokenizer::test

// Skips without the shared Alpaca data; fails when the fixture in `dir` has not run (`name` is
// its ctest name, without the fixture_ prefix).
#define ALPACA_REQUIRE_TOKENIZER_FIXTURE(dir, name)                 \
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");            \
  ASSERT_TRUE(fs::exists((dir) / "reference.json"))                 \
      << "run the fixture first: ctest -R " name " (fixture_" name ")"
