// Parity with the math of Hugging Face Trainer (tests/reference/train_parity_ref.py: transformers'
// LlamaForCausalLM + torch AdamW + transformers' cosine schedule, same tiny model, data and
// example order): fp32, world 1, 30 steps, every loss within 1e-4 relative; then world 2 under
// FSDP full_shard (2 ranks x 2 per device x accumulation 2 = the same global batch of 8) matches
// world 1.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "test_util.h"
#include "train_test_util.h"

namespace test_train_parity {

namespace fs = std::filesystem;
using namespace alpaca::testing;

namespace {

const fs::path kFixture = fixture_dir("train_parity");

std::string common_args(const fs::path& out, int per_device, int accum) {
  return parity_flags(kFixture, out, 30, per_device, accum, "1e-3");
}

// util/host_sync.h: the trainer reads the device once per optimizer step outside logging (the
// loss, stop flag, counts and gradient norm together), whatever the world and accumulation.
void expect_one_host_sync_per_step(const fs::path& out) {
  int logged = 0;
  for (const auto& e : read_metrics(out)) {
    if (!e.count("loss") || !e.count("host_syncs_per_step")) continue;
    ++logged;
    EXPECT_LE(e.at("host_syncs_per_step"), 1.0) << "step " << e.at("step");
  }
  EXPECT_GT(logged, 0) << "no host_syncs_per_step in " << out / "metrics.jsonl";
}

}  // namespace

TEST(TrainParity, World1MatchesTransformersFor30Steps) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture);
  const ReferenceSteps ref = read_reference_steps(kFixture / "reference.json");
  TempDir out("parity_w1");
  std::string log;
  ASSERT_EQ(run_trainer(common_args(out.path(), 4, 2), 1, &log), 0) << log;
  const auto steps = read_step_logs(out.path());
  ASSERT_EQ(steps.size(), 30u) << log;
  const double worst = expect_steps_match(steps, ref, "transformers").worst_loss;
  expect_one_host_sync_per_step(out.path());
  std::cout << "[parity] world 1: worst relative loss difference over 30 steps " << worst << "; first loss "
            << steps.front().loss << ", last " << steps.back().loss << "\n";
}

TEST(TrainParity, World2FsdpMatchesWorld1) {
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(kFixture);
  TempDir w1("parity_w1b"), w2("parity_w2");
  std::string log;
  ASSERT_EQ(run_trainer(common_args(w1.path(), 4, 2), 1, &log), 0) << log;
  ASSERT_EQ(run_trainer(common_args(w2.path(), 2, 2) + " --fsdp 'full_shard auto_wrap'"
                        " --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer", 2, &log), 0) << log;
  const auto a = read_step_logs(w1.path()), b = read_step_logs(w2.path());
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u) << log;
  const double worst = expect_losses_close(b, a, 1e-4, "world 2 vs world 1");
  expect_one_host_sync_per_step(w2.path());
  std::cout << "[parity] world 2 FSDP vs world 1: worst relative loss difference " << worst << "\n";
}

}  // namespace test_train_parity
