// Load-time / peak-memory benchmark for HF checkpoints (not part of ctest; see run_load_bench.sh).
//   bench_hf_load create <config.json> <dir> [--dtype bfloat16]   random model, as init-model
//   bench_hf_load load <dir> [float32|bfloat16] [zero_copy]        load into LlamaForCausalLM
// Prints one line: seconds and peak resident memory (VmHWM) before and after.
#include <cstdio>
#include <iostream>
#include <string>

#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"

using namespace alpaca;

int main(int argc, char** argv) {
  try {
    ALPACA_CHECK(argc >= 3, "usage: bench_hf_load create <config.json> <dir> [dtype] | load <dir> [dtype]");
    const std::string mode = argv[1];
    const double gib = 1024.0 * 1024 * 1024;
    if (mode == "create") {
      ALPACA_CHECK(argc >= 4, "create needs <config.json> <dir>");
      const at::ScalarType dtype = io::parse_dtype_name(argc > 4 ? argv[4] : "bfloat16", "dtype");
      model::LlamaForCausalLM m(model::LlamaConfig::from_json_file(argv[2]));
      model::init_weights(m, 0);
      io::save_hf_directory(m, argv[3], dtype, io::parse_shard_size("2GB"));
      std::printf("created %s: %.3f B parameters\n", argv[3], model::num_parameters(m) / 1e9);
      return 0;
    }
    ALPACA_CHECK(mode == "load", "unknown mode " << mode);
    const at::ScalarType dtype = io::parse_dtype_name(argc > 3 ? argv[3] : "float32", "dtype");
    const int64_t rss0 = sys::peak_rss_bytes();
    sys::Timer timer;
    io::LoadOptions opts;
    opts.zero_copy = argc > 4 && std::string(argv[4]) == "zero_copy";
    model::LlamaForCausalLM m = io::load_hf_model(argv[2], dtype, opts);
    const double secs = timer.seconds();
    const int64_t peak = sys::peak_rss_bytes();
    int64_t param_bytes = 0;
    for (const auto& p : m->parameters()) param_bytes += p.numel() * p.element_size();
    std::printf("ours%-8s load %-8s %6.2f s  peak RSS %5.2f GiB (before %4.2f GiB, params %4.2f GiB)\n",
                opts.zero_copy ? "(0copy)" : "", io::dtype_name(dtype).c_str(), secs, peak / gib, rss0 / gib,
                param_bytes / gib);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
