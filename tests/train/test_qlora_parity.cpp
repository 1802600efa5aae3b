// QLoRA (--use_peft --load_in_4bit) against the Hugging Face stack on the CPU
// (tests/reference/lora_parity_ref.py --load_in_4bit: transformers' BitsAndBytesConfig, NF4 with
// nested quantization, compute fp32, i.e. bitsandbytes' Linear4bit, + peft + torch AdamW + the same
// cosine schedule; tiny random LLaMA with 64-wide layers, 40 real Alpaca records, 20 steps, from
// our initial adapter): world 1 within 1e-4 relative per step (loss; grad norm 1e-3: the same
// tolerances as plain LoRA, since the dequantized weights are bitwise bitsandbytes' and only the
// order of fp32 sums differs); world 2 full_shard with checkpointing matches world 1 within 1e-5;
// the flags are refused where they cannot act, with exit 2 and nothing written. A pre-quantized
// bitsandbytes checkpoint (*-bnb-4bit) trains exactly like quantizing its fp32 source at load, and
// `merge` / `generate --adapter` on it match peft / transformers + bitsandbytes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/io/safetensors.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_qlora_parity {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("qlora_parity");

std::string qlora_args(const fs::path& out, int per_device, int accum) {
  return parity_flags(kFixture, out, 20, per_device, accum, "2e-2")
      .set("--use_peft True --lora_r 8 --lora_alpha 16 --lora_dropout 0")
      .set(kNf4Nested);
}

fs::path bnb_fixture() { return fixture_dir("bnb4bit_checkpoint"); }

// Three QLoRA steps on a model of the bnb4bit_checkpoint fixture (nf4, nested: the checkpoint's quantization).
std::string bnb_args(const fs::path& model, const fs::path& out) {
  return TrainFlags(bnb_fixture(), out).model(model).steps(3)
      .set("--per_device_train_batch_size 2 --learning_rate 1e-2 --save_strategy no")
      .set("--use_peft True --lora_r 8 --lora_dropout 0").set(kNf4Nested);
}

#define SKIP_WITHOUT_FIXTURE() \
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "reference fixture skipped (no shared data)"

}  // namespace

TEST(QloraParity, World1MatchesBitsandbytesAndPeftFor20Steps) {
  SKIP_WITHOUT_FIXTURE();
  std::ifstream rf(kFixture / "reference.json");
  const auto ref = nlohmann::json::parse(rf);
  ASSERT_TRUE(ref["config"]["load_in_4bit"].get<bool>());
  TempDir out("qlora_w1");
  std::string log;
  ASSERT_EQ(run_trainer(qlora_args(out.path(), 4, 2), 1, &log), 0) << log;
  EXPECT_NE(log.find("values 4-bit"), std::string::npos) << "the memory account does not show a 4-bit base:\n" << log;
  const auto steps = read_step_logs(out.path());
  ASSERT_EQ(steps.size(), 20u) << log;
  ReferenceSteps ref_steps = read_reference_steps(kFixture / "reference.json");
  ref_steps.learning_rates.clear();  // bitsandbytes' reference is compared on losses and norms only
  const auto [worst, worst_norm] = expect_steps_match(steps, ref_steps, "bitsandbytes+peft");
  EXPECT_LT(ref["losses"][19].get<double>(), ref["losses"][0].get<double>() - 0.05);
  // Every adapter matrix after 20 steps (each integrates its own gradients at every step), within
  // 1e-3 of its norm: the losses agree to ~2e-7 and the gradient norms to ~2e-5, but AdamW's
  // g / sqrt(v) divides the scale out, so the small components' rounding differences move the
  // weights by about 1e-4 of their norm over 20 steps at lr 2e-2; a wrong gradient moves them O(1).
  const auto ours = alpaca::io::SafetensorsFile::open((out.path() / "adapter_model.safetensors").string());
  const auto theirs = alpaca::io::SafetensorsFile::open((kFixture / "lora_final.safetensors").string());
  const auto init = alpaca::io::SafetensorsFile::open((kFixture / "lora_init.safetensors").string());
  double worst_w = 0;
  int n_lora = 0;
  for (const auto& n : theirs->names()) {
    const at::Tensor r = theirs->tensor(n), o = ours->tensor(n).to(at::kFloat);
    const std::string ours_name = n.substr(std::string("base_model.model.").size());
    const at::Tensor r0 = n.find("lora_A") != std::string::npos ? init->tensor(ours_name) : at::zeros_like(r);
    const double diff = (o - r).norm().item<double>(), rel = diff / r.norm().item<double>();
    worst_w = std::max(worst_w, rel);
    ++n_lora;
    EXPECT_LE(rel, 1e-3) << n << " after 20 steps";
    EXPECT_GT((r - r0).norm().item<double>(), 10 * diff) << n << " moved less than our difference from peft";
  }
  EXPECT_EQ(n_lora, 2 * 2 * 2) << "lora_A and lora_B of q_proj and v_proj in 2 layers";
  std::cout << "[qlora parity] world 1 vs transformers+bitsandbytes+peft: worst relative loss difference " << worst
            << ", grad norm " << worst_norm << ", adapter matrix after 20 steps " << worst_w << "; loss "
            << steps.front().loss << " -> " << steps.back().loss << "\n";

  TempDir w2("qlora_w2");
  ASSERT_EQ(run_trainer(qlora_args(w2.path(), 2, 2) + " --fsdp 'full_shard auto_wrap' --gradient_checkpointing True "
                        "--fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer", 2, &log), 0) << log;
  const auto got = read_step_logs(w2.path());
  ASSERT_EQ(got.size(), 20u) << log;
  const double worst2 = expect_losses_close(got, steps, 1e-5, "world 2");
  std::cout << "[qlora parity] world 2 full_shard + checkpointing vs world 1: worst " << worst2 << "\n";
}

