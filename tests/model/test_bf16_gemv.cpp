// The bf16 decode-step product (model::bf16_gemv, AVX512-BF16) against the fp32 product of the
// same (exactly upcast) operands rounded to bf16 once: each output is that value or a bf16
// neighbour of it (fp32 sums in another order may round to the adjacent bf16). Also: when
// model::linear takes it (1 or 2 rows, bf16, CPU, no autograd, kNative) and when it does not,
// and that splitting the weight rows across threads changes no bit.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "alpaca/model/matmul.h"

namespace test_bf16_gemv {

using namespace alpaca::model;

namespace {

class Bf16GemvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_native_bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16 / AMX-BF16; the kernel never runs here";
    set_cpu_bf16_gemm(CpuBf16Gemm::kNative);
  }
  void TearDown() override { set_cpu_bf16_gemm(cpu_has_native_bf16() ? CpuBf16Gemm::kNative : CpuBf16Gemm::kFp32); }
  at::NoGradGuard no_grad_;
};

// Max distance from the once-rounded fp32 product, in units of the bf16 spacing at the reference.
double max_ulps(const at::Tensor& y_bf16, const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor ref = at::linear(x.to(at::kFloat), w.to(at::kFloat));
  const at::Tensor ulp = at::pow(2.0, at::floor(at::log2(ref.abs().clamp_min(1e-30))) - 7);  // 8-bit significand
  return ((y_bf16.to(at::kFloat) - ref).abs() / ulp).max().item<double>();
}

TEST_F(Bf16GemvTest, OneRoundingOfTheFp32Product) {
  at::manual_seed(3);
  // k: multiples of 32 (the model's 576, 1536) and tails; n: odd and not multiples of anything.
  for (int64_t k : {576, 1536, 100, 33, 7}) {
    for (int64_t n : {1, 37, 192, 1000}) {
      for (int64_t rows : {1, 2}) {
        const at::Tensor w = at::randn({n, k}).to(at::kBFloat16);
        const at::Tensor x = at::randn({rows, 1, k}).to(at::kBFloat16);
        ASSERT_TRUE(bf16_gemv_applies(x, w));
        const at::Tensor y = bf16_gemv(x, w);
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{rows, 1, n}));
        ASSERT_EQ(y.scalar_type(), at::kBFloat16);
        // At most one bf16 step from the fp32 value, plus the fp32 sum-order noise on top of it.
        EXPECT_LE(max_ulps(y, x, w), 1.01) << "k " << k << " n " << n << " rows " << rows;
      }
    }
  }
}

TEST_F(Bf16GemvTest, LinearTakesItOnlyWhereItApplies) {
  at::manual_seed(4);
  const at::Tensor w = at::randn({64, 96}).to(at::kBFloat16);
  const at::Tensor x1 = at::randn({1, 96}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(alpaca::model::linear(x1, w), bf16_gemv(x1, w)));
  EXPECT_FALSE(bf16_gemv_applies(at::randn({3, 96}).to(at::kBFloat16), w)) << "3 rows: oneDNN is faster there";
  EXPECT_FALSE(bf16_gemv_applies(x1.to(at::kFloat), w.to(at::kFloat))) << "fp32 stays on MKL (bitwise as transformers)";
  EXPECT_FALSE(bf16_gemv_applies(at::randn({1, 95}).to(at::kBFloat16), w)) << "mismatched inner size";
  {
    at::AutoGradMode grad(true);
    const at::Tensor wg = w.clone().requires_grad_(true);
    EXPECT_FALSE(bf16_gemv_applies(x1, wg)) << "a product autograd records keeps the differentiable path";
    EXPECT_TRUE(bf16_gemv_applies(x1, w)) << "no operand requires grad";
  }
  set_cpu_bf16_gemm(CpuBf16Gemm::kFp32);
  EXPECT_FALSE(bf16_gemv_applies(x1, w)) << "ALPACA_CPU_BF16_GEMM=fp32 is obeyed";
  set_cpu_bf16_gemm(CpuBf16Gemm::kNative);
  EXPECT_THROW(bf16_gemv(at::randn({3, 96}).to(at::kBFloat16), w), std::exception);
}

TEST_F(Bf16GemvTest, ThreadCountChangesNoBit) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({4099, 576}).to(at::kBFloat16);
  const at::Tensor x = at::randn({2, 576}).to(at::kBFloat16);
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = bf16_gemv(x, w);
  at::set_num_threads(2);
  const at::Tensor two = bf16_gemv(x, w);
  at::set_num_threads(saved);
  EXPECT_TRUE(at::equal(one, two));
}

}  // namespace

}  // namespace test_bf16_gemv
