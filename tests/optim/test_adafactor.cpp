// transformers' Adafactor (ShardedAdamW with options.adafactor: --optim adafactor) against
// transformers itself (tests/reference/adafactor_reference.py: the class with the kwargs its Trainer
// passes, six steps of eight parameters: matrices of several shapes, a one-column one, vectors
// without weight decay, a zero gradient row, steps that clip at the update RMS and steps that do
// not). One flat shard holding every parameter; then the buffer cut into 3 and 50 shards (rows cut by
// shard boundaries, shards shorter than a row) stepped by one thread per rank with an all-reduce
// SUM: every rank keeps the same statistics, and the parameters are those of one rank within
// float rounding. The statistics as a checkpoint names them, and a resume from them.
#include <gtest/gtest.h>

#include <barrier>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "alpaca/fsdp/shard_info.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/optim/adamw.h"
#include "test_util.h"

namespace alpaca::optim::test_adafactor {
namespace {

namespace fs = std::filesystem;

fs::path fixture() { return testing::binary_dir() / "fixtures" / "adafactor"; }

struct Reference {
  nlohmann::json meta;
  std::shared_ptr<io::SafetensorsFile> file;
  at::Tensor get(const std::string& name) const { return file->tensor(name).clone(); }
};

Reference load() {
  Reference r;
  std::ifstream f(fixture() / "adafactor.json");
  EXPECT_TRUE(f) << fixture() << ": run the fixture_adafactor test first";
  if (!f) return r;
  r.meta = nlohmann::json::parse(f);
  r.file = io::SafetensorsFile::open((fixture() / "adafactor.safetensors").string());
  return r;
}

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  bool decay = true;
};

std::vector<Param> params_of(const nlohmann::json& meta, int64_t* total) {
  std::vector<Param> out;
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

AdamWOptions options_of(const nlohmann::json& meta) {
  AdamWOptions o;
  o.weight_decay = meta["weight_decay"].get<double>();
  o.adafactor = true;
  return o;
}

// The parameters as one flat buffer (padded to `world` shards) and every rank's shard as the FSDP
// engine's optim_shards(per_parameter) builds it.
struct Flat {
  at::Tensor values, grads;
  std::vector<OptimShard> shards;
};

Flat make_flat(const Reference& ref, const std::vector<Param>& params, int64_t total, int world) {
  const fsdp::ShardInfo si0 = fsdp::shard_info(total, world, 0);
  Flat f;
  f.values = at::zeros({si0.padded_numel}, at::kFloat);
  f.grads = at::zeros({si0.padded_numel}, at::kFloat);
  for (const Param& p : params) f.values.narrow(0, p.offset, p.numel).copy_(ref.get("init." + p.name).reshape({-1}));
  for (int r = 0; r < world; ++r) {
    const fsdp::ShardInfo si = fsdp::shard_info(total, world, r);
    OptimShard s;
    s.param = f.values.narrow(0, si.shard_begin, si.shard_numel);
    s.grad = f.grads.narrow(0, si.shard_begin, si.shard_numel);
    s.shard_rank = r;
    s.shard_world = world;
    for (const Param& p : params) {
      s.params.push_back({p.name, p.shape});
      const auto slice = fsdp::param_shard_slice(p.offset, p.numel, si);
      if (!slice) continue;
      s.segments.push_back({slice->shard_offset, slice->numel(), p.decay, slice->param_begin, p.numel, false,
                            static_cast<int64_t>(s.params.size()) - 1});
    }
    f.shards.push_back(std::move(s));
  }
  return f;
}

void set_grads(Flat& f, const Reference& ref, const std::vector<Param>& params, int step) {
  for (const Param& p : params)
    f.grads.narrow(0, p.offset, p.numel).copy_(ref.get("grad." + std::to_string(step) + "." + p.name).reshape({-1}));
}

using Optimizers = std::vector<std::unique_ptr<ShardedAdamW>>;

Optimizers make_optimizers(Flat& f, const Reference& ref, int world, std::vector<at::Tensor>& exchange,
                           std::barrier<>& sync) {
  Optimizers opts;
  for (int r = 0; r < world; ++r) {
    opts.push_back(std::make_unique<ShardedAdamW>(std::vector<OptimShard>{f.shards[r]}, options_of(ref.meta)));
    if (world > 1)
      opts.back()->set_sum_reducer([&, r, world](at::Tensor& t) {
        exchange[r] = t.clone();
        sync.arrive_and_wait();
        at::Tensor sum = at::zeros_like(t);
        for (int k = 0; k < world; ++k) sum.add_(exchange[k]);  // every rank adds in the same order
        sync.arrive_and_wait();
        t.copy_(sum);
      });
  }
  return opts;
}

// Steps `opts` (one thread per rank) through the reference's steps [first, last).
void run_steps(Optimizers& opts, Flat& f, const Reference& ref, const std::vector<Param>& params, int first, int last) {
  const auto lrs = ref.meta["lrs"].get<std::vector<double>>();
  for (int step = first; step < last; ++step) {
    set_grads(f, ref, params, step);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < opts.size(); ++r) threads.emplace_back([&, r] { opts[r]->step(lrs[step]); });
    for (auto& t : threads) t.join();
  }
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(Adafactor, TransformersBuildsItWithTheScheduleAsItsLearningRate) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  const auto& w = ref.meta["wiring"];
  EXPECT_EQ(w["class"], "transformers.optimization.Adafactor");
  EXPECT_EQ(w["kwargs"]["scale_parameter"], false);
  EXPECT_EQ(w["kwargs"]["relative_step"], false);
  EXPECT_FALSE(w["kwargs"].contains("beta1"));  // no first moment
  // The class defaults adafactor.cpp writes as constants.
  EXPECT_EQ(w["defaults"]["eps"], nlohmann::json::array({1e-30, 1e-3}));
  EXPECT_EQ(w["defaults"]["clip_threshold"].get<double>(), 1.0);
  EXPECT_EQ(w["defaults"]["decay_rate"].get<double>(), -0.8);
  EXPECT_TRUE(w["defaults"]["beta1"].is_null());
}

// One rank holding every parameter: transformers' parameters and statistics after every step.
TEST(Adafactor, OneShardMatchesTransformers) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  Flat f = make_flat(ref, params, total, 1);
  std::vector<at::Tensor> exchange(1);
  std::barrier sync(1);
  Optimizers opts = make_optimizers(f, ref, 1, exchange, sync);
  const int steps = ref.meta["steps"].get<int>();
  double worst_param = 0, worst_state = 0;
  for (int step = 0; step < steps; ++step) {
    run_steps(opts, f, ref, params, step, step + 1);
    for (const Param& p : params) {
      const std::string s = std::to_string(step);
      worst_param = std::max(worst_param, max_rel_diff(f.values.narrow(0, p.offset, p.numel),
                                                       ref.get("param." + s + "." + p.name).reshape({-1})));
    }
    for (const auto& st : opts[0]->adafactor_state())
      worst_state = std::max(worst_state, max_rel_diff(st.value, ref.get(st.key + "." + std::to_string(step) + "." + st.param)));
  }
  // The statistics are transformers' ops in its order (bit for bit); the update's RMS is a sum of
  // squares where torch takes norm(2), one rounding apart, which the clipped steps carry into the
  // parameters.
  std::printf("one shard vs transformers: parameters within %.3g, statistics within %.3g (relative)\n", worst_param,
              worst_state);
  EXPECT_EQ(worst_state, 0.0);
  EXPECT_LT(worst_param, 5e-7);
}

