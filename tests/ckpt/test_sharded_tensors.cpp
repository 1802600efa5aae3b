// Sharded checkpoint tensors (ckpt/sharded_tensors.h): a flat range cut into DCP boxes, files
// written by several "ranks" read back at another cut, the digest computed while writing equal to
// one computed from the file, and the digest's speed against the old scalar SHA-256.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/ckpt/digest.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/ckpt/sharded_tensors.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_sharded_tensors {

namespace fs = std::filesystem;
using namespace alpaca::ckpt;
using alpaca::testing::TempDir;

TEST(RangeBoxes, CutsAFlatRangeIntoRowsAndPartialRows) {
  // 4 x 5; elements [3, 17): the end of row 0, rows 1-2, the start of row 3.
  auto b = range_boxes({4, 5}, 3, 17);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].offsets, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(b[0].sizes, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b[0].part, 1);
  EXPECT_EQ(b[1].offsets, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(b[1].sizes, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(b[1].range_offset, 2);
  EXPECT_EQ(b[1].part, 0);
  EXPECT_EQ(b[2].offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(b[2].sizes, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b[2].range_offset, 12);
  // Inside one row; whole rows; a 1-D tensor.
  b = range_boxes({4, 5}, 6, 8);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].offsets, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(b[0].sizes, (std::vector<int64_t>{1, 2}));
  b = range_boxes({4, 5}, 5, 15);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].sizes, (std::vector<int64_t>{2, 5}));
  b = range_boxes({9}, 2, 7);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].offsets, (std::vector<int64_t>{2}));
  EXPECT_THROW(range_boxes({4, 5}, 3, 21), alpaca::Error);
  EXPECT_THROW(range_boxes({2, 2, 2}, 1, 4), alpaca::Error);
}

TEST(ShardedTensors, ThreeRanksWrittenReadBackAtAnotherCut) {
  TempDir tmp("sharded_tensors");
  at::manual_seed(0);
  const at::Tensor w = at::randn({7, 5}), v = at::randn({11});
  // Three ranks own [0, 13), [13, 26), [26, 46) of a flat buffer [w | v].
  const at::Tensor flat = at::cat({w.reshape({-1}), v});
  const int64_t cuts[] = {0, 13, 26, 46};
  int64_t digested = 0;
  for (int r = 0; r < 3; ++r) {
    std::vector<RangePiece> pieces;
    const int64_t b = cuts[r], e = cuts[r + 1];
    if (b < 35) pieces.push_back({"w", {7, 5}, b, std::min<int64_t>(e, 35), flat.slice(0, b, std::min<int64_t>(e, 35))});
    if (e > 35) pieces.push_back({"v", {11}, std::max<int64_t>(b, 35) - 35, e - 35, flat.slice(0, std::max<int64_t>(b, 35), e)});
    const auto files = write_rank_shards(tmp.path(), "sharded", "model", r, pieces, {{"step", "3"}});
    ASSERT_EQ(files.size(), 3u);
    for (const auto& f : files) {
      if (f.size < 0) continue;
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(tmp.path() / f.relative_path)), f.size);
      EXPECT_EQ(xxh3_hex(f.digest_high, f.digest_low), xxh3_file((tmp.path() / f.relative_path).string()))
          << "the digest computed while writing " << f.relative_path << " must be the file's";
      ++digested;
    }
  }
  EXPECT_GE(digested, 5);
  EXPECT_TRUE(fs::exists(tmp.path() / "sharded" / "shard-00001-model-00001-of-00003.safetensors"));
  const auto r = ShardedTensorReader::open(tmp.path() / "sharded");
  EXPECT_EQ(r.names(), (std::vector<std::string>{"v", "w"}));
  EXPECT_EQ(r.shape("w"), (std::vector<int64_t>{7, 5}));
  EXPECT_EQ(r.metadata("step"), "3");
  EXPECT_TRUE(at::equal(r.read("w"), w));
  EXPECT_TRUE(at::equal(r.read("v"), v));
  // Another world size's ranges: [4, 23) of w crosses every file of the first two ranks.
  at::Tensor out = at::empty({19});
  r.read_range("w", 4, 23, out);
  EXPECT_TRUE(at::equal(out, w.reshape({-1}).slice(0, 4, 23)));
  // DCP_SHARDING_INFO as torch's reader parses it.
  auto f = alpaca::io::SafetensorsFile::open((tmp.path() / "sharded" / "shard-00002-model-00003-of-00003.safetensors").string());
  const auto info = nlohmann::json::parse(f->metadata().at("DCP_SHARDING_INFO"));
  EXPECT_EQ(info["w"]["saved_offsets"], nlohmann::json({5, 0}));  // rank 1 ends inside row 5
  // A missing file is an error that names the tensor.
  fs::remove(tmp.path() / "sharded" / "shard-00002-model-00001-of-00003.safetensors");
  const auto partial = ShardedTensorReader::open(tmp.path() / "sharded");
  try {
    partial.read("w");
    FAIL() << "a missing shard must be an error";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(std::string(e.what()).find("of w are not all in its shard files"), std::string::npos) << e.what();
  }
}

TEST(Digest, Xxh3IsFasterThanTheOldSha256) {
  TempDir tmp("digest_speed");
  const int64_t bytes = int64_t{64} << 20;
  {
    std::ofstream f(tmp.path() / "blob", std::ios::binary);
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 2654435761u >> 13);
    for (int i = 0; i < bytes >> 20; ++i) f.write(chunk.data(), chunk.size());
  }
  const std::string path = (tmp.path() / "blob").string();
  auto cpu_seconds = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  xxh3_file(path);  // page cache warm for both
  double t0 = cpu_seconds();
  const std::string x = xxh3_file(path);
  const double xxh3_s = cpu_seconds() - t0;
  t0 = cpu_seconds();
  const std::string s = sha256_file(path);
  const double sha_s = cpu_seconds() - t0;
  std::printf("[digest] %lld MiB from the page cache, CPU time: xxh3_128 %.3f s (%.2f GB/s), scalar sha256 %.3f s (%.2f GB/s)\n",
              static_cast<long long>(bytes >> 20), xxh3_s, bytes / std::max(xxh3_s, 1e-9) / 1e9, sha_s,
              bytes / std::max(sha_s, 1e-9) / 1e9);
  EXPECT_EQ(x.size(), 32u);
  EXPECT_EQ(s.size(), 64u);
  EXPECT_LT(xxh3_s * 3, sha_s) << "XXH3 must be several times faster than the scalar SHA-256";
}

}  // namespace test_sharded_tensors
