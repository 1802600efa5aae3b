// New tokens per second of our generation (not part of ctest; bench/generate_bench.py drives it).
//   bench_generate <model_dir> <prompts.json> <batch_size> <max_new_tokens> [bf16]
// prompts.json: {"prompts": [[ids...], ...]} (tokenized by the caller, so both sides decode the
// same inputs). Greedy, EOS from the prompts file's "eos_token_id". One warm-up batch first.
// Prints one JSON line: {"new_tokens", "seconds", "cpu_seconds", "tokens_per_s", "generations"}
// (cpu_seconds: process CPU time, which a busy shared machine distorts less than wall time).
#include <ATen/CPUGeneratorImpl.h>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "alpaca/generate/generator.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"

using namespace alpaca;

int main(int argc, char** argv) {
  try {
    ALPACA_CHECK(argc >= 5, "usage: bench_generate <model_dir> <prompts.json> <batch_size> <max_new_tokens> [bf16]");
    const bool bf16 = argc > 5 && std::string(argv[5]) == "bf16";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(argv[2]));
    auto prompts = j["prompts"].get<std::vector<std::vector<int64_t>>>();
    generate::GenerateOptions opts;
    opts.max_new_tokens = std::stoll(argv[4]);
    opts.eos_token_ids = j["eos_token_id"].get<std::vector<int64_t>>();
    opts.pad_token_id = j["pad_token_id"].get<int64_t>();
    const int64_t batch = std::stoll(argv[3]);
    model::LlamaForCausalLM m = io::load_hf_model(argv[1], bf16 ? at::kBFloat16 : at::kFloat);
    m->eval();
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    {
      generate::GenerateOptions warm = opts;
      warm.max_new_tokens = 4;
      generate::generate_batch(m, {prompts[0]}, warm, gen);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    auto gens = generate::generate_all(m, prompts, opts, batch, gen);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu_secs = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    int64_t n = 0;
    nlohmann::json out_ids = nlohmann::json::array();
    for (const auto& g : gens) {
      n += static_cast<int64_t>(g.ids.size());
      out_ids.push_back(g.ids);
    }
    std::cout << nlohmann::json{{"new_tokens", n}, {"seconds", secs}, {"cpu_seconds", cpu_secs}, {"tokens_per_s", n / secs},
                                {"generations", out_ids}}.dump()
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_generate: " << e.what() << "\n";
    return 1;
  }
}