TEST(QloraParity, FlagsAreRefusedWhereTheyCannotAct) {
  SKIP_WITHOUT_FIXTURE();
  const fs::path f = kFixture;
  const std::string base = "--model_name_or_path " + (f / "model").string() + " --data_path " + (f / "data.json").string() +
                           " --max_steps 1 --report_to none";
  struct Case { std::string flags, expect; };
  const std::vector<Case> cases = {
      {"--load_in_4bit True", "--use_peft"},
      {"--use_peft True --load_in_8bit True", "--load_in_4bit"},
      {"--use_peft True --load_in_4bit True --bnb_4bit_quant_type int4", "nf4"},
      {"--use_peft True --use_bnb_nested_quant True", "--load_in_4bit"},
      {"--use_peft True --load_in_4bit True --bnb_4bit_compute_dtype bfloat16", "run's dtype"},
  };
  for (const Case& c : cases) {
    TempDir out("qlora_bad");
    const fs::path dir = out.path() / "out";
    std::string log;
    EXPECT_EQ(run_trainer(base + " --output_dir " + dir.string() + " " + c.flags, 1, &log), 2) << c.flags << "\n" << log;
    EXPECT_NE(log.find(c.expect), std::string::npos) << c.flags << ": the message does not mention " << c.expect << "\n" << log;
    EXPECT_FALSE(fs::exists(dir)) << c.flags << ": " << dir << " was written";
  }
}

// A pre-quantized bitsandbytes checkpoint (tests/reference/bnb4bit_checkpoint_ref.py: transformers +
// bitsandbytes save_pretrained of the fp32 model/ loaded with BitsAndBytesConfig(load_in_4bit, nf4,
// double quant)) trains exactly as --load_in_4bit on its fp32 source: the same bytes, so the same
// losses and gradient norms at every step, at world 2. A quant_state that disagrees with the model
// fails naming the tensor, with nothing written.
TEST(QloraParity, PrequantizedBnbCheckpointTrainsLikeQuantizingAtLoad) {
  const fs::path f = bnb_fixture();
  if (fs::exists(f / "SKIPPED")) GTEST_SKIP() << "bnb4bit fixture skipped (no shared data)";
  const auto args = bnb_args;
  TempDir from_bnb("bnb_ckpt"), from_fp32("bnb_fp32");
  std::string log;
  ASSERT_EQ(run_trainer(args(f / "model-nf4-nested-bnb-4bit", from_bnb.path()), 2, &log), 0) << log;
  ASSERT_EQ(run_trainer(args(f / "model", from_fp32.path()), 2, &log), 0) << log;
  const auto a = read_step_logs(from_bnb.path()), b = read_step_logs(from_fp32.path());
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i + 1;
  }
  std::cout << "[qlora bnb checkpoint] world 2, 3 steps: losses " << a[0].loss << " " << a[1].loss << " " << a[2].loss
            << " from the bnb directory, " << b[0].loss << " " << b[1].loss << " " << b[2].loss << " from fp32\n";
  // A quant_state of another shape, and an unknown quant_type (int4): named, nothing written.
  const std::vector<std::pair<std::string, std::string>> bads = {
      {"model-bad-quant-state", "model.layers.1.mlp.down_proj.weight"},
      {"model-bad-quant-type", "model.layers.0.self_attn.k_proj.weight has quant_type int4"}};
  for (const auto& [model, expect] : bads) {
    TempDir bad("bnb_bad");
    const fs::path dir = bad.path() / "out";
    EXPECT_NE(run_trainer(args(f / model, dir), 2, &log), 0) << model << "\n" << log;
    EXPECT_NE(log.find(expect), std::string::npos) << model << "\n" << log;
    EXPECT_FALSE(fs::exists(dir / "adapter_model.safetensors")) << model << "\n" << log;
    EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << model << "\n" << log;
  }
}