// The statistics a checkpoint holds, named as torch's Adafactor.state names them.
TEST(Adafactor, StateIsNamedAsTorchNamesIt) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  Flat f = make_flat(ref, params, total, 1);
  std::vector<at::Tensor> exchange(1);
  std::barrier sync(1);
  Optimizers opts = make_optimizers(f, ref, 1, exchange, sync);
  std::map<std::string, std::vector<std::string>> keys;
  for (const auto& st : opts[0]->adafactor_state()) {
    keys[st.param].push_back(st.key);
    const auto shape = ref.get(st.key + ".0." + st.param).sizes();
    EXPECT_EQ(st.value.sizes(), shape) << st.param << " " << st.key;
  }
  for (auto& [name, k] : keys) {
    std::sort(k.begin(), k.end());
    EXPECT_EQ(k, ref.meta["state_keys"][name].get<std::vector<std::string>>()) << name;
  }
  EXPECT_EQ(keys.size(), params.size());
  // rows + columns of a matrix, every element of a vector: what the planner counts.
  int64_t expect = 0;
  for (const Param& p : params) expect += p.shape.size() == 2 ? p.shape[0] + p.shape[1] : p.numel;
  EXPECT_EQ(opts[0]->state_bytes(), 4 * expect);
}

class AdafactorShards : public ::testing::TestWithParam<int> {};

