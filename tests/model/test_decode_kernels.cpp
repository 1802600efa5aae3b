// The fused CPU decode step's per-row kernels (src/model/cpu_kernels.h, namespace decode), each on
// its own against a plain reference, in fp32 and bf16, at lengths on and off the 16-lane vector:
// dot (double sum, 1e-6 of the sum of |products|), axpy (std::fma per value, exact), rms_norm
// (transformers' LlamaRMSNorm in ATen ops: one bf16 step, a few fp32 steps apart), rope_head (apply_rope's
// three ATen ops in the dtype: bitwise), attend (softmax attention in double, with no mask, a
// padding mask, and a fully masked row that sees only itself: 1e-6 relative in fp32, one bf16 step
// in bf16) and silu_mul (ATen's silu in the dtype, times u; as rms_norm).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"

namespace test_decode_kernels {

using namespace alpaca::model;
using c10::BFloat16;

namespace {

class DecodeKernels : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__x86_64__)
    if (!gemv::have_avx512f()) GTEST_SKIP() << "no AVX-512F on this CPU; the fused decode step never runs here";
#endif
    at::manual_seed(7);
  }
};

const int64_t kLengths[] = {1, 7, 16, 17, 64, 100};

template <typename T>
at::ScalarType dtype_of() {
  return std::is_same_v<T, float> ? at::kFloat : at::kBFloat16;
}

// Steps of the dtype allowed where the reference's ATen ops (pairwise fp32 mean, vectorized
// rsqrt / exp) round differently from the kernel's scalar ones: a few in fp32, one in bf16.
template <typename T>
constexpr double kUlps = std::is_same_v<T, float> ? 4.0 : 1.0;

template <typename T>
at::Tensor randn_t(at::IntArrayRef shape) {
  return at::randn(shape).to(dtype_of<T>()).contiguous();
}

// Largest |a - b| in units of the dtype's spacing at |b| (8-bit significand for bf16, 24 for fp32).
template <typename T>
double max_steps(const at::Tensor& a, const at::Tensor& b) {
  const int bits = std::is_same_v<T, float> ? 23 : 7;
  const at::Tensor ref = b.to(at::kDouble);
  const at::Tensor step = at::pow(2.0, at::floor(at::log2(ref.abs().clamp_min(1e-30))) - bits);
  return ((a.to(at::kDouble) - ref).abs() / step).max().item<double>();
}

template <typename T>
void check_dot() {
  for (int64_t n : kLengths) {
    const at::Tensor q = at::randn({n});
    const at::Tensor k = randn_t<T>({n});
    const float got = decode::dot(q.const_data_ptr<float>(), k.const_data_ptr<T>(), n);
    const at::Tensor prod = q.to(at::kDouble) * k.to(at::kDouble);
    const double ref = prod.sum().item<double>(), scale = prod.abs().sum().item<double>();
    EXPECT_NEAR(got, ref, 1e-6 * scale + 1e-30) << "n " << n;
  }
}
TEST_F(DecodeKernels, DotF32) { check_dot<float>(); }
TEST_F(DecodeKernels, DotBf16) { check_dot<BFloat16>(); }

template <typename T>
void check_axpy() {
  for (int64_t n : kLengths) {
    const float a = 0.37F;
    const at::Tensor v = randn_t<T>({n});
    const at::Tensor out0 = at::randn({n});
    at::Tensor out = out0.clone();
    decode::axpy(a, v.const_data_ptr<T>(), out.mutable_data_ptr<float>(), n);
    const at::Tensor vf = v.to(at::kFloat).contiguous();
    for (int64_t c = 0; c < n; ++c) {
      const float ref = std::fma(a, vf.const_data_ptr<float>()[c], out0.const_data_ptr<float>()[c]);
      ASSERT_EQ(out.const_data_ptr<float>()[c], ref) << "n " << n << " at " << c;
    }
  }
}
TEST_F(DecodeKernels, AxpyF32) { check_axpy<float>(); }
TEST_F(DecodeKernels, AxpyBf16) { check_axpy<BFloat16>(); }

template <typename T>
void check_rms_norm() {
  const float eps = 1e-5F;
  for (int64_t n : kLengths) {
    const at::Tensor x = randn_t<T>({n}), w = randn_t<T>({n});
    at::Tensor out = at::empty({n}, dtype_of<T>());
    decode::rms_norm(x.const_data_ptr<T>(), w.const_data_ptr<T>(), eps, n, out.mutable_data_ptr<T>());
    // LlamaRMSNorm.forward: hidden.to(fp32); var = pow(2).mean(-1); hidden * rsqrt(var + eps);
    // weight * hidden.to(input_dtype).
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor y = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(dtype_of<T>());
    const at::Tensor ref = w * y;
    EXPECT_LE(max_steps<T>(out, ref), kUlps<T>) << "n " << n;
  }
}
TEST_F(DecodeKernels, RmsNormF32) { check_rms_norm<float>(); }
TEST_F(DecodeKernels, RmsNormBf16) { check_rms_norm<BFloat16>(); }

