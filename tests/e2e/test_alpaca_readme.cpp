// The Stanford Alpaca README command, verbatim except the model and data paths and a shorter
// schedule (a 64-record data file: 3 epochs of one optimizer step at a global batch of 64),
// under mpirun -np 2 on CPU: the loss falls, the saved directory loads in transformers and has a
// lower held-out loss than the starting checkpoint. Then the same run with offload, with
// gradient checkpointing, and with gradient accumulation 4 completes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train_test_util.h"

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

fs::path fixture() { return binary_dir() / "fixtures" / "train_parity"; }

// records [begin, end) of the shared Alpaca file, written as a JSON list.
fs::path write_records(const fs::path& dir, const std::string& name, size_t begin, size_t end) {
  std::ifstream f(shared_dir() / "data/alpaca/alpaca_5000.json");
  const auto all = nlohmann::json::parse(f);
  nlohmann::json part = nlohmann::json::array();
  for (size_t i = begin; i < end; ++i) part.push_back(all[i]);
  const fs::path p = dir / name;
  std::ofstream(p) << part.dump();
  return p;
}

std::string readme_command(const fs::path& model, const fs::path& data, const fs::path& out) {
  return "--model_name_or_path " + model.string() + " --data_path " + data.string() +
         " --bf16 True --output_dir " + out.string() +
         " --num_train_epochs 3 --per_device_train_batch_size 4 --per_device_eval_batch_size 4"
         " --gradient_accumulation_steps 8 --evaluation_strategy \"no\" --save_strategy \"steps\" --save_steps 2000"
         " --save_total_limit 1 --learning_rate 2e-5 --weight_decay 0. --warmup_ratio 0.03 --lr_scheduler_type \"cosine\""
         " --logging_steps 1 --fsdp \"full_shard auto_wrap\" --fsdp_transformer_layer_cls_to_wrap 'LlamaDecoderLayer'"
         " --tf32 True";
}

std::vector<double> history_losses(const fs::path& out) {
  std::ifstream f(out / "trainer_state.json");
  const auto s = nlohmann::json::parse(f);
  std::vector<double> l;
  for (const auto& e : s["log_history"])
    if (e.contains("loss")) l.push_back(e["loss"].get<double>());
  return l;
}

}  // namespace

TEST(AlpacaReadme, TrainsUnderMpirunAndSavesAModelTransformersLoads) {
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");
  if (fs::exists(fixture() / "SKIPPED")) GTEST_SKIP() << "fixture skipped";
  TempDir tmp("readme");
  const fs::path train = write_records(tmp.path(), "train.json", 0, 64);
  const fs::path heldout = write_records(tmp.path(), "heldout.json", 4000, 4032);
  const fs::path out = tmp.path() / "out";
  std::string log;
  ASSERT_EQ(run_trainer(readme_command(fixture() / "model", train, out), 2, &log), 0) << log;

  // 3 epochs x 1 step; every step sees the same 64 examples, so the losses are comparable.
  const auto losses = history_losses(out);
  ASSERT_EQ(losses.size(), 3u) << log;
  const double first_epoch = losses[0], last_epoch = losses[2];
  std::cout << "[readme] epoch-mean loss " << first_epoch << " -> " << last_epoch << "\n";
  EXPECT_LT(last_epoch, first_epoch) << "the training loss must fall";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json",
                        "trainer_state.json", "train_results.json", "all_results.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;

  std::string check;
  const std::string cmd = "cd " + (source_dir() / "tests/reference").string() + " && " + python() +
                          " train_e2e_check.py --start " + (fixture() / "model").string() + " --final " + out.string() +
                          " --data " + heldout.string();
  ASSERT_EQ(run_command(cmd, &check), 0) << check;
  const auto r = nlohmann::json::parse(check.substr(check.rfind("{\"start_loss\"")));
  std::cout << "[readme] held-out loss in transformers: start " << r["start_loss"] << ", trained " << r["final_loss"]
            << "; tokenizer loads: " << r["tokenizer_loaded"] << "\n";
  EXPECT_EQ(r["final_vocab"], 32001) << "[PAD] added as train.py does";
  EXPECT_LT(r["final_loss"].get<double>(), r["start_loss"].get<double>());
}

TEST(AlpacaReadme, OffloadCheckpointingAndAccumulationVariantsComplete) {
  ALPACA_REQUIRE_SHARED("data/alpaca/alpaca_5000.json");
  if (fs::exists(fixture() / "SKIPPED")) GTEST_SKIP() << "fixture skipped";
  TempDir tmp("readme_variants");
  const fs::path train = write_records(tmp.path(), "train.json", 0, 32);
  struct Variant {
    std::string name, from, to;
  };
  for (const Variant& v : {Variant{"offload", "--fsdp \"full_shard auto_wrap\"", "--fsdp \"full_shard auto_wrap offload\""},
                           Variant{"checkpointing", "--tf32 True", "--tf32 True --gradient_checkpointing True"},
                           Variant{"accum4", "--gradient_accumulation_steps 8", "--gradient_accumulation_steps 4"}}) {
    const fs::path out = tmp.path() / v.name;
    std::string cmd = readme_command(fixture() / "model", train, out);
    cmd.replace(cmd.find(v.from), v.from.size(), v.to);
    cmd.replace(cmd.find("--num_train_epochs 3"), 20, "--num_train_epochs 1");
    std::string log;
    EXPECT_EQ(run_trainer(cmd, 2, &log), 0) << v.name << "\n" << log;
    EXPECT_TRUE(fs::exists(out / "model.safetensors")) << v.name;
    const auto losses = history_losses(out);
    EXPECT_FALSE(losses.empty()) << v.name;
    for (double l : losses) EXPECT_TRUE(std::isfinite(l)) << v.name;
  }
}