// The flat buffer cut into `world` shards, each stepped by its own thread: every rank holds the same
// statistics, and parameters and statistics are those of one rank within float rounding (partial
// sums added in another order).
TEST_P(AdafactorShards, MatchOneRank) {
  const int world = GetParam();
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  Flat one = make_flat(ref, params, total, 1);
  std::vector<at::Tensor> ex1(1);
  std::barrier sync1(1);
  Optimizers o1 = make_optimizers(one, ref, 1, ex1, sync1);
  run_steps(o1, one, ref, params, 0, steps);

  Flat f = make_flat(ref, params, total, world);
  std::vector<at::Tensor> exchange(world);
  std::barrier sync(world);
  Optimizers opts = make_optimizers(f, ref, world, exchange, sync);
  run_steps(opts, f, ref, params, 0, steps);
  for (int r = 1; r < world; ++r) {
    const auto a = opts[0]->adafactor_state(), b = opts[r]->adafactor_state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) ASSERT_TRUE(at::equal(a[k].value, b[k].value)) << "rank " << r << " " << a[k].param;
  }
  double worst_param = 0, worst_state = 0;
  for (const Param& p : params)
    worst_param = std::max(worst_param, max_rel_diff(f.values.narrow(0, p.offset, p.numel), one.values.narrow(0, p.offset, p.numel)));
  const auto a = opts[0]->adafactor_state(), b = o1[0]->adafactor_state();
  for (size_t k = 0; k < a.size(); ++k) worst_state = std::max(worst_state, max_rel_diff(a[k].value, b[k].value));
  std::printf("%d shards vs one: parameters within %.3g, statistics within %.3g (relative)\n", world, worst_param,
              worst_state);
  EXPECT_LT(worst_param, 5e-7);
  EXPECT_LT(worst_state, 1e-6);
  EXPECT_GT(worst_param + worst_state, 0.0);  // the cut rows did add partial sums across ranks
}

INSTANTIATE_TEST_SUITE_P(Worlds, AdafactorShards, ::testing::Values(3, 50));

// A resume: a fresh optimizer given the statistics (by name) and the step count continues exactly.
TEST(Adafactor, ResumesFromItsNamedStateBitwise) {
  const Reference ref = load();
  ASSERT_FALSE(ref.meta.is_null());
  int64_t total = 0;
  const auto params = params_of(ref.meta, &total);
  const int steps = ref.meta["steps"].get<int>();
  for (int world : {1, 3}) {
    SCOPED_TRACE(world);
    Flat a = make_flat(ref, params, total, world);
    std::vector<at::Tensor> ea(world);
    std::barrier sa(world);
    Optimizers oa = make_optimizers(a, ref, world, ea, sa);
    run_steps(oa, a, ref, params, 0, steps);

    Flat b = make_flat(ref, params, total, world);
    std::vector<at::Tensor> eb(world);
    std::barrier sb(world);
    Optimizers ob = make_optimizers(b, ref, world, eb, sb);
    run_steps(ob, b, ref, params, 0, 3);
    std::map<std::string, at::Tensor> saved;  // what a checkpoint holds
    for (const auto& st : ob[0]->adafactor_state()) saved[st.key + "." + st.param] = st.value.clone();
    const at::Tensor values = b.values.clone();
    Flat c = make_flat(ref, params, total, world);
    c.values.copy_(values);
    std::vector<at::Tensor> ec(world);
    std::barrier sc(world);
    Optimizers oc = make_optimizers(c, ref, world, ec, sc);
    for (auto& o : oc) {
      o->set_step_count(3);
      for (const auto& st : o->adafactor_state()) st.value.copy_(saved.at(st.key + "." + st.param));
    }
    run_steps(oc, c, ref, params, 3, steps);
    EXPECT_TRUE(at::equal(c.values, a.values));
  }
}

}  // namespace
}  // namespace alpaca::optim::test_adafactor
