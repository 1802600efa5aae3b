// A real pretrained model end to end (issue 14): SmolLM2-135M-Instruct (LLaMA architecture, tied
// embeddings, GQA, byte-level BPE tokenizer.json), made by scripts/make_smollm2.py through the
// fixture tests/reference/smollm2_reference.py.
//  - the untouched model's eval loss on real Alpaca records equals transformers' (fp32) within 1e-4;
//  - a 2-rank bf16 full_shard fine-tune lowers it, and the exported directory loads in
//    transformers with a lower loss and AutoTokenizer gives the same ids.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train_test_util.h"

namespace test_smollm2 {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("smollm2");

nlohmann::json reference() {
  std::ifstream f(kFixture / "reference.json");
  return nlohmann::json::parse(f);
}

// The real model on the fixture's train.json with evaluation on its eval.json.
std::string args(const fs::path& out) {
  return TrainFlags(kFixture, out).model(reference()["model"].get<std::string>())
      .set("--data_path", (kFixture / "train.json").string())
      .set("--eval_data_path", (kFixture / "eval.json").string())
      .set("--model_max_length 512 --save_strategy no --per_device_eval_batch_size 4 --eval_strategy steps");
}

double last_eval_loss(const fs::path& out) {
  double loss = NAN;
  for (const auto& m : read_metrics(out))
    if (m.count("eval_loss")) loss = m.at("eval_loss");
  return loss;
}

}  // namespace

TEST(SmolLM2, UntouchedEvalLossMatchesTransformersFp32) {
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "no shared Alpaca data";
  ASSERT_TRUE(fs::exists(kFixture / "reference.json")) << "run the fixture first: ctest -R smollm2";
  const double ref = reference()["eval_loss"].get<double>();
  TempDir out("smollm2_eval");
  std::string log;
  // learning_rate 0: the one step leaves every weight as it was; eval runs after it.
  ASSERT_EQ(run_trainer(args(out.path()) + " --max_steps 1 --eval_steps 1 --learning_rate 0"
                                           " --per_device_train_batch_size 1 --weight_decay 0",
                        1, &log),
            0)
      << log;
  const double ours = last_eval_loss(out.path());
  std::cout << "[smollm2] untouched eval loss: ours " << ours << ", transformers " << ref << " (abs diff "
            << std::abs(ours - ref) << ")\n";
  EXPECT_NEAR(ours, ref, 1e-4);
}

TEST(SmolLM2, TwoRankBf16FullShardFineTuneLowersLossAndExports) {
  if (fs::exists(kFixture / "SKIPPED")) GTEST_SKIP() << "no shared Alpaca data";
  ASSERT_TRUE(fs::exists(kFixture / "reference.json")) << "run the fixture first: ctest -R smollm2";
  const auto ref = reference();
  const double before = ref["eval_loss"].get<double>();
  TempDir out("smollm2_ft");
  std::string log;
  ASSERT_EQ(run_trainer(args(out.path()) + " --max_steps 3 --eval_steps 3 --learning_rate 1e-4"
                                           " --warmup_steps 1 --lr_scheduler_type constant_with_warmup"
                                           " --per_device_train_batch_size 2 --bf16 True"
                                           " --fsdp \"full_shard auto_wrap\"",
                        2, &log),
            0)
      << log;
  const double after = last_eval_loss(out.path());
  std::cout << "[smollm2] eval loss before " << before << ", after 3 bf16 full_shard steps on 2 ranks " << after
            << "\n";
  EXPECT_LT(after, before - 0.02);

  std::string py;
  ASSERT_EQ(run_command(python() + " " + (source_dir() / "tests/reference/smollm2_reference.py").string() +
                            " --check_export " + out.path().string() + " --eval_json " +
                            (kFixture / "eval.json").string() + " 2>/dev/null",
                        &py),
            0)
      << py;
  const auto hf = nlohmann::json::parse(py.substr(py.find('{')));
  std::cout << "[smollm2] export in transformers: fp32 eval loss " << hf["eval_loss"].get<double>() << "\n";
  EXPECT_LT(hf["eval_loss"].get<double>(), before - 0.02);
  EXPECT_NEAR(hf["eval_loss"].get<double>(), after, 0.05);  // ours ran in bf16, transformers in fp32
  EXPECT_EQ(hf["input_ids"], ref["input_ids"]);  // AutoTokenizer on the export: the same ids
  EXPECT_EQ(hf["len"], ref["len"]);
}

}  // namespace test_smollm2
