// bitsandbytes' AdamW (ShardedAdamW with bnb_bits 8 / 32: --optim adamw_bnb_8bit, adamw_8bit,
// paged_adamw_8bit, paged_adamw_32bit) against bitsandbytes itself
// (tests/reference/bnb_adamw_reference.py, its CPU kernels, transformers' wiring): the dynamic maps,
// six steps of eight parameters (an embedding with transformers' 32-bit override, one under 4096
// elements, whole and short last blocks, blocks whose largest magnitude is negative, with and without
// weight decay, blocks of zero moments) in one flat shard, parameters and every code and block scale bit for bit. Then the
// same flat buffer cut into 3 and 150 shards (blocks cut by shard boundaries, shards shorter than a
// block) stepped by one thread per rank with an all-reduce MAX of the cut blocks' partial scales:
// the same parameters and states as one rank; and the state a checkpoint writes (dequantized
// moments and block scales) restores the codes exactly, or from fp32 moments alone quantizes as a step.
#include <gtest/gtest.h>

#include <barrier>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "alpaca/fsdp/shard_info.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/optim/adamw.h"
#include "optim_reference.h"
#include "test_util.h"

namespace alpaca::optim::test_bnb_adamw {
namespace {

namespace fs = std::filesystem;

fs::path fixture() { return testing::binary_dir() / "fixtures" / "bnb_adamw"; }

using Reference = test_reference::OptimReference;

// The reference run of bitsandbytes' AdamW or (lion) its Lion at `bits`.
Reference load(int bits, bool lion = false) {
  return test_reference::load_optim_reference(fixture(), "bnb_adamw.json",
                                              std::string(lion ? "bnb_lion" : "bnb_adamw") + std::to_string(bits) + ".safetensors");
}

using Param = test_reference::RefParam;

std::vector<Param> params_of(const nlohmann::json& meta, int64_t* total) { return test_reference::ref_params(meta, total); }

AdamWOptions options_of(const nlohmann::json& meta, int bits, bool lion = false) {
  AdamWOptions o;
  o.lion = lion;
  o.beta1 = meta["beta1"].get<double>();
  o.beta2 = meta["beta2"].get<double>();
  o.eps = meta["eps"].get<double>();
  o.weight_decay = meta["weight_decay"].get<double>();
  o.bnb_bits = bits;
  return o;
}

using Flat = test_reference::RefFlat;

Flat make_flat(const Reference& ref, const std::vector<Param>& params, int64_t total, int world, const std::string& key) {
  return test_reference::make_ref_flat(ref, params, total, world, key);
}

void set_grads(Flat& f, const Reference& ref, const std::vector<Param>& params, int step) {
  for (const Param& p : params)
    f.grads.narrow(0, p.offset, p.numel).copy_(ref.get("grad." + std::to_string(step) + "." + p.name).reshape({-1}));
}

// The codes / scales of parameter `p` across all ranks' optimizers, as one tensor (a cut block's
// scale appears on each rank holding a part: they must agree).
struct ParamState {
  at::Tensor q1, q2, a1, a2;
};

ParamState state_of(const std::vector<std::unique_ptr<ShardedAdamW>>& opts, const Flat& f, const Param& p) {
  ParamState out;
  std::vector<at::Tensor> q1, q2;
  const int64_t blocks = (p.numel + 255) / 256;
  out.a1 = at::full({blocks}, -1.0f);
  out.a2 = at::full({blocks}, -1.0f);
  for (size_t r = 0; r < opts.size(); ++r) {
    const auto& segs = f.shards[r].segments;
    for (size_t k = 0; k < segs.size(); ++k) {
      if (segs[k].param_numel != p.numel || segs[k].offset + f.shards[r].param.numel() * static_cast<int64_t>(r) -
                                                    segs[k].param_begin != p.offset)
        continue;
      const auto qs = opts[r]->quant_state(0, k);
      if (!qs.code1.defined()) return {};
      q1.push_back(qs.code1);
      if (qs.code2.defined()) q2.push_back(qs.code2);  // Lion: none
      const int64_t first = segs[k].param_begin / 256;
      for (int j = 0; j < (qs.code2.defined() ? 2 : 1); ++j) {
        const at::Tensor a = j == 0 ? qs.absmax1 : qs.absmax2;
        at::Tensor dst = (j == 0 ? out.a1 : out.a2).narrow(0, first, a.numel());
        // A block seen twice must have one scale.
        const at::Tensor seen = dst >= 0;
        EXPECT_TRUE(at::equal(dst.masked_select(seen), a.masked_select(seen))) << p.name << ": ranks disagree on a scale";
        dst.copy_(a);
      }
    }
  }
  out.q1 = at::cat(q1);
  if (!q2.empty()) out.q2 = at::cat(q2);
  return out;
}

// Steps `world` optimizers, one thread each, over the reference's six steps; returns them.
std::vector<std::unique_ptr<ShardedAdamW>> run(Flat& f, const Reference& ref, const std::vector<Param>& params,
                                               int bits, int world, int steps, bool lion = false) {
  std::vector<std::unique_ptr<ShardedAdamW>> opts;
  std::vector<at::Tensor> exchange(world);
  std::barrier sync(world);
  for (int r = 0; r < world; ++r) {
    opts.push_back(std::make_unique<ShardedAdamW>(std::vector<OptimShard>{f.shards[r]}, options_of(ref.meta, bits, lion)));
    if (world > 1)
      opts.back()->set_block_max_reducer([&, r](at::Tensor& t) {
        exchange[r] = t.clone();
        sync.arrive_and_wait();
        for (int k = 0; k < world; ++k) t = at::maximum(t, exchange[k]);
        sync.arrive_and_wait();
      });
  }
  const auto lrs = ref.meta["lrs"].get<std::vector<double>>();
  for (int step = 0; step < steps; ++step) {
    set_grads(f, ref, params, step);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { opts[r]->step(lrs[step]); });
    for (auto& t : threads) t.join();
  }
  return opts;
}

TEST(BnbAdamW, DynamicMapsAreBitsandbytes) {
  const auto maps = io::SafetensorsFile::open((fixture() / "qmaps.safetensors").string());
  EXPECT_TRUE(at::equal(bnb_quantization_map(true), maps->tensor("dynamic")));
  EXPECT_TRUE(at::equal(bnb_quantization_map(false), maps->tensor("udynamic")));
}

TEST(BnbAdamW, TransformersBuildsBitsandbytesAdamW) {
  const Reference ref = load(8);
  ASSERT_FALSE(ref.meta.is_null());
  for (const auto& [name, w] : ref.meta["wiring"].items()) {
    SCOPED_TRACE(name);
    const bool lion = name.find("lion") != std::string::npos;
    EXPECT_EQ(w["class"], lion ? "bitsandbytes.optim.lion.Lion" : "bitsandbytes.optim.adamw.AdamW");
    EXPECT_EQ(w["kwargs"]["optim_bits"].get<int>(), name.find("8bit") != std::string::npos ? 8 : 32);
    EXPECT_EQ(w["kwargs"]["is_paged"].get<bool>(), name.rfind("paged", 0) == 0);
    // Lion gets the betas (--adam_beta1 / --adam_beta2) and no eps.
    EXPECT_EQ(w["kwargs"].contains("eps"), !lion);
    EXPECT_EQ(w["kwargs"]["betas"], nlohmann::json::array({0.8, 0.95}));
  }
  EXPECT_EQ(ref.meta["lion_state_dtype8"]["embed_tokens.weight"], "torch.float32");
  EXPECT_EQ(ref.meta["lion_state_dtype8"]["o_proj.weight"], "torch.uint8");
  // The 8-bit run kept the embedding (transformers' override) and the 3072-element weight in fp32.
  EXPECT_EQ(ref.meta["state_dtype8"]["embed_tokens.weight"], "torch.float32");
  EXPECT_EQ(ref.meta["state_dtype8"]["q_proj.weight"], "torch.float32");
  EXPECT_EQ(ref.meta["state_dtype8"]["o_proj.weight"], "torch.uint8");
}

// (Lion, bits): bitsandbytes' AdamW or Lion with 8- or 32-bit states.
class BnbAdamWBits : public ::testing::TestWithParam<std::pair<bool, int>> {};

TEST_P(BnbAdamWBits, OneShardMatchesBitsandbytesBitForBit) {
  const auto [lion, bits] = GetParam();
  const Reference ref = load(bits, lion);
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  Flat f = make_flat(ref, params, total, 1, "init.");
  std::vector<std::unique_ptr<ShardedAdamW>> opts;
  opts.push_back(std::make_unique<ShardedAdamW>(std::vector<OptimShard>{f.shards[0]}, options_of(ref.meta, bits, lion)));
  const auto lrs = ref.meta["lrs"].get<std::vector<double>>();
  int eight = 0;
  int64_t zero_blocks = 0;  // blocks of zero moments (scale 0, code 0): a LoRA B's first steps
  for (int step = 0; step < steps; ++step) {
    set_grads(f, ref, params, step);
    opts[0]->step(lrs[step]);
    const std::string s = std::to_string(step) + ".";
    for (const Param& p : params) {
      SCOPED_TRACE(p.name + ", step " + std::to_string(step + 1));
      const at::Tensor want = ref.get("param." + s + p.name).reshape({-1});
      const at::Tensor got = f.values.narrow(0, p.offset, p.numel);
      ASSERT_TRUE(at::equal(got, want)) << "max |difference| " << (got - want).abs().max().item<double>();
      const ParamState st = state_of(opts, f, p);
      if (!ref.file->contains("absmax1." + s + p.name)) {
        EXPECT_FALSE(st.q1.defined()) << "32-bit in bitsandbytes, 8-bit here";
        continue;
      }
      ASSERT_TRUE(st.q1.defined()) << "8-bit in bitsandbytes, 32-bit here";
      ++eight;
      zero_blocks += (ref.get("absmax1." + s + p.name) == 0).sum().item<int64_t>();
      EXPECT_TRUE(at::equal(st.q1, ref.get("state1." + s + p.name).reshape({-1})));
      EXPECT_TRUE(at::equal(st.a1, ref.get("absmax1." + s + p.name)));
      EXPECT_EQ(st.q2.defined(), !lion) << "Lion keeps one state";
      if (lion) continue;
      EXPECT_TRUE(at::equal(st.q2, ref.get("state2." + s + p.name).reshape({-1})));
      EXPECT_TRUE(at::equal(st.a2, ref.get("absmax2." + s + p.name)));
    }
  }
  EXPECT_EQ(eight > 0, bits == 8);
  EXPECT_EQ(zero_blocks > 0, bits == 8);
  std::cout << (lion ? "[bnb lion] " : "[bnb adamw] ") << bits << "-bit: " << steps << " steps of " << params.size()
            << " parameters identical to bitsandbytes (" << eight << " 8-bit states compared)\n";
}

INSTANTIATE_TEST_SUITE_P(Bits, BnbAdamWBits,
                         ::testing::Values(std::make_pair(false, 8), std::make_pair(false, 32), std::make_pair(true, 8),
                                           std::make_pair(true, 32)));

class BnbSharded : public ::testing::TestWithParam<bool> {};  // Lion or AdamW

TEST_P(BnbSharded, ShardedLikeOneRankWithCutBlocks) {
  const bool lion = GetParam();
  const Reference ref = load(8, lion);
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  Flat one = make_flat(ref, params, total, 1, "init.");
  const auto one_opt = run(one, ref, params, 8, 1, steps, lion);
  for (int world : {3, 150}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Flat f = make_flat(ref, params, total, world, "init.");
    const auto opts = run(f, ref, params, 8, world, steps, lion);
    EXPECT_TRUE(at::equal(f.values.narrow(0, 0, total), one.values.narrow(0, 0, total)))
        << "max |difference| " << (f.values.narrow(0, 0, total) - one.values.narrow(0, 0, total)).abs().max().item<double>();
    for (const Param& p : params) {
      const ParamState a = state_of(opts, f, p), b = state_of(one_opt, one, p);
      if (!b.q1.defined()) continue;
      SCOPED_TRACE(p.name);
      EXPECT_TRUE(at::equal(a.q1, b.q1) && at::equal(a.a1, b.a1));
      if (!lion) {
        EXPECT_TRUE(at::equal(a.q2, b.q2) && at::equal(a.a2, b.a2));
      }
    }
  }
}


TEST_P(BnbSharded, CheckpointStateRestoresTheCodes) {
  const bool lion = GetParam();
  const Reference ref = load(8, lion);
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  Flat f = make_flat(ref, params, total, 1, "init.");
  auto opts = run(f, ref, params, 8, 1, 3, lion);
  ShardedAdamW& a = *opts[0];
  EXPECT_THROW(a.exp_avg(0), Error);  // 8-bit moments exist only around state I/O
  a.begin_state_io();
  EXPECT_EQ(a.has_exp_avg_sq(), !lion);
  if (lion) {
    EXPECT_THROW(a.exp_avg_sq(0), Error);  // Lion keeps one moment
  }
  const at::Tensor m = a.exp_avg(0).clone(), am = a.exp_avg_absmax(0).clone();
  const at::Tensor v = lion ? at::Tensor() : a.exp_avg_sq(0).clone();
  const at::Tensor av = lion ? at::Tensor() : a.exp_avg_sq_absmax(0).clone();
  a.end_state_io();
  // What a checkpoint holds, written into an optimizer between begin/end_state_io.
  auto restore = [&](ShardedAdamW& o, bool with_scales) {
    o.begin_state_io();
    o.exp_avg(0).copy_(m);
    if (with_scales) o.exp_avg_absmax(0).copy_(am);
    if (!lion) {
      o.exp_avg_sq(0).copy_(v);
      if (with_scales) o.exp_avg_sq_absmax(0).copy_(av);
    }
    o.end_state_io(/*written=*/true, with_scales);
  };
  for (bool with_scales : {true, false}) {
    SCOPED_TRACE(with_scales ? "with block scales" : "fp32 moments only");
    ShardedAdamW b(std::vector<OptimShard>{f.shards[0]}, options_of(ref.meta, 8, lion));
    restore(b, with_scales);
    int differ = 0;
    for (size_t k = 0; k < f.shards[0].segments.size(); ++k) {
      const auto qa = a.quant_state(0, k), qb = b.quant_state(0, k);
      if (!qa.code1.defined()) continue;
      const bool same = at::equal(qa.code1, qb.code1) && at::equal(qa.absmax1, qb.absmax1) &&
                        (lion || (at::equal(qa.code2, qb.code2) && at::equal(qa.absmax2, qb.absmax2)));
      if (with_scales) {
        EXPECT_TRUE(same) << "segment " << k;
      }
      differ += !same;
    }
    // Without the scales the moments are quantized afresh: a block whose largest magnitude is
    // negative re-scales (-0.993 x scale) and small values land on other codes (the check that the
    // scales are needed can fail).
    if (!with_scales) {
      EXPECT_GT(differ, 0);
    }
    // The restored optimizer steps on as the original.
    if (with_scales) {
      Flat copy = make_flat(ref, params, total, 1, "init.");
      copy.values.copy_(f.values);
      ShardedAdamW c(std::vector<OptimShard>{copy.shards[0]}, options_of(ref.meta, 8, lion));
      c.set_step_count(a.step_count());
      restore(c, true);
      const auto lrs = ref.meta["lrs"].get<std::vector<double>>();
      for (int step = 3; step < ref.meta["steps"].get<int>(); ++step) {
        set_grads(f, ref, params, step);
        copy.grads.copy_(f.grads);
        a.step(lrs[step]);
        c.step(lrs[step]);
      }
      EXPECT_TRUE(at::equal(copy.values, f.values));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AdamWAndLion, BnbSharded, ::testing::Values(false, true));

}  // namespace
}  // namespace alpaca::optim::test_bnb_adamw
