// HF checkpoint directories: loading errors name the tensor and file; the streaming exporter
// shards like transformers, keeps other files in an existing directory, and reloads bit-exactly.
#include <gtest/gtest.h>

#include <malloc.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "alpaca/cli/commands.h"
#include "alpaca/io/checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/llama.h"
#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"
#include "model_test_util.h"
#include "test_util.h"

namespace test_hf_checkpoint {

using namespace alpaca;
using alpaca::testing::error_of;
using alpaca::testing::llama_config;
namespace fs = std::filesystem;

namespace {

model::LlamaConfig tiny(bool tied) {
  model::LlamaConfig c = llama_config({64, 32, 48, 2, 4, 2, 8});
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = {2};
  return c;
}

// The tiny model with weights drawn from `seed`.
model::LlamaForCausalLM tiny_model(bool tied, uint64_t seed) {
  model::LlamaForCausalLM m(tiny(tied));
  model::init_weights(m, seed);
  return m;
}

void expect_same_params(model::LlamaForCausalLM& a, model::LlamaForCausalLM& b) {
  auto pb = b->named_parameters(true);
  ASSERT_EQ(a->named_parameters(true).size(), pb.size());
  for (const auto& item : a->named_parameters(true)) EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
}

TEST(HfCheckpoint, SaveAndLoadSingleFile) {
  alpaca::testing::TempDir tmp("hf_single");
  model::LlamaForCausalLM m = tiny_model(true, 1);
  const std::string dir = (tmp.path() / "out").string();
  io::save_hf_directory(m, dir);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "generation_config.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  io::CheckpointReader reader = io::CheckpointReader::open(dir);
  EXPECT_FALSE(reader.contains("lm_head.weight"));  // tied: not stored
  // Range reads give an FSDP rank its flat slice of a tensor without reading the rest.
  at::Tensor q = m->named_parameters(true)["model.layers.1.self_attn.q_proj.weight"];
  EXPECT_TRUE(at::equal(reader.read_range("model.layers.1.self_attn.q_proj.weight", 100, 50),
                        q.reshape({-1}).narrow(0, 100, 50)));
  EXPECT_EQ(reader.read("model.norm.weight", at::kBFloat16).scalar_type(), at::kBFloat16);
  model::LlamaForCausalLM back = io::load_hf_model(dir);
  expect_same_params(m, back);
  auto cfg = nlohmann::json::parse(std::ifstream(fs::path(dir) / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["torch_dtype"], "float32");
}

TEST(HfCheckpoint, ZeroCopyLoadSharesTheMappingCopyOnWrite) {
  alpaca::testing::TempDir tmp("hf_zero_copy");
  model::LlamaForCausalLM m = tiny_model(false, 9);
  const std::string dir = (tmp.path() / "out").string();
  io::save_hf_directory(m, dir);
  io::LoadOptions opts;
  opts.zero_copy = true;
  model::LlamaForCausalLM a = io::load_hf_model(dir, at::kFloat, opts);
  model::LlamaForCausalLM b = io::load_hf_model(dir, at::kFloat, opts);
  expect_same_params(m, a);
  // Both models read the same mapped file, yet writing one (an optimizer step) changes neither
  // the other nor the file.
  at::Tensor w = a->named_parameters(true)["model.norm.weight"];
  {
    at::NoGradGuard g;
    w.add_(1.0);
  }
  EXPECT_FALSE(at::equal(w, b->named_parameters(true)["model.norm.weight"]));
  model::LlamaForCausalLM fresh = io::load_hf_model(dir);
  expect_same_params(m, fresh);
  // Gradients flow through zero-copy parameters.
  at::Tensor loss = model::causal_lm_loss(b->forward(at::ones({1, 4}, at::kLong)), at::ones({1, 4}, at::kLong));
  loss.backward();
  EXPECT_TRUE(b->named_parameters(true)["lm_head.weight"].grad().defined());
}

TEST(HfCheckpoint, ShardsLikeTransformersAndKeepsOtherFiles) {
  alpaca::testing::TempDir tmp("hf_sharded");
  model::LlamaForCausalLM m = tiny_model(false, 2);
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "keep me";
  std::ofstream(dir / "pytorch_model.bin") << "stale weights";
  // embed/lm_head are 64*32*2 = 4096 bytes in bf16 > 3000: each gets a shard of its own.
  io::save_hf_directory(m, dir.string(), at::kBFloat16, 3000);
  EXPECT_TRUE(fs::exists(dir / "tokenizer.model"));
  EXPECT_FALSE(fs::exists(dir / "pytorch_model.bin"));
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  const auto& wm = index["weight_map"];
  EXPECT_EQ(wm.size(), m->named_parameters(true).size());
  std::set<std::string> files;
  int64_t total = 0;
  for (auto it = wm.begin(); it != wm.end(); ++it) files.insert(it.value().get<std::string>());
  for (const auto& f : files) {
    auto st = io::SafetensorsFile::open((dir / f).string());
    int64_t bytes = 0;
    for (const auto& n : st->names()) bytes += st->info(n).nbytes();
    total += bytes;
    if (st->names().size() > 1) {
      EXPECT_LE(bytes, 3000) << f;
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_GT(files.size(), 3u);
  EXPECT_TRUE(files.count("model-00001-of-" + std::string(5 - std::to_string(files.size()).size(), '0') +
                          std::to_string(files.size()) + ".safetensors"));
  // Shard 1 holds the oversized embedding alone (it closed first), as huggingface_hub orders it.
  EXPECT_EQ(wm["model.embed_tokens.weight"], *files.begin());
  model::LlamaForCausalLM back = io::load_hf_model(dir.string());
  for (const auto& item : m->named_parameters(true))
    EXPECT_TRUE(at::equal(item.value().to(at::kBFloat16).to(at::kFloat), back->named_parameters(true)[item.key()]));
  EXPECT_FALSE(fs::exists(tmp.path() / ".out.export-tmp"));
}

TEST(HfCheckpoint, ExportToPathWithTrailingSlash) {
  alpaca::testing::TempDir tmp("hf_slash");
  model::LlamaForCausalLM m(tiny(true));
  io::save_hf_directory(m, (tmp.path() / "nested" / "out").string() + "/");
  EXPECT_TRUE(fs::exists(tmp.path() / "nested" / "out" / "model.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path() / "nested"), fs::directory_iterator()), 1);
}

TEST(HfCheckpoint, AbandonedExportLeavesNothing) {
  alpaca::testing::TempDir tmp("hf_abandon");
  const fs::path dir = tmp.path() / "out";
  {
    io::HfExportWriter w(dir.string(), 1000);
    w.add("a", at::ones({100}));
    w.add("b", at::ones({300}));
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(HfCheckpoint, MissingTensorAndWrongShapeNameTensorAndFile) {
  alpaca::testing::TempDir tmp("hf_errors");
  model::LlamaForCausalLM m(tiny(false));
  const std::string dir = (tmp.path() / "ckpt").string();
  io::save_hf_directory(m, dir);
  const std::string file = (fs::path(dir) / "model.safetensors").string();

  model::LlamaConfig bigger = tiny(false);
  bigger.intermediate_size = 64;
  model::LlamaForCausalLM wrong_shape(bigger);
  std::string msg = error_of([&] { io::load_hf_weights(wrong_shape, dir); });
  EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;

  model::LlamaConfig deeper = tiny(false);
  deeper.num_hidden_layers = 3;
  model::LlamaForCausalLM missing(deeper);
  msg = error_of([&] { io::load_hf_weights(missing, dir); });
  EXPECT_NE(msg.find("model.layers.2."), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;

  // An index that names a shard which is not there.
  const fs::path sharded = tmp.path() / "sharded";
  io::save_hf_directory(m, sharded.string(), std::nullopt, 5000);
  auto index = nlohmann::json::parse(std::ifstream(sharded / "model.safetensors.index.json"));
  const std::string shard = index["weight_map"]["model.norm.weight"].get<std::string>();
  fs::remove(sharded / shard);
  msg = error_of([&] { io::CheckpointReader::open(sharded.string()); });
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

  msg = error_of([&] { io::CheckpointReader::open(tmp.path().string()); });
  EXPECT_NE(msg.find("no weights found"), std::string::npos) << msg;

  // A .bin that is not a torch.save file.
  const fs::path bad_bin = tmp.path() / "badbin";
  fs::create_directories(bad_bin);
  std::ofstream(bad_bin / "pytorch_model.bin") << "definitely not a zip";
  msg = error_of([&] { io::CheckpointReader::open(bad_bin.string()); });
  EXPECT_NE(msg.find("pytorch_model.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot read"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("frame #"), std::string::npos) << "no LibTorch backtrace in user errors: " << msg;
}

TEST(HfCheckpoint, LoadingNeverHoldsTwoCopiesOfTheWeights) {
  alpaca::testing::TempDir tmp("hf_peak_rss");
  model::LlamaConfig c = alpaca::testing::llama_21m();
  c.bos_token_id = 1;
  c.eos_token_id = {2};
  const std::string dir = (tmp.path() / "ckpt").string();
  {
    // Write the checkpoint one tensor at a time so this process never held the model itself.
    model::LlamaForCausalLM shapes(c, at::TensorOptions().device(at::kMeta));
    io::HfExportWriter w(dir, 5'000'000'000, at::kBFloat16);
    for (const auto& item : shapes->named_parameters(true)) w.add(item.key(), at::randn(item.value().sizes()) * 0.02);
    w.finish(c);
  }
  malloc_trim(0);
  // Linux resets the peak-RSS counter (VmHWM) when "5" is written to clear_refs.
  if (!(std::ofstream("/proc/self/clear_refs") << "5")) GTEST_SKIP() << "cannot reset VmHWM here";
  const int64_t base = sys::rss_bytes();
  model::LlamaForCausalLM m = io::load_hf_model(dir, at::kFloat);
  int64_t param_bytes = 0;
  for (const auto& p : m->parameters()) param_bytes += p.numel() * p.element_size();
  const int64_t grew = sys::peak_rss_bytes() - base;
  std::cout << "fp32 parameters " << param_bytes / 1e6 << " MB; peak RSS grew " << grew / 1e6 << " MB\n";
  // One copy plus slack; reading the bf16 file fully first would need 1.5x.
  EXPECT_LE(grew, param_bytes * 12 / 10);
}

TEST(HfCheckpoint, ParseShardSize) {
  // transformers 5's convert_file_size_to_int on the same texts (a lower-case b after K/M/G: bits).
  const std::vector<std::pair<std::string, int64_t>> transformers = {
      {"5GB", 5'000'000'000}, {"200MB", 200'000'000}, {"2GiB", 2147483648}, {"8Gb", 1'000'000'000},
      {"5gib", 5368709120},   {"3mib", 3145728},      {"20kb", 2500},       {"20Kb", 2500},
      {"7KiB", 7168}};
  for (const auto& [text, bytes] : transformers) EXPECT_EQ(io::parse_shard_size(text), bytes) << text;
  // Beyond transformers: a byte count, with or without B, a decimal, surrounding spaces.
  EXPECT_EQ(io::parse_shard_size("1000"), 1000);
  EXPECT_EQ(io::parse_shard_size("1000B"), 1000);
  EXPECT_EQ(io::parse_shard_size("1.5GB"), 1'500'000'000);
  EXPECT_EQ(io::parse_shard_size(" 20KB "), 20'000);
  for (const char* bad : {"lots", "5XB", "1.2.3GB", "0.5B", "0MB", "", "1e30GB"})
    EXPECT_THROW(io::parse_shard_size(bad), alpaca::Error) << bad;
}

TEST(HfCheckpoint, InitModelCommandWritesALoadableRandomModel) {
  alpaca::testing::TempDir tmp("init_model");
  const std::string cfg = (alpaca::testing::source_dir() / "tests/fixtures/configs/tiny_llama3_rope.json").string();
  const std::string out = (tmp.path() / "m").string();
  ASSERT_EQ(cli::run_init_model({"--config", cfg, "--output_dir", out, "--seed", "7", "--dtype", "bfloat16"}), 0);
  model::LlamaForCausalLM m = io::load_hf_model(out);
  EXPECT_NEAR(m->named_parameters(true)["model.layers.0.mlp.up_proj.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_EQ(m->config().rope_scaling.type, "llama3");
  EXPECT_EQ(io::CheckpointReader::open(out).info("model.norm.weight").dtype, at::kBFloat16);
  EXPECT_NE(error_of([&] { cli::run_init_model({"--config", cfg}); }).find("output_dir"), std::string::npos);
  EXPECT_NE(error_of([&] { cli::run_init_model({"--config", cfg, "--output_dir", out, "--dtype", "int8"}); })
                .find("--dtype"),
            std::string::npos);
}

}  // namespace

}  // namespace test_hf_checkpoint
