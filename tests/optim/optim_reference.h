// A reference optimizer run written by a Python script (tests/reference/*_reference.py): its JSON
// description and its safetensors of parameters, gradients and states per step.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "alpaca/fsdp/shard_info.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/optim/adamw.h"

namespace alpaca::optim::test_reference {

struct OptimReference {
  nlohmann::json meta;  // null when the fixture is missing (the test fails, saying so)
  std::shared_ptr<io::SafetensorsFile> file;
  at::Tensor get(const std::string& name) const { return file->tensor(name).clone(); }
};

// A parameter of the reference (meta["params"]: name, shape, decay) at its place in one flat buffer
// of all of them, in order.
struct RefParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  bool decay = true;
};

inline std::vector<RefParam> ref_params(const nlohmann::json& meta, int64_t* total) {
  std::vector<RefParam> out;
  int64_t off = 0;
  for (const auto& p : meta["params"]) {
    const auto shape = p["shape"].get<std::vector<int64_t>>();
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.push_back({p["name"].get<std::string>(), shape, off, n, p["decay"].get<bool>()});
    off += n;
  }
  *total = off;
  return out;
}

// The parameters as one flat buffer (padded to `world` shards) holding the reference's `key` +
// name tensors, and every rank's shard as the FSDP engine's optim_shards(per_parameter) builds it:
// one segment per parameter part with its extent, every parameter listed, embed_tokens.weight an
// embedding.
struct RefFlat {
  at::Tensor values, grads;  // (padded) fp32
  std::vector<OptimShard> shards;
};

template <class Reference>
RefFlat make_ref_flat(const Reference& ref, const std::vector<RefParam>& params, int64_t total, int world,
                      const std::string& key) {
  const fsdp::ShardInfo si0 = fsdp::shard_info(total, world, 0);
  RefFlat f;
  f.values = at::zeros({si0.padded_numel}, at::kFloat);
  f.grads = at::zeros({si0.padded_numel}, at::kFloat);
  for (const RefParam& p : params) f.values.narrow(0, p.offset, p.numel).copy_(ref.get(key + p.name).reshape({-1}));
  for (int r = 0; r < world; ++r) {
    const fsdp::ShardInfo si = fsdp::shard_info(total, world, r);
    OptimShard s;
    s.param = f.values.narrow(0, si.shard_begin, si.shard_numel);
    s.grad = f.grads.narrow(0, si.shard_begin, si.shard_numel);
    s.shard_rank = r;
    s.shard_world = world;
    for (const RefParam& p : params) {
      s.params.push_back({p.name, p.shape});
      const auto slice = fsdp::param_shard_slice(p.offset, p.numel, si);
      if (!slice) continue;
      s.segments.push_back({slice->shard_offset, slice->numel(), p.decay, slice->param_begin, p.numel,
                            p.name == "embed_tokens.weight", static_cast<int64_t>(s.params.size()) - 1});
    }
    f.shards.push_back(std::move(s));
  }
  return f;
}

// `dir`/`json_name` and `dir`/`tensors_name`, written by the fixture named after `dir`.
inline OptimReference load_optim_reference(const std::filesystem::path& dir, const std::string& json_name,
                                           const std::string& tensors_name) {
  OptimReference r;
  std::ifstream f(dir / json_name);
  EXPECT_TRUE(f) << dir << ": run the fixture_" << dir.filename().string() << " test first";
  if (!f) return r;
  r.meta = nlohmann::json::parse(f);
  r.file = io::SafetensorsFile::open((dir / tensors_name).string());
  return r;
}

}  // namespace alpaca::optim::test_reference
