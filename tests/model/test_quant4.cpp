// 4-bit quantization (model/quant4.h) byte for byte against bitsandbytes 0.50 on the CPU
// (tests/reference/quant4_reference.py): packed bytes, absmax, nested statistics (8-bit codes, their
// fp32 absmax, the offset) and the dequantized fp32 / bf16 weights, bitwise (the native kernel and
// the ATen-op path the engine takes off the CPU); on synthetic tensors
// (odd sizes, partial last blocks, blocksizes 32..4096, code-book midpoints, zero blocks), on every
// linear of a tiny LLaMA and on every linear of SmolLM2-135M (skipped with a message when the model
// was not made).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/io/safetensors.h"
#include "alpaca/model/quant4.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_quant4 {

using namespace alpaca::model;
using alpaca::io::SafetensorsFile;

namespace {

std::filesystem::path fixture_dir() { return alpaca::testing::binary_dir() / "fixtures" / "quant4"; }

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// Bitwise equality (so -0.0 != 0.0 and NaN == NaN), with the first differing index on failure.
::testing::AssertionResult same_bits(const at::Tensor& got, const at::Tensor& want) {
  if (got.scalar_type() != want.scalar_type() || got.numel() != want.numel())
    return ::testing::AssertionFailure() << "dtype/numel " << got.scalar_type() << "/" << got.numel() << " vs "
                                         << want.scalar_type() << "/" << want.numel();
  const at::Tensor a = got.contiguous().reshape({-1}), b = want.contiguous().reshape({-1});
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  const int64_t es = static_cast<int64_t>(a.element_size());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + i * es, pb + i * es, static_cast<size_t>(es)) != 0)
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << a.numel() << ": "
                                           << a[i].item<double>() << " vs " << b[i].item<double>();
  return ::testing::AssertionSuccess();
}

// The fixture's checksum(): sum_i bits_i * (i % 65521 + 1), int64 wrapping.
int64_t checksum(const at::Tensor& t) {
  const at::Tensor flat = t.contiguous().reshape({-1});
  uint64_t sum = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    uint64_t bits = 0;
    if (flat.element_size() == 4)
      bits = reinterpret_cast<const uint32_t*>(flat.data_ptr())[i];
    else
      bits = reinterpret_cast<const uint16_t*>(flat.data_ptr())[i];
    sum += bits * static_cast<uint64_t>(i % 65521 + 1);
  }
  return static_cast<int64_t>(sum);
}

Quant4Options options_of(const nlohmann::json& m) {
  Quant4Options o;
  o.type = parse_quant4_type(m.at("type").get<std::string>());
  o.blocksize = m.at("blocksize").get<int64_t>();
  o.nested = m.at("nested").get<bool>();
  return o;
}

void expect_stats(const Quant4Tensor& q, const SafetensorsFile& f, const std::string& key) {
  EXPECT_TRUE(same_bits(q.packed.reshape({-1}), f.tensor(key + ".packed"))) << key << " packed";
  EXPECT_TRUE(same_bits(q.state.absmax, f.tensor(key + ".absmax"))) << key << " absmax";
  if (q.state.nested) {
    EXPECT_TRUE(same_bits(q.state.nested_absmax, f.tensor(key + ".nested_absmax"))) << key << " nested_absmax";
    EXPECT_TRUE(same_bits(at::full({1}, q.state.offset, at::kFloat), f.tensor(key + ".offset"))) << key << " offset";
  }
}

}  // namespace

TEST(Quant4, CodeBooksAreBitsandbytes) {
  EXPECT_EQ(quant4_code(Quant4Type::kNf4)[0], -1.0f);
  EXPECT_EQ(quant4_code(Quant4Type::kNf4)[7], 0.0f);
  EXPECT_EQ(quant4_code(Quant4Type::kFp4)[3], 1.0f);
  EXPECT_EQ(quant4_code(Quant4Type::kFp4)[1], 0.0625f / 12.0f);
  const auto& m = dynamic_map_8bit();
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_THROW(parse_quant4_type("int4"), alpaca::Error);
  EXPECT_THROW(quantize_4bit(at::ones({64}), Quant4Options{Quant4Type::kNf4, 48, false}), alpaca::Error);
  // 4 + 32/64 bits a value plain, 4 + 8/64 + 32/(64*256) nested (+ one fp32 offset a tensor).
  const int64_t n = 64 * 256 * 16;
  EXPECT_EQ(quant4_bytes(n, {Quant4Type::kNf4, 64, false}), n / 2 + n / 16);
  EXPECT_EQ(quant4_bytes(n, {Quant4Type::kNf4, 64, true}), n / 2 + n / 64 + 16 * 4 + 4);
}

