// Generation on a GPU (skipped without CUDA; scripts/gpu_check.sh runs it): the KV-cache decode
// through the modules on CUDA against the same model on the CPU. fp32 (TF32 off, LibTorch's
// default): a prefill and 8 teacher-forced decode steps of a left-padded batch of 3, logits
// within 1e-4 of their scale of the CPU's; then generate_batch on the GPU gives the CPU's greedy
// tokens for 4 prompts, batched and one by one (the CPU's one-by-one runs the fused CPU step).
// bf16 on the GPU: the same steps within 5% of the fp32 scale.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include "alpaca/generate/generator.h"
#include "alpaca/model/kv_cache.h"
#include "alpaca/model/llama.h"
#include "model_test_util.h"

namespace test_generate_gpu {

using namespace alpaca;
using namespace alpaca::model;

namespace {

LlamaConfig tiny() {
  LlamaConfig c = alpaca::testing::llama_config({128, 64, 96, 3, 4, 2, 16, 64});
  c.initializer_range = 0.1;
  return c;
}

LlamaForCausalLM make(const at::Device& device, at::ScalarType dtype) {
  LlamaForCausalLM m(tiny());
  init_weights(m, 21);  // on the CPU, so both devices get the same numbers
  m->to(device, dtype);
  m->eval();
  return m;
}

// Logits (fp32, on the CPU) of a prefill of ids (B, T) under mask, then of `tokens` fed one step at a time.
std::vector<at::Tensor> steps(LlamaForCausalLM& m, const at::Tensor& ids, const at::Tensor& mask,
                              const at::Tensor& tokens_bs) {
  at::NoGradGuard no_grad;
  const at::Device dev = m->lm_head_weight().device();
  const int64_t b = ids.size(0), t = ids.size(1), n = tokens_bs.size(1);
  KvCache cache(m->config(), b, t + n, m->lm_head_weight().options());
  at::Tensor pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0);
  std::vector<at::Tensor> out{m->forward_cached(ids.to(dev), cache, mask.to(dev), pos.to(dev)).to(at::kCPU, at::kFloat)};
  at::Tensor full = at::cat({mask, at::ones({b, n}, at::kLong)}, 1).to(dev);
  at::Tensor next_pos = mask.sum(-1, true).to(dev);
  for (int64_t s = 0; s < n; ++s) {
    at::Tensor logits = m->forward_cached(tokens_bs.narrow(1, s, 1).to(dev), cache, full.narrow(1, 0, t + s + 1), next_pos);
    out.push_back(logits.to(at::kCPU, at::kFloat));
    next_pos = next_pos + 1;
  }
  return out;
}

class GenerateGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    at::manual_seed(4);
    ids_ = at::randint(1, 128, {3, 9}, at::kLong);
    mask_ = at::ones({3, 9}, at::kLong);
    mask_.select(0, 1).narrow(0, 0, 4).zero_();
    ids_.select(0, 1).narrow(0, 0, 4).fill_(0);
    tokens_ = at::randint(1, 128, {3, 8}, at::kLong);
  }
  at::Tensor ids_, mask_, tokens_;
};

double scale_of(const std::vector<at::Tensor>& ls) {
  double s = 0;
  for (const auto& l : ls) s = std::max(s, l.abs().max().item<double>());
  return std::max(s, 1.0);
}

TEST_F(GenerateGpu, CachedDecodeOnCudaMatchesTheCpu) {
  LlamaForCausalLM cpu = make(at::kCPU, at::kFloat);
  LlamaForCausalLM gpu = make(at::Device(at::kCUDA, 0), at::kFloat);
  auto want = steps(cpu, ids_, mask_, tokens_);
  auto got = steps(gpu, ids_, mask_, tokens_);
  const double scale = scale_of(want);
  double worst = 0;
  for (size_t s = 0; s < want.size(); ++s) worst = std::max(worst, (got[s] - want[s]).abs().max().item<double>());
  std::cout << "[gpu-figures] generate fp32 cuda vs cpu: max logit difference " << worst << " (scale " << scale << ")\n";
  EXPECT_LE(worst, 1e-4 * scale);

  LlamaForCausalLM gpu16 = make(at::Device(at::kCUDA, 0), at::kBFloat16);
  auto got16 = steps(gpu16, ids_, mask_, tokens_);
  double worst16 = 0;
  for (size_t s = 0; s < want.size(); ++s) worst16 = std::max(worst16, (got16[s] - want[s]).abs().max().item<double>());
  std::cout << "[gpu-figures] generate bf16 cuda vs fp32 cpu: max logit difference " << worst16 << "\n";
  EXPECT_LE(worst16, 0.05 * scale);
}

TEST_F(GenerateGpu, GreedyTokensEqualTheCpus) {
  LlamaForCausalLM cpu = make(at::kCPU, at::kFloat);
  LlamaForCausalLM gpu = make(at::Device(at::kCUDA, 0), at::kFloat);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < 4; ++r) {
    at::Tensor p = at::randint(1, 128, {5 + 2 * r}, at::kLong);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
  }
  generate::GenerateOptions opts;
  opts.max_new_tokens = 12;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(0);
  auto ids = [](const std::vector<generate::Generation>& gs) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& x : gs) out.push_back(x.ids);
    return out;
  };
  const auto want = ids(generate::generate_all(cpu, prompts, opts, 1, g));
  EXPECT_EQ(ids(generate::generate_all(gpu, prompts, opts, 4, g)), want) << "batched on the GPU";
  EXPECT_EQ(ids(generate::generate_all(gpu, prompts, opts, 1, g)), want) << "one by one on the GPU";
}

}  // namespace

}  // namespace test_generate_gpu
