// Issue 17: --auto_find_batch_size at world 2 under a CPU memory cap (ALPACA_FAULTS
// mem.cpu_cap_bytes, the counting allocator). The cap sits between the planner's peaks for
// micro-batch 8 and 4, so the run starts at 8, runs out, settles on 4 with accumulation 2 — and
// trains exactly what a run started at 4 x 2 trains (final weights equal within 1e-6). The choice
// is in training_args.json and a resume keeps it. Every sharding strategy settles the same way.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/io/safetensors.h"
#include "memory_test_util.h"
#include "test_util.h"
#include "train_test_util.h"

namespace test_auto_batch {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

std::string flags(const fs::path& fx, const fs::path& out, int micro, int accum, int steps, const std::string& fsdp) {
  return TrainFlags(fx, out).steps(steps).batch(micro, accum)
      .set("--model_max_length 128 --learning_rate 1e-3 --lr_scheduler_type constant --disable_tqdm True --seed 3")
      .set("--fsdp", "'" + fsdp + "'");
}

int64_t estimate(const fs::path& fx, int micro, const std::string& fsdp) {
  std::string out;
  const int rc = run_command(train_bin() + " estimate-memory --json --num_cpu_ranks 2 " +
                                 flags(fx, "/nonexistent", micro, 1, 1, fsdp) + " 2>&1",
                             &out);
  EXPECT_EQ(rc, 0) << out;
  return rc == 0 ? nlohmann::json::parse(out)["device_allocated_bytes"].get<int64_t>() : 0;
}

nlohmann::json args_json(const fs::path& out) {
  std::ifstream f(out / "training_args.json");
  return nlohmann::json::parse(f);
}

double max_weight_difference(const fs::path& a, const fs::path& b) {
  auto fa = alpaca::io::SafetensorsFile::open((a / "model.safetensors").string());
  auto fb = alpaca::io::SafetensorsFile::open((b / "model.safetensors").string());
  EXPECT_EQ(fa->names(), fb->names());
  double worst = 0;
  for (const auto& n : fa->names())
    worst = std::max(worst, (fa->tensor(n).to(at::kFloat) - fb->tensor(n).to(at::kFloat)).abs().max().item<double>());
  return worst;
}

// A cap between the peaks of micro-batch 8 and 4: 8 cannot fit, 4 can.
int64_t cap_between_8_and_4(const fs::path& fx, const std::string& fsdp) {
  const int64_t e8 = estimate(fx, 8, fsdp), e4 = estimate(fx, 4, fsdp);
  EXPECT_GT(e8, e4 * 1.03) << "the fixture does not separate micro-batches 8 and 4";
  return (e8 + e4) / 2;
}

int run_capped(int64_t cap, const std::string& args, std::string* log) {
  return run_command(trainer_command(args, 2, "mem.cpu_cap_bytes=" + std::to_string(cap)), log);
}

}  // namespace

TEST(AutoFindBatchSize, SettlesUnderACapAndTrainsExactlyTheSmallerMicroBatchRun) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  TempDir fx("afbs_fx"), autod("afbs_auto"), direct("afbs_direct"), resumed("afbs_resumed");
  ASSERT_EQ(make_memory_fixture(fx.path()), "");
  const std::string fsdp = "full_shard auto_wrap";
  const int64_t cap = cap_between_8_and_4(fx.path(), fsdp);

  // Without the flag, micro-batch 8 under the cap is an out-of-memory error.
  std::string log;
  EXPECT_NE(run_capped(cap, flags(fx.path(), autod.path(), 8, 1, 4, fsdp) + " --save_strategy no", &log), 0);
  EXPECT_NE(log.find("CPU tensor memory cap"), std::string::npos) << log;

  ASSERT_EQ(run_capped(cap, flags(fx.path(), autod.path(), 8, 1, 4, fsdp) +
                                " --auto_find_batch_size True --save_steps 2 --overwrite_output_dir True",
                       &log),
            0)
      << log;
  EXPECT_NE(log.find("per_device_train_batch_size 8 ran out of memory"), std::string::npos) << log;
  EXPECT_NE(log.find("auto_find_batch_size: per_device_train_batch_size 4, gradient_accumulation_steps 2"),
            std::string::npos)
      << log;
  const auto a = args_json(autod.path());
  EXPECT_EQ(a["per_device_train_batch_size"], 4);
  EXPECT_EQ(a["gradient_accumulation_steps"], 2);
  for (const auto& m : read_metrics(autod.path()))
    if (m.count("cpu_tensor_peak_bytes")) {
      EXPECT_LE(m.at("cpu_tensor_peak_bytes"), static_cast<double>(cap));
    }

  ASSERT_EQ(run_trainer(flags(fx.path(), direct.path(), 4, 2, 4, fsdp) + " --save_strategy no", 2, &log), 0) << log;
  const double diff = max_weight_difference(autod.path(), direct.path());
  std::cout << "[auto_find_batch_size] cap " << cap << " bytes: settled on 4 x 2; max |weight difference| vs a run "
            << "started at 4 x 2: " << diff << "\n";
  EXPECT_LE(diff, 1e-6);

  // Resume from step 2 with the original flags and no cap: the checkpoint's micro-batch is kept.
  fs::copy(autod.path() / "checkpoint-2", resumed.path() / "checkpoint-2", fs::copy_options::recursive);
  ASSERT_EQ(run_trainer(flags(fx.path(), resumed.path(), 8, 1, 4, fsdp) +
                            " --auto_find_batch_size True --save_strategy no --resume_from_checkpoint " +
                            (resumed.path() / "checkpoint-2").string(),
                        2, &log),
            0)
      << log;
  EXPECT_NE(log.find("the checkpoint trained with per_device_train_batch_size 4"), std::string::npos) << log;
  const auto r = args_json(resumed.path());
  EXPECT_EQ(r["per_device_train_batch_size"], 4);
  EXPECT_EQ(r["gradient_accumulation_steps"], 2);
  EXPECT_LE(max_weight_difference(resumed.path(), direct.path()), 1e-6);
}