template <typename T>
void check_rope() {
  for (int64_t dh : {2, 8, 18, 64, 128}) {
    const at::Tensor x = randn_t<T>({dh}), cos = randn_t<T>({dh}), sin = randn_t<T>({dh});
    at::Tensor got = x.clone();
    decode::rope_head(got.mutable_data_ptr<T>(), cos.const_data_ptr<T>(), sin.const_data_ptr<T>(), dh);
    // apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, rotate_half = cat(-x2, x1).
    const at::Tensor rot = at::cat({-x.narrow(0, dh / 2, dh / 2), x.narrow(0, 0, dh / 2)});
    const at::Tensor ref = x * cos + rot * sin;
    EXPECT_TRUE(at::equal(got, ref)) << "head_dim " << dh;
  }
}
TEST_F(DecodeKernels, RopeHeadF32) { check_rope<float>(); }
TEST_F(DecodeKernels, RopeHeadBf16) { check_rope<BFloat16>(); }

// softmax(q k^T * scale) v over the allowed keys, in double; a row with none allowed sees `self`.
at::Tensor attend_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allow,
                            int64_t self, double scale) {
  at::Tensor s = at::mv(k.to(at::kDouble), q.to(at::kDouble)) * scale;
  at::Tensor ok = allow.defined() ? allow.clone() : at::ones({k.size(0)}, at::kBool);
  if (!ok.any().item<bool>()) ok[self] = true;
  s = s.masked_fill(ok.logical_not(), -std::numeric_limits<double>::infinity());
  return at::mv(v.to(at::kDouble).t(), at::softmax(s, 0));
}

template <typename T>
void check_attend() {
  const int64_t keys = 11;
  for (int64_t dh : {8, 17, 64}) {
    const at::Tensor q = randn_t<T>({dh}), k = randn_t<T>({keys, dh}), v = randn_t<T>({keys, dh});
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
    at::Tensor padded = at::ones({keys}, at::kBool);
    padded.narrow(0, 0, 3).fill_(false);
    for (const at::Tensor& allow : {at::Tensor(), padded, at::zeros({keys}, at::kBool)}) {
      std::vector<float> scores(keys);
      at::Tensor out = at::empty({dh}, dtype_of<T>());
      decode::attend(q.const_data_ptr<T>(), k.const_data_ptr<T>(), v.const_data_ptr<T>(), keys,
                     allow.defined() ? allow.const_data_ptr<bool>() : nullptr, keys - 1, dh, scale, scores.data(),
                     out.mutable_data_ptr<T>());
      const at::Tensor ref = attend_reference(q, k, v, allow, keys - 1, scale);
      if constexpr (std::is_same_v<T, float>) {
        EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref, 1e-6, 1e-6)) << "head_dim " << dh;
      } else {
        EXPECT_LE(max_steps<T>(out, ref.to(at::kFloat)), 1.0) << "head_dim " << dh;
      }
    }
  }
}
TEST_F(DecodeKernels, AttendF32) { check_attend<float>(); }
TEST_F(DecodeKernels, AttendBf16) { check_attend<BFloat16>(); }

template <typename T>
void check_silu_mul() {
  const at::Tensor g = randn_t<T>({257}) * 4, u = randn_t<T>({257});
  // LlamaMLP: act_fn(gate_proj(x)) * up_proj(x), each a tensor of dtype T.
  const at::Tensor ref = at::silu(g) * u;
  at::Tensor got = at::empty_like(ref);
  for (int64_t j = 0; j < g.numel(); ++j)
    got.mutable_data_ptr<T>()[j] = static_cast<T>(
        decode::silu_mul<T>(static_cast<float>(g.const_data_ptr<T>()[j]), static_cast<float>(u.const_data_ptr<T>()[j])));
  EXPECT_LE(max_steps<T>(got, ref), kUlps<T>);
}
TEST_F(DecodeKernels, SiluMulF32) { check_silu_mul<float>(); }
TEST_F(DecodeKernels, SiluMulBf16) { check_silu_mul<BFloat16>(); }

}  // namespace

}  // namespace test_decode_kernels
