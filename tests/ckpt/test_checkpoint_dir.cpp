// Checkpoint directories: atomic commit, completeness checks, resume discovery, a kill -9 in
// the middle of a save, and rotation compared with transformers' own rotate_checkpoints.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_checkpoint_dir {

namespace fs = std::filesystem;
using namespace alpaca::ckpt;
using alpaca::testing::BackgroundRun;
using alpaca::testing::TempDir;

namespace {

void write_text(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

fs::path save_checkpoint(const fs::path& out, int64_t step, const std::string& payload = "weights") {
  CheckpointWriter w(out, step);
  w.begin();
  write_text(w.staging_dir() / "model.safetensors", payload + std::to_string(step));
  write_text(w.staging_dir() / "optimizer" / "rank_independent.bin", "adam");
  return w.commit();
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

}  // namespace

TEST(CheckpointDir, NamesParseLikeHF) {
  EXPECT_EQ(checkpoint_name(120), "checkpoint-120");
  EXPECT_EQ(parse_checkpoint_step("checkpoint-120"), 120);
  EXPECT_FALSE(parse_checkpoint_step("checkpoint-"));
  EXPECT_FALSE(parse_checkpoint_step("tmp-checkpoint-3"));
  EXPECT_FALSE(parse_checkpoint_step("checkpoint-3x"));
}

TEST(CheckpointDir, CommitIsAtomicAndComplete) {
  TempDir tmp("ckpt_commit");
  CheckpointWriter w(tmp.path(), 7);
  w.begin();
  write_text(w.staging_dir() / "a.bin", "12345");
  EXPECT_FALSE(fs::exists(tmp.path() / "checkpoint-7")) << "nothing final before commit";
  EXPECT_FALSE(find_latest_complete_checkpoint(tmp.path()));
  const fs::path dst = w.commit();
  EXPECT_EQ(dst, tmp.path() / "checkpoint-7");
  EXPECT_TRUE(fs::exists(dst / kCompleteMarker));
  EXPECT_FALSE(fs::exists(w.staging_dir()));
  EXPECT_EQ(checkpoint_problem(dst), "");
  // Saving the same step again replaces it.
  CheckpointWriter again(tmp.path(), 7);
  again.begin();
  write_text(again.staging_dir() / "b.bin", "x");
  again.commit();
  EXPECT_FALSE(fs::exists(dst / "a.bin"));
  EXPECT_TRUE(fs::exists(dst / "b.bin"));
  EXPECT_EQ(names_in(tmp.path()), std::set<std::string>{"checkpoint-7"});
}

TEST(CheckpointDir, SkipsIncompleteAndCorruptNewest) {
  TempDir tmp("ckpt_skip");
  save_checkpoint(tmp.path(), 10);
  const fs::path c20 = save_checkpoint(tmp.path(), 20);
  const fs::path c30 = save_checkpoint(tmp.path(), 30);
  EXPECT_EQ(*find_latest_complete_checkpoint(tmp.path()), c30);

  // Newest truncated after the fact, next one lost its marker: fall back to checkpoint-10.
  fs::resize_file(c30 / "model.safetensors", 3);
  EXPECT_NE(checkpoint_problem(c30).find("model.safetensors has 3 bytes"), std::string::npos) << checkpoint_problem(c30);
  EXPECT_EQ(*find_latest_complete_checkpoint(tmp.path()), c20);
  fs::remove(c20 / kCompleteMarker);
  EXPECT_NE(checkpoint_problem(c20).find("did not finish"), std::string::npos);
  EXPECT_EQ(*find_latest_complete_checkpoint(tmp.path()), tmp.path() / "checkpoint-10");
  // A transformers Trainer checkpoint is named as one, with the way to start from its weights.
  const fs::path hf = tmp.path() / "hf-checkpoint-5";
  fs::create_directories(hf);
  std::ofstream(hf / "trainer_state.json") << "{}";
  std::ofstream(hf / "optimizer.pt") << "pickle";
  EXPECT_NE(checkpoint_problem(hf).find("Hugging Face Trainer checkpoint (optimizer.pt)"), std::string::npos)
      << checkpoint_problem(hf);
  EXPECT_NE(checkpoint_problem(hf).find("--model_name_or_path " + hf.string()), std::string::npos);
  // A missing file and a marker for another step are corrupt too.
  const fs::path c40 = save_checkpoint(tmp.path(), 40);
  fs::remove(c40 / "optimizer" / "rank_independent.bin");
  EXPECT_NE(checkpoint_problem(c40).find("missing"), std::string::npos);
  fs::rename(tmp.path() / "checkpoint-10", tmp.path() / "checkpoint-11");
  EXPECT_NE(checkpoint_problem(tmp.path() / "checkpoint-11").find("step 10"), std::string::npos);
  EXPECT_FALSE(find_latest_complete_checkpoint(tmp.path()));
}

TEST(CheckpointDir, OneFlippedByteIsCaughtByTheDigestAndNamesTheFile) {
  TempDir tmp("ckpt_flip");
  const fs::path c10 = save_checkpoint(tmp.path(), 10);
  const fs::path c20 = save_checkpoint(tmp.path(), 20);
  // Same size, one byte different: only the checksum can tell.
  {
    std::fstream f(c20 / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2);
    f.put('X');
  }
  const std::string why = checkpoint_problem(c20);
  EXPECT_NE(why.find((c20 / "model.safetensors").string() + " is corrupt: its xxh3_128 is"), std::string::npos) << why;
  EXPECT_EQ(*find_latest_complete_checkpoint(tmp.path()), c10) << "the corrupt newest is skipped";
  // Split between 3 ranks, only the rank whose share holds the file reads it.
  int found = 0;
  for (int r = 0; r < 3; ++r) found += checkpoint_problem(c20, r, 3).empty() ? 0 : 1;
  EXPECT_EQ(found, 1);
  std::ifstream in(c10 / kCompleteMarker);
  nlohmann::json marker = nlohmann::json::parse(in);
  // A checkpoint written with SHA-256 digests (before XXH3) still verifies, and catches a flip.
  nlohmann::json sha = nlohmann::json::object();
  for (const auto& [rel, size] : marker["files"].items()) sha[rel] = sha256_file((c10 / rel).string());
  nlohmann::json old_marker = marker;
  old_marker.erase("xxh3_128");
  old_marker["sha256"] = sha;
  std::ofstream(c10 / kCompleteMarker) << old_marker.dump(2);
  EXPECT_EQ(checkpoint_problem(c10), "");
  old_marker["sha256"]["model.safetensors"] = std::string(64, '0');
  std::ofstream(c10 / kCompleteMarker) << old_marker.dump(2);
  EXPECT_NE(checkpoint_problem(c10).find("is corrupt: its sha256 is"), std::string::npos);
  // A checkpoint written before the checksums (sizes only) is still resumable.
  marker.erase("xxh3_128");
  std::ofstream(c10 / kCompleteMarker) << marker.dump(2);
  EXPECT_EQ(checkpoint_problem(c10), "");
  // A marker that is not what we wrote is corrupt, not a crash.
  std::ofstream(c10 / kCompleteMarker) << R"({"step": 1e300, "files": {}})";
  EXPECT_NE(checkpoint_problem(c10).find("not an integer"), std::string::npos);
  std::ofstream(c10 / kCompleteMarker) << R"({"step": 10, "files": {"model.safetensors": "big"}})";
  EXPECT_NE(checkpoint_problem(c10).find("without an integer size"), std::string::npos);
}

TEST(CheckpointDir, KillNineDuringSaveKeepsPreviousCheckpoint) {
  TempDir tmp("ckpt_kill");
  const fs::path first = save_checkpoint(tmp.path(), 5);
  TempDir logs("ckpt_kill_log");  // not in tmp: the test lists what is there
  // Child: start checkpoint-10 and keep writing until killed.
  BackgroundRun child(
      [&] {
        CheckpointWriter w(tmp.path(), 10);
        w.begin();
        std::ofstream f(w.staging_dir() / "model.safetensors", std::ios::binary);
        std::string chunk(1 << 16, 'x');
        for (;;) {
          f.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
          f.flush();
        }
      },
      logs.path() / "child.log");
  const fs::path staged = tmp.path() / "tmp-checkpoint-10" / "model.safetensors";
  child.wait_until([&] { return fs::exists(staged) && fs::file_size(staged) > (1 << 18); });
  child.signal(SIGKILL);
  const int status = child.wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(tmp.path() / "tmp-checkpoint-10")) << "the child died mid-save";
  EXPECT_FALSE(fs::exists(tmp.path() / "checkpoint-10"));
  EXPECT_EQ(*find_latest_complete_checkpoint(tmp.path()), first);
  EXPECT_EQ(checkpoint_problem(first), "");
  const auto removed = remove_stale_staging(tmp.path());
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(names_in(tmp.path()), std::set<std::string>{"checkpoint-5"});
}

TEST(CheckpointDir, SortMovesBestToSecondToLast) {
  TempDir tmp("ckpt_sort");
  for (int s : {100, 20, 3}) save_checkpoint(tmp.path(), s);
  auto sorted = sort_checkpoints(tmp.path());
  ASSERT_EQ(sorted.size(), 3u);
  EXPECT_EQ(sorted[0].filename(), "checkpoint-3");
  EXPECT_EQ(sorted[2].filename(), "checkpoint-100");
  sorted = sort_checkpoints(tmp.path(), false, (tmp.path() / "checkpoint-3").string());
  EXPECT_EQ(sorted[0].filename(), "checkpoint-20");
  EXPECT_EQ(sorted[1].filename(), "checkpoint-3");
  EXPECT_EQ(sorted[2].filename(), "checkpoint-100");
}

// Rotation: our rotate_checkpoints and transformers' on identical layouts leave identical sets
// (every case's layout made first, then one Python start rotates all of transformers' copies).
TEST(CheckpointDir, RotationMatchesTransformers) {
  struct Case {
    int limit;
    std::string best;
  };
  const std::vector<Case> cases = {Case{2, ""}, Case{1, ""}, Case{3, ""}, Case{2, "checkpoint-2"}, Case{1, "checkpoint-3"},
                                   Case{0, ""}, Case{9, ""}};
  TempDir ours("rot_ours"), theirs("rot_hf");
  std::string cmd = alpaca::testing::python() + " " +
                    (alpaca::testing::source_dir() / "tests/reference/train_ckpt_hf_check.py").string() + " rotate";
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path o = ours.path() / std::to_string(i), t = theirs.path() / std::to_string(i);
    for (int s = 1; s <= 5; ++s) {
      save_checkpoint(o, s);
      save_checkpoint(t, s);
    }
    const Case& c = cases[i];
    rotate_checkpoints(o, c.limit, c.best.empty() ? "" : (o / c.best).string(), /*use_mtime=*/false);
    cmd += " " + t.string() + " " + std::to_string(c.limit) + " " + (c.best.empty() ? "-" : c.best);
  }
  std::string out;
  ASSERT_EQ(alpaca::testing::run_command(cmd, &out), 0) << out;
  std::vector<std::set<std::string>> hf(cases.size());
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);) {
    const fs::path p = line;
    if (line.empty() || p.parent_path().parent_path() != theirs.path()) continue;  // not a listing line
    hf.at(std::stoul(p.parent_path().filename().string())).insert(p.filename().string());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    EXPECT_EQ(names_in(ours.path() / std::to_string(i)), hf[i]) << "limit " << c.limit << " best '" << c.best << "'";
    if (c.limit > 0 && c.best.empty()) {
      EXPECT_EQ(names_in(ours.path() / std::to_string(i)).size(), std::min<size_t>(c.limit, 5));
    }
  }
}

TEST(CheckpointDir, RotationByMtimeKeepsNewestWritten) {
  TempDir tmp("rot_mtime");
  for (int s = 1; s <= 4; ++s) save_checkpoint(tmp.path(), s);
  // Make checkpoint-1 the most recently written (mtimes > 1 s apart so HF's rule trusts them).
  const auto now = fs::file_time_type::clock::now();
  for (int s = 1; s <= 4; ++s)
    fs::last_write_time(tmp.path() / checkpoint_name(s), now - std::chrono::seconds(10 * (5 - s)));
  fs::last_write_time(tmp.path() / "checkpoint-1", now + std::chrono::seconds(5));
  rotate_checkpoints(tmp.path(), 2, "", /*use_mtime=*/true);
  EXPECT_EQ(names_in(tmp.path()), (std::set<std::string>{"checkpoint-1", "checkpoint-4"}));
}

}  // namespace test_checkpoint_dir
