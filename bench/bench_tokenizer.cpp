// Tokenization throughput of our tokenizer on a list of texts (bench/bench_tokenizer.py runs it
// beside the `tokenizers` library and prints the ratio).
//   bench_tokenizer <tokenizer dir> <texts.json: a JSON list of strings> <threads> [ids_out.json]
// Prints one JSON line: texts, tokens, seconds (best of 3), texts_per_s, tokens_per_s.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/sys.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: bench_tokenizer <tokenizer dir> <texts.json> <threads> [ids_out.json]\n";
    return 2;
  }
  auto tok = alpaca::tokenizer::Tokenizer::load(argv[1], /*use_fast=*/true);
  std::ifstream in(argv[2]);
  const auto texts = nlohmann::json::parse(in).get<std::vector<std::string>>();
  const int threads = std::max(1, std::atoi(argv[3]));
  std::vector<std::vector<int64_t>> ids(texts.size());
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    alpaca::sys::Timer timer;
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < texts.size();) ids[i] = tok.encode(texts[i]);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    best = std::min(best, timer.seconds());
  }
  size_t tokens = 0;
  for (const auto& v : ids) tokens += v.size();
  if (argc > 4) std::ofstream(argv[4]) << nlohmann::json(ids).dump();
  std::cout << nlohmann::json{{"texts", texts.size()}, {"tokens", tokens}, {"threads", threads},
                              {"seconds", best}, {"texts_per_s", texts.size() / best},
                              {"tokens_per_s", tokens / best}}
                   .dump()
            << "\n";
  return 0;
}