// On a 4-bit base (the *-bnb-4bit fixture) and the adapter trained on it: `merge` (and
// --merge_adapter True at the end of training, the same bytes) dequantizes
// (bitsandbytes' dequantize_4bit) and merges into a plain HF directory equal to peft's
// merge_and_unload on transformers' dequantized model; `generate --adapter` (the base dequantized at
// load, the adapter unmerged) gives the greedy tokens of transformers + bitsandbytes' Linear4bit +
// peft (tests/reference/qlora_merge_generate_check.py).
TEST(QloraParity, MergeAndGenerateOnA4bitBaseMatchPeft) {
  const fs::path f = bnb_fixture(), base = f / "model-nf4-nested-bnb-4bit";
  if (fs::exists(f / "SKIPPED")) GTEST_SKIP() << "bnb4bit fixture skipped (no shared data)";
  TempDir run("bnb_merge");
  const fs::path adapter = run.path() / "adapter", merged = run.path() / "merged";
  std::string log;
  ASSERT_EQ(run_trainer(bnb_args(base, adapter) + " --merge_adapter True", 1, &log), 0) << log;
  ASSERT_EQ(run_command(train_bin() + " merge --model_name_or_path " + base.string() + " --adapter " + adapter.string() +
                            " --output_dir " + merged.string() + " 2>&1", &log), 0) << log;
  {  // --merge_adapter True at the end of training wrote the same merged model
    auto x = alpaca::io::SafetensorsFile::open((adapter / "merged" / "model.safetensors").string());
    auto y = alpaca::io::SafetensorsFile::open((merged / "model.safetensors").string());
    ASSERT_EQ(x->names(), y->names());
    for (const auto& n : x->names()) EXPECT_TRUE(at::equal(x->tensor(n), y->tensor(n))) << n;
    EXPECT_EQ(y->tensor("model.layers.0.mlp.down_proj.weight").scalar_type(), at::kFloat);  // the quantized-from dtype
  }
  const std::vector<std::string> prompts = {"Name three colors.", "What is the capital of France?"};
  {
    std::ofstream p(run.path() / "p.jsonl");
    for (const auto& t : prompts) p << nlohmann::json{{"instruction", t}}.dump() << "\n";
  }
  ASSERT_EQ(run_command(train_bin() + " generate --model_name_or_path " + base.string() + " --adapter " +
                            adapter.string() + " --prompts " + (run.path() / "p.jsonl").string() + " --raw_prompt --output " +
                            (run.path() / "o.jsonl").string() + " --max_new_tokens 8 --batch_size 1 --device cpu 2>&1", &log),
            0) << log;
  std::vector<std::vector<int64_t>> ours;
  std::ifstream o(run.path() / "o.jsonl");
  for (std::string line; std::getline(o, line);)
    if (!line.empty()) ours.push_back(nlohmann::json::parse(line)["generation_ids"].get<std::vector<int64_t>>());
  std::string check = python() + " " + (source_dir() / "tests/reference/qlora_merge_generate_check.py").string() +
                      " --base " + base.string() + " --adapter " + adapter.string() + " --merged " + merged.string();
  for (const auto& t : prompts) check += " --prompt '" + t + "'";
  ASSERT_EQ(run_command(check + " 2>&1", &log), 0) << log;
  const auto brace = log.rfind("{\"merged_max_abs_diff\"");
  ASSERT_NE(brace, std::string::npos) << log;
  const auto ref = nlohmann::json::parse(log.substr(brace, log.find('\n', brace) - brace));
  EXPECT_EQ(ref["merged_tensors"].get<int>(), 21);
  EXPECT_LE(ref["merged_max_abs_diff"].get<double>(), 1e-6) << "merge differs from peft's merge_and_unload";
  EXPECT_EQ(ours, ref["generation_ids"].get<std::vector<std::vector<int64_t>>>());
  std::cout << "[qlora 4-bit base] merge vs peft merge_and_unload: max |diff| " << ref["merged_max_abs_diff"]
            << "; generate --adapter vs transformers+bitsandbytes+peft greedy: " << ours.size() << " x 8 tokens equal "
            << "(smallest top-2 logit margin " << ref["min_margin"] << ")\n";
}

}  // namespace test_qlora_parity

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
