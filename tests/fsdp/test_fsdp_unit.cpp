// Pure parts of fsdp/: shard arithmetic, flat parameters (views, padding, freeing), the HF
// weight-decay rule, and --fsdp / --fsdp_config parsing.
#include <gtest/gtest.h>

#include <tuple>

#include <cstring>
#include <limits>

#include "alpaca/fsdp/engine.h"
#include "alpaca/fsdp/flat_param.h"
#include "alpaca/fsdp/grad_add.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/fsdp/shard_info.h"
#include "alpaca/util/error.h"

namespace alpaca::fsdp::test_fsdp_unit {
namespace {

TEST(ShardInfo, PadsToMultipleOfWorldAndCoversEveryElementOnce) {
  for (int64_t numel : {0, 1, 3, 7, 8, 82, 135}) {
    for (int world : {1, 2, 3, 4, 5, 8}) {
      std::vector<int> owner(numel, -1);
      for (int r = 0; r < world; ++r) {
        ShardInfo s = shard_info(numel, world, r);
        EXPECT_EQ(s.padded_numel % world, 0);
        EXPECT_GE(s.padded_numel, numel);
        EXPECT_LT(s.padded_numel - numel, world);
        EXPECT_EQ(s.shard_begin, r * s.shard_numel);
        for (int64_t i = 0; i < s.valid_numel; ++i) {
          ASSERT_EQ(owner[s.shard_begin + i], -1);
          owner[s.shard_begin + i] = r;
        }
      }
      for (int64_t i = 0; i < numel; ++i) EXPECT_GE(owner[i], 0) << numel << "/" << world;
    }
  }
}

TEST(ShardInfo, WorldLargerThanBuffer) {
  ShardInfo s = shard_info(3, 4, 3);
  EXPECT_EQ(s.shard_numel, 1);
  EXPECT_EQ(s.valid_numel, 0);  // rank 3 holds only padding
  EXPECT_EQ(shard_info(3, 4, 2).valid_numel, 1);
}

TEST(ShardInfo, ParamSlices) {
  // flat = [a(5) b(4) c(3)] = 12, world 5 -> shard 3 (padded 15)
  ShardInfo s1 = shard_info(12, 5, 1);  // elements 3..5
  auto a = param_shard_slice(0, 5, s1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->param_begin, 3);
  EXPECT_EQ(a->param_end, 5);
  EXPECT_EQ(a->shard_offset, 0);
  auto b = param_shard_slice(5, 4, s1);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->param_begin, 0);
  EXPECT_EQ(b->param_end, 1);
  EXPECT_EQ(b->shard_offset, 2);
  EXPECT_FALSE(param_shard_slice(9, 3, s1));
  EXPECT_FALSE(param_shard_slice(9, 3, shard_info(12, 5, 4)));  // rank 4: padding only (12..14)
  EXPECT_THROW(shard_info(4, 0, 0), Error);
  EXPECT_THROW(shard_info(4, 2, 2), Error);
}

TEST(FlatParameter, ParamsBecomeViewsOfTheFreedFullBuffer) {
  at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3}).requires_grad_(true);
  at::Tensor b = at::arange(6, 9, at::kFloat).requires_grad_(true);
  std::vector<FlatParamEntry> entries(2);
  entries[0].name = "w";
  entries[0].param = w;
  entries[1].name = "b";
  entries[1].param = b;
  FlatParamOptions opt;
  opt.param_dtype = at::kBFloat16;
  FlatParameter flat(std::move(entries), /*world=*/4, /*rank=*/2, opt);  // 9 -> padded 12, shard 3: 6..8
  EXPECT_EQ(flat.shard_info().padded_numel, 12);
  EXPECT_TRUE(at::equal(flat.shard(), at::tensor({6.f, 7.f, 8.f})));
  EXPECT_FALSE(flat.full_allocated());
  EXPECT_EQ(w.scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
  flat.alloc_full();
  flat.full().copy_(at::arange(12, at::kFloat));
  // The module's tensors see the buffer's values through the shared storage.
  EXPECT_TRUE(at::equal(w.to(at::kFloat), at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(at::equal(b.to(at::kFloat), at::arange(6, 9, at::kFloat)));
  flat.free_full();
  EXPECT_EQ(flat.full().storage().nbytes(), 0u);
  flat.alloc_full();
  flat.full().fill_(2);
  EXPECT_TRUE(at::equal(b.to(at::kFloat), at::full({3}, 2.f)));
}

TEST(WeightDecay, HfRule) {
  EXPECT_TRUE(hf_no_weight_decay("model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(hf_no_weight_decay("model.layers.3.post_attention_layernorm.weight"));
  EXPECT_TRUE(hf_no_weight_decay("model.norm.weight"));
  EXPECT_TRUE(hf_no_weight_decay("model.layers.0.mlp.up_proj.bias"));
  EXPECT_TRUE(hf_no_weight_decay("q_norm.weight"));
  EXPECT_FALSE(hf_no_weight_decay("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(hf_no_weight_decay("model.embed_tokens.weight"));
  EXPECT_FALSE(hf_no_weight_decay("lm_head.weight"));
  EXPECT_FALSE(hf_no_weight_decay("model.normalizer.weight"));
}

FsdpPolicy build(const std::string& words, const std::string& cfg = "", const std::string& mp = "no",
                 bool gc = false) {
  FsdpPolicyInputs in;
  in.fsdp = words;
  in.fsdp_config = cfg;
  in.mixed_precision = mp;
  in.gradient_checkpointing = gc;
  in.local_world_size = 2;
  return build_fsdp_policy(in);
}

TEST(Policy, AlpacaReadmeFlags) {
  FsdpPolicyInputs in;
  in.fsdp = "full_shard auto_wrap";
  in.transformer_layer_cls_to_wrap = {"LlamaDecoderLayer"};
  in.mixed_precision = "bf16";
  FsdpPolicy p = build_fsdp_policy(in);
  EXPECT_EQ(p.strategy, ShardingStrategy::kFullShard);
  EXPECT_TRUE(p.auto_wrap);
  EXPECT_FALSE(p.offload);
  EXPECT_EQ(p.param_dtype, at::kBFloat16);
  EXPECT_EQ(p.reduce_dtype, at::kBFloat16);  // accelerate: reduce in param dtype
  // Speed defaults (HF: NO_PREFETCH / false), the math is identical (test_fsdp_collective_path).
  EXPECT_EQ(p.backward_prefetch, BackwardPrefetch::kBackwardPre);
  EXPECT_TRUE(p.forward_prefetch);
  EXPECT_TRUE(p.limit_all_gathers);
  EXPECT_FALSE(p.force_collectives);
  EXPECT_TRUE(p.sync_module_states);
  EXPECT_FALSE(p.activation_checkpointing);
}

TEST(Policy, WrapClassIsTheModelTypesDecoderLayer) {
  FsdpPolicyInputs in;
  in.fsdp = "full_shard auto_wrap";
  EXPECT_TRUE(build_fsdp_policy(in).wrap_classes.empty());  // not given: the model's own class
  for (const auto& [type, cls] : std::vector<std::pair<std::string, std::string>>{
           {"llama", "LlamaDecoderLayer"}, {"mistral", "MistralDecoderLayer"}, {"qwen2", "Qwen2DecoderLayer"}}) {
    SCOPED_TRACE(cls);
    EXPECT_EQ(decoder_layer_class(type), cls);
    in.transformer_layer_cls_to_wrap = {cls};
    const FsdpPolicy p = build_fsdp_policy(in);
    EXPECT_EQ(p.wrap_classes, std::vector<std::string>{cls});
    EXPECT_NO_THROW(check_wrap_classes(p, type, "m/config.json"));
    for (const std::string other : {"llama", "mistral", "qwen2"}) {
      if (other == type) continue;
      try {
        check_wrap_classes(p, other, "m/config.json");
        FAIL() << cls << " accepted for " << other;
      } catch (const Error& e) {
        for (const std::string& needle : std::vector<std::string>{cls, "m/config.json", "model_type " + other, decoder_layer_class(other)})
          EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
      }
    }
  }
  // Through fsdp_config too; a class of no supported model is refused at parse time.
  in.transformer_layer_cls_to_wrap.clear();
  in.fsdp_config = R"({"transformer_layer_cls_to_wrap": ["MistralDecoderLayer"]})";
  EXPECT_THROW(check_wrap_classes(build_fsdp_policy(in), "llama", "m/config.json"), Error);
  in.fsdp_config = R"({"transformer_layer_cls_to_wrap": ["GPT2Block"]})";
  try {
    build_fsdp_policy(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("GPT2Block"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("Qwen2DecoderLayer"), std::string::npos) << e.message();
  }
}

TEST(Policy, Words) {
  EXPECT_EQ(build("shard_grad_op auto_wrap").strategy, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(build("no_shard").strategy, ShardingStrategy::kNoShard);
  EXPECT_FALSE(build("full_shard").auto_wrap);  // no auto_wrap: the whole model is one unit
  FsdpPolicy h = build("hybrid_shard offload auto_wrap");
  EXPECT_EQ(h.strategy, ShardingStrategy::kHybridShard);
  EXPECT_TRUE(h.offload);
  EXPECT_EQ(h.hybrid_shard_size, 2);
  EXPECT_EQ(build("True").strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(build("").strategy, ShardingStrategy::kNoShard);
  EXPECT_THROW(build("offload"), Error);
  EXPECT_THROW(build("full_shard shard_grad_op"), Error);
  EXPECT_THROW(build("full_shard zero3"), Error);
  EXPECT_THROW(build("hybrid_shard_zero2"), Error);
  EXPECT_TRUE(build("full_shard", "", "no", /*gc=*/true).activation_checkpointing);
  EXPECT_EQ(build("full_shard", "", "fp16").param_dtype, at::kHalf);
  EXPECT_THROW(build("full_shard", "", "fp8"), Error);
}

TEST(Policy, ConfigKeysWithAndWithoutPrefix) {
  FsdpPolicy p = build("full_shard auto_wrap", R"({
    "fsdp_backward_prefetch": "backward_pre", "forward_prefetch": "true", "limit_all_gathers": false,
    "sync_module_states": true, "cpu_ram_efficient_loading": true, "activation_checkpointing": true,
    "use_orig_params": true, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "min_num_params": 0,
    "fsdp_version": 1, "reduce_dtype": "fp32"})", "bf16");
  EXPECT_EQ(p.backward_prefetch, BackwardPrefetch::kBackwardPre);
  EXPECT_TRUE(p.forward_prefetch);
  EXPECT_FALSE(p.limit_all_gathers);
  EXPECT_TRUE(p.cpu_ram_efficient_loading);
  EXPECT_TRUE(p.activation_checkpointing);
  EXPECT_EQ(p.param_dtype, at::kBFloat16);
  EXPECT_EQ(p.reduce_dtype, at::kFloat);
  EXPECT_EQ(build("full_shard", R"({"backward_prefetch":"BACKWARD_POST"})").backward_prefetch,
            BackwardPrefetch::kBackwardPost);
}

// The speed defaults never override what a config says: HF's explicit values are kept.
TEST(Policy, ExplicitPrefetchValuesAreHonoured) {
  FsdpPolicy none = build("full_shard auto_wrap", R"({"backward_prefetch": "NO_PREFETCH", "forward_prefetch": false})");
  EXPECT_EQ(none.backward_prefetch, BackwardPrefetch::kNone);
  EXPECT_FALSE(none.forward_prefetch);
  FsdpPolicy post = build("full_shard auto_wrap", R"({"fsdp_backward_prefetch": "backward_post"})");
  EXPECT_EQ(post.backward_prefetch, BackwardPrefetch::kBackwardPost);
  EXPECT_TRUE(post.forward_prefetch);  // not given: the default
  FsdpPolicy fwd_off = build("full_shard auto_wrap", R"({"forward_prefetch": "false"})");
  EXPECT_EQ(fwd_off.backward_prefetch, BackwardPrefetch::kBackwardPre);
  EXPECT_FALSE(fwd_off.forward_prefetch);
  EXPECT_TRUE(build("full_shard auto_wrap", R"({"force_collectives": true})").force_collectives);
  EXPECT_THROW(build("full_shard auto_wrap", R"({"force_collectives": "sometimes"})"), Error);
}

// state_dict_type: checkpoints are sharded by rank and the final output_dir is one HF directory,
// which is what both accelerate values ask for. sharding_strategy decides only when --fsdp names none.
TEST(Policy, StateDictTypesAndAStrategyNamedOnce) {
  for (const char* v : {"FULL_STATE_DICT", "SHARDED_STATE_DICT"})
    EXPECT_NO_THROW(build("full_shard auto_wrap", std::string(R"({"state_dict_type": ")") + v + "\"}")) << v;
  EXPECT_EQ(build("auto_wrap", R"({"sharding_strategy": "SHARD_GRAD_OP"})").strategy, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(build("full_shard auto_wrap", R"({"fsdp_sharding_strategy": "FULL_SHARD"})").strategy,
            ShardingStrategy::kFullShard);
  try {
    build("full_shard auto_wrap", R"({"sharding_strategy": "NO_SHARD"})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("contradicts --fsdp, which names FULL_SHARD"), std::string::npos) << e.message();
  }
}

// transformers 5's fsdp_config (FSDP2 by default): version 2, reshard_after_forward true/false for
// full_shard/shard_grad_op, cpu_offload, auto_wrap_policy, xla false. The same training as FSDP1's words.
TEST(Policy, TransformersFiveKeys) {
  const FsdpPolicy a = build("auto_wrap", R"({"version": 2, "reshard_after_forward": false, "cpu_offload": true,
                                              "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "xla": false, "xla_fsdp_v2": false})");
  EXPECT_EQ(a.strategy, ShardingStrategy::kShardGradOp);
  EXPECT_TRUE(a.offload);
  EXPECT_TRUE(a.auto_wrap);
  EXPECT_EQ(build("auto_wrap", R"({"fsdp_reshard_after_forward": true})").strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(build("auto_wrap", R"({"version": 1, "reshard_after_forward": "hybrid_shard"})").strategy, ShardingStrategy::kHybridShard);
  EXPECT_FALSE(build("full_shard auto_wrap", R"({"auto_wrap_policy": "NO_WRAP"})").auto_wrap);
  EXPECT_EQ(build("full_shard auto_wrap", R"({"reshard_after_forward": true})").strategy, ShardingStrategy::kFullShard);
  for (const auto& [words, cfg, needle] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"full_shard auto_wrap", R"({"reshard_after_forward": false})", "contradicts --fsdp, which names FULL_SHARD"},
           {"auto_wrap", R"({"reshard_after_forward": false, "sharding_strategy": "FULL_SHARD"})", "name different strategies"},
           {"auto_wrap", R"({"xla": true})", "PyTorch/XLA"},
           {"auto_wrap", R"({"version": 3})", "version 3 is not supported"}}) {
    try {
      build(words, cfg);
      ADD_FAILURE() << cfg;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  }
}

TEST(Policy, KeysNotActedOnAreErrors) {
  for (const char* bad : {R"({"xla": true})", R"({"fsdp_version": 3})",
                          R"({"auto_wrap_policy": "SIZE_BASED_WRAP"})", R"({"reshard_after_forward": "sometimes"})", R"({"min_num_params": 1000})",
                          R"({"use_orig_params": false})", R"({"transformer_layer_cls_to_wrap": "GPT2Block"})",
                          R"({"backward_prefetch": "sometimes"})", R"({"limit_all_gathers": "maybe"})",
                          R"({"sync_module_states": false, "cpu_ram_efficient_loading": true})",
                          R"({"state_dict_type": "LOCAL_STATE_DICT"})", R"({"sharding_strategy": "SHARD_GRAD_OP"})",
                          R"([1, 2])", R"({not json)",
                          R"({"backward_prefetch": "backward_pre", "fsdp_backward_prefetch": "backward_pre"})"}) {
    EXPECT_THROW(build("full_shard auto_wrap", bad), Error) << bad;
  }
  try {
    build("full_shard", R"({"xla_fsdp_grad_ckpt": true})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("xla_fsdp_grad_ckpt"), std::string::npos) << e.message();
  }
  FsdpPolicyInputs in;
  in.fsdp = "full_shard auto_wrap";
  in.fsdp_config = R"({"transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})";
  in.transformer_layer_cls_to_wrap = {"LlamaDecoderLayer"};
  EXPECT_EQ(build_fsdp_policy(in).wrap_classes, std::vector<std::string>{"LlamaDecoderLayer"});  // the same class twice
  in.fsdp_config = R"({"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer", "LlamaDecoderLayer2"]})";
  EXPECT_THROW(build_fsdp_policy(in), Error);  // two different answers: the user must give one
  in.fsdp_config = "";
  in.fsdp = "full_shard";
  EXPECT_THROW(build_fsdp_policy(in), Error);  // the class flag only acts with auto_wrap
  in.fsdp = "";
  in.transformer_layer_cls_to_wrap.clear();
  in.fsdp_config = R"({"backward_prefetch": "backward_pre"})";
  EXPECT_THROW(build_fsdp_policy(in), Error);  // fsdp_config without --fsdp would do nothing
}

}  // namespace
}  // namespace alpaca::fsdp::test_fsdp_unit

namespace test_fsdp_unit {

// The fused bf16 -> fp32 gradient add: ATen's add_ bit for bit (upcast, one fp32 add), over lengths
// around the vector widths and the parallel grain, with signed zeros, infinities and NaNs; other
// dtypes and layouts fall back to add_.
TEST(AddGradient, MatchesAtenAddBitForBit) {
  at::manual_seed(3);
  for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 33, 1000, 65536 * 3 + 5}) {
    at::Tensor src = (at::randn({n}) * 1e3).to(at::kBFloat16);
    if (n > 8) {
      src[0] = -0.0;
      src[1] = std::numeric_limits<float>::infinity();
      src[2] = std::numeric_limits<float>::quiet_NaN();
      src[3] = 1e-40;  // a subnormal
    }
    const at::Tensor base = at::randn({n}) * 10;
    at::Tensor ours = base.clone(), ref = base.clone();
    alpaca::fsdp::add_gradient(ours, src);
    ref.add_(src);
    ASSERT_EQ(std::memcmp(ours.data_ptr(), ref.data_ptr(), static_cast<size_t>(n) * 4), 0) << "n = " << n;
  }
  // Not the fused case (fp32 source, strided destination): add_'s result.
  at::Tensor grad = at::zeros({4, 6}), src = at::randn({6, 4}).to(at::kBFloat16);
  at::Tensor view = grad.t();
  alpaca::fsdp::add_gradient(view, src);
  EXPECT_TRUE(at::equal(grad.t(), src.to(at::kFloat)));
}

}  // namespace test_fsdp_unit