TEST(Quant4, MatchesBitsandbytesOnSyntheticAndTinyModel) {
  ASSERT_TRUE(std::filesystem::exists(fixture_dir() / "cases.json")) << "run the quant4 fixture first";
  const auto meta = read_json(fixture_dir() / "cases.json");
  auto f = SafetensorsFile::open((fixture_dir() / "cases.safetensors").string());
  int checked = 0;
  for (const auto& [key, m] : meta.items()) {
    SCOPED_TRACE(key);
    const at::Tensor x = f->tensor(m.at("input").get<std::string>());
    const Quant4Tensor q = quantize_4bit(x, options_of(m));
    expect_stats(q, *f, key);
    EXPECT_TRUE(same_bits(dequantize_4bit(q.packed, q.state, at::kFloat), f->tensor(key + ".deq_fp32"))) << "fp32";
    EXPECT_TRUE(same_bits(dequantize_4bit(q.packed, q.state, at::kBFloat16), f->tensor(key + ".deq_bf16"))) << "bf16";
    // The ATen-op path (the engine's GPU path), run here on the CPU: the same bits, chunk
    // boundaries included (two blocks a chunk; the default chunk).
    const at::Tensor packed = q.packed.reshape({-1}), absmax = dequantize_absmax(q.state);
    at::Tensor fp32 = at::empty({x.numel()}, at::kFloat), bf16 = at::empty({x.numel()}, at::kBFloat16);
    dequantize_4bit_aten(packed, absmax, x.numel(), q.state.blocksize, q.state.type, fp32, 2 * q.state.blocksize);
    dequantize_4bit_aten(packed, absmax, x.numel(), q.state.blocksize, q.state.type, bf16);
    EXPECT_TRUE(same_bits(fp32, f->tensor(key + ".deq_fp32"))) << "ATen fp32";
    EXPECT_TRUE(same_bits(bf16, f->tensor(key + ".deq_bf16"))) << "ATen bf16";
    ++checked;
  }
  EXPECT_GE(checked, 70);
}

TEST(Quant4, MatchesBitsandbytesOnEveryLinearOfSmolLM2) {
  if (std::filesystem::exists(fixture_dir() / "smollm2_SKIPPED"))
    GTEST_SKIP() << "SmolLM2 part of the quant4 fixture skipped: "
                 << std::ifstream(fixture_dir() / "smollm2_SKIPPED").rdbuf();
  ASSERT_TRUE(std::filesystem::exists(fixture_dir() / "smollm2.json")) << "run the quant4 fixture first";
  const auto meta = read_json(fixture_dir() / "smollm2.json");
  auto model = SafetensorsFile::open(meta.at("model").get<std::string>() + "/model.safetensors");
  auto f = SafetensorsFile::open((fixture_dir() / "smollm2.safetensors").string());
  int checked = 0;
  for (const auto& [key, m] : meta.at("cases").items()) {
    SCOPED_TRACE(key);
    at::Tensor w = model->tensor(m.at("tensor").get<std::string>());
    if (m.at("input_dtype").get<std::string>() == "bfloat16") w = w.to(at::kBFloat16);
    const Quant4Tensor q = quantize_4bit(w, options_of(m));
    expect_stats(q, *f, key);
    EXPECT_EQ(checksum(dequantize_4bit(q.packed, q.state, at::kFloat)), m.at("deq_fp32_checksum").get<int64_t>());
    EXPECT_EQ(checksum(dequantize_4bit(q.packed, q.state, at::kBFloat16)), m.at("deq_bf16_checksum").get<int64_t>());
    ++checked;
  }
  EXPECT_EQ(checked, 420);  // 30 layers x 7 linears x (nf4 nested, fp4 plain)
}

// The 16-bit outputs (the AVX-512 word-permute path where the CPU has it, scalar otherwise) are the
// fp32 values rounded once, for every size (partial blocks, odd counts) and blocksize.
TEST(Quant4, SixteenBitDequantizationIsTheFp32ValuesRounded) {
  at::manual_seed(7);
  for (int64_t n : {1, 31, 33, 64, 95, 4096 + 33}) {
    for (int64_t bs : {64, 128}) {
      for (bool nested : {false, true}) {
        const Quant4Tensor q = quantize_4bit(at::randn({n}), {Quant4Type::kNf4, bs, nested});
        const at::Tensor fp32 = dequantize_4bit(q.packed, q.state, at::kFloat);
        for (auto dt : {at::kBFloat16, at::kHalf})
          EXPECT_TRUE(at::equal(dequantize_4bit(q.packed, q.state, dt), fp32.to(dt)))
              << n << " values, blocksize " << bs << ", " << dt;
      }
    }
  }
}

}  // namespace test_quant4
