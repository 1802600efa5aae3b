// optim/: HF LR schedules against transformers.get_scheduler (python fixture), DeepSpeed's
// scheduler classes against DeepSpeed (committed fixture), sharded AdamW
// against torch::optim::AdamW (decay mask inside one flat buffer), global-norm clipping against
// torch::nn::utils::clip_grad_norm_, and the dynamic loss scaler.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <fstream>

#include "alpaca/optim/adamw.h"
#include "alpaca/optim/grad_clip.h"
#include "alpaca/optim/loss_scaler.h"
#include "alpaca/optim/lr_schedule.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace alpaca::optim::test_optim {
namespace {

TEST(LrSchedule, MatchesTransformersGetScheduler) {
  const auto path = testing::binary_dir() / "fixtures" / "optim_lr_schedules" / "lr_schedules.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "fixture " << path << " missing; run ctest (it generates it) or tests/reference/optim_lr_schedules.py";
  const auto cases = nlohmann::json::parse(f);
  ASSERT_GE(cases.size(), 20u);
  int checked = 0;
  for (const auto& c : cases) {
    LrSchedule s;
    s.type = parse_schedule_type(c["name"].get<std::string>());
    s.num_warmup_steps = c["warmup"].get<int64_t>();
    s.num_training_steps = c["total"].get<int64_t>();
    s.base_lr = c["base_lr"].get<double>();
    const auto& kw = c["kwargs"];
    if (kw.contains("num_cycles")) s.num_cycles = kw["num_cycles"].get<double>();
    if (kw.contains("power")) s.power = kw["power"].get<double>();
    if (kw.contains("lr_end")) s.lr_end = kw["lr_end"].get<double>();
    if (kw.contains("timescale")) s.timescale = kw["timescale"].get<int64_t>();
    if (kw.contains("min_lr")) s.min_lr = kw["min_lr"].get<double>();
    if (kw.contains("min_lr_rate")) s.min_lr_rate = kw["min_lr_rate"].get<double>();
    if (kw.contains("warmup_lr_rate")) s.warmup_lr_rate = kw["warmup_lr_rate"].get<double>();
    if (kw.contains("num_decay_steps")) s.num_decay_steps = kw["num_decay_steps"].get<int64_t>();
    if (kw.contains("num_stable_steps")) s.num_stable_steps = kw["num_stable_steps"].get<int64_t>();
    if (kw.contains("warmup_type")) s.warmup_type = kw["warmup_type"].get<std::string>();
    if (kw.contains("decay_type")) s.decay_type = kw["decay_type"].get<std::string>();
    if (kw.contains("min_lr_ratio")) s.min_lr_ratio = kw["min_lr_ratio"].get<double>();
    validate(s);
    const auto& lrs = c["lrs"];
    for (size_t step = 0; step < lrs.size(); ++step) {
      const double want = lrs[step].get<double>();
      EXPECT_NEAR(learning_rate(s, static_cast<int64_t>(step)), want, 1e-15 + 1e-12 * std::abs(want))
          << c["name"] << " warmup " << s.num_warmup_steps << " step " << step;
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

// reduce_lr_on_plateau: plateau_step against torch's ReduceLROnPlateau stepped with the same
// metrics (min and max modes, patience, cooldown, abs threshold, min_lr, eps).
TEST(LrSchedule, ReduceOnPlateauMatchesTorch) {
  const auto path = testing::binary_dir() / "fixtures" / "optim_lr_schedules" / "plateau.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "fixture " << path << " missing; run ctest (it generates it)";
  const auto cases = nlohmann::json::parse(f);
  ASSERT_EQ(cases.size(), 6u);
  int total_reductions = 0;
  for (const auto& c : cases) {
    LrSchedule s;
    s.type = parse_schedule_type("reduce_lr_on_plateau");
    s.base_lr = c["base_lr"].get<double>();
    const auto& kw = c["kwargs"];
    if (kw.contains("mode")) s.plateau.mode = kw["mode"].get<std::string>();
    if (kw.contains("factor")) s.plateau.factor = kw["factor"].get<double>();
    if (kw.contains("patience")) s.plateau.patience = kw["patience"].get<int64_t>();
    if (kw.contains("threshold")) s.plateau.threshold = kw["threshold"].get<double>();
    if (kw.contains("threshold_mode")) s.plateau.threshold_mode = kw["threshold_mode"].get<std::string>();
    if (kw.contains("cooldown")) s.plateau.cooldown = kw["cooldown"].get<int64_t>();
    if (kw.contains("min_lr")) s.plateau.min_lr = kw["min_lr"].get<double>();
    if (kw.contains("eps")) s.plateau.eps = kw["eps"].get<double>();
    validate(s);
    EXPECT_EQ(learning_rate(s, 0), s.base_lr);
    int reductions = 0;
    for (size_t i = 0; i < c["metrics"].size(); ++i) {
      reductions += plateau_step(s, c["metrics"][i].get<double>());
      EXPECT_DOUBLE_EQ(learning_rate(s, static_cast<int64_t>(i) + 7), c["lrs"][i].get<double>()) << kw.dump() << " eval " << i;
    }
    total_reductions += reductions;
  }
  EXPECT_GE(total_reductions, 8) << "the cases must reduce the rate";
}

// DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR against the classes themselves (DeepSpeed
// 0.19.8, stepped as DeepSpeedEngine under HF Trainer; tests/reference/deepspeed_lr_schedules.py
// wrote the committed fixture): log and linear warmup, warmup 1 (DeepSpeed's floor of 2), 2, 3 and
// longer than the run, non-zero warmup_min_lr, cosine ratios, and DeepSpeed's defaults for absent keys.
TEST(LrSchedule, MatchesDeepSpeedSchedulerClasses) {
  const auto path = testing::source_dir() / "tests" / "fixtures" / "deepspeed_lr" / "deepspeed_lr_schedules.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << path;
  const auto fixture = nlohmann::json::parse(f);
  const auto& cases = fixture["cases"];
  ASSERT_GE(cases.size(), 90u);
  int checked = 0;
  for (const auto& c : cases) {
    const std::string name = c["type"].get<std::string>();
    const auto& p = c["params"];
    LrSchedule s;
    s.type = name == "WarmupLR"         ? ScheduleType::kDeepSpeedWarmupLR
             : name == "WarmupDecayLR"  ? ScheduleType::kDeepSpeedWarmupDecayLR
                                        : ScheduleType::kDeepSpeedWarmupCosineLR;
    ASSERT_TRUE(is_deepspeed(s.type));
    s.base_lr = c["base_lr"].get<double>();
    s.num_warmup_steps = p.value("warmup_num_steps", int64_t{1000});
    s.num_training_steps = p.value("total_num_steps", int64_t{0});
    s.deepspeed.log_warmup = p.value("warmup_type", std::string("log")) == "log";
    s.deepspeed.warmup_min_lr = p.value("warmup_min_lr", 0.0);
    if (p.contains("warmup_max_lr")) s.deepspeed.warmup_max_lr = p["warmup_max_lr"].get<double>();
    s.deepspeed.warmup_min_ratio = p.value("warmup_min_ratio", 0.0);
    s.deepspeed.cos_min_ratio = p.value("cos_min_ratio", 0.0001);
    validate(s);
    const auto& used = c["used"];
    const auto& logged = c["logged"];
    for (size_t k = 0; k < used.size(); ++k) {
      const double want = used[k].get<double>(), want_log = logged[k].get<double>();
      EXPECT_NEAR(learning_rate(s, static_cast<int64_t>(k)), want, 1e-18 + 1e-13 * std::abs(want)) << p.dump() << " step " << k;
      EXPECT_NEAR(logged_learning_rate(s, static_cast<int64_t>(k) + 1, true), want_log, 1e-18 + 1e-13 * std::abs(want_log))
          << name << p.dump() << " logged after step " << k;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1500);
  // HF's own schedules log the rate the step used; a skipped (fp16 overflow) step logs the current one.
  LrSchedule hf;
  hf.type = ScheduleType::kLinear;
  hf.base_lr = 1.0;
  hf.num_training_steps = 4;
  EXPECT_DOUBLE_EQ(logged_learning_rate(hf, 1, true), 1.0);
  EXPECT_DOUBLE_EQ(logged_learning_rate(hf, 1, false), 0.75);
  LrSchedule ds;
  ds.type = ScheduleType::kDeepSpeedWarmupLR;
  ds.num_warmup_steps = 0;
  EXPECT_THROW(validate(ds), Error);  // DeepSpeed 0.19.8 refuses a non-positive warmup_num_steps
}

TEST(LrSchedule, RejectsUnknownAndInvalid) {
  EXPECT_THROW(parse_schedule_type("greedy"), Error);
  EXPECT_THROW(parse_schedule_type("cosineish"), Error);
  LrSchedule s;
  s.type = ScheduleType::kCosineWithMinLr;
  EXPECT_THROW(validate(s), Error);
  s.min_lr = 1e-6;
  s.min_lr_rate = 0.1;
  EXPECT_THROW(validate(s), Error);
  LrSchedule p;
  p.type = ScheduleType::kPolynomial;
  p.base_lr = 1e-8;
  EXPECT_THROW(validate(p), Error);
  LrSchedule wsd;  // get_wsd_schedule: num_decay_steps is required, the shapes are three words
  wsd.type = ScheduleType::kWarmupStableDecay;
  EXPECT_THROW(validate(wsd), Error);
  wsd.num_decay_steps = 4;
  validate(wsd);
  wsd.decay_type = "exponential";
  EXPECT_THROW(validate(wsd), Error);
}

TEST(ShardedAdamW, MatchesTorchAdamWWithDecayMask) {
  // One flat "shard" holding w (decayed, 6), b (not decayed, 3), padding (2) and v (decayed, 4).
  at::manual_seed(3);
  at::Tensor w0 = at::randn({2, 3}), b0 = at::randn({3}), v0 = at::randn({4});
  at::Tensor flat = at::zeros({15});
  flat.narrow(0, 0, 6).copy_(w0.reshape({-1}));
  flat.narrow(0, 6, 3).copy_(b0);
  flat.narrow(0, 11, 4).copy_(v0);
  at::Tensor grad = at::zeros({15});
  ShardedAdamW opt({OptimShard{flat, grad, {{0, 6, true}, {6, 3, false}, {11, 4, true}}}},
                   AdamWOptions{0.9, 0.999, 1e-8, 0.1});

  at::Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{w, v},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{b},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.0)));
  torch::optim::AdamW ref(std::move(groups), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    const double lr = 1e-2 * (1.0 - 0.1 * step);  // the schedule changes lr every step
    for (auto& g : ref.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    at::Tensor gw = at::randn({2, 3}), gb = at::randn({3}), gv = at::randn({4});
    w.mutable_grad() = gw.clone();
    b.mutable_grad() = gb.clone();
    v.mutable_grad() = gv.clone();
    grad.zero_();
    grad.narrow(0, 0, 6).copy_(gw.reshape({-1}));
    grad.narrow(0, 6, 3).copy_(gb);
    grad.narrow(0, 11, 4).copy_(gv);
    ref.step();
    opt.step(lr);
  }
  EXPECT_TRUE(at::allclose(flat.narrow(0, 0, 6), w.detach().reshape({-1}), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(flat.narrow(0, 6, 3), b.detach(), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(flat.narrow(0, 11, 4), v.detach(), 1e-6, 1e-7));
  EXPECT_TRUE(at::equal(flat.narrow(0, 9, 2), at::zeros({2})));  // padding never moves
  EXPECT_EQ(opt.step_count(), 5);
  EXPECT_EQ(opt.state_bytes(), 2 * 15 * 4);
  auto& st = static_cast<torch::optim::AdamWParamState&>(*ref.state().at(b.unsafeGetTensorImpl()));
  EXPECT_TRUE(at::allclose(opt.exp_avg_sq(0).narrow(0, 6, 3), st.exp_avg_sq(), 1e-6, 1e-9));
}

TEST(ShardedAdamW, RejectsMismatchedShards) {
  EXPECT_THROW(ShardedAdamW({OptimShard{at::zeros({4}), at::zeros({3}), {}}}, AdamWOptions{}), Error);
  EXPECT_THROW(ShardedAdamW({OptimShard{at::zeros({4}), at::zeros({4}), {{2, 3, true}}}}, AdamWOptions{}), Error);
  EXPECT_THROW(ShardedAdamW({OptimShard{at::zeros({4}, at::kHalf), at::zeros({4}, at::kHalf), {}}}, AdamWOptions{}), Error);
}

TEST(GradClip, MatchesTorchClipGradNorm) {
  at::manual_seed(5);
  for (double max_norm : {0.1, 1.0, 100.0}) {
    at::Tensor a = at::randn({7}), b = at::randn({3, 2});
    at::Tensor pa = at::zeros({7}).requires_grad_(true), pb = at::zeros({3, 2}).requires_grad_(true);
    pa.mutable_grad() = a.clone();
    pb.mutable_grad() = b.clone();
    const double want = torch::nn::utils::clip_grad_norm_(std::vector<at::Tensor>{pa, pb}, max_norm);
    const double got = clip_grad_norm({a, b}, max_norm, nullptr);
    EXPECT_NEAR(got, want, 1e-5 * want);
    EXPECT_TRUE(at::allclose(a, pa.grad(), 1e-6, 1e-7)) << max_norm;
    EXPECT_TRUE(at::allclose(b, pb.grad(), 1e-6, 1e-7)) << max_norm;
  }
}

// A flat shard of millions of elements: the norm is as exact as fp32 gradients allow (ATen's one
// fp32 norm over such a vector is 1e-4..1e-3 off), and one shard equals the same values split into
// per-parameter tensors, as a rank count or FSDP unit split would cut them.
TEST(GradClip, NormOfALargeFlatShardIsFp64Accurate) {
  at::manual_seed(7);
  at::Tensor flat = at::randn({3'000'001}) * 1e-3;
  flat.narrow(0, 0, 100).mul_(1000);
  const double truth = flat.to(at::kDouble).norm().item<double>();
  EXPECT_NEAR(global_grad_norm({flat}, nullptr), truth, 1e-6 * truth);
  EXPECT_NEAR(global_grad_norm({flat.narrow(0, 0, 1'234'567), flat.narrow(0, 1'234'567, 1'765'434)}, nullptr), truth,
              1e-6 * truth);
}

TEST(LossScaler, SkipsOnOverflowAndGrows) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 2;
  DynamicLossScaler s(o);
  at::Tensor g = at::full({3}, 2048.0);
  EXPECT_TRUE(s.unscale_or_skip({g}, nullptr));
  EXPECT_TRUE(at::allclose(g, at::full({3}, 2.0)));
  EXPECT_EQ(s.scale(), 1024);
  at::Tensor bad = at::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(s.unscale_or_skip({g, bad}, nullptr));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.num_skipped(), 1);
  at::Tensor nan = at::tensor({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_FALSE(s.unscale_or_skip({nan}, nullptr));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_TRUE(s.unscale_or_skip({at::ones({2})}, nullptr));
  EXPECT_TRUE(s.unscale_or_skip({at::ones({2})}, nullptr));
  EXPECT_EQ(s.scale(), 512);  // grew after growth_interval clean steps
}

}  // namespace
}  // namespace alpaca::optim::test_optim