TEST(AutoFindBatchSize, EveryShardingStrategySettles) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  TempDir fx("afbs_fx2");
  ASSERT_EQ(make_memory_fixture(fx.path()), "");
  // (full_shard offload on CPU ranks has the same memory as full_shard, covered above.)
  for (const std::string fsdp : {"shard_grad_op auto_wrap", "no_shard auto_wrap", "hybrid_shard auto_wrap"}) {
    TempDir out("afbs_strategy");
    const int64_t cap = cap_between_8_and_4(fx.path(), fsdp);
    std::string log;
    ASSERT_EQ(run_capped(cap, flags(fx.path(), out.path(), 8, 1, 1, fsdp) +
                                  " --auto_find_batch_size True --save_strategy no --overwrite_output_dir True",
                         &log),
              0)
        << fsdp << ": " << log;
    EXPECT_NE(log.find("auto_find_batch_size: per_device_train_batch_size 4, gradient_accumulation_steps 2"),
              std::string::npos)
        << fsdp << ": " << log;
  }
}

// batch_rebalance cuts each global batch into micro-batches of variable row counts, so the probe
// runs the micro-batch of this rank's whole run that pads to the most tokens at the candidate split
// (not the `micro` longest rows). On data of mixed lengths (a quarter of the rows 128 tokens, the
// rest 48 to 75) under the cap that refuses 8 x 128 tokens, the rebalanced micro-batches of 8 x 1
// are lighter than that (measured: at most 6 rows x 128): the search keeps 8 x 1, and the training
// run stays under the cap (so the probe did not under-estimate what the run draws).
TEST(AutoFindBatchSize, BatchRebalanceProbesTheHeaviestMicroBatchTheRunDraws) {
  ALPACA_REQUIRE_SHARED("data/llama2-tokenizer/tokenizer.model");
  TempDir fx("afbs_fx3"), out("afbs_rebalance");
  ASSERT_EQ(make_memory_fixture(fx.path(), 128, 2, 64), "");
  nlohmann::json data = nlohmann::json::array();
  for (int i = 0; i < 64; ++i) {
    std::string text;
    const int words = i % 4 == 0 ? 200 : 2 + (i * 7) % 10;  // 200 words: truncated at 128 tokens
    for (int w = 0; w < words; ++w) text += "fox" + std::to_string((i + w) % 10) + " ";
    data.push_back({{"instruction", "Repeat " + std::to_string(i) + "."}, {"input", ""}, {"output", text}});
  }
  std::ofstream(fx.path() / "data.json") << data.dump();
  const std::string fsdp = "full_shard auto_wrap";
  const int64_t cap = cap_between_8_and_4(fx.path(), fsdp);
  std::string log;
  ASSERT_EQ(run_capped(cap, flags(fx.path(), out.path(), 8, 1, 4, fsdp) +
                                " --train_sampling_strategy batch_rebalance --auto_find_batch_size True"
                                " --save_strategy no --overwrite_output_dir True",
                       &log),
            0)
      << log;
  const auto at = log.find("under batch_rebalance: rank 0's heaviest micro-batch of the run is ");
  ASSERT_NE(at, std::string::npos) << log;
  std::cout << "[auto_find_batch_size] batch_rebalance, cap " << cap << ": " << log.substr(at, log.find('\n', at) - at)
            << "\n";
  EXPECT_NE(log.find("auto_find_batch_size: per_device_train_batch_size 8, gradient_accumulation_steps 1"),
            std::string::npos)
      << log;
  int peaks = 0;
  for (const auto& m : read_metrics(out.path()))
    if (m.count("cpu_tensor_peak_bytes")) {
      EXPECT_LE(m.at("cpu_tensor_peak_bytes"), static_cast<double>(cap));
      ++peaks;
    }
  EXPECT_GT(peaks, 0);
}

}  // namespace test_auto_batch
