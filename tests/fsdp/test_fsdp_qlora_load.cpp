// Loading a pre-quantized bitsandbytes 4-bit checkpoint (issue 29) into the engine's 4-bit store,
// under mpirun 1, 2, 4. The fixture (tests/reference/bnb4bit_checkpoint_ref.py) saves a tiny random
// LLaMA in fp32 and the same model through transformers + bitsandbytes on the CPU
// (BitsAndBytesConfig(load_in_4bit=True), model.save_pretrained): packed uint8 linears with their
// absmax / quant_map / nested statistics / quant_state. Loading the bnb directory (each rank copying
// its own shard's bytes, nothing dequantized) must give exactly what quantizing the fp32 directory
// at load gives: the dequantized base and a forward/backward's loss and adapter gradients bitwise
// equal, for nf4 nested and fp4 plain. Bad input is refused naming the tensor or the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/fsdp/load_checkpoint.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/model/loss.h"
#include "alpaca/util/error.h"
#include "fsdp_test_env.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace alpaca::testing::test_fsdp_qlora_load {
namespace {

const auto* g_env = register_job_comm(fsdp_job_options());

fs::path fixture() { return binary_dir() / "fixtures" / "bnb4bit_checkpoint"; }

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(fixture() / "SKIPPED")) GTEST_SKIP() << "bnb4bit fixture skipped (no shared data)"

using ParamMap = std::map<std::string, at::Tensor>;

// The fixture's model with LoRA r=4 on every linear, sharded full_shard over the job, the base loaded
// from `dir` (the adapters keep their seeded initial values). quant_type "": a plain LoRA run.
// rank0_only: the plain tensors are read by rank 0 and broadcast (cpu_ram_efficient_loading).
std::unique_ptr<fsdp::FsdpLlama> load(const fs::path& dir, const std::string& quant_type, bool nested,
                                      bool rank0_only = false) {
  const model::LlamaConfig c = model::LlamaConfig::from_json_file((fixture() / "model" / "config.json").string());
  model::LlamaForCausalLM m(c);
  model::init_weights(m, 3);
  model::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.dropout = 0.0;
  o.target_modules = {"all-linear"};
  model::apply_lora(*m, o, 5);
  {
    at::NoGradGuard ng;
    for (auto& p : m->named_parameters())
      if (p.key().ends_with("lora_B.weight")) p.value().fill_(0.01);  // A gets a gradient too
  }
  fsdp::FsdpPolicy p;
  p.quant4_type = quant_type;
  p.quant4_nested = nested;
  p.sync_module_states = false;
  auto f = fsdp::apply_fsdp(std::move(m), job_comm(), p);
  fsdp::load_checkpoint(f->engine(), dir.string(), rank0_only, /*vocab_mean_from=*/-1,
                        [](const std::string& n) { return !model::is_lora_param(n); });
  return f;
}

ParamMap exported(fsdp::FsdpLlama& f) {
  ParamMap out;
  f.engine().export_full_state([&](const std::string& n, const at::Tensor& t) { out[n] = t; }, /*all_ranks=*/true);
  return out;
}

// This rank's loss sum on its part of a fixed batch and its adapter gradient shards after backward.
std::pair<double, std::vector<at::Tensor>> loss_and_grads(fsdp::FsdpLlama& f) {
  const int world = job_comm()->world_size(), rank = job_comm()->rank();
  const GlobalBatch b = make_global_batch(32000, 4 * world, 9, 7);
  auto ls = model::causal_lm_loss_sum(f.forward(b.ids_bt.narrow(0, 4 * rank, 4)), b.labels_bt.narrow(0, 4 * rank, 4));
  (ls.sum / static_cast<double>(b.num_tokens)).backward();
  return {ls.sum.item<double>(), f.engine().grad_shards()};
}

}  // namespace

TEST(FsdpQloraLoad, PrequantizedBnbCheckpointIsTheSameStoreAsQuantizingAtLoad) {
  SKIP_WITHOUT_FIXTURE();
  struct C { const char* dir; const char* type; bool nested; };
  for (const C& c : {C{"model-nf4-nested-bnb-4bit", "nf4", true}, C{"model-fp4-bnb-4bit", "fp4", false}}) {
    auto from_bnb = load(fixture() / c.dir, c.type, c.nested);
    auto from_fp32 = load(fixture() / "model", c.type, c.nested);
    EXPECT_EQ(from_bnb->engine().memory_account().frozen_bytes, from_fp32->engine().memory_account().frozen_bytes);
    const ParamMap a = exported(*from_bnb), b = exported(*from_fp32);
    ASSERT_EQ(a.size(), b.size()) << c.dir;
    int quantized = 0;
    for (const auto& [n, t] : b) {
      EXPECT_TRUE(at::equal(a.at(n), t)) << c.dir << ": " << n;
      quantized += n.find("layers.") != std::string::npos && n.ends_with("proj.weight");
    }
    EXPECT_EQ(quantized, 2 * 7) << c.dir;
    const auto [loss_a, grads_a] = loss_and_grads(*from_bnb);
    const auto [loss_b, grads_b] = loss_and_grads(*from_fp32);
    EXPECT_EQ(loss_a, loss_b) << c.dir;
    ASSERT_EQ(grads_a.size(), grads_b.size());
    for (size_t i = 0; i < grads_b.size(); ++i) EXPECT_TRUE(at::equal(grads_a[i], grads_b[i])) << c.dir << ": grad shard " << i;
    // With rank0_only the 4-bit bytes are still read by every rank (its own shard's), the norms broadcast.
    const ParamMap c0 = exported(*load(fixture() / c.dir, c.type, c.nested, /*rank0_only=*/true));
    for (const auto& [n, t] : b) EXPECT_TRUE(at::equal(c0.at(n), t)) << c.dir << " rank0_only: " << n;
    if (job_comm()->rank() == 0)
      std::cout << "[qlora load] world " << job_comm()->world_size() << " " << c.dir << ": loss sum " << loss_a
                << " from the bnb directory, " << loss_b << " quantizing the fp32 one\n";
  }
}

TEST(FsdpQloraLoad, BadCheckpointsAndMismatchedFlagsAreRefusedByName) {
  SKIP_WITHOUT_FIXTURE();
  // bnb4bit_checkpoint_ref.py gives layer 1's down_proj the transposed shape in its quant_state.
  std::string e = error_of([] { load(fixture() / "model-bad-quant-state", "nf4", true); });
  EXPECT_NE(e.find("model.layers.1.mlp.down_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("quant_state"), std::string::npos) << e;
  e = error_of([] { load(fixture() / "model-bad-quant-type", "nf4", true); });  // layer 0's k_proj says int4
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.weight has quant_type int4"), std::string::npos) << e;
  e = error_of([] { load(fixture() / "model-nf4-nested-bnb-4bit", "fp4", true); });
  EXPECT_NE(e.find("--bnb_4bit_quant_type nf4 --use_bnb_nested_quant True"), std::string::npos) << e;
  e = error_of([] { load(fixture() / "model-fp4-bnb-4bit", "fp4", true); });
  EXPECT_NE(e.find("without nested quantization"), std::string::npos) << e;
  e = error_of([] { load(fixture() / "model-fp4-bnb-4bit", "", false); });
  EXPECT_NE(e.find("--load_in_4bit True"), std::string::npos) << e;
}

}  // namespace alpaca::testing::test_fsdp_qlora_load

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
